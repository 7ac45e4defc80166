//! `cargo bench --bench scale`: how far one client and one lock scale (issue 18, item 4),
//! against a real redis-server (spawned here, or the one at `REDIS_URL`).
//!
//! 1. Many holds: one client (in a process of its own, so its memory and its watchdog
//!    thread are the measured ones) takes `REDMUTEX_SCALE_LOCKS` (default 100,000) locks
//!    with watchdog leases (`watchdog_timeout` 3 s: a renewal round every second), keeps
//!    the guards, and idles for 6 renewal rounds. Reported: time to acquire them, renewal
//!    round trips per round (requests the server read while only the watchdog ran, from
//!    the start of a round to the end of the 6th: rounds are told apart by polling the
//!    server's script calls every 20 ms, a round being calls with no gap of a sixth of the period), Redis CPU
//!    per round, the watchdog thread's CPU per round (`/proc/self/task/<tid>/schedstat`
//!    of the thread named "redmutex-watchdog"), client RSS per held lock (VmRSS growth
//!    over the acquisitions / N: Lock handles dropped, guards kept, the client's tables
//!    included), Redis `used_memory` per held lock, and leases lost (guards that say so,
//!    and keys missing on the server after the idle rounds, which outlast the lease twice).
//! 2. Long queues: one lock with `REDMUTEX_SCALE_WAITERS` (default 1,000) waiters queued
//!    (4 processes × 250 threads, one client per process, each thread waits once, holds
//!    1 ms, releases), against the same with 4 waiters (4 processes × 1 thread) repeated
//!    in 100 rounds, for `FairLock` and `Lock`, in the same run. The parent holds the lock
//!    until the queue (LLEN) shows every waiter, then releases. Reported: handoff time
//!    (a release began -> the next holder runs, CLOCK_MONOTONIC across processes), Redis
//!    CPU, executed commands and requests per handoff, and the queue's own cost per waiter
//!    joining (from "go" to all queued: the failed attempt, the queue entry, the
//!    subscription).
//!
//! The server's own figures come from `INFO all` snapshots (`ServerSnapshot` in
//! `benches/common`); requests the bench's own polls add are subtracted. Prints a table
//! with PASS/FAIL per target and exits 0 either way: it measures, it does not gate.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, LockGuard};

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::*;

use support::child::{say, ChildProc};

const THREADS_ENV: &str = "REDMUTEX_SCALE_THREADS";
/// Locks held at once by the one client; 100,000 unless set.
const LOCKS_ENV: &str = "REDMUTEX_SCALE_LOCKS";
const DEFAULT_LOCKS: usize = 100_000;
/// Waiters queued on the one lock; 1,000 unless set (a multiple of the processes).
const WAITERS_ENV: &str = "REDMUTEX_SCALE_WAITERS";
const DEFAULT_WAITERS: usize = 1_000;

/// The held locks' watchdog timeout, s; 10 unless set. Short, so that renewal rounds
/// (a third of it) come often; not shorter by default, since renewing 100,000 leases
/// takes this 2-core machine about a second of Redis CPU and half a second of the
/// watchdog thread's (3 s, a round a second, loses leases here).
const WATCHDOG_ENV: &str = "REDMUTEX_SCALE_WATCHDOG_SECS";
const DEFAULT_WATCHDOG_SECS: usize = 10;
/// Two threads of the holding client take turns on one `FairLock` for this long, each
/// release handing it to the other: before the many locks are taken and while they are
/// held, so that a cost per handoff that grows with the locks held shows (the watchdog
/// thread's CPU per acquisition: the median over 100 ms slices).
const HOT: Duration = Duration::from_millis(1_500);
/// Renewal rounds measured while idle: twice the lease, so a missed renewal loses leases.
const IDLE_ROUNDS: usize = 6;
/// How often the server's script calls are polled to tell renewal rounds apart.
const POLL: Duration = Duration::from_millis(20);
/// The watchdog batches up to this many leases per call (src/runtime/renewer.rs).
const RENEW_BATCH: usize = 500;
/// Linux truncates thread names to 15 bytes.
const WATCHDOG_COMM: &str = "redmutex-watchd";
const PUBSUB_COMM: &str = "redmutex-pubsub";
/// Channels the holding client is left subscribed to for the hot lock's second run.
const CHANNELS: usize = 1_000;

const PROCESSES: usize = 4;
/// Rounds of the short queue, so its handoffs are many.
const SHORT_ROUNDS: usize = 100;
const HOLD: Duration = Duration::from_millis(1);
const LOCK_NAME: &str = "queued";
const STUCK: Duration = Duration::from_secs(60);

fn main() {
    dispatch(ROLE_ENV, child_main, parent_main);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lock,
    Fair,
}

