//! `cargo bench --bench saturation`: how many acquisitions one Redis core serves (issue 18,
//! item 3), for redmutex and a naive lock in the same run, against a real redis-server
//! (spawned here, or the one at `REDIS_URL`).
//!
//! 8 processes × 4 threads loop lock -> (no hold) -> unlock for `REDMUTEX_SATURATION_SECS`
//! seconds (default 3) per run, in `REDMUTEX_SATURATION_PASSES` passes (default 2) over
//! all runs whose figures are summed, over 1,000 lock names (each iteration a random one: little
//! contention) and over 1 name (all contention). Runs, back to back: 1,000 names with
//! `Lock` and the naive lock; 1 name with `Lock`, `FairLock` and the naive lock. Each
//! process has one redmutex `Client` (its threads share it), or one connection per thread
//! for the naive lock.
//!
//! The naive lock is `SET key token NX PX 30000`, released by a compare-and-delete script
//! (EVALSHA); a thread that finds the key taken sleeps `REDMUTEX_SATURATION_POLL_MS`
//! (default 1 ms) and tries again.
//!
//! Reported per run: acquisitions/s, Redis CPU busy fraction (Redis process CPU s / wall
//! s: 1.0 is one core busy all along), acquisitions per Redis CPU second (per Redis core),
//! executed commands and requests per acquisition, the clients' own CPU (all 8 processes,
//! in cores), least/most acquisitions per process, and redmutex / naive ratios. The
//! machine's cores are shared by Redis and the 32 client threads, so Redis need not be
//! the bottleneck: its busy fraction says how close it came, and acquisitions per Redis
//! CPU second is the figure that holds either way.
//!
//! Re-executes itself as the worker processes. Prints tables and exits 0: it measures, it
//! does not gate.

use std::fmt::Write as _;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::*;

use support::child::say;

const NAMES_ENV: &str = "REDMUTEX_SATURATION_NAMES";
/// Seconds per run (a float); 3 unless set.
const SECS_ENV: &str = "REDMUTEX_SATURATION_SECS";
const DEFAULT_SECS: f64 = 3.0;
/// Passes over all the runs, their figures summed per run: a slow phase of a shared
/// machine then weighs on every kind alike. 2 unless set.
const PASSES_ENV: &str = "REDMUTEX_SATURATION_PASSES";
const DEFAULT_PASSES: f64 = 2.0;
/// The naive lock's sleep after a failed SET NX, ms (a float); 1 unless set.
const POLL_ENV: &str = "REDMUTEX_SATURATION_POLL_MS";
const DEFAULT_POLL_MS: f64 = 1.0;

const PROCESSES: usize = 8;
const THREADS: usize = 4;
const MANY_NAMES: usize = 1_000;
const NAIVE_LEASE_MS: u64 = 30_000;
const STUCK: Duration = Duration::from_secs(60);

fn main() {
    dispatch(ROLE_ENV, |_| child_main(), parent_main);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lock,
    Fair,
    Naive,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "Lock",
            Kind::Fair => "FairLock",
            Kind::Naive => "naive",
        }
    }

    fn parse(s: &str) -> Kind {
        kind_named(&[Kind::Lock, Kind::Fair, Kind::Naive], Kind::name, s)
    }
}

// ---------------------------------------------------------------------------------------
// Parent.

struct Run {
    kind: Kind,
    names: usize,
    /// Acquisitions per process.
    counts: Vec<u64>,
    wall_s: f64,
    cost: ServerCost,
    /// CPU the worker processes used during the run, s (all of them).
    client_cpu_s: f64,
}

impl Run {
    fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn label(&self) -> String {
        format!("{} x{}", self.kind.name(), self.names)
    }

    /// Another pass of the same run.
    fn add(&mut self, other: &Run) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.wall_s += other.wall_s;
        self.cost.add(&other.cost);
        self.client_cpu_s += other.client_cpu_s;
    }

    fn redis_cpu_s(&self) -> f64 {
        self.cost.cpu_us / 1e6
    }

    fn per_redis_cpu_s(&self) -> f64 {
        self.total() as f64 / self.redis_cpu_s()
    }
}

