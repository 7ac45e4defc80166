//! `cargo bench --bench lock`: redmutex's latency and footprint targets, measured in one run
//! against a real redis-server (spawned here, or the one at `REDIS_URL`).
//!
//! Latencies are medians over thousands of operations after a warm-up, and are judged as
//! ratios to a plain PING round trip on a pooled connection, so the targets hold on any
//! machine. Measured: uncontended and nested `lock()` + drop, the handoff of a contended
//! lock to a blocked waiter in another process (against a naive `SET NX` + 10 ms polling
//! lock under the same protocol), the Redis commands a thread blocked for 2 s issues, and
//! what holding 1,000 watchdog locks costs (threads, pub/sub connections, renewal round
//! trips, memory).
//!
//! A plain harness rather than criterion because the handoff needs a second process: the
//! binary re-executes itself as that child, its role chosen by an environment variable.
//! It prints a table with PASS/FAIL per target and exits 0 either way: it measures, it
//! does not gate. Command-line arguments (cargo's `--bench`, filters) are ignored.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redmutex::{Client, LockGuard};

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{
    connect, dispatch, median, percentile, rss_kib, unique_prefix, Admin, PREFIX_ENV, ROLE_ENV,
    URL_ENV,
};

/// Operations per kind before any sample is kept: connections, scripts and caches warm up.
const WARMUP_OPS: usize = 500;
/// The cheap latencies are sampled in interleaved rounds, so that a slow phase of a noisy
/// machine hits PING and the lock operations alike instead of skewing one ratio.
const ROUNDS: usize = 8;
const OPS_PER_ROUND: usize = 750;

const HANDOFF_WARMUP: usize = 20;
const HANDOFFS: usize = 300;
/// The waiter is released at a random moment in this window after it is known blocked,
/// so the naive lock's 10 ms polling is met at a random phase, as in real use.
const RELEASE_DELAY_MIN_US: u64 = 2_000;
const RELEASE_DELAY_SPAN_US: u64 = 10_000;
const NAIVE_POLL: Duration = Duration::from_millis(10);
const NAIVE_LEASE_MS: u64 = 30_000;

const BLOCKED_FOR: Duration = Duration::from_secs(2);
const FIXED_LEASE: Duration = Duration::from_secs(60);

const MANY_LOCKS: usize = 1_000;
const MANY_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(3);
const MANY_PERIODS: u32 = 3;

/// Linux truncates thread names to 15 bytes: "redmutex-watchdog" reads back like this.
const WATCHDOG_COMM: &str = "redmutex-watchd";

/// Waits on another process's progress never last this long unless something is broken.
const STUCK: Duration = Duration::from_secs(15);

/// A child (its role in `ROLE_ENV`: which lock it contends with ("redmutex" or "naive")) or the parent.
fn main() {
    dispatch(ROLE_ENV, child_main, parent_main);
}

// ---------------------------------------------------------------------------------------
// Parent: runs every measurement and prints the table.

