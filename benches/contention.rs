//! `cargo bench --bench contention`: fairness and handoff under contention (issue 7), for
//! `Lock`, `FairLock`, a naive polling lock and the "fair floor" side by side in one run,
//! against a real redis-server (spawned here, or the one at `REDIS_URL`).
//!
//! 1. Contention: 4 processes × 1 thread loop `lock()` → 1 ms critical section (a
//!    `thread::sleep(1 ms)`, not a busy spin: two cores serve 4 workers and Redis; a spin
//!    with `REDMUTEX_CONTENTION_SPIN=1`) →
//!    release, on one lock, for `REDMUTEX_CONTENTION_SECS` seconds (default 10) per kind.
//!    Reported: acquisitions/s, acquisitions per process (least, most, least/most, Jain
//!    index), cross-process handoff p50/p99, the fraction of handoffs that went to
//!    another process, and the server cost per acquisition.
//! 2. Drain: 4 processes × 8 threads wait on a lock the parent holds for 2 s; once all 32
//!    are visibly waiting the parent releases; each waiter holds 1 ms once and releases.
//!    Reported: release → first acquisition, release → 32nd release, the requests the
//!    waiters sent between "all visibly waiting" and the release, and the drain's server
//!    cost per acquisition.
//! 3. Floors, measured in the same run with raw Redis commands: a PUBLISH received by a
//!    subscriber in another process, one EVALSHA round trip, and the 1 ms hold itself.
//! 4. The figure: phase 1's throughput, least/most and handoff distribution beside the
//!    floors, drawn to `docs/img/contention.svg` (`REDMUTEX_CONTENTION_PLOT` names another
//!    path); see `common/plot.rs`.
//!
//! The naive lock is `SET key token NX PX 30000`, retried every 10 ms while it fails, and
//! released by a compare-and-delete script (EVALSHA). It is cheap partly because it is
//! unfair: its holder mostly takes the lock again, so it rarely hands over at all.
//!
//! The fair floor (`common::QueueFloorLock`) is the least a fair lock that hands over
//! without polling, queueing in Redis and waking the next waiter with a PUBLISH (as `Lock`
//! and `FairLock` do), can do. It runs in phases 1 and 2 exactly like the others: a take
//! script (`SET NX PX`, else `RPUSH` onto a FIFO list) and a give script (compare, `LPOP`
//! the next waiter, `SET` it as holder and `PUBLISH` its grant on its own channel, else
//! `DEL`), as EVALSHA; each waiter thread subscribes to its channel once, before the run,
//! and blocks on it. Every acquisition it hands over costs 2 script requests and 1
//! delivered PUBLISH; it has no ticket, queue-entry expiry, crash safety, renewal,
//! reentrancy or grant confirmation (see its doc comment), so `Lock`'s and `FairLock`'s
//! server cost is shown as a multiple of it too: what their safety costs above the least
//! that fairness costs.
//!
//! What each run costs the Redis server (issue 18) comes from two `INFO all` snapshots
//! around it (`ServerSnapshot` in `benches/common`): Redis process CPU (user + sys),
//! commands executed by name (script-internal ones included) and requests (socket reads),
//! each per acquisition, beside the naive lock's and the fair floor's from the same run.
//! No MONITOR runs: it would cost Redis CPU per executed command and so weigh on the
//! kinds that run more. Timestamps come from `CLOCK_MONOTONIC`, which is one clock for
//! every process on Linux, so times measured in different processes can be subtracted.
//!
//! Re-executes itself as the worker processes (role chosen by an environment variable).
//! Prints a table with PASS/FAIL per target and exits 0 either way: it measures, it does
//! not gate. Command-line arguments (cargo's `--bench`, filters) are ignored.

use std::fmt::Write as _;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, LockGuard};

mod common;
#[path = "common/plot.rs"]
mod plot;
#[path = "../tests/support/mod.rs"]
mod support;

use common::*;

use support::child::{say, ChildProc};

/// Seconds each kind contends (a float); 10 unless set.
const SECS_ENV: &str = "REDMUTEX_CONTENTION_SECS";
const DEFAULT_SECS: f64 = 10.0;