const KINDS: [Kind; 2] = [Kind::Fair, Kind::Lock];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "Lock",
            Kind::Fair => "FairLock",
        }
    }

    fn parse(s: &str) -> Kind {
        kind_named(&KINDS, Kind::name, s)
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|&n: &usize| n > 0)
            .unwrap_or_else(|| panic!("{name}={v:?}: expected a positive whole number")),
        Err(_) => default,
    }
}

// ---------------------------------------------------------------------------------------
// Parent.

fn parent_main() {
    let locks = env_usize(LOCKS_ENV, DEFAULT_LOCKS);
    let waiters = env_usize(WAITERS_ENV, DEFAULT_WAITERS);
    assert!(
        waiters.is_multiple_of(PROCESSES),
        "{WAITERS_ENV} must be a multiple of {PROCESSES}"
    );
    let (url, server) = support::redis_url_or_spawn();
    let mut admin = admin_connection(&url, STUCK);
    let version = support::redis_version(&mut admin);
    let started = Instant::now();

    let on = run_on(
        "scale",
        &["REDIS_URL", LOCKS_ENV, WAITERS_ENV],
        &url,
        server.as_ref(),
        &version,
    );
    println!("{on}");

    eprintln!("[1/2] {locks} watchdog locks held by one client ...");
    let many = many_holds(&url, locks);
    let mut queues = Vec::new();
    for kind in KINDS {
        for (per_process, rounds) in [(waiters / PROCESSES, 1), (1, SHORT_ROUNDS)] {
            eprintln!(
                "[2/2] {} waiters x {rounds} round(s) on one {} ...",
                per_process * PROCESSES,
                kind.name()
            );
            queues.push(queue_run(&url, kind, per_process, rounds, &mut admin));
        }
    }
    report(&many, &queues, started.elapsed());
}

// ---------------------------------------------------------------------------------------
// 1: many holds in one client.

/// What the holding child reports, by name.
struct Many {
    locks: usize,
    figures: BTreeMap<String, f64>,
    executed: String,
}

impl Many {
    fn get(&self, name: &str) -> f64 {
        *self
            .figures
            .get(name)
            .unwrap_or_else(|| panic!("the holding child did not report {name}"))
    }
}

fn many_holds(url: &str, locks: usize) -> Many {
    // As long as the default prefix ("redmutex:", 9 bytes), and as unique as the bench
    // needs on a shared server: each key name holds it, so its length weighs on the
    // memory per lock on both sides.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let prefix = format!("rm{:06x}:", nanos & 0xff_ffff);
    let child = ChildProc::spawn(
        "hold",
        &[
            (ROLE_ENV, "hold"),
            (URL_ENV, url),
            (PREFIX_ENV, &prefix),
            (LOCKS_ENV, &locks.to_string()),
        ],
    );
    let mut figures = BTreeMap::new();
    let mut executed = String::new();
    loop {
        let line = child
            .try_line(STUCK * 3)
            .expect("the holding child hung or failed");
        if line == "done" {
            break;
        }
        if let Some(rest) = line.strip_prefix("executed ") {
            executed = rest.to_owned();
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("unexpected child line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number in {line:?}"));
        figures.insert(name.to_owned(), value);
    }
    child.wait_success();
    Many {
        locks,
        figures,
        executed,
    }
}

