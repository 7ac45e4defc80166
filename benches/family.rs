//! `cargo bench --bench family`: the lock family's targets (issue 8), measured in one run
//! against a real redis-server (spawned here, or the one at `REDIS_URL`).
//!
//! 1. Uncontended pairs: `rw.read_lock().lock()` + drop, `sem.acquire()` + drop and, for
//!    reference, `lock()` + drop, each judged as a ratio to a PING round trip on a pooled
//!    connection and to its own scripts run by hand (the same acquire and release scripts
//!    the library runs, EVALSHA with the same keys and arguments, over one pooled
//!    connection). Medians of thousands of operations after a warm-up, sampled in
//!    interleaved rounds so a slow phase of a noisy machine hits every kind alike. Beside
//!    them, Redis's own time per call (`INFO commandstats` usec / calls): what a script
//!    costs the server, the part of a pair no client can save.
//! 2. Readers: 4 processes × 2 threads loop `read().lock()` → 1 ms section → release on
//!    one read-write lock for `REDMUTEX_FAMILY_SECS` seconds (default 5), then the same 8
//!    threads on a plain `Lock`. Target: read acquisitions/s ≥ 3× the `Lock`'s.
//! 3. Semaphore: 4 permits, 4 processes × 4 threads loop `acquire()` → 1 ms → release.
//!    Target: requests per acquisition ≤ 2.5, counted as the EVALSHA + EVAL calls of
//!    `INFO commandstats` (deltas over the run, the workers' exits included) divided by
//!    acquisitions; the other commands clients sent are shown too (commandstats also counts
//!    the commands scripts run: those are told apart by name, from the bundled scripts).
//!    Also reported: acquisitions/s, per process (least/most, Jain index), and for every
//!    run the most and mean holds at once and how busy the scripts kept Redis.
//!    Then a naive mutex (`SET NX PX`, polled every 10 ms, compare-and-delete release) on
//!    the `Lock`'s 8 threads: the floor of what a lock costs Redis. For every run, what it
//!    cost the server per acquisition (`ServerSnapshot` in `benches/common`: Redis CPU,
//!    executed commands by name, requests) beside the naive lock's (issue 18).
//! 4. Floors, measured in the same run: the 1 ms section as `thread::sleep` really lasts
//!    here, and a PUBLISH received by a subscriber in another process (plus one EVALSHA
//!    round trip). From them: the readers' ceiling 8 / (hold + one uncontended read pair),
//!    and the semaphore's 4 / (hold + PUBLISH → received).
//!
//! The critical section is a `thread::sleep(1 ms)`: two cores serve 16 workers and Redis.
//! Timestamps come from `CLOCK_MONOTONIC`, one clock for every process on Linux, so holds
//! measured in different processes can be laid on one time line (the concurrency figures:
//! a hold counts from its `lock()` returning to its release starting, so they never
//! overstate it).
//!
//! Re-executes itself as the worker processes (role chosen by an environment variable).
//! Prints tables with PASS/FAIL per target and exits 0 either way: it measures, it does
//! not gate. Command-line arguments (cargo's `--bench`, filters) are ignored.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::Client;

mod common;
#[allow(dead_code)] // the bits these hand-run scripts need, of all the library's
#[path = "../src/runtime/scripting/flags.rs"]
mod flags;
#[path = "../tests/support/mod.rs"]
mod support;

use common::*;
use support::manifest;

use support::child::{say, ChildProc};

/// Seconds each contended kind runs (a float); 5 unless set.
const SECS_ENV: &str = "REDMUTEX_FAMILY_SECS";
const DEFAULT_SECS: f64 = 5.0;

const PROCESSES: usize = 4;
const READER_THREADS: usize = 2;
const SEM_THREADS: usize = 4;
const SEM_PERMITS: u32 = 4;
const HOLD: Duration = Duration::from_millis(1);
const NAME: &str = "family";

/// The name each kind is measured on: a name is one kind at a time (a lock, a read-write
/// lock and a semaphore cannot share one), so each has its own.
fn name_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "family-lock",
        Kind::Read => "family-rw",
        Kind::Sem => "family-sem",
        Kind::Naive => NAME,
    }
}

/// Operations per kind before any sample is kept: connections, scripts and caches warm up.
const WARMUP_OPS: usize = 300;
const ROUNDS: usize = 8;
const OPS_PER_ROUND: usize = 600;