fn parent_main() {
    let (url, _server) = support::redis_url_or_spawn();
    let mut admin = Admin::new(&url, STUCK);
    let version = admin.redis_version();
    let started = Instant::now();

    eprintln!("[1-3/7] PING, uncontended and nested lock()+drop ...");
    let cheap = cheap_latencies(&url);
    eprintln!("[4/7] blocked waiter: commands in {BLOCKED_FOR:?} ...");
    let blocked = blocked_waiter_commands(&url, &mut admin);
    eprintln!("[5/7] contended handoff across processes: redmutex, then naive ...");
    let redmutex_handoff = handoff(&url, Mode::Redmutex, &mut admin);
    let naive = handoff(&url, Mode::Naive, &mut admin);
    let floor = handoff(&url, Mode::Floor, &mut admin);
    eprintln!("[6/7] {MANY_LOCKS} watchdog locks held by one client ...");
    let many = many_locks(&url, &mut admin);
    eprintln!("[7/7] server cost of an uncontended lock + unlock pair, redmutex and naive ...");
    let pair_cost = pair_server_cost(&url, &mut admin);

    let ping = median(&cheap.ping);
    let mut details = String::new();
    let _ = writeln!(details, "details (µs unless noted):");
    for (what, samples) in [
        ("PING (pooled)", &cheap.ping),
        ("lock()+drop, uncontended", &cheap.lock),
        ("nested lock()+drop", &cheap.nested),
        ("acquire+release scripts by hand", &cheap.scripts),
        ("handoff, redmutex", &redmutex_handoff),
        ("handoff, naive SET NX + 10 ms poll", &naive),
        ("handoff floor: PUBLISH seen + 1 RTT", &floor),
    ] {
        let _ = writeln!(
            details,
            "  {what:<36} n={:<6} p10 {:>9.1}  median {:>9.1}  p90 {:>9.1}  max {:>9.1}",
            samples.len(),
            percentile(samples, 0.10),
            median(samples),
            percentile(samples, 0.90),
            percentile(samples, 1.0),
        );
    }
    let by_command: Vec<String> = blocked
        .by_command
        .iter()
        .map(|(c, n)| format!("{c}={n}"))
        .collect();
    let _ = writeln!(
        details,
        "  blocked waiter, commands in {BLOCKED_FOR:?}: {} ({})",
        blocked.total,
        by_command.join(", ")
    );
    let _ = writeln!(
        details,
        "  {MANY_LOCKS} locks: acquired in {:.1} ms; script calls over {MANY_PERIODS} periods of {:?}: \
         {}; RSS {} -> {} KiB ({:+} KiB, {:.0} B/lock); leases lost: {}",
        many.acquire_time.as_secs_f64() * 1e3,
        MANY_WATCHDOG_TIMEOUT / 3,
        many.renew_calls,
        many.rss_before_kib,
        many.rss_after_kib,
        many.rss_growth_kib(),
        many.rss_growth_kib() as f64 * 1024.0 / MANY_LOCKS as f64,
        many.lost,
    );
    let _ = writeln!(
        details,
        "  whole bench took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!("\n{details}");
    print!("{}", pair_cost.render());

    let mut table = Table::new(format!("redmutex bench (redis {version}, one run)"));
    table.row("PING (pooled)", us(ping), "1.00x".into(), "", None);
    let ratio_row = |table: &mut Table, name: &str, samples: &[f64], max: f64| {
        let r = median(samples) / ping;
        table.row(
            name,
            us(median(samples)),
            format!("{r:.2}x"),
            &format!("<={max}x"),
            Some(r <= max),
        );
    };
    ratio_row(&mut table, "lock()+drop, uncontended", &cheap.lock, 2.5);
    let scripts_floor = median(&cheap.scripts);
    table.row(
        "  floor: its two scripts run by hand",
        us(scripts_floor),
        format!("{:.2}x", scripts_floor / ping),
        "",
        None,
    );
    ratio_row(
        &mut table,
        "nested lock()+drop (outer held)",
        &cheap.nested,
        2.5,
    );
    ratio_row(
        &mut table,
        "handoff across processes, redmutex",
        &redmutex_handoff,
        6.0,
    );
    let floor_ratio = median(&floor) / ping;
    table.row(
        "  floor: raw PUBLISH wake-up + one RTT",
        us(median(&floor)),
        format!("{floor_ratio:.2}x"),
        "",
        None,
    );
    let naive_ratio = median(&naive) / ping;
    table.row(
        "handoff across processes, naive (10 ms poll)",
        us(median(&naive)),
        format!("{naive_ratio:.1}x"),
        "",
        None,
    );
    let speedup = median(&naive) / median(&redmutex_handoff);
    table.row(
        "  naive / redmutex handoff",
        String::new(),
        format!("{speedup:.1}x"),
        ">=20x",
        Some(speedup >= 20.0),
    );
    table.row(
        &format!("commands by a thread blocked {}s", BLOCKED_FOR.as_secs()),
        format!("{} cmds", blocked.total),
        String::new(),
        "<=4",
        Some(blocked.total <= 4),
    );
    table.row(
        &format!("{MANY_LOCKS} watchdog locks: watchdog threads"),
        many.watchdog_threads.to_string(),
        String::new(),
        "<=1",
        Some(many.watchdog_threads <= 1),
    );
    table.row(
        &format!("{MANY_LOCKS} watchdog locks: pub/sub connections"),
        many.pubsub_connections.to_string(),
        String::new(),
        "<=1",
        Some(many.pubsub_connections <= 1),
    );
    let per_period = many.renew_calls as f64 / f64::from(MANY_PERIODS);
    table.row(
        &format!("{MANY_LOCKS} watchdog locks: renewal RTTs/period"),
        format!("{per_period:.2}"),
        String::new(),
        "<=10",
        Some(per_period <= 10.0),
    );
    table.row(
        &format!("{MANY_LOCKS} watchdog locks: RSS growth"),
        format!("{} KiB", many.rss_growth_kib()),
        String::new(),
        "",
        None,
    );
    println!("{}", table.render());
}

// ---------------------------------------------------------------------------------------
// 1-3: PING baseline, uncontended lock()+drop, nested re-acquire + release.

struct Cheap {
    ping: Vec<f64>,
    lock: Vec<f64>,
    nested: Vec<f64>,
    /// The library's acquire and release scripts run by hand: what Redis itself costs.
    scripts: Vec<f64>,
}

fn cheap_latencies(url: &str) -> Cheap {
    // Like the library's pool: no PING on checkout, connections made on demand.
    let pool = r2d2::Pool::builder()
        .max_size(16)
        .min_idle(Some(0))
        .test_on_check_out(false)
        .build(redis::Client::open(url).expect("valid redis url"))
        .expect("build the PING pool");
    let ping_op = || {
        let mut con = pool.get().expect("pooled connection");
        redis::cmd("PING")
            .query::<()>(&mut *con)
            .expect("PING answered");
    };

    // The library's scripts as it runs them (the queue's rules prepended), with the
    // arguments it passes: the floor of an uncontended lock + unlock.
    let queued = support::queued_script;
    let acquire = redis::Script::new(&queued(support::lock_acquire()));
    let release = redis::Script::new(&queued(support::lock_release()));
    let lock_keys = [
        "cheap:{raw}",
        "cheap:!fence:{raw}",
        "cheap:!queue:{raw}",
        "cheap:!waiters:{raw}",
    ];
    let other_kinds = ["cheap:!rw:{raw}", "cheap:!sem:{raw}", "cheap:!latch:{raw}"];
    let scripts_op = || {
        let mut con = pool.get().expect("pooled connection");
        let mut call = acquire.prepare_invoke();
        // Last, the other kinds of the name, which the script refuses it for.
        for key in lock_keys.into_iter().chain(other_kinds) {
            call.key(key);
        }
        // A grant without a fencing token is the bare count (lua/acquire.lua).
        let count: i64 = call
            .arg("bench:1")
            .arg(30_000)
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(0)
            .invoke(&mut *con)
            .expect("acquire script");
        assert_eq!(count, 1);
        drop(con);
        let mut con = pool.get().expect("pooled connection");
        let mut call = release.prepare_invoke();
        for key in lock_keys {
            call.key(key);
        }
        // Freed with nobody told: 0 alone (lua/release.lua).
        let left: i64 = call
            .arg("bench:1")
            .arg(30_000)
            .arg(1)
            .invoke(&mut *con)
            .expect("release script");
        assert_eq!(left, 0);
    };

    let client = bench_client(url, "cheap").build().expect("build client");
    let plain = client.lock("uncontended");
    let nested = client.lock("nested");
    let lock_op = || drop(plain.lock().expect("uncontended lock"));
    let nested_op = || drop(nested.lock().expect("nested lock"));
    let nested_block = |n: usize, out: Option<&mut Vec<f64>>| {
        let outer = nested.lock().expect("outer lock");
        time_ops(n, out, nested_op);
        outer.unlock().expect("outer unlock");
    };

    time_ops(WARMUP_OPS, None, ping_op);
    time_ops(WARMUP_OPS, None, lock_op);
    time_ops(WARMUP_OPS, None, scripts_op);
    nested_block(WARMUP_OPS, None);

    let n = ROUNDS * OPS_PER_ROUND;
    let mut out = Cheap {
        ping: Vec::with_capacity(n),
        lock: Vec::with_capacity(n),
        nested: Vec::with_capacity(n),
        scripts: Vec::with_capacity(n),
    };
    for _ in 0..ROUNDS {
        time_ops(OPS_PER_ROUND, Some(&mut out.ping), ping_op);
        time_ops(OPS_PER_ROUND, Some(&mut out.lock), lock_op);
        time_ops(OPS_PER_ROUND, Some(&mut out.scripts), scripts_op);
        nested_block(OPS_PER_ROUND, Some(&mut out.nested));
    }
    out
}

/// Runs `op` `n` times, appending each run's duration in µs to `out` when given.
fn time_ops(n: usize, mut out: Option<&mut Vec<f64>>, op: impl Fn()) {
    for _ in 0..n {
        let t = Instant::now();
        op();
        let us = t.elapsed().as_secs_f64() * 1e6;
        if let Some(out) = out.as_deref_mut() {
            out.push(us);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5 (printed as such): Redis commands issued by a thread blocked for 2 s.

struct Blocked {
    total: u64,
    by_command: BTreeMap<String, u64>,
}

fn blocked_waiter_commands(url: &str, admin: &mut Admin) -> Blocked {
    let prefix = unique_prefix("bench", "blocked");
    let holder = bench_client(url, &prefix).build().expect("build client");
    let waiter = bench_client(url, &prefix).build().expect("build client");

    // Warm the waiter's client up the way a busy one is: it has waited once already, so
    // its pub/sub connection and a pooled connection exist. Connection setup is a one-time
    // cost that would otherwise be counted as the blocked thread's traffic. The warm-up's
    // holder is a client of its own, dropped after its release: the check it would run a
    // pickup window after handing the lock over is no traffic of the blocked thread.
    let warm_holder = bench_client(url, &prefix).build().expect("build client");
    let warm = warm_holder
        .lock("warm")
        .try_lock_with(redmutex::LockOptions::new().lease(FIXED_LEASE))
        .map(Option::unwrap)
        .expect("hold warm");
    let w = waiter.clone();
    let warm_waiter = thread::spawn(move || drop(w.lock("warm").lock().expect("warm lock")));
    let channel = channel_of(&prefix, "warm");
    assert!(
        support::wait_until(STUCK, || admin.numsub(&channel) >= 1),
        "the warm-up waiter never subscribed"
    );
    drop(warm);
    drop(warm_holder);
    warm_waiter.join().expect("warm-up waiter");

    // A fixed lease, so no watchdog renewals of the holder add to the count.
    let held = holder
        .lock("held")
        .try_lock_with(redmutex::LockOptions::new().lease(FIXED_LEASE))
        .map(Option::unwrap)
        .expect("hold lock");
    // INFO commandstats also counts the commands a script calls, which are not round
    // trips; MONITOR tells them apart ("[0 lua]"), so it counts what the client sends.
    let monitor = support::Monitor::start(url, Vec::new());
    let w = waiter.clone();
    let blocked = thread::spawn(move || drop(w.lock("held").lock().expect("blocked lock")));
    thread::sleep(BLOCKED_FOR);
    let lines = monitor.stop();
    // `<time> [<db> <addr>] "<command>" ...`: the command names clients sent.
    let sent = support::Monitor::top_level(&lines)
        .into_iter()
        .filter_map(|line| line.split('"').nth(1))
        .map(str::to_ascii_lowercase);
    assert!(
        !blocked.is_finished(),
        "the waiter got a lock that was held"
    );
    drop(held);
    blocked.join().expect("blocked waiter");

    let mut by_command = BTreeMap::new();
    for cmd in sent {
        *by_command.entry(cmd).or_insert(0) += 1;
    }
    Blocked {
        total: by_command.values().sum(),
        by_command,
    }
}

// ---------------------------------------------------------------------------------------
// 4: contended handoff to a waiter blocked in another process.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Redmutex,
    Naive,
    /// No lock: a raw subscriber woken by a raw PUBLISH, then one PING. What any lock
    /// woken by pub/sub needs at least on this machine, measured under the same protocol.
    Floor,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Redmutex => "redmutex",
            Mode::Naive => "naive",
            Mode::Floor => "floor",
        }
    }

    fn parse(s: &str) -> Mode {
        match s {
            "redmutex" => Mode::Redmutex,
            "naive" => Mode::Naive,
            "floor" => Mode::Floor,
            other => panic!("{ROLE_ENV}={other:?}: expected redmutex or naive"),
        }
    }

    /// The command the waiter's failed attempts show up as in INFO commandstats, and how
    /// many of them prove it is asleep. redmutex tries once, subscribes, tries again and
    /// only then sleeps; the naive lock sleeps after its first failed SET.
    fn attempts(self) -> (&'static str, u64) {
        match self {
            // Queued with its first try (its client still listens from the last round),
            // or tried, subscribed and queued with the second.
            Mode::Redmutex => (common::script_command(), 1),
            Mode::Naive => ("set", 1),
            Mode::Floor => ("subscribe", 0),
        }
    }
}

const HANDOFF_LOCK: &str = "handoff";

/// The parent's side of one of the two locks.
enum ParentLock {
    Redmutex(redmutex::Lock),
    Naive(redis::Connection, String),
    Floor(redis::Connection, String),
}

enum Held {
    Redmutex(LockGuard),
    Naive,
    Floor,
}

impl ParentLock {
    fn acquire(&mut self) -> Held {
        match self {
            ParentLock::Redmutex(lock) => Held::Redmutex(lock.lock().expect("parent lock")),
            ParentLock::Floor(..) => Held::Floor,
            ParentLock::Naive(con, key) => {
                // The child deleted the key before it reported, so this succeeds at once.
                let deadline = Instant::now() + STUCK;
                while !naive_try(con, key) {
                    assert!(Instant::now() < deadline, "naive lock never became free");
                    thread::sleep(Duration::from_millis(1));
                }
                Held::Naive
            }
        }
    }

    fn release(&mut self, held: Held) {
        match (self, held) {
            (ParentLock::Redmutex(_), Held::Redmutex(guard)) => {
                guard.unlock().expect("parent unlock")
            }
            (ParentLock::Naive(con, key), Held::Naive) => naive_release(con, key),
            (ParentLock::Floor(con, channel), Held::Floor) => redis::cmd("PUBLISH")
                .arg(channel.as_str())
                .arg("0")
                .exec(con)
                .expect("PUBLISH"),
            _ => unreachable!("a hold of the other lock"),
        }
    }
}

/// Strict alternation: the parent holds the lock; the child announces it is about to
/// lock and blocks; once Redis shows the child's failed attempts (and, for redmutex, its
/// subscription) the parent waits a random 2-12 ms, notes t0 and releases; the child
/// notes t1 when its acquisition returns, releases and reports t1. Both clocks are the
/// same machine's, so t1 - t0 is the handoff.
fn handoff(url: &str, mode: Mode, admin: &mut Admin) -> Vec<f64> {
    let prefix = unique_prefix("bench", mode.name());
    let (count_cmd, attempts) = mode.attempts();
    let mut child = ChildProc::spawn(url, &prefix, mode);
    let mut lock = match mode {
        Mode::Redmutex => {
            let client = bench_client(url, &prefix).build().expect("build client");
            ParentLock::Redmutex(client.lock(HANDOFF_LOCK))
        }
        Mode::Naive => ParentLock::Naive(connect(url), naive_key(&prefix)),
        Mode::Floor => ParentLock::Floor(connect(url), channel_of(&prefix, HANDOFF_LOCK)),
    };
    let channel = channel_of(&prefix, HANDOFF_LOCK);
    let mut rng = XorShift::seeded();
    let mut samples = Vec::with_capacity(HANDOFFS);

    for i in 0..HANDOFF_WARMUP + HANDOFFS {
        let held = lock.acquire();
        let base = admin.calls(count_cmd);
        child.send("go");
        let line = child.recv();
        assert_eq!(line, "about to lock", "unexpected line from the child");
        let deadline = Instant::now() + STUCK;
        loop {
            let blocked = admin.calls(count_cmd) >= base + attempts
                && match mode {
                    Mode::Naive => true,
                    Mode::Redmutex => admin.queued(&queue_of(&prefix, HANDOFF_LOCK)) >= 1,
                    Mode::Floor => admin.numsub(&channel) >= 1,
                };
            if blocked {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the {} child never blocked",
                mode.name()
            );
            child.check_alive();
            thread::sleep(Duration::from_micros(200));
        }
        let delay = RELEASE_DELAY_MIN_US + rng.next() % RELEASE_DELAY_SPAN_US;
        thread::sleep(Duration::from_micros(delay));
        let t0 = unix_nanos();
        lock.release(held);
        let t1: i128 = child.recv().parse().expect("t1 in unix nanoseconds");
        if i >= HANDOFF_WARMUP {
            samples.push((t1 - t0) as f64 / 1e3);
        }
    }
    child.finish();
    samples
}

struct ChildProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ChildProc {
    fn spawn(url: &str, prefix: &str, mode: Mode) -> ChildProc {
        let exe = std::env::current_exe().expect("path of the bench binary");
        let mut child = Command::new(exe)
            .env(ROLE_ENV, mode.name())
            .env(URL_ENV, url)
            .env(PREFIX_ENV, prefix)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("re-execute the bench as the handoff child");
        let stdin = child.stdin.take().expect("child stdin");
        let stdout = BufReader::new(child.stdout.take().expect("child stdout"));
        ChildProc {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .expect("write to the child");
    }

    fn recv(&mut self) -> String {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("read from the child");
        assert!(n > 0, "the handoff child exited early");
        line.trim_end().to_owned()
    }

    fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("poll the child") {
            panic!("the handoff child exited early with {status}");
        }
    }

    fn finish(mut self) {
        self.send("quit");
        let status = self.child.wait().expect("wait for the child");
        assert!(status.success(), "the handoff child failed: {status}");
    }
}

/// The child's side: for each "go" line, announce, acquire, note t1, release, report t1.
fn child_main(role: &str) {
    let mode = Mode::parse(role);
    let url = std::env::var(URL_ENV).expect("REDMUTEX_BENCH_URL in the child");
    let prefix = std::env::var(PREFIX_ENV).expect("REDMUTEX_BENCH_PREFIX in the child");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut say = |line: &str| {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .expect("write to the parent");
    };
    match mode {
        Mode::Redmutex => {
            let client = bench_client(&url, &prefix).build().expect("build client");
            let lock = client.lock(HANDOFF_LOCK);
            for line in stdin.lock().lines() {
                if line.expect("read from the parent") != "go" {
                    break;
                }
                say("about to lock");
                let guard = lock.lock().expect("child lock");
                let t1 = unix_nanos();
                guard.unlock().expect("child unlock");
                say(&t1.to_string());
            }
        }
        Mode::Floor => {
            let mut sub = connect(&url);
            let mut con = connect(&url);
            let mut pubsub = sub.as_pubsub();
            pubsub
                .subscribe(channel_of(&prefix, HANDOFF_LOCK))
                .expect("SUBSCRIBE");
            for line in stdin.lock().lines() {
                if line.expect("read from the parent") != "go" {
                    break;
                }
                say("about to lock");
                pubsub.get_message().expect("floor message");
                redis::cmd("PING").exec(&mut con).expect("PING");
                let t1 = unix_nanos();
                say(&t1.to_string());
            }
        }
        Mode::Naive => {
            let mut con = connect(&url);
            let key = naive_key(&prefix);
            for line in stdin.lock().lines() {
                if line.expect("read from the parent") != "go" {
                    break;
                }
                say("about to lock");
                while !naive_try(&mut con, &key) {
                    thread::sleep(NAIVE_POLL);
                }
                let t1 = unix_nanos();
                naive_release(&mut con, &key);
                say(&t1.to_string());
            }
        }
    }
}

fn naive_key(prefix: &str) -> String {
    format!("{prefix}naive")
}

/// The naive lock: SET NX with a lease; the caller polls on failure.
fn naive_try(con: &mut redis::Connection, key: &str) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(std::process::id())
        .arg("NX")
        .arg("PX")
        .arg(NAIVE_LEASE_MS)
        .query(con)
        .expect("SET NX");
    set.is_some()
}