fn child_hold(url: &str, prefix: &str) {
    let n = env_usize(LOCKS_ENV, DEFAULT_LOCKS);
    let mut admin = connect(url);
    let poller = connect(url);
    let client = Client::builder()
        .url(url)
        .key_prefix(prefix)
        .watchdog_timeout(watchdog_timeout())
        .command_timeout(watchdog_timeout() / 3)
        .build()
        .expect("build client");
    // Warm up: the scripts loaded, a pooled connection open, the watchdog thread started.
    client
        .lock("warm-up")
        .lock()
        .expect("warm-up lock")
        .unlock()
        .expect("warm-up unlock");
    hot(&client);
    let (hot_n, hot_cpu) = hot(&client);
    let say_hot = |what: &str, (n, cpu): (u64, u64)| {
        say(&format!(
            "hot_{what}_per_s={}",
            n as f64 / HOT.as_secs_f64()
        ));
        say(&format!(
            "hot_{what}_cpu_us={}",
            cpu as f64 / 1e3 / n.max(1) as f64
        ));
    };
    say_hot("empty", (hot_n, hot_cpu));
    let pubsub_before = thread_cpu_ns(PUBSUB_COMM);
    let (turns, _) = hot(&client);
    say(&format!(
        "hot_pubsub_empty_us={}",
        (thread_cpu_ns(PUBSUB_COMM) - pubsub_before) as f64 / 1e3 / turns.max(1) as f64
    ));
    // The same while the client's pub/sub connection is subscribed to many channels
    // (locks waited on a moment ago: each lingers a few seconds).
    let channels = linger_channels(url, prefix, &client);
    let pubsub_before = thread_cpu_ns(PUBSUB_COMM);
    let (turns, _) = hot(&client);
    say(&format!(
        "hot_pubsub_channels_us={}",
        (thread_cpu_ns(PUBSUB_COMM) - pubsub_before) as f64 / 1e3 / turns.max(1) as f64
    ));
    say(&format!(
        "hot_channels_per_s={}",
        turns as f64 / HOT.as_secs_f64()
    ));
    let lingering = support::subscribers(&mut admin, format!("{prefix}{{c"));
    say(&format!("lingering_channels={channels}"));
    say(&format!("lingering_at_end={lingering}"));
    let names: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
    let rss_before = rss_kib().expect("VmRSS in /proc/self/status");
    let mem_before = used_memory(&mut admin);

    let t = Instant::now();
    let guards: Vec<LockGuard> = names
        .iter()
        .map(|name| client.lock(name.as_str()).lock().expect("lock one of many"))
        .collect();
    let acquire_s = t.elapsed().as_secs_f64();
    let rss_after = rss_kib().expect("VmRSS in /proc/self/status");
    let mem_after = used_memory(&mut admin);

    // Idle rounds: from the end of one renewal round to the end of the IDLE_ROUNDS-th
    // after it.
    let mut poller = Poller {
        con: poller,
        polls: 0,
        last: 0,
        lengths: Vec::new(),
    };
    // The handoffs while all are held, between two rounds (a round takes about a
    // second of the period's 3.3 s here).
    poller.end_of_round();
    let calls_before = poller.script_calls();
    let full = hot(&client);
    // A renewal round that overlapped the hot run would show as many more script calls
    // than the hot lock's own three or so per acquisition.
    say(&format!(
        "hot_full_calls_per_acq={}",
        (poller.script_calls() - calls_before) as f64 / full.0.max(1) as f64
    ));
    say_hot("full", full);
    poller.last = poller.script_calls();
    poller.end_of_round();
    let rss_idle = rss_kib().expect("VmRSS in /proc/self/status");
    let before = ServerSnapshot::take(&mut admin);
    let polls_before = poller.polls;
    let cpu_before = watchdog_cpu_ns();
    let idle_start = Instant::now();
    for _ in 0..IDLE_ROUNDS {
        poller.end_of_round();
    }
    let cpu_after = watchdog_cpu_ns();
    let idle_s = idle_start.elapsed().as_secs_f64();
    let cost = ServerSnapshot::take(&mut admin).since(&before);
    let polls = poller.polls - polls_before;
    let round_ms = median(&poller.lengths[1..]);

    let lost_guards = guards.iter().filter(|g| g.is_lease_lost()).count();
    let keys: Vec<Vec<u8>> = names
        .iter()
        .map(|name| format!("{prefix}{{{name}}}").into_bytes())
        .collect();
    let mut present = 0u64;
    for chunk in keys.chunks(1_000) {
        let n: u64 = redis::cmd("EXISTS")
            .arg(chunk)
            .query(&mut admin)
            .expect("EXISTS");
        present += n;
    }

    let t = Instant::now();
    let mut lost_at_unlock = 0u64;
    for g in guards {
        match g.unlock() {
            Ok(()) => {}
            Err(redmutex::Error::LeaseLost { .. }) => lost_at_unlock += 1,
            Err(e) => panic!("unlock one of many: {e}"),
        }
    }
    let release_s = t.elapsed().as_secs_f64();

    let rounds = IDLE_ROUNDS as f64;
    // The poller's INFO calls land on the same server: each is one request and one
    // executed INFO, not the watchdog's.
    let requests = cost.reads.saturating_sub(polls);
    let mut executed = cost.executed.clone();
    executed.remove("info");
    let executed_total: u64 = executed.values().sum();
    let script_calls_total: u64 = ["evalsha", "eval", "fcall", "script|load"]
        .iter()
        .map(|c| executed.get(*c).copied().unwrap_or(0))
        .sum();
    let figure = |name: &str, v: f64| say(&format!("{name}={v}"));
    figure("acquire_s", acquire_s);
    figure("release_s", release_s);
    figure("rss_before_kib", rss_before as f64);
    figure("rss_after_kib", rss_after as f64);
    figure("rss_idle_kib", rss_idle as f64);
    figure("mem_before", mem_before as f64);
    figure("mem_after", mem_after as f64);
    figure("idle_s", idle_s);
    figure("round_ms", round_ms);
    figure("rounds", rounds);
    figure("requests_per_round", requests as f64 / rounds);
    figure("script_calls_per_round", script_calls_total as f64 / rounds);
    figure("executed_per_round", executed_total as f64 / rounds);
    figure("redis_cpu_ms_per_round", cost.cpu_us / 1e3 / rounds);
    figure(
        "watchdog_cpu_ms_per_round",
        (cpu_after.saturating_sub(cpu_before)) as f64 / 1e6 / rounds,
    );
    figure("lost_guards", lost_guards as f64);
    figure("lost_at_unlock", lost_at_unlock as f64);
    figure("missing_keys", (n as u64 - present) as f64);
    let per_round = ServerCost {
        executed,
        ..Default::default()
    };
    say(&format!(
        "executed {}",
        per_round.breakdown(IDLE_ROUNDS as u64)
    ));
    say("done");
}

