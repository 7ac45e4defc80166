//! redmutex's demo: several processes × threads contend on one lock, with nested critical
//! sections, and prove that no update was lost; once with a `Lock`, once with a `FairLock`.
//!
//! ```sh
//! cargo run --release --example demo                  # 4 processes x 4 threads, 4 s per kind
//! cargo run --release --example demo -- --processes 2 --threads 8 --seconds 10 --kind fair
//! cargo run --release --example demo -- --sentinel      # on a primary + 2 replicas + 3 sentinels
//! cargo run --release --example demo -- --cluster       # on a cluster of 3 primaries
//! ```
//!
//! Without `REDIS_URL` it starts a throwaway `redis-server` on a free loopback port; with
//! `--sentinel` (without `REDIS_SENTINELS`) a throwaway Sentinel topology, with `--cluster`
//! (without `REDIS_CLUSTER`) a throwaway cluster (see `tests/support/deployment.rs`). It
//! re-executes itself as the worker processes. Every thread loops: take the lock, take it
//! again (re-entry), read a counter from Redis, write it back plus one (deliberately not
//! atomic: only the lock keeps two increments apart), release both levels, then do a
//! little work outside the lock. The parent then prints acquisitions per second, lost
//! updates (the counter against the acquisitions the workers counted: must be 0), the
//! handoff latency from one holder's release to the next holder's return from `lock()`,
//! the Redis traffic the lock itself caused per acquisition, and how evenly the processes
//! were served: the least and the most acquisitions of one process, and Jain's fairness
//! index over the processes ((Σx)² / (n·Σx²): 1 when all got as many, 1/n when one got all).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::deployment::{self, Deployment, Embedded, Shape};

const WORKER_ENV: &str = "REDMUTEX_DEMO_WORKER";
const LOCK_NAME: &str = "counter";
const USAGE: &str = "usage: demo [--processes N] [--threads N] [--seconds S] \
                     [--kind lock|fair|both] [--sentinel | --cluster]\n\
                     Without REDIS_URL (REDIS_SENTINELS with --sentinel, REDIS_CLUSTER with \
                     --cluster) it starts a throwaway server of its own.";

struct Options {
    processes: usize,
    threads: usize,
    /// Per kind.
    seconds: f64,
    kinds: Vec<Kind>,
    shape: Shape,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lock,
    Fair,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "Lock",
            Kind::Fair => "FairLock",
        }
    }
}