fn naive_release(con: &mut redis::Connection, key: &str) {
    redis::cmd("DEL")
        .arg(key)
        .query::<()>(con)
        .expect("DEL naive lock");
}

// ---------------------------------------------------------------------------------------
// 7: what an uncontended lock + unlock pair costs the Redis server (issue 18).

/// Pairs per kind, in chunks that alternate between the kinds.
const PAIR_CHUNKS: usize = 5;
const PAIRS_PER_CHUNK: usize = 1_000;

struct PairCost {
    redmutex: common::ServerCost,
    naive: common::ServerCost,
    hash: common::ServerCost,
    pairs: u64,
}

impl PairCost {
    fn render(&self) -> String {
        let n = self.pairs;
        let mut out = format!(
            "\nserver cost of an uncontended pair ({n} per kind, in {PAIR_CHUNKS} alternating \
             chunks; INFO snapshots):\n"
        );
        let mut grid = common::Grid::new(&[
            "",
            "Lock lock()+unlock()",
            "naive SET NX PX + CAD",
            "floor: minimal hash lock",
        ]);
        common::server_cost_rows(
            &mut grid,
            &[(&self.redmutex, n), (&self.naive, n), (&self.hash, n)],
            Some((&self.naive, n)),
        );
        out.push_str(&grid.render());
        let _ = writeln!(
            out,
            "  Lock  executed per pair: {}",
            self.redmutex.breakdown(n)
        );
        let _ = writeln!(
            out,
            "  naive executed per pair: {}",
            self.naive.breakdown(n)
        );
        let _ = writeln!(
            out,
            "  floor executed per pair: {} (a reentrant hash lock's least: two EVALSHAs of \
             EXISTS+HINCRBY+PEXPIRE and HEXISTS+HINCRBY+DEL+PUBLISH; Lock / floor = {:.2}x)",
            self.hash.breakdown(n),
            self.redmutex.cpu_per(n) / self.hash.cpu_per(n)
        );
        let mut t = common::Targets::default();
        let (cpu, floor) = (self.redmutex.cpu_per(n), self.naive.cpu_per(n));
        t.check(
            "uncontended pair Redis CPU µs",
            common::f1(cpu),
            &format!("<= {:.1}", 1.1 * floor),
            cpu <= 1.1 * floor,
            &format!(
                "1.1 x naive's {floor:.1} (issue 18); design floor (minimal hash lock) {:.1}",
                self.hash.cpu_per(n)
            ),
        );
        out.push_str(&t.render());
        out
    }
}