/// What the library passes its scripts (the defaults: a 30 s watchdog lease).
const LEASE_MS: u64 = 30_000;
/// Flags of the holds (src/runtime/scripting/scripts.rs): a plain lock none, a read hold
/// fair and read, a semaphore's permits fair.
const PLAIN_FLAGS: u8 = 0;
const READ_FLAGS: u8 = flags::FAIR | flags::READ;
const PERMIT_FLAGS: u8 = flags::FAIR;

/// Waits on other processes never last this long unless something is broken.
const STUCK: Duration = Duration::from_secs(30);

/// The text of the bundled script `name` ("acquire", "rw_release"...) as the library runs
/// it as a script of its own (the files the manifest lists), after the line of constants
/// it puts first (a 1 s pickup window, a 10 ms starvation bound).
fn bundled_script(name: &str) -> String {
    let text = manifest::script_text(name).expect("a bundled script");
    ["local PICKUP, STARVE = 1000, 10\n", &text].concat()
}

/// Every bundled script's files but `allow_oom.lua`, `inspect.lua` and `latch.lua`, to
/// learn which commands scripts run: `INFO commandstats` counts those too, so they are
/// told apart from the requests clients send by name (none of them is a command the
/// library sends itself).
const ALL_LUA: [manifest::Part; 21] = [
    manifest::ACQUIRE,
    manifest::ACQUIRE_FAST,
    manifest::CANCEL,
    manifest::FORCE_UNLOCK,
    manifest::KICK,
    manifest::LATCH_COUNT_DOWN,
    manifest::LATCH_SET,
    manifest::LATCH_STATE,
    manifest::LEASED_CANCEL,
    manifest::LEASED_RELEASE,
    manifest::LEASES,
    manifest::LEVELS,
    manifest::QUEUE,
    manifest::RELEASE,
    manifest::RELEASE_FAST,
    manifest::RENEW,
    manifest::RW,
    manifest::RW_ACQUIRE,
    manifest::SEM_ACQUIRE,
    manifest::SEM_PERMITS,
    manifest::SEMAPHORE,
];

/// One EVALSHA round trip for the floor child (a script that touches nothing).
const NOOP: &str = "return 0";

/// A worker (its role, "contend" or "floor", in `ROLE_ENV`) or the parent.
fn main() {
    dispatch(ROLE_ENV, child_main, parent_main);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Read,
    Lock,
    Sem,
    /// The floor of what a mutex costs Redis: `SET NX PX`, polled every 10 ms while it
    /// fails, released by a compare-and-delete script; the `Lock`'s threads.
    Naive,
}

const KINDS: [Kind; 4] = [Kind::Read, Kind::Lock, Kind::Sem, Kind::Naive];
const NAIVE_POLL: Duration = Duration::from_millis(10);

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Lock => "Lock",
            Kind::Sem => "Semaphore",
            Kind::Naive => "naive",
        }
    }

    fn parse(s: &str) -> Kind {
        kind_named(&KINDS, Kind::name, s)
    }

    fn threads(self) -> usize {
        match self {
            Kind::Read | Kind::Lock | Kind::Naive => READER_THREADS,
            Kind::Sem => SEM_THREADS,
        }
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
        "family",
        &["REDIS_URL", SECS_ENV],
        &url,
        server.as_ref(),
        &version,
    );
    println!(
        "{on}; contention {secs} s per kind ({SECS_ENV}); \
         critical section: thread::sleep(1 ms)"
    );

    eprintln!("[1/4] PING, read/permit/lock pairs and their scripts by hand, interleaved ...");
    let cheap = cheap_latencies(&url, &mut admin);
    eprintln!("[2/4] floors: sleep(1 ms), PUBLISH -> receive across processes ...");
    let floor = floors(&url);
    let mut runs = Vec::new();
    for kind in KINDS {
        eprintln!(
            "[3-4/4] contention: {PROCESSES} processes x {} threads, {}, {secs} s ...",
            kind.threads(),
            kind.name()
        );
        runs.push(contend(&url, kind, secs, &mut admin));
    }
    report(&cheap, &floor, &runs, secs, started.elapsed());
}

// ---------------------------------------------------------------------------------------
// 1: uncontended pairs.

/// The uncontended figures, in µs, per row of `CHEAP_ROWS`.
struct Cheap {
    samples: Vec<Vec<f64>>,
    /// Per row, Redis's own figures for the row's commands (PING, or EVALSHA): calls and
    /// the server time they took.
    server: Vec<Stat>,
}