/// Polls the server's script calls to tell the watchdog's renewal rounds apart.
struct Poller {
    con: redis::Connection,
    /// INFO requests sent so far: the bench's own, not the watchdog's.
    polls: u64,
    last: u64,
    /// Each round's first call seen -> its last call seen, ms.
    lengths: Vec<f64>,
}

impl Poller {
    fn script_calls(&mut self) -> u64 {
        self.polls += 1;
        let stats = support::commandstats(&mut self.con);
        ["evalsha", "eval", "fcall"]
            .iter()
            .map(|c| stats.get(*c).copied().unwrap_or(0))
            .sum()
    }

    /// Waits for the end of the next round that begins: calls seen, then a quiet gap.
    fn end_of_round(&mut self) {
        let give_up = Instant::now() + STUCK;
        let mut seen = None;
        let mut quiet_since = Instant::now();
        loop {
            assert!(Instant::now() < give_up, "no renewal round came");
            thread::sleep(POLL);
            let calls = self.script_calls();
            if calls != self.last {
                self.last = calls;
                seen = seen.or(Some(Instant::now()));
                quiet_since = Instant::now();
            } else if let Some(first) = seen.filter(|_| quiet_since.elapsed() >= round_gap()) {
                self.lengths.push((quiet_since - first).as_secs_f64() * 1e3);
                return;
            }
        }
    }
}

/// No script call for this long: a renewal round is over. A sixth of the period: a round
/// of 100,000 leases on a busy machine can pause for a few hundred ms.
fn round_gap() -> Duration {
    watchdog_timeout() / 18
}

fn watchdog_timeout() -> Duration {
    Duration::from_secs(env_usize(WATCHDOG_ENV, DEFAULT_WATCHDOG_SECS) as u64)
}

/// Two threads take turns on one `FairLock` for [`HOT`]: how many acquisitions, and the
/// watchdog thread's CPU meanwhile (ns), estimated from its median per acquisition over
/// 100 ms slices, so that a renewal round overlapping part of the run (a few slices) does
/// not count as the handoffs' cost.
fn hot(client: &Client) -> (u64, u64) {
    let end = Instant::now() + HOT;
    let count = std::sync::atomic::AtomicU64::new(0);
    let mut per_acq = Vec::new();
    thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let lock = client.fair_lock("hot");
                while Instant::now() < end {
                    lock.lock().expect("hot lock").unlock().expect("hot unlock");
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        let mut last = (watchdog_cpu_ns(), 0);
        while Instant::now() < end {
            thread::sleep(Duration::from_millis(100));
            let now = (
                watchdog_cpu_ns(),
                count.load(std::sync::atomic::Ordering::Relaxed),
            );
            if now.1 > last.1 {
                per_acq.push((now.0 - last.0) as f64 / (now.1 - last.1) as f64);
            }
            last = now;
        }
    });
    let n = count.into_inner();
    (n, (median(&per_acq) * n as f64) as u64)
}

fn used_memory(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(con)
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .map(|v| parse_u64(v.trim()))
        .expect("used_memory in INFO memory")
}

/// On-CPU time of this process's watchdog thread, ns (schedstat's first field: the
/// scheduler's own account, finer than stat's clock ticks).
/// Has the client wait a moment on each of [`CHANNELS`] locks another client holds, so
/// that its pub/sub connection stays subscribed to their channels for a few seconds.
fn linger_channels(url: &str, prefix: &str, client: &Client) -> usize {
    let other = bench_client(url, prefix);
    for i in 0..CHANNELS {
        let name = format!("c{i}");
        let held = other
            .lock(name.as_str())
            .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(30)))
            .map(Option::unwrap)
            .expect("hold a lock for another client");
        let got = client
            .lock(name.as_str())
            .try_lock_for(Duration::from_millis(1))
            .expect("wait a moment");
        assert!(got.is_none(), "the lock was held by the other client");
        held.unlock().expect("unlock");
    }
    CHANNELS
}