fn pair_server_cost(url: &str, admin: &mut Admin) -> PairCost {
    let prefix = unique_prefix("lock", "pair-cost");
    let client = bench_client(url, &prefix).build().expect("build client");
    let lock = client.lock("pair");
    let mut con = connect(url);
    let key = format!("{prefix}naive-pair");
    let naive = common::NaiveLock::new();
    let mut token = 0u64;
    let mut naive_pair = |con: &mut redis::Connection| {
        token += 1;
        assert!(
            naive.try_lock(con, &key, token, NAIVE_LEASE_MS),
            "the uncontended naive lock was taken"
        );
        naive.unlock(con, &key, token);
    };
    let redmutex_pair = || lock.lock().expect("lock").unlock().expect("unlock");
    let hash = common::HashLock::new();
    let (hash_key, hash_channel) = (
        format!("{prefix}{{hash-pair}}"),
        format!("{prefix}{{hash-pair}}:c"),
    );
    // Warm up: scripts loaded, connections open, outside the measured chunks.
    for _ in 0..WARMUP_OPS {
        redmutex_pair();
        naive_pair(&mut con);
        hash.pair(&mut con, &hash_key, &hash_channel);
    }
    let mut out = PairCost {
        redmutex: common::ServerCost::default(),
        naive: common::ServerCost::default(),
        hash: common::ServerCost::default(),
        pairs: (PAIR_CHUNKS * PAIRS_PER_CHUNK) as u64,
    };
    for _ in 0..PAIR_CHUNKS {
        let (cost, ()) = common::ServerCost::measure(&mut admin.con, || {
            (0..PAIRS_PER_CHUNK).for_each(|_| redmutex_pair())
        });
        out.redmutex.add(&cost);
        let (cost, ()) = common::ServerCost::measure(&mut admin.con, || {
            (0..PAIRS_PER_CHUNK).for_each(|_| naive_pair(&mut con))
        });
        out.naive.add(&cost);
        let (cost, ()) = common::ServerCost::measure(&mut admin.con, || {
            (0..PAIRS_PER_CHUNK).for_each(|_| hash.pair(&mut con, &hash_key, &hash_channel))
        });
        out.hash.add(&cost);
    }
    out
}