const CHEAP_ROWS: [&str; 7] = [
    "PING (pooled)",
    "read().lock() + drop",
    "  its scripts by hand",
    "acquire() + drop (1 permit)",
    "  its scripts by hand",
    "Lock lock() + drop (reference)",
    "  its scripts by hand",
];

impl Cheap {
    fn median(&self, row: usize) -> f64 {
        median(&self.samples[row])
    }
}

/// The Redis names of one object, as src/runtime/keys.rs makes them for a plain name:
/// the key `<prefix><object>{name}`, its auxiliary keys `<prefix>!<aux>:<object>{name}`.
struct Keys {
    /// In the scripts' order: the holds, the fence counter, the queue, the waiters, then
    /// the leases (read-write lock, semaphore) and the permits (semaphore).
    all: Vec<String>,
    /// The main keys of the name's other kinds (src/runtime/keys.rs `other_kinds`), which
    /// the acquire script takes last.
    others: Vec<String>,
}

impl Keys {
    fn new(prefix: &str, kind: Kind, name: &str) -> Keys {
        let object = match kind {
            Kind::Lock => "",
            Kind::Read => "!rw:",
            Kind::Sem => "!sem:",
            Kind::Naive => unreachable!("the naive lock has no redmutex keys"),
        };
        let rest = format!("{object}{{{name}}}");
        let key = format!("{prefix}{rest}");
        let aux = |what: &str| format!("{prefix}!{what}:{rest}");
        let mut all = vec![key.clone(), aux("fence"), aux("queue"), aux("waiters")];
        if kind != Kind::Lock {
            all.push(aux("leases"));
        }
        if kind == Kind::Sem {
            all.push(aux("permits"));
        }
        let others = ["", "!rw:", "!sem:", "!latch:"]
            .into_iter()
            .filter(|mark| *mark != object)
            .map(|mark| format!("{prefix}{mark}{{{name}}}"))
            .collect();
        Keys { all, others }
    }
}

/// An object's acquire and release scripts, run by hand with the arguments the library
/// passes (src/primitives/lock.rs `attempt`, src/primitives/guard.rs `release`) for an
/// uncontended acquisition that would queue if it had to wait: not queued, no ticket.
struct HandRun {
    kind: Kind,
    acquire: redis::Script,
    release: redis::Script,
    keys: Keys,
    flags: u8,
}

impl HandRun {
    fn new(kind: Kind, prefix: &str) -> HandRun {
        let (acquire, release, flags) = match kind {
            Kind::Lock => ("acquire", "release", PLAIN_FLAGS),
            Kind::Read => ("rw_acquire", "rw_release", READ_FLAGS),
            Kind::Sem => ("sem_acquire", "sem_release", PERMIT_FLAGS),
            Kind::Naive => unreachable!("the naive lock has no redmutex scripts"),
        };
        HandRun {
            kind,
            acquire: redis::Script::new(&bundled_script(acquire)),
            release: redis::Script::new(&bundled_script(release)),
            keys: Keys::new(prefix, kind, name_of(kind)),
            flags,
        }
    }

    fn pair(&self, pool: &r2d2::Pool<redis::Client>) {
        // A holder id as the library makes them: "<client id>:<token>".
        let holder = "00000000-0000-4000-8000-000000000000:1";
        let mut con = pool.get().expect("pooled connection");
        let mut call = self.acquire.prepare_invoke();
        for key in self.keys.all.iter().chain(&self.keys.others) {
            call.key(key);
        }
        call.arg(holder)
            .arg(LEASE_MS)
            .arg(0)
            .arg(self.flags)
            .arg(0)
            .arg(0)
            .arg(0);
        if self.kind == Kind::Sem {
            // One permit of a semaphore made with SEM_PERMITS, whose definition outlives
            // its last lease by a day (the library's default).
            call.arg(1).arg(SEM_PERMITS).arg(86_400_000);
        }
        // A lock's grant without a fencing token is its bare count (lua/acquire.lua).
        let reply: Vec<i64> = match call.invoke(&mut *con).expect("acquire script") {
            redis::Value::Int(count) => vec![1, count, 0],
            table => redis::from_redis_value(table).expect("acquire reply"),
        };
        assert_eq!(reply, [1, 1, 0], "{:?} acquire script by hand", self.kind);
        drop(con);
        let mut con = pool.get().expect("pooled connection");
        let mut call = self.release.prepare_invoke();
        for key in &self.keys.all {
            call.key(key);
        }
        let reply = call
            .arg(holder)
            .arg(0)
            .arg(1)
            .arg(self.flags)
            .invoke(&mut *con)
            .expect("release script");
        // A lock's release that told nobody replies its levels left alone
        // (lua/release.lua).
        let (left, served): (i64, i64) = match reply {
            redis::Value::Int(left) => (left, 0),
            table => redis::from_redis_value(table).expect("release reply"),
        };
        assert_eq!(
            (left, served),
            (0, 0),
            "{:?} release script by hand",
            self.kind
        );
    }
}