const PROCESSES: usize = 4;
const DRAIN_THREADS: usize = 8;
const WAITERS: usize = PROCESSES * DRAIN_THREADS;
/// The critical section: `thread::sleep`, so it costs no CPU; a busy spin instead when
/// `REDMUTEX_CONTENTION_SPIN=1` (workers and the floor alike).
const HOLD: Duration = Duration::from_millis(1);
const SPIN_ENV: &str = "REDMUTEX_CONTENTION_SPIN";
const NAIVE_POLL: Duration = Duration::from_millis(10);
const NAIVE_LEASE_MS: u64 = 30_000;
/// How long the parent holds the lock the 32 drain waiters wait on.
const DRAIN_HELD: Duration = Duration::from_secs(2);
/// The naive lock shows no queue: its waiters count as visibly waiting this long after
/// every one of them has been let go (each has then made its first SET and sleeps).
const NAIVE_SETTLE: Duration = Duration::from_millis(100);
/// Without a queue key to watch: no acquire attempt for this long means all are asleep.
const QUIET: Duration = Duration::from_millis(20);
/// Give up waiting for "all visibly waiting" after this long (and say so).
const WAITING_TIMEOUT: Duration = Duration::from_secs(10);

const LOCK_NAME: &str = "contended";
/// Waits on other processes never last this long unless something is broken.
const STUCK: Duration = Duration::from_secs(30);

/// A worker (its role, "contend", "drain" or "floor", in `ROLE_ENV`) or the parent.
fn main() {
    dispatch(ROLE_ENV, child_main, parent_main);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lock,
    Fair,
    Naive,
    /// `common::QueueFloorLock`: the least a fair lock that hands over without polling
    /// can do.
    FairFloor,
}

const KINDS: [Kind; 4] = [Kind::Lock, Kind::Fair, Kind::Naive, Kind::FairFloor];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "Lock",
            Kind::Fair => "FairLock",
            Kind::Naive => "naive",
            Kind::FairFloor => "fair floor",
        }
    }

    fn parse(s: &str) -> Kind {
        kind_named(&KINDS, Kind::name, s)
    }

    /// Whether it is one of redmutex's, run through a `redmutex::Client`.
    fn redmutex(self) -> bool {
        matches!(self, Kind::Lock | Kind::Fair)
    }
}

// ---------------------------------------------------------------------------------------
// Parent.

fn parent_main() {
    let secs = env_f64(SECS_ENV, DEFAULT_SECS);
    let (url, server) = support::redis_url_or_spawn();
    let mut admin = Admin::new(&url, STUCK);
    let version = admin.redis_version();
    let started = Instant::now();

    let on = run_on(
        "contention",
        &["REDIS_URL", SECS_ENV, SPIN_ENV],
        &url,
        server.as_ref(),
        &version,
    );
    println!(
        "{on}; contention {secs} s per kind ({SECS_ENV}); \
         critical section: {}",
        hold_name()
    );

    eprintln!("[1/3] floors: PUBLISH -> receive across processes, EVALSHA, sleep(1 ms) ...");
    let floor = floors(&url);
    let mut contention = Vec::new();
    for kind in KINDS {
        eprintln!(
            "[2/3] contention: {PROCESSES} processes x 1 thread, {}, {secs} s ...",
            kind.name()
        );
        contention.push(contend(&url, kind, secs, &mut admin));
    }
    let mut drains = Vec::new();
    for kind in KINDS {
        eprintln!(
            "[3/3] drain: {PROCESSES} processes x {DRAIN_THREADS} threads, {} ...",
            kind.name()
        );
        drains.push(drain(&url, kind, &mut admin));
    }
    // The design's own floor, on the same server: a contended acquisition is at least
    // two script calls on a hash (the try that finds it taken, the release that wakes or
    // hands over) and a PUBLISH; a minimal hash lock's uncontended pair is exactly that.
    let design_floor = hash_lock_pairs(&url, &mut admin);
    let elapsed = started.elapsed();
    report(&floor, &contention, &drains, design_floor, secs, elapsed);
}

// ---------------------------------------------------------------------------------------
// Floors.

/// Pairs of the minimal hash lock measured for the design floor.
const HASH_PAIRS: u64 = 3_000;

/// Redis CPU per pair of a minimal reentrant hash lock (`common::HashLock`).
fn hash_lock_pairs(url: &str, admin: &mut Admin) -> f64 {
    let mut con = common::connect(url);
    let hash = common::HashLock::new();
    let (key, channel) = ("contention:{hash-floor}", "contention:{hash-floor}:c");
    for _ in 0..200 {
        hash.pair(&mut con, key, channel);
    }
    let (cost, ()) = common::ServerCost::measure(&mut admin.con, || {
        (0..HASH_PAIRS).for_each(|_| hash.pair(&mut con, key, channel))
    });
    cost.cpu_per(HASH_PAIRS)
}

fn floors(url: &str) -> Floor {
    let prefix = unique_prefix("contention", "floor");
    let child = ChildProc::spawn(
        "floor",
        &[
            (ROLE_ENV, "floor"),
            (URL_ENV, url),
            (PREFIX_ENV, &prefix),
            (KIND_ENV, "naive"),
        ],
    );
    child.expect("ready");
    measure_floor(url, &format!("{prefix}channel"), child, hold)
}