fn main() -> ExitCode {
    if std::env::var_os(WORKER_ENV).is_some() {
        worker();
        return ExitCode::SUCCESS;
    }
    let opts = match parse_args() {
        Ok(Some(opts)) => opts,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("demo: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (deploy, embedded) = deployment::deployment_or_spawn(opts.shape);
    let mut fairness = Vec::new();
    let mut code = ExitCode::SUCCESS;
    for &kind in &opts.kinds {
        match parent(&opts, kind, &deploy, &embedded) {
            Ok(f) => fairness.push((kind, f)),
            Err(()) => code = ExitCode::FAILURE,
        }
    }
    if fairness.len() > 1 {
        let parts: Vec<String> = fairness
            .iter()
            .map(|(k, (lm, jain))| format!("{} least/most {lm:.2}, Jain {jain:.3}", k.name()))
            .collect();
        println!("fairness across processes: {}", parts.join("  |  "));
    }
    code
}

/// The options, or `None` when `--help` (or `-h`) asked for the usage.
fn parse_args() -> Result<Option<Options>, String> {
    let mut opts = Options {
        processes: 4,
        threads: 4,
        seconds: 4.0,
        kinds: vec![Kind::Lock, Kind::Fair],
        shape: Shape::Single,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let shape = match flag.as_str() {
            "--sentinel" => Some(Shape::Sentinel),
            "--cluster" => Some(Shape::Cluster),
            _ => None,
        };
        if let Some(shape) = shape {
            if opts.shape != Shape::Single {
                return Err("--sentinel and --cluster exclude each other".to_owned());
            }
            opts.shape = shape;
            continue;
        }
        if !["--processes", "--threads", "--seconds", "--kind"].contains(&flag.as_str()) {
            return Err(format!("unknown option {flag}"));
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = || format!("bad value {value:?} for {flag}");
        match flag.as_str() {
            "--processes" => opts.processes = value.parse().map_err(|_| bad())?,
            "--threads" => opts.threads = value.parse().map_err(|_| bad())?,
            "--seconds" => opts.seconds = value.parse().map_err(|_| bad())?,
            "--kind" => {
                opts.kinds = match value.as_str() {
                    "lock" => vec![Kind::Lock],
                    "fair" => vec![Kind::Fair],
                    "both" => vec![Kind::Lock, Kind::Fair],
                    _ => return Err(bad()),
                }
            }
            _ => unreachable!("checked above"),
        }
    }
    if opts.processes == 0 || opts.threads == 0 || opts.seconds.is_nan() || opts.seconds <= 0.0 {
        return Err("processes, threads and seconds must be positive".to_owned());
    }
    Ok(Some(opts))
}

/// One run with `kind`; on success, its (least/most, Jain index) over the processes.
fn parent(
    opts: &Options,
    kind: Kind,
    deploy: &Deployment,
    embedded: &Embedded,
) -> Result<(f64, f64), ()> {
    let prefix = format!("redmutex-demo:{}:{}:", std::process::id(), kind.name());
    // Every primary's counters: on a cluster the lock lives on one, the data on others.
    let mut primaries: Vec<redis::Connection> = deploy
        .primaries()
        .iter()
        .map(|url| {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("connect to a primary")
        })
        .collect();
    let commandstats = |primaries: &mut Vec<redis::Connection>| {
        let mut sum = std::collections::HashMap::new();
        for con in primaries.iter_mut() {
            for (cmd, n) in support::commandstats(con) {
                *sum.entry(cmd).or_insert(0) += n;
            }
        }
        sum
    };
    let before = commandstats(&mut primaries);

    // Workers start together: they all run until the same wall-clock instant.
    let start_at = unix_micros() + 300_000;
    let end_at = start_at + (opts.seconds * 1e6) as u64;
    let workers: Vec<_> = (0..opts.processes)
        .map(|i| {
            Command::new(std::env::current_exe().expect("the demo's own path"))
                .env(WORKER_ENV, i.to_string())
                .env("DEMO_KIND", kind.name())
                .env("DEMO_DEPLOYMENT", deploy.to_env())
                .env("DEMO_PREFIX", &prefix)
                .env("DEMO_THREADS", opts.threads.to_string())
                .env("DEMO_START_AT", start_at.to_string())
                .env("DEMO_END_AT", end_at.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker process")
        })
        .collect();

    let mut acquisitions = 0u64;
    let mut per_process = Vec::new();
    let mut handoffs = Vec::new();
    let mut failed = 0;
    for mut worker in workers {
        let out = BufReader::new(worker.stdout.take().expect("worker stdout"));
        let mut mine = 0;
        for line in out.lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("acquisitions") => mine += parse_u64(words.next()),
                Some("handoffs") => handoffs.extend(words.map(|w| parse_u64(Some(w)))),
                _ => {}
            }
        }
        if !worker.wait().is_ok_and(|s| s.success()) {
            failed += 1;
        }
        acquisitions += mine;
        per_process.push(mine);
    }
    let elapsed = (end_at - start_at) as f64 / 1e6;

    let counter_key = format!("{prefix}data");
    let mut data = deploy.data_connection();
    let counter: u64 = redis::cmd("GET")
        .arg(&counter_key)
        .query::<Option<u64>>(&mut *data)
        .expect("GET counter")
        .unwrap_or(0);
    let after = commandstats(&mut primaries);
    let delta =
        |cmd: &str| after.get(cmd).copied().unwrap_or(0) - before.get(cmd).copied().unwrap_or(0);
    for admin in primaries.iter_mut() {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(admin)
            .unwrap_or_default();
        for key in keys {
            let _: Result<(), _> = redis::cmd("DEL").arg(key).query(admin);
        }
    }

    let version = support::redis_version(&mut primaries[0]);
    let origin = match embedded {
        Embedded::External => deploy.to_env(),
        embedded => embedded.to_string(),
    };
    let lost = acquisitions as i64 - counter as i64;
    let per_acq = |n: u64| n as f64 / acquisitions.max(1) as f64;
    handoffs.sort_unstable();
    println!(
        "redmutex demo, {}: {} processes x {} threads, {elapsed:.1} s, redis {version} ({:?}, {origin})",
        kind.name(),
        opts.processes,
        opts.threads,
        deploy.shape(),
    );
    println!(
        "  acquisitions        {acquisitions:>8}  ({:.0}/s), each with a nested re-entry",
        acquisitions as f64 / elapsed
    );
    println!("  counter             {counter:>8}  expected {acquisitions}  lost updates {lost}");
    let least = per_process.iter().copied().min().unwrap_or(0);
    let most = per_process.iter().copied().max().unwrap_or(0);
    let least_most = least as f64 / most.max(1) as f64;
    let jain = jain(&per_process);
    let list: Vec<String> = per_process.iter().map(u64::to_string).collect();
    println!(
        "  per process         least {least}  most {most}  least/most {least_most:.2}  \
         Jain index {jain:.3}  ({})",
        list.join("/")
    );
    println!(
        "  handoff latency     p50 {} µs   p99 {} µs   (n={}, release start to next lock() return)",
        percentile(&handoffs, 0.50),
        percentile(&handoffs, 0.99),
        handoffs.len()
    );
    // Scripts publish one message per turn handed on (INFO counts those too, as calls
    // inside scripts); the client itself only PUBLISHes to nudge its pub/sub reader when
    // a thread first waits on a lock, a handful in all. The scripts themselves are FCALLs
    // on Redis 7 and Valkey, EVALSHAs on 6.2: support::script_calls counts both (counting
    // only EVAL/EVALSHA printed 0.00 on Redis 7).
    let scripts = support::script_calls(&after).saturating_sub(support::script_calls(&before));
    let messages = delta("publish");
    let subs = delta("subscribe") + delta("unsubscribe");
    println!(
        "  redis commands/acq  {:.2} sent by the lock: {:.2} scripts = 4 (lock, re-enter, 2 releases)\n\
         {:>28.2} tries that found the lock taken (then queued, or retried after a wake-up);\n\
         {:>28} {subs} (UN)SUBSCRIBE; {:.2} messages per acquisition",
        per_acq(scripts + subs),
        per_acq(scripts),
        per_acq(scripts.saturating_sub(4 * acquisitions)),
        "",
        per_acq(messages),
    );
    if failed > 0 || lost != 0 || acquisitions == 0 {
        eprintln!(
            "demo FAILED ({}): {failed} worker(s) failed, {lost} lost update(s)",
            kind.name()
        );
        return Err(());
    }
    Ok((least_most, jain))
}

/// Jain's fairness index: (Σx)² / (n·Σx²).
fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// What one worker thread does, and when.
struct Turns {
    deploy: Deployment,
    prefix: String,
    seed: u64,
    start_at: u64,
    end_at: u64,
}

/// Takes the lock (trying first, then blocking), re-enters it, does a non-atomic
/// read-modify-write of the counter inside, until `end_at`. Returns the acquisitions and
/// the handoff latencies it saw.
fn work<K: redmutex::Kind>(lock: &redmutex::Lock<K>, turns: Turns) -> (u64, Vec<u64>) {
    let Turns {
        deploy,
        prefix,
        seed: mut rng,
        start_at,
        end_at,
    } = turns;
    let data = format!("{prefix}data");
    let released_at = format!("{prefix}released_at");
    let mut con = deploy.data_connection();
    let con = &mut *con;
    let (mut count, mut handoffs) = (0u64, Vec::new());
    sleep_until(start_at);
    while unix_micros() < end_at {
        let (outer, waited) = match lock.try_lock().expect("try_lock") {
            Some(guard) => (guard, false),
            None => (lock.lock().expect("lock"), true),
        };
        let acquired = unix_micros();
        if waited {
            let prev: Option<u64> = redis::cmd("GET").arg(&released_at).query(con).expect("GET");
            if let Some(prev) = prev.filter(|&p| p <= acquired) {
                handoffs.push(acquired - prev);
            }
        }
        // A nested critical section: the same thread takes the lock again.
        let inner = lock.lock().expect("re-entry");
        assert_eq!(lock.hold_count().expect("hold_count"), 2);
        let n: Option<u64> = redis::cmd("GET").arg(&data).query(con).expect("GET");
        redis::cmd("SET")
            .arg(&data)
            .arg(n.unwrap_or(0) + 1)
            .exec(con)
            .expect("SET");
        inner.unlock().expect("inner unlock");
        count += 1;
        redis::cmd("SET")
            .arg(&released_at)
            .arg(unix_micros())
            .exec(con)
            .expect("SET");
        outer.unlock().expect("outer unlock");
        // Work outside the lock, so that other threads get their turn.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        thread::sleep(Duration::from_micros(rng % 2_000));
    }
    (count, handoffs)
}

fn worker() {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let deploy = Deployment::from_env(&env("DEMO_DEPLOYMENT"));
    let prefix = env("DEMO_PREFIX");
    let threads: usize = env("DEMO_THREADS").parse().expect("DEMO_THREADS");
    let start_at: u64 = env("DEMO_START_AT").parse().expect("DEMO_START_AT");
    let end_at: u64 = env("DEMO_END_AT").parse().expect("DEMO_END_AT");
    let fair = env("DEMO_KIND") == Kind::Fair.name();
    let client = deploy
        .builder()
        .key_prefix(prefix.as_str())
        .build()
        .expect("build client");

    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let turns = Turns {
                deploy: deploy.clone(),
                prefix: prefix.clone(),
                seed: (u64::from(std::process::id()) << 16) ^ t as u64 ^ start_at,
                start_at,
                end_at,
            };
            // One surface for every kind: the same code runs a `Lock` or a `FairLock`.
            if fair {
                let lock = client.fair_lock(LOCK_NAME);
                thread::spawn(move || work(&lock, turns))
            } else {
                let lock = client.lock(LOCK_NAME);
                thread::spawn(move || work(&lock, turns))
            }
        })
        .collect();

    let (mut count, mut handoffs) = (0, Vec::new());
    for w in workers {
        let (c, h) = w.join().expect("worker thread");
        count += c;
        handoffs.extend(h);
    }
    println!("acquisitions {count}");
    let list: Vec<String> = handoffs.iter().map(u64::to_string).collect();
    println!("handoffs {}", list.join(" "));
}

fn percentile(sorted: &[u64], p: f64) -> String {
    if sorted.is_empty() {
        return "-".to_owned();
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].to_string()
}

fn parse_u64(word: Option<&str>) -> u64 {
    word.and_then(|w| w.parse().ok()).unwrap_or(0)
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

fn sleep_until(unix_us: u64) {
    let now = unix_micros();
    if unix_us > now {
        thread::sleep(Duration::from_micros(unix_us - now));
    }
}