fn cheap_latencies(url: &str, admin: &mut Admin) -> Cheap {
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

    let lib_prefix = unique_prefix("family", "cheap");
    let hand_prefix = unique_prefix("family", "cheap-by-hand");
    let client = bench_client(url, &lib_prefix);
    let read = client.read_write_lock(name_of(Kind::Read)).read_lock();
    let sem = client.semaphore(name_of(Kind::Sem), SEM_PERMITS);
    let lock = client.lock(name_of(Kind::Lock));
    let hand: Vec<HandRun> = [Kind::Read, Kind::Sem, Kind::Lock]
        .into_iter()
        .map(|k| HandRun::new(k, &hand_prefix))
        .collect();

    // The hand-run keys are the library's layout: while the library holds each object,
    // the keys computed for its prefix exist (holds and leases; the permits key always).
    {
        let _r = read.lock().expect("read lock");
        let _p = sem.acquire().expect("permit");
        let _l = lock.lock().expect("lock");
        for kind in [Kind::Read, Kind::Sem, Kind::Lock] {
            let keys = Keys::new(&lib_prefix, kind, name_of(kind));
            let mut want = vec![keys.all[0].clone()];
            want.extend(keys.all.get(4..).unwrap_or_default().iter().cloned());
            for key in want {
                assert!(
                    admin.exists(&key),
                    "{kind:?} held, but {key:?} does not exist: the hand-run layout is not the library's"
                );
            }
        }
    }

    let read_op = || drop(read.lock().expect("read lock"));
    let permit_op = || drop(sem.acquire().expect("permit"));
    let lock_op = || drop(lock.lock().expect("lock"));
    let ops: [&dyn Fn(); 7] = [
        &ping_op,
        &read_op,
        &|| hand[0].pair(&pool),
        &permit_op,
        &|| hand[1].pair(&pool),
        &lock_op,
        &|| hand[2].pair(&pool),
    ];
    for op in ops {
        time_ops(WARMUP_OPS, None, op);
    }
    let mut samples: Vec<Vec<f64>> = ops
        .iter()
        .map(|_| Vec::with_capacity(ROUNDS * OPS_PER_ROUND))
        .collect();
    let mut server = vec![Stat::default(); ops.len()];
    for _ in 0..ROUNDS {
        for (row, (op, out)) in ops.iter().zip(samples.iter_mut()).enumerate() {
            // The library's scripts run as FCALLs, those run by hand as EVALSHAs.
            let cmds: &[&str] = if row == 0 {
                &["ping"]
            } else {
                &["fcall", "evalsha"]
            };
            let before = admin.commandstats();
            time_ops(OPS_PER_ROUND, Some(out), op);
            let after = admin.commandstats();
            for cmd in cmds {
                if let Some(s) = after.get(*cmd) {
                    server[row].add(s.since(before.get(*cmd)));
                }
            }
        }
    }
    Cheap { samples, server }
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
// Floors.

fn floors(url: &str) -> Floor {
    let prefix = unique_prefix("family", "floor");
    let child = ChildProc::spawn(
        "floor",
        &[
            (ROLE_ENV, "floor"),
            (URL_ENV, url),
            (PREFIX_ENV, &prefix),
            (KIND_ENV, Kind::Lock.name()),
        ],
    );
    child.expect("ready");
    measure_floor(url, &format!("{prefix}channel"), child, hold)
}

// ---------------------------------------------------------------------------------------
// 2-3: contention.

struct Run {
    kind: Kind,
    acquired: Acquisitions,
    /// Calls per command during the run (`INFO commandstats` deltas; INFO left out).
    calls: HashMap<String, u64>,
    /// EVALSHA and EVAL during the run: calls and Redis's time running the scripts.
    scripts: Stat,
    /// What the run cost the Redis server (CPU, executed commands, requests).
    cost: ServerCost,
}

impl Run {
    fn scripts(&self) -> u64 {
        ["fcall", "evalsha", "eval"]
            .iter()
            .map(|c| self.calls.get(*c).copied().unwrap_or(0))
            .sum()
    }

    fn scripts_per_acq(&self) -> f64 {
        self.scripts() as f64 / self.acquired.total().max(1) as f64
    }

    /// Commands the clients sent (`top`) or scripts ran (not `top`), by name.
    fn calls_of(&self, top: bool) -> Vec<(&str, u64)> {
        let inside = script_commands();
        let mut v: Vec<(&str, u64)> = self
            .calls
            .iter()
            .filter(|(c, &n)| n > 0 && inside.contains(c.as_str()) != top)
            .map(|(c, &n)| (c.as_str(), n))
            .collect();
        v.sort_unstable();
        v
    }

    fn per_acq(&self, top: bool) -> f64 {
        let n: u64 = self.calls_of(top).iter().map(|&(_, n)| n).sum();
        n as f64 / self.acquired.total().max(1) as f64
    }

    fn calls_summary(&self, top: bool) -> String {
        let parts: Vec<String> = self
            .calls_of(top)
            .iter()
            .map(|(c, n)| format!("{c}={n}"))
            .collect();
        parts.join(", ")
    }

    /// The most holds seen at one instant, and the mean number held over the run.
    fn concurrency(&self) -> (i64, f64) {
        let mut edges: Vec<(u64, i64)> = Vec::new();
        let mut held_ns = 0u64;
        for &(a, r) in self.acquired.by_process.iter().flatten() {
            edges.push((a, 1));
            edges.push((r, -1));
            held_ns += r.saturating_sub(a);
        }
        // A release at the same instant as an acquisition ends first.
        edges.sort_unstable();
        let (mut now, mut max) = (0i64, 0i64);
        for (_, d) in edges {
            now += d;
            max = max.max(now);
        }
        let mean = held_ns as f64 / 1e9 / self.acquired.seconds();
        (max, mean)
    }
}

fn contend(url: &str, kind: Kind, secs: f64, admin: &mut Admin) -> Run {
    let prefix = unique_prefix("family", &format!("contend-{}", kind.name()));
    let mut children = spawn_workers(
        PROCESSES,
        ROLE_ENV,
        "contend",
        &[
            (KIND_ENV, kind.name()),
            (URL_ENV, url),
            (PREFIX_ENV, &prefix),
        ],
    );
    // Warm-ups one process at a time (and one thread at a time in each): nobody queues,
    // nothing is handed on, so no check of a handoff lands in the measured run.
    for c in &mut children {
        c.send("warm");
        c.expect("ready");
    }
    let before = admin.commandstats();
    let cost_from = ServerSnapshot::take(&mut admin.con);
    let acquired = Acquisitions::run(
        children,
        secs,
        STUCK,
        &format!("a {} worker hung", kind.name()),
    );
    let cost = ServerSnapshot::take(&mut admin.con).since(&cost_from);
    let after = admin.commandstats();
    let calls = after
        .iter()
        .filter(|(c, _)| c.as_str() != "info")
        .map(|(c, s)| (c.clone(), s.since(before.get(c)).calls))
        .collect();
    let mut scripts = Stat::default();
    for c in ["fcall", "evalsha", "eval"] {
        if let Some(s) = after.get(c) {
            scripts.add(s.since(before.get(c)));
        }
    }
    Run {
        kind,
        acquired,
        calls,
        scripts,
        cost,
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
        "floor" => child_floor(&url, &prefix),
        other => panic!("{ROLE_ENV}={other:?}: expected contend or floor"),
    }
}

/// One thread's handle on the object under test.
enum Handle {
    Read(redmutex::ReadLock),
    Lock(redmutex::Lock),
    Sem(redmutex::Semaphore),
    Naive(Arc<Naive>),
}

enum Held {
    Read(redmutex::ReadGuard),
    Lock(redmutex::LockGuard),
    Sem(redmutex::Permit),
    Naive(Arc<Naive>, String),
}

/// One thread's naive lock: its own connection, its token counter.
struct Naive {
    con: Mutex<(redis::Connection, u64)>,
    key: String,
    token: String,
    lock: common::NaiveLock,
}

impl Handle {
    fn new(kind: Kind, client: &Client, url: &str, prefix: &str) -> Handle {
        match kind {
            Kind::Naive => Handle::Naive(Arc::new(Naive {
                con: Mutex::new((connect(url), 0)),
                key: format!("{prefix}naive:{NAME}"),
                token: format!("{}:{:?}", std::process::id(), thread::current().id()),
                lock: common::NaiveLock::new(),
            })),
            Kind::Read => Handle::Read(client.read_write_lock(name_of(kind)).read_lock()),
            Kind::Lock => Handle::Lock(client.lock(name_of(kind))),
            Kind::Sem => Handle::Sem(client.semaphore(name_of(kind), SEM_PERMITS)),
        }
    }

    fn acquire(&self) -> Held {
        match self {
            Handle::Read(l) => Held::Read(l.lock().expect("read lock")),
            Handle::Lock(l) => Held::Lock(l.lock().expect("lock")),
            Handle::Sem(s) => Held::Sem(s.acquire().expect("acquire a permit")),
            Handle::Naive(n) => loop {
                let mut con = n.con.lock().expect("naive connection");
                con.1 += 1;
                let mine = format!("{}:{}", n.token, con.1);
                let taken = n.lock.try_lock(&mut con.0, &n.key, &mine, LEASE_MS);
                drop(con);
                if taken {
                    break Held::Naive(n.clone(), mine);
                }
                thread::sleep(NAIVE_POLL);
            },
        }
    }
}

impl Held {
    /// Released explicitly, so that a failed release fails the bench (a drop only logs).
    fn release(self) {
        match self {
            Held::Read(g) => g.unlock().expect("read unlock"),
            Held::Lock(g) => g.unlock().expect("unlock"),
            Held::Sem(p) => p.release().expect("release the permit"),
            Held::Naive(n, mine) => {
                let mut con = n.con.lock().expect("naive connection");
                n.lock.unlock(&mut con.0, &n.key, mine);
            }
        }
    }
}

fn child_contend(kind: Kind, url: &str, prefix: &str) {
    let client = bench_client(url, prefix);
    let threads = kind.threads();
    assert_eq!(read_line(), "warm", "unexpected parent line");
    let one_at_a_time = Arc::new(Mutex::new(()));
    let ready = Arc::new(Barrier::new(threads + 1));
    let go = Arc::new(Barrier::new(threads + 1));
    let window: Arc<OnceLock<(u64, u64)>> = Arc::new(OnceLock::new());
    let results = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (client, url, prefix) = (client.clone(), url.to_owned(), prefix.to_owned());
            let (ready, go, window) = (ready.clone(), go.clone(), window.clone());
            let (results, one_at_a_time) = (results.clone(), one_at_a_time.clone());
            thread::spawn(move || {
                let handle = Handle::new(kind, &client, &url, &prefix);
                {
                    let _turn = one_at_a_time.lock().expect("warm-up turn");
                    handle.acquire().release();
                }
                ready.wait();
                go.wait();
                let window = *window.get().expect("the run's window");
                let events = work_window(window, || handle.acquire(), hold, |held| held.release());
                results.lock().expect("results").extend(events);
            })
        })
        .collect();
    ready.wait();
    say("ready");
    window.set(read_window()).expect("one window");
    go.wait();
    for t in workers {
        t.join().expect("worker thread");
    }
    report_events(results.lock().expect("results").iter());
}