// ---------------------------------------------------------------------------------------
// Contention: 4 processes x 1 thread.

struct Contention {
    kind: Kind,
    acquired: Acquisitions,
    /// What the run cost Redis, from `go` to the last worker's exit.
    cost: ServerCost,
}

impl Contention {
    /// Every acquisition in time order with its process.
    fn timeline(&self) -> Vec<(u64, u64, usize)> {
        let mut all: Vec<(u64, u64, usize)> = self
            .acquired
            .by_process
            .iter()
            .enumerate()
            .flat_map(|(p, e)| e.iter().map(move |&(a, r)| (a, r, p)))
            .collect();
        all.sort_unstable();
        all
    }

    /// Cross-process handoffs (µs), the number of consecutive acquisitions, and how many
    /// of those overlapped (an acquisition before the previous release began: must be 0).
    fn handoffs(&self) -> (Vec<f64>, usize, usize) {
        let all = self.timeline();
        let mut cross = Vec::new();
        let mut overlaps = 0;
        for w in all.windows(2) {
            let ((_, rel, p), (acq, _, q)) = (w[0], w[1]);
            if acq < rel {
                overlaps += 1;
            } else if p != q {
                cross.push(us_between(rel, acq));
            }
        }
        (cross, all.len().saturating_sub(1), overlaps)
    }
}

fn contend(url: &str, kind: Kind, secs: f64, admin: &mut Admin) -> Contention {
    let prefix = unique_prefix("contention", &format!("contend-{}", kind.name()));
    let children = spawn_workers(
        PROCESSES,
        ROLE_ENV,
        "contend",
        &[
            (KIND_ENV, kind.name()),
            (URL_ENV, url),
            (PREFIX_ENV, &prefix),
        ],
    );
    for c in &children {
        c.expect("ready");
    }
    let before = ServerSnapshot::take(&mut admin.con);
    let acquired = Acquisitions::run(
        children,
        secs,
        STUCK,
        &format!("a {} contention worker hung", kind.name()),
    );
    let cost = ServerSnapshot::take(&mut admin.con).since(&before);
    Contention {
        kind,
        acquired,
        cost,
    }
}

// ---------------------------------------------------------------------------------------
// Drain: 32 waiters released at once.

struct Drain {
    kind: Kind,
    /// Per waiter: (acquired, release started, release returned), CLOCK_MONOTONIC ns.
    events: Vec<(u64, u64, u64)>,
    /// When the parent began its release.
    released: u64,
    /// How "all visibly waiting" was decided.
    waited_by: String,
    /// From "all visibly waiting" to the release, the window whose requests count.
    window: Duration,
    /// What Redis did in that window.
    waiting: ServerCost,
    /// What the drain cost Redis: the parent's release to the last waiter's exit.
    draining: ServerCost,
}

impl Drain {
    fn first_us(&self) -> f64 {
        let first = self.events.iter().map(|e| e.0).min().unwrap_or(0);
        us_between(self.released, first)
    }

    fn total_us(&self) -> f64 {
        let last = self.events.iter().map(|e| e.2).max().unwrap_or(0);
        us_between(self.released, last)
    }

    fn overlaps(&self) -> usize {
        let mut v = self.events.clone();
        v.sort_unstable();
        v.windows(2).filter(|w| w[1].0 < w[0].1).count()
    }
}