fn parent_main() {
    let secs = env_f64(SECS_ENV, DEFAULT_SECS);
    let passes = env_f64(PASSES_ENV, DEFAULT_PASSES) as usize;
    let poll_ms = env_f64(POLL_ENV, DEFAULT_POLL_MS);
    let (url, server) = support::redis_url_or_spawn();
    let mut admin = admin_connection(&url, STUCK);
    let version = support::redis_version(&mut admin);
    let started = Instant::now();

    let on = run_on(
        "saturation",
        &["REDIS_URL", SECS_ENV, PASSES_ENV, POLL_ENV],
        &url,
        server.as_ref(),
        &version,
    );
    println!(
        "{on}; {PROCESSES} processes x {THREADS} threads, \
         lock -> unlock (no hold), {secs} s per run, {passes} passes (figures summed); \
         naive polls every {poll_ms} ms"
    );

    let plan = [
        (Kind::Lock, MANY_NAMES),
        (Kind::Naive, MANY_NAMES),
        (Kind::Lock, 1),
        (Kind::Fair, 1),
        (Kind::Naive, 1),
    ];
    let mut runs: Vec<Run> = Vec::new();
    for pass in 0..passes {
        for (i, &(kind, names)) in plan.iter().enumerate() {
            eprintln!(
                "[pass {}/{passes}, {}/{}] {} over {names} name(s), {secs} s ...",
                pass + 1,
                i + 1,
                plan.len(),
                kind.name()
            );
            let r = run(&url, kind, names, secs, &mut admin);
            match runs.get_mut(i) {
                Some(sum) => sum.add(&r),
                None => runs.push(r),
            }
        }
    }
    report(&runs, started.elapsed());
}

fn run(url: &str, kind: Kind, names: usize, secs: f64, admin: &mut redis::Connection) -> Run {
    let prefix = unique_prefix("saturation", &format!("{}-{names}", kind.name()));
    let names_s = names.to_string();
    let mut children = spawn_workers(
        PROCESSES,
        ROLE_ENV,
        "worker",
        &[
            (KIND_ENV, kind.name()),
            (URL_ENV, url),
            (PREFIX_ENV, &prefix),
            (NAMES_ENV, &names_s),
        ],
    );
    for c in &children {
        c.expect("ready");
    }
    let before = ServerSnapshot::take(admin);
    let (start, end) = start_window(&mut children, secs);
    let mut counts = Vec::new();
    let mut client_cpu_s = 0.0;
    let mut last_end = end;
    for c in &children {
        let line = c
            .try_line(Duration::from_secs_f64(secs) + STUCK)
            .unwrap_or_else(|| panic!("a {} worker hung", kind.name()));
        let v: Vec<u64> = line
            .strip_prefix("count ")
            .unwrap_or_else(|| panic!("unexpected worker line {line:?}"))
            .split_whitespace()
            .map(parse_u64)
            .collect();
        counts.push(v[0]);
        client_cpu_s += v[1] as f64 / 1e9;
        last_end = last_end.max(v[2]);
    }
    let cost = ServerSnapshot::take(admin).since(&before);
    for c in children {
        c.wait_success();
    }
    Run {
        kind,
        names,
        counts,
        // Until the last thread's last release returned.
        wall_s: (last_end - start) as f64 / 1e9,
        cost,
        client_cpu_s,
    }
}

// ---------------------------------------------------------------------------------------
// Workers.

enum Handles {
    Lock(Vec<redmutex::Lock>),
    Fair(Vec<redmutex::FairLock>),
    Naive {
        con: Box<redis::Connection>,
        keys: Vec<String>,
        naive: NaiveLock,
        token: String,
    },
}

fn child_main() {
    let kind = Kind::parse(&env(KIND_ENV));
    let url = env(URL_ENV);
    let prefix = env(PREFIX_ENV);
    let names = parse_u64(&env(NAMES_ENV)) as usize;
    let poll = Duration::from_secs_f64(env_f64(POLL_ENV, DEFAULT_POLL_MS) / 1e3);
    let client = (kind != Kind::Naive).then(|| bench_client(&url, &prefix));
    let ready = Arc::new(Barrier::new(THREADS + 1));
    let go = Arc::new(Barrier::new(THREADS + 1));
    let window = Arc::new(std::sync::Mutex::new((0u64, 0u64)));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (client, url, prefix) = (client.clone(), url.clone(), prefix.clone());
            let (ready, go, window) = (ready.clone(), go.clone(), window.clone());
            thread::spawn(move || {
                let name = |i: usize| format!("n{i}");
                let mut h = match kind {
                    Kind::Lock => {
                        let c = client.as_ref().expect("a client");
                        Handles::Lock((0..names).map(|i| c.lock(name(i))).collect())
                    }
                    Kind::Fair => {
                        let c = client.as_ref().expect("a client");
                        Handles::Fair((0..names).map(|i| c.fair_lock(name(i))).collect())
                    }
                    Kind::Naive => Handles::Naive {
                        con: Box::new(connect(&url)),
                        keys: (0..names)
                            .map(|i| format!("{prefix}naive:{}", name(i)))
                            .collect(),
                        naive: NaiveLock::new(),
                        token: format!("{}:{t}", std::process::id()),
                    },
                };
                // xorshift64, seeded per process and thread.
                let mut seed = (std::process::id() as u64) << 8 | t as u64 | 1;
                let mut pick = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % names as u64) as usize
                };
                let mut n = 0u64;
                let mut once = |i: usize| match &mut h {
                    Handles::Lock(locks) => {
                        locks[i].lock().expect("lock").unlock().expect("unlock");
                    }
                    Handles::Fair(locks) => {
                        locks[i].lock().expect("lock").unlock().expect("unlock");
                    }
                    Handles::Naive {
                        con,
                        keys,
                        naive,
                        token,
                    } => {
                        n += 1;
                        let mine = format!("{token}:{n}");
                        while !naive.try_lock(con, &keys[i], &mine, NAIVE_LEASE_MS) {
                            thread::sleep(poll);
                        }
                        naive.unlock(con, &keys[i], &mine);
                    }
                };
                // Warm up: scripts loaded, connections open.
                once(0);
                ready.wait();
                go.wait();
                let (start, end) = *window.lock().expect("window");
                sleep_until_mono(start);
                let mut count = 0u64;
                while mono_ns() < end {
                    once(pick());
                    count += 1;
                }
                (count, mono_ns())
            })
        })
        .collect();
    ready.wait();
    say("ready");
    *window.lock().expect("window") = read_window();
    let cpu_before = process_cpu_ns();
    go.wait();
    let mut count = 0;
    let mut last = 0;
    for t in threads {
        let (c, at) = t.join().expect("worker thread");
        count += c;
        last = last.max(at);
    }
    let cpu = process_cpu_ns() - cpu_before;
    say(&format!("count {count} {cpu} {last}"));
}