fn child_floor(url: &str, prefix: &str) {
    let script = redis::Script::new(NOOP);
    serve_floor(url, &format!("{prefix}channel"), |con| {
        let _: i64 = script.invoke(con).expect("EVALSHA");
    });
}

// ---------------------------------------------------------------------------------------
// Report.

fn report(cheap: &Cheap, floor: &Floor, runs: &[Run], secs: f64, elapsed: Duration) {
    let mut out = String::new();
    let ping = cheap.median(0);

    let _ = writeln!(
        out,
        "\nuncontended pairs (µs; n={} each, {ROUNDS} interleaved rounds; watchdog leases)",
        ROUNDS * OPS_PER_ROUND
    );
    let mut t = Grid::new(&[
        "",
        "p10",
        "median",
        "p90",
        "x PING",
        "x scripts",
        "cmds/op",
        "Redis µs/cmd",
    ]);
    for (i, name) in CHEAP_ROWS.iter().enumerate() {
        let s = &cheap.samples[i];
        let m = median(s);
        // Rows 1, 3, 5 are library pairs, the row after each its scripts by hand.
        let vs_scripts = if i % 2 == 1 {
            f2(m / cheap.median(i + 1))
        } else {
            String::new()
        };
        t.row(
            name,
            vec![
                f1(percentile(s, 0.10)),
                f1(m),
                f1(percentile(s, 0.90)),
                f2(m / ping),
                vs_scripts,
                f2(cheap.server[i].calls as f64 / s.len() as f64),
                f1(cheap.server[i].usec_per_call()),
            ],
        );
    }
    let _ = write!(out, "{}", t.render());

    let by_kind = |k: Kind| runs.iter().find(|r| r.kind == k).expect("every kind ran");
    let read = by_kind(Kind::Read);
    let lock = by_kind(Kind::Lock);
    let sem = by_kind(Kind::Sem);
    let hold_us = median(&floor.sleep);
    let delivery = median(&floor.delivery);
    let read_pair = cheap.median(1);
    let readers = (PROCESSES * READER_THREADS) as f64;
    let read_ceiling = readers * 1e6 / (hold_us + read_pair);
    let mutex_ceiling = 1e6 / (hold_us + delivery);
    let sem_ceiling = f64::from(SEM_PERMITS) * 1e6 / (hold_us + delivery);

    let _ = writeln!(
        out,
        "\ncontention: lock -> sleep(1 ms) -> release, {secs} s per kind; read-write lock and \
         Lock: {PROCESSES} processes x {READER_THREADS} threads; Semaphore({SEM_PERMITS}): \
         {PROCESSES} x {SEM_THREADS}"
    );
    let mut t = Grid::new(&["", "read-write (read)", "Lock", "Semaphore(4)", "naive"]);
    let col = |f: &dyn Fn(&Run) -> String| -> Vec<String> { runs.iter().map(f).collect() };
    t.row("acquisitions/s", col(&|r| f1(r.acquired.rate())));
    t.row("acquisitions", col(&|r| r.acquired.total().to_string()));
    t.row("  over s", col(&|r| f2(r.acquired.seconds())));
    t.row(
        "per process",
        col(&|r| {
            r.acquired
                .counts()
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("/")
        }),
    );
    t.row("least/most", col(&|r| f2(least_most(&r.acquired.counts()))));
    t.row("Jain index", col(&|r| f3(jain(&r.acquired.counts()))));
    t.row("scripts / acq", col(&|r| f2(r.scripts_per_acq())));
    t.row("requests / acq (all sent)", col(&|r| f2(r.per_acq(true))));
    t.row(
        "commands inside scripts / acq",
        col(&|r| f2(r.per_acq(false))),
    );
    t.row(
        "max holders at once",
        col(&|r| r.concurrency().0.to_string()),
    );
    t.row("mean holders", col(&|r| f2(r.concurrency().1)));
    t.row("Redis µs / script", col(&|r| f1(r.scripts.usec_per_call())));
    t.row(
        "Redis busy in scripts",
        col(&|r| format!("{:.0}%", r.scripts.usec as f64 / 1e4 / r.acquired.seconds())),
    );
    t.row(
        "ceiling acquisitions/s",
        vec![
            f1(read_ceiling),
            f1(mutex_ceiling),
            f1(sem_ceiling),
            f1(mutex_ceiling),
        ],
    );
    let naive = by_kind(Kind::Naive);
    server_cost_rows(
        &mut t,
        &runs
            .iter()
            .map(|r| (&r.cost, r.acquired.total()))
            .collect::<Vec<_>>(),
        Some((&naive.cost, naive.acquired.total())),
    );
    let _ = write!(out, "{}", t.render());
    let _ = writeln!(
        out,
        "  ceilings: read 8 / (hold + uncontended read pair); Lock 1 / (hold + PUBLISH->received); \
         Semaphore 4 / (hold + PUBLISH->received)"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "  {} requests: {}",
            r.kind.name(),
            r.calls_summary(true)
        );
    }
    let _ = writeln!(
        out,
        "  executed commands per acquisition, by name (INFO commandstats, scripts included):"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "  {:<9} {}",
            r.kind.name(),
            r.cost.breakdown(r.acquired.total())
        );
    }

    let _ = writeln!(
        out,
        "\nfloors (same run; µs p50 / p99): hold sleep(1 ms) {:.1} / {:.1}; PUBLISH -> received \
         in another process {:.1} / {:.1}; ... + one EVALSHA {:.1} / {:.1}",
        hold_us,
        percentile(&floor.sleep, 0.99),
        delivery,
        percentile(&floor.delivery, 0.99),
        median(&floor.delivery_rtt),
        percentile(&floor.delivery_rtt, 0.99),
    );

    let mut t = Targets::default();
    let speedup = read.acquired.rate() / lock.acquired.rate();
    t.check(
        "read throughput / Lock throughput",
        format!("{speedup:.2}x"),
        ">= 3x",
        speedup >= 3.0,
        &format!(
            "{:.1}/s vs {:.1}/s; ceilings {:.1}/s vs {:.1}/s = {:.2}x",
            read.acquired.rate(),
            lock.acquired.rate(),
            read_ceiling,
            mutex_ceiling,
            read_ceiling / mutex_ceiling
        ),
    );
    let req = sem.scripts_per_acq();
    t.check(
        "Semaphore requests/acq (EVALSHA+EVAL)",
        f2(req),
        "<= 2.5",
        req <= 2.5,
        &format!("all requests sent {:.2}", sem.per_acq(true)),
    );
    let lock_max = lock.concurrency().0;
    t.check(
        "Lock: max holders at once",
        lock_max.to_string(),
        "== 1",
        lock_max == 1,
        "",
    );
    let sem_max = sem.concurrency().0;
    t.check(
        "Semaphore(4): max holders at once",
        sem_max.to_string(),
        "<= 4",
        sem_max <= i64::from(SEM_PERMITS),
        "",
    );
    let _ = write!(out, "\n{}", t.render());
    let _ = writeln!(out, "figures without a target:");
    for (name, row) in [("read pair", 1), ("permit pair", 3), ("Lock pair", 5)] {
        let _ = writeln!(
            out,
            "  {name:<12} {:.2}x PING, {:.2}x its scripts by hand",
            cheap.median(row) / ping,
            cheap.median(row) / cheap.median(row + 1),
        );
    }
    let _ = writeln!(
        out,
        "  readers      {:.1}/s = {:.0}% of their ceiling {:.1}/s; at most {} of 8 held at once, \
         {:.2} on average",
        read.acquired.rate(),
        100.0 * read.acquired.rate() / read_ceiling,
        read_ceiling,
        read.concurrency().0,
        read.concurrency().1,
    );
    let _ = writeln!(
        out,
        "  Semaphore(4) {:.1}/s = {:.0}% of its ceiling {:.1}/s; per process least/most {:.2}, \
         Jain {:.3}",
        sem.acquired.rate(),
        100.0 * sem.acquired.rate() / sem_ceiling,
        sem_ceiling,
        least_most(&sem.acquired.counts()),
        jain(&sem.acquired.counts()),
    );
    let _ = writeln!(out, "whole bench took {:.1} s", elapsed.as_secs_f64());
    print!("{out}");
}