fn drain(url: &str, kind: Kind, admin: &mut Admin) -> Drain {
    let prefix = unique_prefix("contention", &format!("drain-{}", kind.name()));
    let mut children: Vec<ChildProc> = (0..PROCESSES)
        .map(|_| {
            ChildProc::spawn(
                "drain",
                &[
                    (ROLE_ENV, "drain"),
                    (KIND_ENV, kind.name()),
                    (URL_ENV, url),
                    (PREFIX_ENV, &prefix),
                ],
            )
        })
        .collect();
    for c in &mut children {
        c.send("warm");
        c.expect("ready");
    }

    let client = kind.redmutex().then(|| bench_client(url, &prefix));
    let mut parent = Handle::new(kind, client.as_ref(), url, &prefix);
    let held = parent.acquire();
    let held_at = Instant::now();
    let base_evalsha = admin.calls(common::script_command());
    for c in &mut children {
        c.send("go");
    }
    for c in &children {
        c.expect("waiting");
    }
    let waited_by = if kind == Kind::Naive {
        thread::sleep(NAIVE_SETTLE);
        format!("fixed settle of {NAIVE_SETTLE:?} after all {WAITERS} were let go")
    } else {
        let queue = queue_key(&prefix);
        let released = format!("{prefix}{{{LOCK_NAME}}}:released");
        let mut how = "";
        let mut last = (0, Instant::now());
        let seen = support::wait_until(WAITING_TIMEOUT, || {
            let len = admin.llen(&queue);
            if len >= WAITERS as u64 {
                how = "queue LLEN == 32";
                return true;
            }
            // No queue (a redmutex without one): every process subscribed, every thread
            // made its attempt, and no attempt for 20 ms: all sleep until a release.
            let calls = admin.calls(common::script_command());
            if calls != last.0 {
                last = (calls, Instant::now());
            }
            if len == 0
                && admin.numsub(&released) >= PROCESSES as u64
                && calls >= base_evalsha + WAITERS as u64
                && last.1.elapsed() >= QUIET
            {
                how = "no queue key: 4 subscribers on :released, >= 32 attempts, then 20 ms quiet";
                return true;
            }
            false
        });
        if seen {
            how.to_owned()
        } else {
            format!(
                "NEVER (queue LLEN {} after {WAITING_TIMEOUT:?}); released anyway",
                admin.llen(&queue)
            )
        }
    };
    let waiting_from = ServerSnapshot::take(&mut admin.con);
    let waiting_since = Instant::now();
    if let Some(left) = DRAIN_HELD.checked_sub(held_at.elapsed()) {
        thread::sleep(left);
    }
    let drain_from = ServerSnapshot::take(&mut admin.con);
    let waiting = drain_from.since(&waiting_from);
    let window = waiting_since.elapsed();
    let released = mono_ns();
    parent.release(held);

    let mut events = Vec::new();
    for c in children {
        loop {
            let line = c.next_line();
            if line == "done" {
                break;
            }
            let v: Vec<u64> = line
                .strip_prefix("acq ")
                .unwrap_or_else(|| panic!("unexpected worker line {line:?}"))
                .split_whitespace()
                .map(parse_u64)
                .collect();
            events.push((v[0], v[1], v[2]));
        }
        c.wait_success();
    }
    let draining = ServerSnapshot::take(&mut admin.con).since(&drain_from);
    drop(parent);
    drop(client);
    Drain {
        kind,
        events,
        released,
        waited_by,
        window,
        waiting,
        draining,
    }
}

// ---------------------------------------------------------------------------------------
// Workers.

fn child_main(role: &str) {
    let kind = Kind::parse(&env(KIND_ENV));
    let url = env(URL_ENV);
    let prefix = env(PREFIX_ENV);
    match role {
        "contend" => child_contend(kind, &url, &prefix),
        "drain" => child_drain(kind, &url, &prefix),
        "floor" => child_floor(&url, &prefix),
        other => panic!("{ROLE_ENV}={other:?}: expected contend, drain or floor"),
    }
}

fn child_contend(kind: Kind, url: &str, prefix: &str) {
    let client = kind.redmutex().then(|| bench_client(url, prefix));
    let mut lock = Handle::new(kind, client.as_ref(), url, prefix);
    // Warm up: scripts loaded, pooled connection open.
    let held = lock.acquire();
    lock.release(held);
    say("ready");
    let lock = std::cell::RefCell::new(lock);
    let events = work_window(
        read_window(),
        || lock.borrow_mut().acquire(),
        hold,
        |held| lock.borrow_mut().release(held),
    );
    report_events(&events);
}

fn child_drain(kind: Kind, url: &str, prefix: &str) {
    let client = kind.redmutex().then(|| bench_client(url, prefix));
    // Every thread warms up on the drain lock (scripts loaded, the pool's connection),
    // then all wait for the parent's "go" at the barrier. The warm-ups run one at a time,
    // the processes too (the parent lets them go in turn), so no waiter queues and no
    // lock is handed on: a handoff makes its client re-check the lock about a second
    // later, and that request would land in the window measured while all wait.
    assert_eq!(read_line(), "warm", "unexpected parent line");
    let one_at_a_time = Arc::new(Mutex::new(()));
    let ready = Arc::new(Barrier::new(DRAIN_THREADS + 1));
    let go = Arc::new(Barrier::new(DRAIN_THREADS + 1));
    let results = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..DRAIN_THREADS)
        .map(|_| {
            let (client, url, prefix) = (client.clone(), url.to_owned(), prefix.to_owned());
            let (ready, go, results) = (ready.clone(), go.clone(), results.clone());
            let one_at_a_time = one_at_a_time.clone();
            thread::spawn(move || {
                let mut lock = Handle::new(kind, client.as_ref(), &url, &prefix);
                {
                    let _turn = one_at_a_time.lock().expect("warm-up turn");
                    let held = lock.acquire();
                    lock.release(held);
                }
                ready.wait();
                go.wait();
                let held = lock.acquire();
                let acquired = mono_ns();
                hold();
                let releasing = mono_ns();
                lock.release(held);
                let released = mono_ns();
                results
                    .lock()
                    .expect("results")
                    .push((acquired, releasing, released));
            })
        })
        .collect();
    ready.wait();
    say("ready");
    assert_eq!(read_line(), "go", "unexpected parent line");
    go.wait();
    say("waiting");
    for t in threads {
        t.join().expect("drain thread");
    }
    for (a, r, d) in results.lock().expect("results").iter() {
        say(&format!("acq {a} {r} {d}"));
    }
    say("done");
}