/// This process's CPU time, user + sys, ns (`/proc/self/stat`, clock ticks of 10 ms).
fn process_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("comm in /proc/self/stat") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the comm.
    let ticks = parse_u64(f[11]) + parse_u64(f[12]);
    ticks * 10_000_000
}

// ---------------------------------------------------------------------------------------
// Report.

fn report(runs: &[Run], elapsed: Duration) {
    let mut out = String::new();
    for names in [MANY_NAMES, 1] {
        let these: Vec<&Run> = runs.iter().filter(|r| r.names == names).collect();
        let naive = these
            .iter()
            .find(|r| r.kind == Kind::Naive)
            .expect("a naive run");
        let _ = writeln!(
            out,
            "\n{PROCESSES} processes x {THREADS} threads over {names} name(s){}",
            if names == 1 {
                " (all contention)"
            } else {
                " (each iteration a random name: little contention)"
            }
        );
        let header: Vec<String> = std::iter::once(String::new())
            .chain(these.iter().map(|r| r.label()))
            .collect();
        let mut t = Grid::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
        let col =
            |f: &dyn Fn(&Run) -> String| -> Vec<String> { these.iter().map(|r| f(r)).collect() };
        t.row("acquisitions", col(&|r| r.total().to_string()));
        t.row(
            "acquisitions/s",
            col(&|r| format!("{:.0}", r.total() as f64 / r.wall_s)),
        );
        t.row(
            "  x naive",
            col(&|r| {
                format!(
                    "{:.2}x",
                    (r.total() as f64 / r.wall_s) / (naive.total() as f64 / naive.wall_s)
                )
            }),
        );
        t.row(
            "Redis CPU busy (CPU s / wall s)",
            col(&|r| f2(r.redis_cpu_s() / r.wall_s)),
        );
        t.row(
            "clients' CPU (cores)",
            col(&|r| f2(r.client_cpu_s / r.wall_s)),
        );
        t.row(
            "acquisitions per Redis CPU s",
            col(&|r| format!("{:.0}", r.per_redis_cpu_s())),
        );
        t.row(
            "  x naive",
            col(&|r| format!("{:.2}x", r.per_redis_cpu_s() / naive.per_redis_cpu_s())),
        );
        server_cost_rows(
            &mut t,
            &these
                .iter()
                .map(|r| (&r.cost, r.total()))
                .collect::<Vec<_>>(),
            Some((&naive.cost, naive.total())),
        );
        t.row(
            "  x naive (requests)",
            col(&|r| {
                format!(
                    "{:.2}x",
                    r.cost.requests_per(r.total()) / naive.cost.requests_per(naive.total())
                )
            }),
        );
        t.row(
            "least/most per process",
            col(&|r| f2(least_most(&r.counts))),
        );
        let _ = write!(out, "{}", t.render());
        let busiest = these
            .iter()
            .map(|r| r.redis_cpu_s() / r.wall_s)
            .fold(0.0, f64::max);
        let cpus = thread::available_parallelism().map_or(0, |n| n.get());
        let _ = writeln!(
            out,
            "  Redis {} the bottleneck: at most {busiest:.2} of a core busy (it is single-threaded), \
             with {cpus} CPUs shared by it, the {} client threads and whatever else runs here; \
             acquisitions per Redis CPU s is the figure that holds either way",
            if busiest >= 0.9 { "was" } else { "was NOT" },
            PROCESSES * THREADS
        );
        for r in &these {
            let _ = writeln!(
                out,
                "  {:<12} per acquisition: {}",
                r.label(),
                r.cost.breakdown(r.total())
            );
        }
    }
    let _ = writeln!(out, "\nwhole bench took {:.1} s", elapsed.as_secs_f64());
    print!("{out}");
}