// ---------------------------------------------------------------------------------------
// 6: one client holding 1,000 watchdog locks.

struct Many {
    watchdog_threads: usize,
    pubsub_connections: usize,
    renew_calls: u64,
    rss_before_kib: u64,
    rss_after_kib: u64,
    acquire_time: Duration,
    lost: usize,
}

impl Many {
    fn rss_growth_kib(&self) -> i64 {
        self.rss_after_kib as i64 - self.rss_before_kib as i64
    }
}

fn many_locks(url: &str, admin: &mut Admin) -> Many {
    // Earlier clients are dropped; their threads and connections wind down within about a
    // second (the pub/sub reader notices on its next read tick). Counting before then
    // would charge them to this client.
    support::wait_until(STUCK, || watchdog_threads() == 0);
    support::wait_until(Duration::from_secs(3), || admin.pubsub_connections() == 0);
    let pubsub_before = admin.pubsub_connections();

    let client = bench_client(url, &unique_prefix("bench", "many"))
        .watchdog_timeout(MANY_WATCHDOG_TIMEOUT)
        .command_timeout(MANY_WATCHDOG_TIMEOUT / 3)
        .build()
        .expect("build client");
    let rss_before_kib = rss_kib().unwrap_or(0);
    let locks: Vec<redmutex::Lock> = (0..MANY_LOCKS)
        .map(|i| client.lock(format!("many:{i}")))
        .collect();
    let t = Instant::now();
    let guards: Vec<LockGuard> = locks
        .iter()
        .map(|l| l.lock().expect("lock one of many"))
        .collect();
    let acquire_time = t.elapsed();
    let rss_after_kib = rss_kib().unwrap_or(0);
    let watchdog_threads = watchdog_threads();
    let pubsub_connections = admin.pubsub_connections().saturating_sub(pubsub_before);

    let before = admin.calls(common::script_command());
    thread::sleep(MANY_WATCHDOG_TIMEOUT / 3 * MANY_PERIODS);
    let renew_calls = admin.calls(common::script_command()) - before;

    let lost = guards.iter().filter(|g| g.is_lease_lost()).count();
    drop(guards);
    Many {
        watchdog_threads,
        pubsub_connections,
        renew_calls,
        rss_before_kib,
        rss_after_kib,
        acquire_time,
        lost,
    }
}