/// The commands the bundled scripts run (`redis.call('<name>'`), lowercase.
fn script_commands() -> HashSet<&'static str> {
    ALL_LUA
        .iter()
        .flat_map(|part| part.text.split("redis.call('").skip(1))
        .filter_map(|rest| rest.split_once('\'').map(|(name, _)| name))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Shared helpers.

/// One command's figures in `INFO commandstats`.
#[derive(Clone, Copy, Default)]
struct Stat {
    calls: u64,
    /// Server time spent in the command (a script's: its whole run).
    usec: u64,
}

impl Stat {
    fn since(self, before: Option<&Stat>) -> Stat {
        let before = before.copied().unwrap_or_default();
        Stat {
            calls: self.calls - before.calls,
            usec: self.usec - before.usec,
        }
    }

    fn add(&mut self, other: Stat) {
        self.calls += other.calls;
        self.usec += other.usec;
    }

    fn usec_per_call(self) -> f64 {
        self.usec as f64 / self.calls.max(1) as f64
    }
}

/// What this bench asks of the server besides the common questions.
impl Admin {
    /// Calls and µs of server time per command (lowercase) since the server started, from
    /// `INFO commandstats`.
    fn commandstats(&mut self) -> HashMap<String, Stat> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.con)
            .expect("INFO commandstats");
        info.lines()
            .filter_map(|line| {
                let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |key: &str| -> Option<u64> {
                    stats
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(key))?
                        .parse()
                        .ok()
                };
                let stat = Stat {
                    calls: field("calls=")?,
                    usec: field("usec=")?,
                };
                Some((name.to_ascii_lowercase(), stat))
            })
            .collect()
    }

    fn exists(&mut self, key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<u64>(&mut self.con)
            .expect("EXISTS")
            == 1
    }
}

/// The 1 ms critical section.
fn hold() {
    thread::sleep(HOLD);
}