fn child_floor(url: &str, prefix: &str) {
    // The naive lock's release script, on a key that does not exist: one EVALSHA.
    let naive = common::NaiveLock::new();
    let key = format!("{prefix}none");
    serve_floor(url, &format!("{prefix}channel"), |con| {
        naive.compare_and_delete(con, &key, "token");
    });
}

/// One thread's view of the lock under test.
enum Handle {
    Lock(redmutex::Lock),
    Fair(redmutex::FairLock),
    Naive {
        con: Box<redis::Connection>,
        key: String,
        token: String,
        n: u64,
        naive: common::NaiveLock,
    },
    /// One holder id per thread: the naive lock's token without its per-acquisition
    /// counter, since the grant channel is named after it and subscribed once, up front.
    FairFloor {
        con: Box<redis::Connection>,
        sub: Box<redis::Connection>,
        key: String,
        queue: String,
        channels: String,
        me: String,
        floor: common::QueueFloorLock,
    },
}

enum Held {
    Guard(LockGuard),
    Fair(LockGuard<redmutex::Fair>),
    Naive(String),
    FairFloor,
}

/// The waiter queue the drain watches: redmutex's fair queue, and the fair floor's list
/// under the same name.
fn queue_key(prefix: &str) -> String {
    format!("{prefix}!queue:{{{LOCK_NAME}}}")
}

/// The naive lock's holder ids, and the fair floor's: unique per thread and run.
fn thread_token() -> String {
    format!(
        "{}:{:?}:{}",
        std::process::id(),
        thread::current().id(),
        mono_ns()
    )
}

impl Handle {
    fn new(kind: Kind, client: Option<&Client>, url: &str, prefix: &str) -> Handle {
        match kind {
            Kind::Lock => Handle::Lock(client.expect("a client").lock(LOCK_NAME)),
            Kind::Fair => Handle::Fair(client.expect("a client").fair_lock(LOCK_NAME)),
            Kind::Naive => Handle::Naive {
                con: Box::new(connect(url)),
                key: format!("{prefix}naive:{LOCK_NAME}"),
                token: thread_token(),
                n: 0,
                naive: common::NaiveLock::new(),
            },
            Kind::FairFloor => {
                let me = thread_token();
                let channels = format!("{prefix}floor-grant:");
                let mut sub = Box::new(connect(url));
                common::QueueFloorLock::subscribe(&mut sub, &channels, &me, STUCK);
                Handle::FairFloor {
                    con: Box::new(connect(url)),
                    sub,
                    key: format!("{prefix}floor:{LOCK_NAME}"),
                    queue: queue_key(prefix),
                    channels,
                    me,
                    floor: common::QueueFloorLock::new(),
                }
            }
        }
    }

    fn acquire(&mut self) -> Held {
        match self {
            Handle::Lock(lock) => Held::Guard(lock.lock().expect("Lock::lock")),
            Handle::Fair(lock) => Held::Fair(lock.lock().expect("FairLock::lock")),
            Handle::Naive {
                con,
                key,
                token,
                n,
                naive,
            } => {
                *n += 1;
                let mine = format!("{token}:{n}");
                while !naive.try_lock(con, key, &mine, NAIVE_LEASE_MS) {
                    thread::sleep(NAIVE_POLL);
                }
                Held::Naive(mine)
            }
            Handle::FairFloor {
                con,
                sub,
                key,
                queue,
                me,
                floor,
                ..
            } => {
                floor.lock(con, sub, key, queue, me, NAIVE_LEASE_MS);
                Held::FairFloor
            }
        }
    }