fn watchdog_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == WATCHDOG_COMM)
        .count()
}

// ---------------------------------------------------------------------------------------
// Shared helpers.

/// What this bench asks of the server besides the common questions.
impl Admin {
    /// Waiters in a lock's queue.
    fn queued(&mut self, queue: &str) -> u64 {
        redis::cmd("LLEN")
            .arg(queue)
            .query(&mut self.con)
            .expect("LLEN")
    }

    /// Subscriptions to channels starting with `channel` (a lock has one per client).
    fn numsub(&mut self, channel: &str) -> u64 {
        support::subscribers(&mut self.con, channel) as u64
    }

    fn pubsub_connections(&mut self) -> usize {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut self.con)
            .expect("CLIENT LIST TYPE pubsub");
        list.lines().filter(|l| !l.trim().is_empty()).count()
    }
}

fn bench_client(url: &str, prefix: &str) -> redmutex::ClientBuilder {
    Client::builder()
        .url(url)
        .key_prefix(prefix)
        .use_functions(common::use_functions())
}

/// The wait queue of lock `name` (a name without braces).
fn queue_of(prefix: &str, name: &str) -> String {
    format!("{prefix}!queue:{{{name}}}")
}

/// The common prefix of lock `name`'s channels (a name without braces):
/// `<prefix>{name}:to:`, followed by the id of each client waiting on it.
fn channel_of(prefix: &str, name: &str) -> String {
    format!("{prefix}{{{name}}}:to:")
}