fn watchdog_cpu_ns() -> u64 {
    thread_cpu_ns(WATCHDOG_COMM)
}

fn thread_cpu_ns(comm: &str) -> u64 {
    // A thread just started names itself a moment later.
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(ns) = try_thread_cpu_ns(comm) {
            return ns;
        }
        assert!(Instant::now() < give_up, "not exactly one {comm} thread");
        thread::sleep(Duration::from_millis(10));
    }
}

/// The CPU time of the one thread named `comm_of`; `None` while there is none, or more
/// than one (a client dropped a moment ago: its threads end within a second).
fn try_thread_cpu_ns(comm_of: &str) -> Option<u64> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    let mut found = None;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == comm_of {
            if found.is_some() {
                return None;
            }
            let stat = std::fs::read_to_string(task.path().join("schedstat"))
                .expect("/proc/self/task/<tid>/schedstat");
            found = stat.split_whitespace().next().map(parse_u64);
        }
    }
    found
}

// ---------------------------------------------------------------------------------------
// 2: one lock, a long queue against a short one.

struct Queue {
    kind: Kind,
    /// Waiters per round.
    waiters: usize,
    rounds: usize,
    /// Every handoff, µs: a release began -> the next holder runs.
    handoffs: Vec<f64>,
    /// Those between two different processes (the parent counts as one).
    cross: Vec<f64>,
    overlaps: usize,
    /// Go -> the queue shows every waiter, ms, per round.
    joined_ms: Vec<f64>,
    /// What the waiters' joining cost Redis, summed over the rounds.
    join: ServerCost,
    /// What the handoffs cost Redis: the parent's release to the last waiter's release.
    drain: ServerCost,
    /// Rounds where the queue never showed every waiter (released anyway).
    never_queued: usize,
}

impl Queue {
    fn label(&self) -> String {
        format!("{} {}", self.kind.name(), self.waiters)
    }

    fn total(&self) -> u64 {
        (self.waiters * self.rounds) as u64
    }
}

fn queue_run(
    url: &str,
    kind: Kind,
    per_process: usize,
    rounds: usize,
    admin: &mut redis::Connection,
) -> Queue {
    let prefix = unique_prefix("scale", &format!("queue-{}-{per_process}", kind.name()));
    let waiters = per_process * PROCESSES;
    let per = per_process.to_string();
    let mut children: Vec<ChildProc> = (0..PROCESSES)
        .map(|_| {
            ChildProc::spawn(
                "wait",
                &[
                    (ROLE_ENV, "wait"),
                    (KIND_ENV, kind.name()),
                    (URL_ENV, url),
                    (PREFIX_ENV, &prefix),
                    (THREADS_ENV, &per),
                ],
            )
        })
        .collect();
    // One process warms up at a time: no waiter queues, no lock is handed on.
    for c in &mut children {
        c.send("warm");
        c.expect("ready");
    }
    let client = bench_client(url, &prefix);
    let lock = client.lock(LOCK_NAME);
    let fair = client.fair_lock(LOCK_NAME);
    let queue_key = format!("{prefix}!queue:{{{LOCK_NAME}}}");

    let mut out = Queue {
        kind,
        waiters,
        rounds,
        handoffs: Vec::new(),
        cross: Vec::new(),
        overlaps: 0,
        joined_ms: Vec::new(),
        join: ServerCost::default(),
        drain: ServerCost::default(),
        never_queued: 0,
    };
    for _ in 0..rounds {
        let held = match kind {
            Kind::Lock => Ok(lock.lock().expect("parent lock")),
            Kind::Fair => Err(fair.lock().expect("parent fair lock")),
        };
        let before = ServerSnapshot::take(admin);
        let go = Instant::now();
        for c in &mut children {
            c.send("go");
        }
        let mut polls = 0u64;
        let queued = support::wait_until(Duration::from_secs(20), || {
            polls += 1;
            let len: u64 = redis::cmd("LLEN")
                .arg(&queue_key)
                .query(admin)
                .expect("LLEN");
            len >= waiters as u64
        });
        let joined = ServerSnapshot::take(admin);
        out.joined_ms.push(go.elapsed().as_secs_f64() * 1e3);
        if !queued {
            out.never_queued += 1;
        }
        let mut join = joined.since(&before);
        // The polls are the bench's own requests.
        join.reads = join.reads.saturating_sub(polls);
        if let Some(n) = join.executed.get_mut("llen") {
            *n = n.saturating_sub(polls);
        }
        join.executed.retain(|_, n| *n > 0);
        out.join.add(&join);

        let released = mono_ns();
        match held {
            Ok(g) => g.unlock().expect("parent unlock"),
            Err(g) => g.unlock().expect("parent unlock"),
        }
        // (acquired, release began, process); the parent is process PROCESSES.
        let mut events: Vec<(u64, u64, usize)> = Vec::new();
        for (p, c) in children.iter().enumerate() {
            loop {
                let line = c
                    .try_line(STUCK)
                    .unwrap_or_else(|| panic!("a {} waiter process hung", kind.name()));
                if line == "done" {
                    break;
                }
                let v: Vec<u64> = line
                    .strip_prefix("acq ")
                    .unwrap_or_else(|| panic!("unexpected worker line {line:?}"))
                    .split_whitespace()
                    .map(parse_u64)
                    .collect();
                events.push((v[0], v[1], p));
            }
        }
        out.drain.add(&ServerSnapshot::take(admin).since(&joined));
        events.sort_unstable();
        let mut prev = (released, PROCESSES);
        for &(acq, rel, p) in &events {
            if acq < prev.0 {
                out.overlaps += 1;
            } else {
                let us = us_between(prev.0, acq);
                out.handoffs.push(us);
                if p != prev.1 {
                    out.cross.push(us);
                }
            }
            prev = (rel, p);
        }
    }
    for c in &mut children {
        c.send("quit");
    }
    for c in children {
        c.wait_success();
    }
    out
}