    fn release(&mut self, held: Held) {
        match (self, held) {
            (Handle::Lock(_), Held::Guard(g)) => g.unlock().expect("unlock"),
            (Handle::Fair(_), Held::Fair(g)) => g.unlock().expect("unlock"),
            (
                Handle::Naive {
                    con, key, naive, ..
                },
                Held::Naive(mine),
            ) => naive.unlock(con, key, mine),
            (
                Handle::FairFloor {
                    con,
                    key,
                    queue,
                    channels,
                    me,
                    floor,
                    ..
                },
                Held::FairFloor,
            ) => floor.unlock(con, key, queue, me, NAIVE_LEASE_MS, channels),
            _ => unreachable!("a hold of another kind"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Report.

fn report(
    floor: &Floor,
    contention: &[Contention],
    drains: &[Drain],
    design_floor: f64,
    secs: f64,
    elapsed: Duration,
) {
    let by_kind = |k: Kind| contention.iter().find(|c| c.kind == k).expect("every kind");
    let drain_of = |k: Kind| drains.iter().find(|d| d.kind == k).expect("every kind");

    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ncontention: {PROCESSES} processes x 1 thread, lock -> {} -> release, \
         {secs} s per kind",
        hold_name()
    );
    let mut header = vec![""];
    header.extend(KINDS.iter().map(|k| k.name()));
    let mut t = Grid::new(&header);
    let col = |f: &dyn Fn(&Contention) -> String| -> Vec<String> {
        KINDS.iter().map(|&k| f(by_kind(k))).collect()
    };
    t.row("acquisitions/s", col(&|c| f1(c.acquired.rate())));
    t.row("acquisitions", col(&|c| c.acquired.total().to_string()));
    t.row(
        "per process",
        col(&|c| {
            c.acquired
                .counts()
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("/")
        }),
    );
    t.row("least/most", col(&|c| f2(least_most(&c.acquired.counts()))));
    t.row("Jain index", col(&|c| f3(jain(&c.acquired.counts()))));
    t.row(
        "handoffs to another process",
        col(&|c| {
            let (cross, n, _) = c.handoffs();
            format!(
                "{:.2} ({}/{n})",
                cross.len() as f64 / n.max(1) as f64,
                cross.len()
            )
        }),
    );
    t.row(
        "cross-process handoff p50 µs",
        col(&|c| f1(percentile(&c.handoffs().0, 0.50))),
    );
    t.row(
        "cross-process handoff p99 µs",
        col(&|c| f1(percentile(&c.handoffs().0, 0.99))),
    );
    t.row(
        "overlapping holds (must be 0)",
        col(&|c| c.handoffs().2.to_string()),
    );
    let cost = |k: Kind| (&by_kind(k).cost, by_kind(k).acquired.total());
    server_cost_rows_vs(
        &mut t,
        &KINDS.map(cost),
        &[
            (Kind::Naive.name(), cost(Kind::Naive).0, cost(Kind::Naive).1),
            (
                Kind::FairFloor.name(),
                cost(Kind::FairFloor).0,
                cost(Kind::FairFloor).1,
            ),
        ],
    );
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(
        out,
        "  executed commands per acquisition, by name (INFO commandstats, scripts included):"
    );
    for c in contention {
        let _ = writeln!(
            out,
            "  {:<10} {}",
            c.kind.name(),
            c.cost.breakdown(c.acquired.total())
        );
    }

    let _ = writeln!(
        out,
        "\ndrain: {WAITERS} waiters ({PROCESSES} processes x {DRAIN_THREADS} threads) on a lock \
         held {DRAIN_HELD:?}, each holds 1 ms once"
    );
    let mut header = vec![""];
    header.extend(KINDS.iter().map(|k| k.name()));
    let mut t = Grid::new(&header);
    let col = |f: &dyn Fn(&Drain) -> String| -> Vec<String> {
        KINDS.iter().map(|&k| f(drain_of(k))).collect()
    };
    t.row(
        "release -> first acquisition µs",
        col(&|d| f1(d.first_us())),
    );
    t.row(
        "release -> 32nd release ms",
        col(&|d| f2(d.total_us() / 1e3)),
    );
    t.row(
        "socket reads while all waiting",
        col(&|d| d.waiting.reads.to_string()),
    );
    t.row(
        "executed commands while all waiting",
        col(&|d| d.waiting.executed_total().to_string()),
    );
    t.row(
        "  over a window of ms",
        col(&|d| f1(d.window.as_secs_f64() * 1e3)),
    );
    let cost = |k: Kind| (&drain_of(k).draining, drain_of(k).events.len() as u64);
    server_cost_rows_vs(
        &mut t,
        &KINDS.map(cost),
        &[
            (Kind::Naive.name(), cost(Kind::Naive).0, cost(Kind::Naive).1),
            (
                Kind::FairFloor.name(),
                cost(Kind::FairFloor).0,
                cost(Kind::FairFloor).1,
            ),
        ],
    );
    t.row(
        "overlapping holds (must be 0)",
        col(&|d| d.overlaps().to_string()),
    );
    let _ = write!(out, "{}", t.render());
    for d in drains {
        let _ = writeln!(
            out,
            "  {}: all waiting by {}; executed while waiting: {}; per acquisition during the drain: {}",
            d.kind.name(),
            d.waited_by,
            d.waiting.breakdown(1),
            d.draining.breakdown(d.events.len() as u64)
        );
    }

    let delivery = median(&floor.delivery);
    let rtt = median(&floor.rtt);
    let sleep = median(&floor.sleep);
    let drain_floor = WAITERS as f64 * (sleep + rtt + delivery);
    // Every acquisition a handoff to another process: a hold, then the handoff floor.
    let rate_floor = 1e6 / (sleep + median(&floor.delivery_rtt));
    let _ = writeln!(
        out,
        "\nfloors (raw Redis commands, same run; n={FLOOR_SAMPLES}; µs p50 / p99):"
    );
    let _ = writeln!(
        out,
        "  PUBLISH -> received in another process   {:>8.1} / {:>8.1}",
        delivery,
        percentile(&floor.delivery, 0.99)
    );
    let _ = writeln!(
        out,
        "  ... + one EVALSHA round trip             {:>8.1} / {:>8.1}",
        median(&floor.delivery_rtt),
        percentile(&floor.delivery_rtt, 0.99)
    );
    let _ = writeln!(
        out,
        "  EVALSHA round trip alone                 {:>8.1} / {:>8.1}",
        rtt,
        percentile(&floor.rtt, 0.99)
    );
    let _ = writeln!(
        out,
        "  the 1 ms hold                            {:>8.1} / {:>8.1}",
        sleep,
        percentile(&floor.sleep, 0.99)
    );
    let _ = writeln!(
        out,
        "  drain floor: 32 x (hold + EVALSHA + PUBLISH->received) = {:.2} ms",
        drain_floor / 1e3
    );
    let _ = writeln!(
        out,
        "  strict-turns throughput: 1 s / (hold + PUBLISH->received + EVALSHA) = {rate_floor:.1}/s"
    );

    let lock = by_kind(Kind::Lock);
    let fair = by_kind(Kind::Fair);
    let naive = by_kind(Kind::Naive);
    let fair_drain = drain_of(Kind::Fair);
    let (fair_cross, _, _) = fair.handoffs();
    let (lock_cross, _, _) = lock.handoffs();
    let fair_p50 = percentile(&fair_cross, 0.50);
    let lock_p50 = percentile(&lock_cross, 0.50);
    let rate = |c: &Contention| c.acquired.rate();

    let mut t = Targets::default();
    t.check(
        "FairLock least/most",
        f2(least_most(&fair.acquired.counts())),
        ">= 0.95",
        least_most(&fair.acquired.counts()) >= 0.95,
        "issue 18",
    );
    t.check(
        "FairLock Jain index",
        f3(jain(&fair.acquired.counts())),
        ">= 0.99",
        jain(&fair.acquired.counts()) >= 0.99,
        "",
    );
    let fair_req = fair.cost.requests_per(fair.acquired.total());
    t.check(
        "FairLock requests/acq",
        f2(fair_req),
        "<= 2.2",
        fair_req <= 2.2,
        "",
    );
    let naive_cpu = naive.cost.cpu_per(naive.acquired.total());
    let fair_floor = by_kind(Kind::FairFloor);
    let fair_floor_cpu = fair_floor.cost.cpu_per(fair_floor.acquired.total());
    for c in [lock, fair] {
        let cpu = c.cost.cpu_per(c.acquired.total());
        t.check(
            &format!("{} Redis CPU µs/acq", c.kind.name()),
            f1(cpu),
            &format!("<= {:.1}", 1.2 * naive_cpu),
            cpu <= 1.2 * naive_cpu,
            &format!(
                "1.2 x naive's {naive_cpu:.1} (issue 18); design floor {design_floor:.1} \
                 (two script calls on a hash + PUBLISH), {:.2}x of it; \
                 fair floor {fair_floor_cpu:.1} (same run), {:.2}x of it",
                cpu / design_floor,
                cpu / fair_floor_cpu
            ),
        );
    }
    // Not a target: whether the CPU target sits below what any fair lock that
    // hands over without polling must spend, measured under the same contention.
    t.info(
        "fair floor Redis CPU µs/acq",
        f1(fair_floor_cpu),
        &format!(
            "{:.2}x naive's {naive_cpu:.1}, {:.2}x the 1.2 x naive target: \
             2 scripts + 1 delivered PUBLISH per handover",
            fair_floor_cpu / naive_cpu,
            fair_floor_cpu / (1.2 * naive_cpu)
        ),
    );
    let lock_req = lock.cost.requests_per(lock.acquired.total());
    t.check(
        "Lock requests/acq",
        f2(lock_req),
        "<= 2.2",
        lock_req <= 2.2,
        "",
    );
    t.check(
        "FairLock cross-process handoff p50 µs",
        f1(fair_p50),
        &format!("<= {:.1}", 0.6 * lock_p50),
        fair_p50 <= 0.6 * lock_p50,
        &format!(
            "0.6 x Lock's {}; floor {:.1} (PUBLISH->recv)",
            f1(lock_p50),
            delivery
        ),
    );
    let fair_p99 = percentile(&fair_cross, 0.99);
    t.check(
        "FairLock cross-process handoff p99 µs",
        f1(fair_p99),
        "<= 1000",
        fair_p99 <= 1000.0,
        &format!(
            "floor {:.1} (PUBLISH->recv), {:.1} (+ EVALSHA)",
            percentile(&floor.delivery, 0.99),
            percentile(&floor.delivery_rtt, 0.99)
        ),
    );
    t.check(
        "FairLock acquisitions/s",
        f1(rate(fair)),
        &format!(">= {:.1}", rate(naive)),
        rate(fair) >= rate(naive),
        &format!("naive's; strict-turns floor {rate_floor:.1}/s"),
    );
    t.check(
        "Lock least/most",
        f2(least_most(&lock.acquired.counts())),
        ">= 0.8",
        least_most(&lock.acquired.counts()) >= 0.8,
        "issue 18",
    );
    t.check(
        "Lock acquisitions/s",
        f1(rate(lock)),
        &format!(">= {:.1}", rate(naive)),
        rate(lock) >= rate(naive),
        &format!("naive's; strict-turns floor {rate_floor:.1}/s"),
    );
    let first = fair_drain.first_us();
    t.check(
        "FairLock drain: release -> first µs",
        f1(first),
        "<= 500",
        first <= 500.0,
        &format!("floor {delivery:.1} (PUBLISH->recv)"),
    );
    let total = fair_drain.total_us() / 1e3;
    t.check(
        "FairLock drain: all 32 released ms",
        f2(total),
        "<= 40",
        total <= 40.0,
        &format!(
            "floor {:.2}; the fair floor's drain {:.2}",
            drain_floor / 1e3,
            drain_of(Kind::FairFloor).total_us() / 1e3
        ),
    );
    // Executed commands, not socket reads: a read that runs nothing (a pooled connection
    // closing) is no request.
    let waiting = fair_drain.waiting.executed_total();
    t.check(
        "FairLock drain: commands while waiting",
        waiting.to_string(),
        "== 0",
        waiting == 0,
        "",
    );
    let overlaps: usize = contention.iter().map(|c| c.handoffs().2).sum::<usize>()
        + drains.iter().map(Drain::overlaps).sum::<usize>();
    t.check(
        "overlapping holds, all kinds and phases",
        overlaps.to_string(),
        "== 0",
        overlaps == 0,
        "",
    );
    let _ = write!(out, "\n{}", t.render());
    let _ = writeln!(out, "whole bench took {:.1} s", elapsed.as_secs_f64());

    let series: Vec<plot::Series> = KINDS
        .iter()
        .map(|&k| {
            let c = by_kind(k);
            plot::Series {
                name: k.name(),
                per_second: c.acquired.rate(),
                least_most: least_most(&c.acquired.counts()),
                handoffs: c.handoffs().0,
            }
        })
        .collect();
    let floors = plot::Floors {
        turns_per_second: rate_floor,
        handoff_us: median(&floor.delivery_rtt),
    };
    let caption = format!(
        "{PROCESSES} processes x 1 thread on one lock, {} holds, {secs} s per lock, one run",
        hold_name()
    );
    let path = plot::path();
    match plot::draw(&path, &caption, &series, &floors) {
        Ok(()) => {
            let _ = writeln!(out, "figure: {}", path.display());
        }
        Err(e) => {
            let _ = writeln!(out, "figure not written ({}): {e}", path.display());
        }
    }
    print!("{out}");
}

// ---------------------------------------------------------------------------------------
// Shared helpers.

/// What this bench asks of the server besides the common questions.
impl Admin {
    fn llen(&mut self, key: &str) -> u64 {
        // A key of another type (none expected) counts as no queue.
        redis::cmd("LLEN")
            .arg(key)
            .query(&mut self.con)
            .unwrap_or(0)
    }

    fn numsub(&mut self, channel: &str) -> u64 {
        let (_, n): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query(&mut self.con)
            .expect("PUBSUB NUMSUB");
        n
    }
}

fn spinning() -> bool {
    std::env::var(SPIN_ENV).is_ok_and(|v| v == "1")
}

fn hold_name() -> &'static str {
    if spinning() {
        "busy spin of 1 ms"
    } else {
        "thread::sleep(1 ms)"
    }
}

/// The 1 ms critical section.
fn hold() {
    if spinning() {
        let t = Instant::now();
        while t.elapsed() < HOLD {
            std::hint::spin_loop();
        }
    } else {
        thread::sleep(HOLD);
    }
}