fn unix_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as i128
}

struct XorShift(u64);

impl XorShift {
    fn seeded() -> XorShift {
        XorShift(unix_nanos() as u64 | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

struct Table {
    title: String,
    rows: Vec<[String; 5]>,
}

impl Table {
    fn new(title: String) -> Table {
        Table {
            title,
            rows: Vec::new(),
        }
    }

    fn row(&mut self, name: &str, value: String, ratio: String, target: &str, ok: Option<bool>) {
        let ok = match ok {
            Some(true) => "PASS",
            Some(false) => "FAIL  <<<",
            None => "",
        };
        self.rows.push([
            name.to_owned(),
            value,
            ratio,
            target.to_owned(),
            ok.to_owned(),
        ]);
    }

    fn render(&self) -> String {
        let width = self
            .rows
            .iter()
            .map(|r| r[0].chars().count())
            .chain([self.title.chars().count()])
            .max()
            .unwrap_or(0)
            + 2;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$}{:>12}{:>10}{:>10}   ok",
            self.title, "median", "ratio", "target"
        );
        for [name, value, ratio, target, ok] in &self.rows {
            let line = format!("{name:<width$}{value:>12}{ratio:>10}{target:>10}   {ok}");
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let failed = self
            .rows
            .iter()
            .filter(|r| r[4].starts_with("FAIL"))
            .count();
        let passed = self.rows.iter().filter(|r| r[4] == "PASS").count();
        let _ = write!(out, "targets: {passed} PASS, {failed} FAIL");
        out
    }
}