/// One thread's lock handle, of either kind.
enum Handle {
    Lock(redmutex::Lock),
    Fair(redmutex::FairLock),
}

/// Takes `lock`, holds it for `HOLD` and releases it: when it was acquired and when the
/// release began (CLOCK_MONOTONIC ns). `what` names the call if it fails.
fn hold_once<K: redmutex::Kind>(lock: &redmutex::Lock<K>, what: &str) -> (u64, u64) {
    let g = lock.lock().expect(what);
    let acquired = mono_ns();
    thread::sleep(HOLD);
    let releasing = mono_ns();
    g.unlock().expect("unlock");
    (acquired, releasing)
}

fn child_wait(kind: Kind, url: &str, prefix: &str) {
    let threads = env_usize(THREADS_ENV, 1);
    let client = bench_client(url, prefix);
    assert_eq!(read_line(), "warm", "unexpected parent line");
    let one_at_a_time = Arc::new(Mutex::new(()));
    let ready = Arc::new(Barrier::new(threads + 1));
    let go = Arc::new(Barrier::new(threads + 1));
    let done = Arc::new(Barrier::new(threads + 1));
    let quit = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let results = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let client = client.clone();
            let (ready, go, done, quit) = (ready.clone(), go.clone(), done.clone(), quit.clone());
            let (results, one_at_a_time) = (results.clone(), one_at_a_time.clone());
            thread::Builder::new()
                .stack_size(512 * 1024)
                .spawn(move || {
                    let handle = match kind {
                        Kind::Lock => Handle::Lock(client.lock(LOCK_NAME)),
                        Kind::Fair => Handle::Fair(client.fair_lock(LOCK_NAME)),
                    };
                    let once = || -> (u64, u64) {
                        match &handle {
                            Handle::Lock(l) => hold_once(l, "Lock::lock"),
                            Handle::Fair(l) => hold_once(l, "FairLock::lock"),
                        }
                    };
                    {
                        let _turn = one_at_a_time.lock().expect("warm-up turn");
                        once();
                    }
                    ready.wait();
                    loop {
                        go.wait();
                        if quit.load(std::sync::atomic::Ordering::SeqCst) {
                            return;
                        }
                        let e = once();
                        results.lock().expect("results").push(e);
                        done.wait();
                    }
                })
                .expect("spawn a waiter thread")
        })
        .collect();
    ready.wait();
    say("ready");
    loop {
        match read_line().as_str() {
            "go" => {
                go.wait();
                done.wait();
                report_events(results.lock().expect("results").drain(..).as_slice());
            }
            "quit" => {
                quit.store(true, std::sync::atomic::Ordering::SeqCst);
                go.wait();
                break;
            }
            other => panic!("unexpected parent line {other:?}"),
        }
    }
    for h in handles {
        h.join().expect("waiter thread");
    }
}

fn child_main(role: &str) {
    let url = env(URL_ENV);
    let prefix = env(PREFIX_ENV);
    match role {
        "hold" => child_hold(&url, &prefix),
        "wait" => child_wait(Kind::parse(&env(KIND_ENV)), &url, &prefix),
        other => panic!("{ROLE_ENV}={other:?}: expected hold or wait"),
    }
}

// ---------------------------------------------------------------------------------------
// Report.

fn report(many: &Many, queues: &[Queue], elapsed: Duration) {
    let mut out = String::new();
    let n = many.locks as f64;
    let rounds = many.get("rounds");
    let _ = writeln!(
        out,
        "\nmany holds: one client, {} locks with watchdog leases (watchdog_timeout {:?}: a \
         renewal round every {:?}), {} idle rounds ({:.1} s)",
        many.locks,
        watchdog_timeout(),
        watchdog_timeout() / 3,
        rounds,
        many.get("idle_s")
    );
    // The larger of right after the acquisitions and after the first idle rounds (the
    // rounds' own buffers count too).
    let rss_top = many.get("rss_after_kib").max(many.get("rss_idle_kib"));
    let rss_per = (rss_top - many.get("rss_before_kib")) * 1024.0 / n;
    let mem_per = (many.get("mem_after") - many.get("mem_before")) / n;
    let rtt = many.get("script_calls_per_round");
    let rows: Vec<(&str, String)> = vec![
        (
            "time to acquire them s",
            format!(
                "{:.2} ({:.1} µs each)",
                many.get("acquire_s"),
                many.get("acquire_s") * 1e6 / n
            ),
        ),
        (
            "renewal round length ms (median)",
            format!("{:.0} (first call seen -> last)", many.get("round_ms")),
        ),
        (
            "renewal round trips per round",
            format!("{:.1} ({:.0} leases each)", rtt, n / rtt.max(1e-9)),
        ),
        (
            "  socket reads per round",
            format!(
                "{:.1} (a call of 500 leases is ~40 KB: several reads)",
                many.get("requests_per_round")
            ),
        ),
        (
            "executed commands per round",
            format!(
                "{:.0} ({:.2} per lease)",
                many.get("executed_per_round"),
                many.get("executed_per_round") / n
            ),
        ),
        (
            "Redis CPU per round ms",
            format!(
                "{:.1} ({:.2} µs per lease)",
                many.get("redis_cpu_ms_per_round"),
                many.get("redis_cpu_ms_per_round") * 1e3 / n
            ),
        ),
        (
            "watchdog thread CPU per round ms",
            format!(
                "{:.1} ({:.2} µs per lease)",
                many.get("watchdog_cpu_ms_per_round"),
                many.get("watchdog_cpu_ms_per_round") * 1e3 / n
            ),
        ),
        (
            "client RSS per held lock B",
            format!(
                "{rss_per:.0} (VmRSS {} -> {} KiB acquired, {} KiB idle)",
                many.get("rss_before_kib"),
                many.get("rss_after_kib"),
                many.get("rss_idle_kib")
            ),
        ),
        ("Redis used_memory per held lock B", format!("{mem_per:.0}")),
        (
            "leases lost (guards / keys missing / at unlock)",
            format!(
                "{} / {} / {}",
                many.get("lost_guards"),
                many.get("missing_keys"),
                many.get("lost_at_unlock")
            ),
        ),
        ("time to release them s", f2(many.get("release_s"))),
        (
            "hot FairLock, 2 threads: acquisitions/s",
            format!(
                "{:.0} holding none, {:.0} holding {}",
                many.get("hot_empty_per_s"),
                many.get("hot_full_per_s"),
                many.locks
            ),
        ),
        (
            "  pub/sub thread CPU µs per acquisition",
            format!(
                "{:.2} with its one channel, {:.2} with {} more lingering ({:.0} acq/s; {} \
                 subscribed at the end)",
                many.get("hot_pubsub_empty_us"),
                many.get("hot_pubsub_channels_us"),
                many.get("lingering_channels"),
                many.get("hot_channels_per_s"),
                many.get("lingering_at_end")
            ),
        ),
        (
            "  watchdog thread CPU µs per acquisition",
            format!(
                "{:.3} holding none, {:.3} holding {} ({:.2} script calls per acquisition)",
                many.get("hot_empty_cpu_us"),
                many.get("hot_full_cpu_us"),
                many.locks,
                many.get("hot_full_calls_per_acq")
            ),
        ),
    ];
    let mut t = Grid::new(&["", ""]);
    for (name, v) in rows {
        t.row(name, vec![v]);
    }
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(out, "  executed per round: {}", many.executed);

    let _ = writeln!(
        out,
        "\nlong queue: one lock, waiters over {PROCESSES} processes (one client each), each \
         waits once, holds {HOLD:?}, releases; the short queue repeated {SHORT_ROUNDS} times"
    );
    let mut t = Grid::new(
        &std::iter::once("".to_owned())
            .chain(queues.iter().map(Queue::label))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let col = |f: &dyn Fn(&Queue) -> String| -> Vec<String> { queues.iter().map(f).collect() };
    t.row("handoffs", col(&|q| q.handoffs.len().to_string()));
    t.row("handoff p50 µs", col(&|q| f1(percentile(&q.handoffs, 0.5))));
    t.row("handoff p90 µs", col(&|q| f1(percentile(&q.handoffs, 0.9))));
    t.row(
        "handoff p99 µs",
        col(&|q| f1(percentile(&q.handoffs, 0.99))),
    );
    t.row(
        "handoff mean µs",
        col(&|q| f1(q.handoffs.iter().sum::<f64>() / q.handoffs.len().max(1) as f64)),
    );
    t.row(
        "cross-process handoff p50 µs",
        col(&|q| format!("{} (n={})", f1(percentile(&q.cross, 0.5)), q.cross.len())),
    );
    server_cost_rows(
        &mut t,
        &queues
            .iter()
            .map(|q| (&q.drain, q.total()))
            .collect::<Vec<_>>(),
        None,
    );
    t.row(
        "join: Redis CPU µs/waiter",
        col(&|q| f1(q.join.cpu_per(q.total()))),
    );
    t.row(
        "join: executed commands/waiter",
        col(&|q| f2(q.join.executed_per(q.total()))),
    );
    t.row(
        "join: requests/waiter",
        col(&|q| f2(q.join.requests_per(q.total()))),
    );
    t.row(
        "go -> all queued ms (median round)",
        col(&|q| f1(median(&q.joined_ms))),
    );
    t.row(
        "rounds never fully queued",
        col(&|q| q.never_queued.to_string()),
    );
    t.row(
        "overlapping holds (must be 0)",
        col(&|q| q.overlaps.to_string()),
    );
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(
        out,
        "  (\"/op\" rows: per handoff = per waiter's acquisition)"
    );
    for q in queues {
        let _ = writeln!(
            out,
            "  {}: per handoff {}; per join {}",
            q.label(),
            q.drain.breakdown(q.total()),
            q.join.breakdown(q.total())
        );
    }

    let mut t = Targets::default();
    let batches = (n / RENEW_BATCH as f64).ceil();
    t.check(
        &format!("{} locks: renewal round trips/round", many.locks),
        f1(rtt),
        &format!("<= {batches:.0}"),
        rtt <= batches,
        "1 per 500 leases",
    );
    t.check(
        &format!("{} locks: client RSS per lock B", many.locks),
        format!("{rss_per:.0}"),
        "<= 1024",
        rss_per <= 1024.0,
        "",
    );
    let (he, hf) = (many.get("hot_empty_per_s"), many.get("hot_full_per_s"));
    t.check(
        &format!("hot lock acq/s holding {}", many.locks),
        format!("{hf:.0}"),
        &format!(">= {:.0}", he / 1.2),
        hf >= he / 1.2,
        &format!("within 1.2x of holding none: {he:.0}"),
    );
    let (pe, pc) = (
        many.get("hot_pubsub_empty_us"),
        many.get("hot_pubsub_channels_us"),
    );
    t.check(
        &format!("hot lock pub/sub CPU µs/acq, {CHANNELS} channels"),
        f2(pc),
        &format!("<= {:.2}", 1.2 * pe),
        pc <= 1.2 * pe,
        &format!("1.2x with one channel: {pe:.2}"),
    );
    let lost = many.get("lost_guards") + many.get("missing_keys") + many.get("lost_at_unlock");
    t.check(
        &format!("{} locks: leases lost", many.locks),
        format!("{lost}"),
        "== 0",
        lost == 0.0,
        "",
    );
    for kind in KINDS {
        let long = queues
            .iter()
            .find(|q| q.kind == kind && q.rounds == 1)
            .expect("the long run");
        let short = queues
            .iter()
            .find(|q| q.kind == kind && q.rounds == SHORT_ROUNDS)
            .expect("the short run");
        let (lp, sp) = (
            percentile(&long.handoffs, 0.5),
            percentile(&short.handoffs, 0.5),
        );
        t.check(
            &format!("{} {}: handoff p50 µs", kind.name(), long.waiters),
            f1(lp),
            &format!("<= {:.1}", 1.2 * sp),
            lp <= 1.2 * sp,
            &format!("1.2 x {} waiters' {sp:.1}", short.waiters),
        );
        let (lc, sc) = (
            long.drain.cpu_per(long.total()),
            short.drain.cpu_per(short.total()),
        );
        t.check(
            &format!("{} {}: Redis CPU µs/handoff", kind.name(), long.waiters),
            f1(lc),
            &format!("<= {:.1}", 1.2 * sc),
            lc <= 1.2 * sc,
            &format!("1.2 x {} waiters' {sc:.1}", short.waiters),
        );
    }
    let overlaps: usize = queues.iter().map(|q| q.overlaps).sum();
    t.check(
        "overlapping holds, all runs",
        overlaps.to_string(),
        "== 0",
        overlaps == 0,
        "",
    );
    let _ = write!(out, "\n{}", t.render());
    let _ = writeln!(out, "whole bench took {:.1} s", elapsed.as_secs_f64());
    print!("{out}");
}
