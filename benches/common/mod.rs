//! What the benchmark harnesses share (`mod common;` in each): a toolbox of
//! connections, clocks, statistics and the printed tables. The servers and child
//! processes come from `tests/support`, like the tests'.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redmutex::Client;

use crate::support::child::{say, ChildProc};

/// What a bench's parent tells the workers it starts (its own binary, run again): the
/// role (set only in a worker), the kind of lock, the server and the key prefix. Each
/// bench's workers are its own, so one set of names serves every bench.
pub const ROLE_ENV: &str = "REDMUTEX_BENCH_ROLE";
pub const KIND_ENV: &str = "REDMUTEX_BENCH_KIND";
pub const URL_ENV: &str = "REDMUTEX_BENCH_URL";
pub const PREFIX_ENV: &str = "REDMUTEX_BENCH_PREFIX";

pub fn least_most(counts: &[u64]) -> f64 {
    let most = counts.iter().copied().max().unwrap_or(0);
    let least = counts.iter().copied().min().unwrap_or(0);
    if most == 0 {
        return f64::NAN;
    }
    least as f64 / most as f64
}

/// Jain's fairness index: (Σx)² / (n·Σx²), 1 when all are equal, 1/n when one gets all.
pub fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return f64::NAN;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// One timed operation of an uncontended table.
pub type Op<'a> = Box<dyn FnMut() + 'a>;

/// Times `ops` (each warmed up `warmup` times first) in `rounds` interleaved rounds of
/// `per_round` calls each, so a slow phase of a noisy machine hits every figure alike:
/// each operation's samples, in µs.
pub fn interleaved(
    ops: &mut [(&str, Op)],
    warmup: usize,
    rounds: usize,
    per_round: usize,
) -> Vec<Vec<f64>> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
    for (_, op) in ops.iter_mut() {
        for _ in 0..warmup {
            op();
        }
    }
    for _ in 0..rounds {
        for (i, (_, op)) in ops.iter_mut().enumerate() {
            for _ in 0..per_round {
                let t = Instant::now();
                op();
                samples[i].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    samples
}

/// A table of figures per kind.
pub struct Grid {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Grid {
    pub fn new(header: &[&str]) -> Grid {
        Grid {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, name: &str, cells: Vec<String>) {
        let mut row = vec![name.to_owned()];
        row.extend(cells);
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let all = || std::iter::once(&self.header).chain(&self.rows);
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| all().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in all() {
            let mut line = format!("  {:<w$}", r[0], w = widths[0]);
            for (cell, w) in r.iter().zip(&widths).skip(1) {
                let _ = write!(line, "  {cell:>w$}");
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[derive(Default)]
pub struct Targets {
    rows: Vec<[String; 5]>,
}

impl Targets {
    pub fn check(&mut self, name: &str, value: String, target: &str, ok: bool, note: &str) {
        let ok = if ok { "PASS" } else { "FAIL <<<" };
        self.rows.push([
            name.to_owned(),
            value,
            target.to_owned(),
            ok.to_owned(),
            note.to_owned(),
        ]);
    }

    /// A figure printed among the targets that is no target (a floor): neither PASS nor
    /// FAIL.
    pub fn info(&mut self, name: &str, value: String, note: &str) {
        self.rows.push([
            name.to_owned(),
            value,
            "-".to_owned(),
            "info".to_owned(),
            note.to_owned(),
        ]);
    }

    pub fn render(&self) -> String {
        let w0 = self.rows.iter().map(|r| r[0].chars().count()).max();
        let w0 = w0.unwrap_or(0).max("targets".len());
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<w0$}  {:>10}  {:>10}  ok",
            "targets", "measured", "target"
        );
        for [name, value, target, ok, note] in &self.rows {
            let note = if note.is_empty() {
                String::new()
            } else {
                format!("  ({note})")
            };
            let line = format!("{name:<w0$}  {value:>10}  {target:>10}  {ok:<8}{note}");
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let count = |ok: &str| self.rows.iter().filter(|r| r[3].starts_with(ok)).count();
        let _ = writeln!(
            out,
            "targets: {} PASS, {} FAIL",
            count("PASS"),
            count("FAIL")
        );
        out
    }
}

/// The parent's admin connection: its reads give up after `stuck`, so a hung server fails
/// the bench instead of freezing it.
pub fn admin_connection(url: &str, stuck: Duration) -> redis::Connection {
    let con = connect(url);
    con.set_read_timeout(Some(stuck)).expect("set read timeout");
    con
}

/// The parent's one admin connection, opened before any measurement so that its own setup
/// is never counted (each bench adds the questions it asks).
pub struct Admin {
    pub con: redis::Connection,
}

impl Admin {
    pub fn new(url: &str, stuck: Duration) -> Admin {
        Admin {
            con: admin_connection(url, stuck),
        }
    }

    pub fn redis_version(&mut self) -> String {
        crate::support::redis_version(&mut self.con)
    }

    /// Calls of `cmd` (lowercase) since the server started, from `INFO commandstats`.
    pub fn calls(&mut self, cmd: &str) -> u64 {
        crate::support::commandstats(&mut self.con)
            .get(cmd)
            .copied()
            .unwrap_or(0)
    }
}

/// This process's resident memory, KiB, from /proc/self/status (Linux only).
pub fn rss_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
}

/// The one of `kinds` that `name` calls `s` (a worker's kind, sent in `KIND_ENV`).
pub fn kind_named<K: Copy>(kinds: &[K], name: fn(K) -> &'static str, s: &str) -> K {
    kinds
        .iter()
        .copied()
        .find(|&k| name(k) == s)
        .unwrap_or_else(|| {
            let names: Vec<&str> = kinds.iter().map(|&k| name(k)).collect();
            panic!("{KIND_ENV}={s:?}: expected one of {names:?}")
        })
}

/// A positive number from the environment variable `name`; `default` when it is unset.
pub fn env_f64(name: &str, default: f64) -> f64 {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => s,
            _ => panic!("{name}={v:?}: expected a positive number"),
        },
        Err(_) => default,
    }
}

/// Prints the command that repeats this run (those of `vars` that are set, then
/// `cargo bench --bench <bench>`) and returns what the figures were taken on:
/// `redis <version> (<where>), <n> CPUs`.
pub fn run_on(
    bench: &str,
    vars: &[&str],
    url: &str,
    server: Option<&crate::support::RedisServer>,
    version: &str,
) -> String {
    let mut command = String::new();
    for var in vars {
        if let Ok(v) = std::env::var(var) {
            let _ = write!(command, "{var}={v} ");
        }
    }
    command.push_str("cargo bench --bench ");
    command.push_str(bench);
    println!("command: {command}");
    let origin = match server {
        Some(s) => format!("spawned, port {}", s.port()),
        None => url.to_owned(),
    };
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    format!("redis {version} ({origin}), {cpus} CPUs")
}

pub fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to redis")
}

pub fn bench_client(url: &str, prefix: &str) -> Client {
    Client::builder()
        .url(url)
        .key_prefix(prefix)
        .use_functions(use_functions())
        .build()
        .expect("build client")
}

/// Whether the benches' clients run the scripts as the library's functions (the default),
/// or with EVALSHA when `REDMUTEX_BENCH_EVALSHA=1`: what the scripts cost sent either way.
pub fn use_functions() -> bool {
    std::env::var("REDMUTEX_BENCH_EVALSHA").map_or(true, |v| v != "1")
}

/// The command the benches' clients run their scripts with (see [`use_functions`]).
pub fn script_command() -> &'static str {
    if use_functions() {
        "fcall"
    } else {
        "evalsha"
    }
}

/// A key prefix of its own per phase, so a shared `REDIS_URL` server is harmless.
pub fn unique_prefix(bench: &str, what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("redmutex-{bench}:{nanos}:{what}:")
}

/// CLOCK_MONOTONIC in ns: one clock for all processes of the machine (Linux).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn sleep_until_mono(at: u64) {
    let now = mono_ns();
    if at > now {
        thread::sleep(Duration::from_nanos(at - now));
    }
}

pub fn us_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e3
}

pub fn parse_u64(s: &str) -> u64 {
    s.parse()
        .unwrap_or_else(|_| panic!("expected a number, got {s:?}"))
}

pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn f1(v: f64) -> String {
    format!("{v:.1}")
}

pub fn f2(v: f64) -> String {
    format!("{v:.2}")
}

pub fn f3(v: f64) -> String {
    format!("{v:.3}")
}

/// Floor samples before any is kept.
pub const FLOOR_WARMUP: usize = 50;
pub const FLOOR_SAMPLES: usize = 1_000;
/// Samples of the 1 ms hold itself.
pub const SLEEP_SAMPLES: usize = 300;

/// What Redis and the machine allow a handoff, measured with raw commands in the same run.
pub struct Floor {
    /// PUBLISH sent (parent) -> message read by a subscriber in another process, µs.
    pub delivery: Vec<f64>,
    /// The same plus one EVALSHA round trip by that process, µs.
    pub delivery_rtt: Vec<f64>,
    /// EVALSHA round trips alone, µs.
    pub rtt: Vec<f64>,
    /// The 1 ms hold as it really lasts here, µs.
    pub sleep: Vec<f64>,
}

/// The parent's side of the floor: `child`, running [`serve_floor`] on `channel`, is sent
/// one message per sample and answers with when it read it and when its EVALSHA returned;
/// it is told to quit and waited for at the end.
pub fn measure_floor(url: &str, channel: &str, child: ChildProc, hold: impl Fn()) -> Floor {
    let mut con = connect(url);
    let mut out = Floor {
        delivery: Vec::new(),
        delivery_rtt: Vec::new(),
        rtt: Vec::new(),
        sleep: Vec::new(),
    };
    for i in 0..FLOOR_WARMUP + FLOOR_SAMPLES {
        // The same idle pattern as the loops it is the floor of: a 1 ms hold, then the
        // handoff. (Back to back, on a warm CPU and a warm Redis, the figures are about
        // half: that is not what a handoff after a critical section meets.)
        hold();
        let t0 = mono_ns();
        let receivers: u64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(i)
            .query(&mut con)
            .expect("PUBLISH");
        assert_eq!(receivers, 1, "the floor child is not subscribed");
        let line = child.next_line();
        let (t1, t2) = line
            .split_once(' ')
            .map(|(a, b)| (parse_u64(a), parse_u64(b)))
            .expect("`t1 t2` from the floor child");
        if i >= FLOOR_WARMUP {
            out.delivery.push(us_between(t0, t1));
            out.delivery_rtt.push(us_between(t0, t2));
            out.rtt.push(us_between(t1, t2));
        }
    }
    let _: u64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg("quit")
        .query(&mut con)
        .expect("PUBLISH quit");
    child.wait_success();
    for _ in 0..SLEEP_SAMPLES {
        let t = Instant::now();
        hold();
        out.sleep.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// The floor child's side: subscribes to `channel`, says "ready", then answers each
/// message with `<read at> <rtt done at>` after one `rtt` round trip, until "quit".
pub fn serve_floor(url: &str, channel: &str, mut rtt: impl FnMut(&mut redis::Connection)) {
    let mut sub = connect(url);
    let mut con = connect(url);
    rtt(&mut con);
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel).expect("SUBSCRIBE");
    say("ready");
    loop {
        let msg = pubsub.get_message().expect("floor message");
        let t1 = mono_ns();
        let payload: String = msg.get_payload().expect("payload");
        if payload == "quit" {
            break;
        }
        rtt(&mut con);
        let t2 = mono_ns();
        say(&format!("{t1} {t2}"));
    }
}

/// One line from the parent, on a worker's stdin.
pub fn read_line() -> String {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .expect("read from the parent");
    line.trim_end().to_owned()
}

/// A variable the parent sets for its workers.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// What the Redis server reports about itself at one moment (`INFO all`, one request):
/// its process CPU, the calls per command (those run inside scripts included) and its
/// request counters. Two of them around a run give [`ServerCost`].
pub struct ServerSnapshot {
    cpu_s: f64,
    calls: BTreeMap<String, u64>,
    commands: u64,
    reads: u64,
}

impl ServerSnapshot {
    /// Takes one snapshot on `con`. Keep `con` otherwise idle between the two snapshots
    /// of a run: whatever it sends in between is counted as the run's.
    pub fn take(con: &mut redis::Connection) -> ServerSnapshot {
        let info: String = redis::cmd("INFO").arg("all").query(con).expect("INFO all");
        let field = |name: &str| -> &str {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {name} in INFO all"))
        };
        let secs = |name: &str| -> f64 {
            field(name)
                .parse()
                .unwrap_or_else(|_| panic!("{name} is not a number"))
        };
        let calls = info
            .lines()
            .filter_map(|line| {
                let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let n = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_ascii_lowercase(), n.parse().ok()?))
            })
            .collect();
        ServerSnapshot {
            cpu_s: secs("used_cpu_user") + secs("used_cpu_sys"),
            calls,
            commands: parse_u64(field("total_commands_processed")),
            reads: parse_u64(field("total_reads_processed")),
        }
    }

    /// What the server did from `before` to this snapshot, less the snapshots' own
    /// traffic: `before`'s INFO is counted once it has run (so it lands in the
    /// difference), and this one's request was read before it ran.
    pub fn since(&self, before: &ServerSnapshot) -> ServerCost {
        let mut executed = BTreeMap::new();
        for (name, &n) in &self.calls {
            let mut d = n.saturating_sub(before.calls.get(name).copied().unwrap_or(0));
            if name == "info" {
                d = d.saturating_sub(1);
            }
            if d > 0 {
                executed.insert(name.clone(), d);
            }
        }
        ServerCost {
            cpu_us: (self.cpu_s - before.cpu_s).max(0.0) * 1e6,
            executed,
            commands: self.commands.saturating_sub(before.commands + 1),
            reads: self.reads.saturating_sub(before.reads + 1),
        }
    }
}

/// What one run cost the Redis server, from two [`ServerSnapshot`]s.
#[derive(Default, Clone)]
pub struct ServerCost {
    /// Server process CPU, user + sys (`INFO cpu`), µs. Every thread of the process, so
    /// background work (expiry, lazy free) the run caused counts too.
    pub cpu_us: f64,
    /// Commands executed, by name (`INFO commandstats`): those run inside scripts
    /// included, each script call counted once more as itself.
    pub executed: BTreeMap<String, u64>,
    /// `total_commands_processed` (INFO stats); Redis 7 counts script-internal ones too.
    pub commands: u64,
    /// Read events on client sockets (`total_reads_processed`): one per request for
    /// clients that wait for each reply, as these do (no pipelining), so "requests".
    pub reads: u64,
}

impl ServerCost {
    /// Snapshot, run `f`, snapshot: what `f` cost the server, and what it returned.
    pub fn measure<T>(con: &mut redis::Connection, f: impl FnOnce() -> T) -> (ServerCost, T) {
        let before = ServerSnapshot::take(con);
        let out = f();
        (ServerSnapshot::take(con).since(&before), out)
    }

    /// [`ServerCost::measure`] over several servers (a RedLock's masters): their costs
    /// summed.
    pub fn measure_all<T>(
        cons: &mut [redis::Connection],
        f: impl FnOnce() -> T,
    ) -> (ServerCost, T) {
        let before: Vec<ServerSnapshot> = cons.iter_mut().map(ServerSnapshot::take).collect();
        let out = f();
        let mut sum = ServerCost::default();
        for (con, b) in cons.iter_mut().zip(&before) {
            sum.add(&ServerSnapshot::take(con).since(b));
        }
        (sum, out)
    }

    /// Adds `other`'s run to this one (runs measured in chunks, interleaved with another
    /// kind's so that a slow phase of a busy machine weighs on both alike).
    pub fn add(&mut self, other: &ServerCost) {
        self.cpu_us += other.cpu_us;
        for (name, n) in &other.executed {
            *self.executed.entry(name.clone()).or_insert(0) += n;
        }
        self.commands += other.commands;
        self.reads += other.reads;
    }

    pub fn executed_total(&self) -> u64 {
        self.executed.values().sum()
    }

    /// Redis CPU µs per operation.
    pub fn cpu_per(&self, ops: u64) -> f64 {
        self.cpu_us / ops.max(1) as f64
    }

    /// Executed commands (script-internal included) per operation.
    pub fn executed_per(&self, ops: u64) -> f64 {
        self.executed_total() as f64 / ops.max(1) as f64
    }

    /// Requests (socket reads) per operation.
    pub fn requests_per(&self, ops: u64) -> f64 {
        self.reads as f64 / ops.max(1) as f64
    }

    /// Executed commands per operation by name, most first: `hget 6.29, exists 4.65, ...`.
    pub fn breakdown(&self, ops: u64) -> String {
        let mut v: Vec<(&String, &u64)> = self.executed.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = v
            .iter()
            .map(|(name, &n)| format!("{name} {:.2}", n as f64 / ops.max(1) as f64))
            .collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// The server-cost rows of a table, one column per cost: Redis CPU µs, executed
/// commands and requests per operation, and each kind's CPU as a multiple of `floor`'s
/// (the naive lock measured in the same run).
pub fn server_cost_rows(
    grid: &mut Grid,
    columns: &[(&ServerCost, u64)],
    floor: Option<(&ServerCost, u64)>,
) {
    let floors: Vec<(&str, &ServerCost, u64)> =
        floor.into_iter().map(|(c, n)| ("naive", c, n)).collect();
    server_cost_rows_vs(grid, columns, &floors);
}

/// [`server_cost_rows`] with each kind's CPU and executed commands as multiples of every
/// one of `floors` (name, cost, operations), all measured in the same run.
pub fn server_cost_rows_vs(
    grid: &mut Grid,
    columns: &[(&ServerCost, u64)],
    floors: &[(&str, &ServerCost, u64)],
) {
    let col = |f: &dyn Fn(&ServerCost, u64) -> String| -> Vec<String> {
        columns.iter().map(|&(c, n)| f(c, n)).collect()
    };
    type Per = fn(&ServerCost, u64) -> f64;
    let rows: [(&str, &str, Per, usize); 2] = [
        ("Redis CPU µs/op", "Redis CPU", ServerCost::cpu_per, 1),
        (
            "executed commands/op (scripts incl.)",
            "executed",
            ServerCost::executed_per,
            2,
        ),
    ];
    for (label, what, per, digits) in rows {
        grid.row(label, col(&|c, n| format!("{:.*}", digits, per(c, n))));
        for &(name, fc, fn_) in floors {
            let base = per(fc, fn_);
            grid.row(
                &format!("  x {name} ({what})"),
                col(&|c, n| format!("{:.2}x", per(c, n) / base)),
            );
        }
    }
    grid.row(
        "requests/op (socket reads)",
        col(&|c, n| f2(c.requests_per(n))),
    );
}

/// The floor every bench measures redmutex against: an rslock-style lock, taken with
/// `SET key token NX PX lease` (callers poll on failure) and given back by a script that
/// deletes the key only while it holds the caller's token.
pub struct NaiveLock {
    release: redis::Script,
}

impl NaiveLock {
    pub fn new() -> NaiveLock {
        NaiveLock {
            release: redis::Script::new(
                r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"#,
            ),
        }
    }

    /// One try: true when `key` was free and now holds `token` for `lease_ms`.
    pub fn try_lock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        token: impl redis::ToRedisArgs,
        lease_ms: u64,
    ) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .query(con)
            .expect("SET NX PX");
        set.is_some()
    }

    /// Gives `key` back; fails the bench if it no longer held `token` (a bench whose
    /// naive lock expired under it measured nothing).
    pub fn unlock(&self, con: &mut redis::Connection, key: &str, token: impl redis::ToRedisArgs) {
        let deleted = self.compare_and_delete(con, key, token);
        assert_eq!(deleted, 1, "the naive lock was not ours any more");
    }

    /// The release script alone: 1 when it deleted the key (the floors' one script round
    /// trip runs it on a key that does not exist).
    pub fn compare_and_delete(
        &self,
        con: &mut redis::Connection,
        key: &str,
        token: impl redis::ToRedisArgs,
    ) -> i64 {
        self.release
            .key(key)
            .arg(token)
            .invoke(con)
            .expect("compare-and-delete")
    }
}

/// The floor of the design itself: the least a reentrant lock kept in a hash by Lua
/// scripts can run (take: EXISTS, HINCRBY, PEXPIRE; give back: HEXISTS, HINCRBY, DEL,
/// PUBLISH to wake waiters), no queue, no fencing, no fairness, as EVALSHA calls.
pub struct HashLock {
    take: redis::Script,
    give: redis::Script,
}

impl HashLock {
    pub fn new() -> HashLock {
        HashLock {
            take: redis::Script::new(
                r#"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"#,
            ),
            give: redis::Script::new(
                r#"
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 'free')
return 1
"#,
            ),
        }
    }

    /// One uncontended take + give back of `key` (waking nobody on `channel`).
    pub fn pair(&self, con: &mut redis::Connection, key: &str, channel: &str) {
        let taken: Option<i64> = self
            .take
            .key(key)
            .arg(30_000u64)
            .arg("holder:1")
            .invoke(con)
            .expect("hash lock take");
        assert!(taken.is_none(), "the uncontended hash lock was taken");
        let given: Option<i64> = self
            .give
            .key(key)
            .key(channel)
            .arg("holder:1")
            .arg(30_000u64)
            .invoke(con)
            .expect("hash lock give");
        assert_eq!(given, Some(1), "the hash lock was not ours any more");
    }
}

/// The hash floors' take, written once: the first hold (`EXISTS`, `HSET`, `PEXPIRE`) or
/// the holder's re-entry (`HEXISTS`, `HINCRBY`, `PEXPIRE`), each returning 1; what
/// follows it runs when another holds the lock.
macro_rules! hash_take {
    () => {
        r#"
if redis.call('EXISTS', keys[1]) == 0 then
    redis.call('HSET', keys[1], args[1], 1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 1
end
if redis.call('HEXISTS', keys[1], args[1]) == 1 then
    redis.call('HINCRBY', keys[1], args[1], 1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 1
end
"#
    };
}

/// The hash floors' give, written once: -1 when the caller does not hold the lock, 0 when
/// it keeps levels (`HINCRBY -1`, `PEXPIRE`); after its last level the lock is deleted and
/// what follows runs.
macro_rules! hash_leave {
    () => {
        r#"
local n = redis.call('HGET', keys[1], args[1])
if not n then
    return -1
end
if tonumber(n) > 1 then
    redis.call('HINCRBY', keys[1], args[1], -1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 0
end
redis.call('DEL', keys[1])
"#
    };
}

/// The string-lock floors' handover, written once: `next` (popped) made the holder and
/// told, else the lock deleted.
macro_rules! set_hand {
    () => {
        r#"
if next then
    redis.call('SET', keys[1], next, 'PX', args[2])
    redis.call('PUBLISH', args[3] .. next, 'g')
    return 1
end
redis.call('DEL', keys[1])
return 0
"#
    };
}

/// Which shape a [`ScriptFloor`] keeps its hold in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FloorShape {
    /// A HASH holder -> reentry count with PEXPIRE, as `Lock` keeps it: the least the
    /// design's shape allows.
    Hash,
    /// The naive lock's string (`SET NX PX`, compare-and-delete), but both calls scripted:
    /// what running every operation as a script costs, without the hash.
    Set,
}

impl FloorShape {
    fn prefix(self) -> &'static str {
        match self {
            FloorShape::Hash => "hashfloor",
            FloorShape::Set => "setfloor",
        }
    }
}

/// The scripts' bodies, written against `keys` and `args` (a function's parameters); the
/// EVALSHA text reads `KEYS` and `ARGV` instead.
/// Hash take: the first hold is EXISTS, HSET, PEXPIRE (3 commands); reentry by the holder
/// HINCRBY + PEXPIRE; held by another: 0 (the caller polls). Hash give: HGET, then DEL
/// on the last level (2 commands), else HINCRBY -1 + PEXPIRE. No queue, so no look for
/// waiters on release, no wake-up, no fencing, no metadata: a floor, not a lock to use.
const FLOOR_BODIES: [(&str, &str); 4] = [
    ("hashfloor_take", concat!(hash_take!(), "return 0\n")),
    ("hashfloor_give", concat!(hash_leave!(), "return 1\n")),
    (
        "setfloor_take",
        r#"
if redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2]) then
    return 1
end
return 0
"#,
    ),
    (
        "setfloor_give",
        r#"
if redis.call('GET', keys[1]) == args[1] then
    redis.call('DEL', keys[1])
    return 1
end
return -1
"#,
    ),
];

/// The function library holding [`FLOOR_BODIES`] (Redis 7.0+, Valkey).
const FLOOR_LIBRARY: &str = "redmutex_bench_floors";

/// The script floor of a lock kept by Lua scripts (issue 29 item 1): one script call to
/// take (`KEYS[1]`, `ARGV`: holder, lease ms), one to give back, each doing only the
/// commands its shape needs, with the fewest strings per call (FCALL name 1 key holder
/// lease). Run as functions of their own library ([`ScriptFloor::load_library`]) or as
/// EVALSHA scripts, the way the client under comparison runs its own.
pub struct ScriptFloor {
    shape: FloorShape,
    fcall: bool,
    take: redis::Script,
    give: redis::Script,
}

impl ScriptFloor {
    pub fn new(shape: FloorShape, fcall: bool) -> ScriptFloor {
        let evalsha = |name: &str| {
            let (_, body) = FLOOR_BODIES
                .iter()
                .find(|(n, _)| *n == name)
                .expect("a floor body");
            redis::Script::new(&body.replace("keys[", "KEYS[").replace("args[", "ARGV["))
        };
        let p = shape.prefix();
        ScriptFloor {
            shape,
            fcall,
            take: evalsha(&format!("{p}_take")),
            give: evalsha(&format!("{p}_give")),
        }
    }

    /// Loads (or replaces) the floors' function library: once, before the workers start.
    pub fn load_library(con: &mut redis::Connection) {
        let mut code = format!(
            "#!lua name={FLOOR_LIBRARY}
"
        );
        for (name, body) in FLOOR_BODIES.iter().chain(&QUEUE_FLOOR_BODIES) {
            let _ = writeln!(
                code,
                "redis.register_function('{name}', function(keys, args){body}end)"
            );
        }
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(code)
            .query(con)
            .expect("FUNCTION LOAD the floors' library");
    }

    fn call(
        &self,
        con: &mut redis::Connection,
        op: &str,
        key: &str,
        holder: &str,
        lease_ms: u64,
    ) -> i64 {
        if self.fcall {
            redis::cmd("FCALL")
                .arg(format!("{}_{op}", self.shape.prefix()))
                .arg(1)
                .arg(key)
                .arg(holder)
                .arg(lease_ms)
                .query(con)
        } else {
            let script = if op == "take" { &self.take } else { &self.give };
            script.key(key).arg(holder).arg(lease_ms).invoke(con)
        }
        .unwrap_or_else(|e| panic!("{} {op}: {e}", self.shape.prefix()))
    }

    /// One try: true when `key` was free (or already `holder`'s) and is now held.
    pub fn try_lock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        holder: &str,
        lease_ms: u64,
    ) -> bool {
        self.call(con, "take", key, holder, lease_ms) == 1
    }

    /// Gives one level of `key` back; fails the bench if `holder` did not hold it.
    pub fn unlock(&self, con: &mut redis::Connection, key: &str, holder: &str, lease_ms: u64) {
        let r = self.call(con, "give", key, holder, lease_ms);
        assert!(r >= 0, "the {} was not ours any more", self.shape.prefix());
    }
}

/// Which fair floor a [`QueueFloorLock`] is: issue 29's, or one that also survives a
/// waiter that dies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QueueShape {
    /// Issue 29's fair floor: the lock a string (`SET NX PX`), the queue a list of holder
    /// ids, nothing else.
    Bare,
    /// The fair floor with what keeps a queue working when waiters die: every entry has an
    /// expiry (a HASH holder -> expiry beside the list, one `TIME` per call that needs
    /// it), the release skips entries past it, and the queue's keys expire after their
    /// longest entry (one `PTTL` per join, raising both keys' expiry when short). Without
    /// it a waiter that dies is handed the lock and holds the queue for a whole lease,
    /// and an abandoned queue stays in memory for ever. A contended acquisition: take
    /// `SET NX`, `TIME`, `HSET`, `RPUSH`, `PTTL`; give `GET`, `LPOP`, `HGET`, `HDEL`,
    /// `TIME`, `SET PX`, `PUBLISH`: 14 executed commands with the two calls.
    Safe,
    /// [`QueueShape::Safe`] with the lock kept as `Lock` keeps it, the design's shape: a
    /// HASH holder -> reentry count with PEXPIRE, so a take looks whether the caller holds
    /// it already (`EXISTS`, `HEXISTS`) and a handover is `DEL`, `HSET`, `PEXPIRE` where
    /// the string needs one `SET PX`: 17 executed commands per contended acquisition.
    SafeHash,
}

impl QueueShape {
    fn prefix(self) -> &'static str {
        match self {
            QueueShape::Bare => "floor",
            QueueShape::Safe => "safefloor",
            QueueShape::SafeHash => "safehash",
        }
    }
}

/// The safe floors' join (after a take found the lock held), written once: the entry's
/// expiry in the entries hash (pushed on the list when new), and the queue keys' expiry
/// raised to twice an entry's life when less than one is left (one `PTTL` when not).
macro_rules! safe_join {
    () => {
        r#"
local t = redis.call('TIME')
local life = tonumber(args[3])
if redis.call('HSET', keys[3], args[1], t[1] * 1000 + math.floor(t[2] / 1000) + life) == 1 then
    redis.call('RPUSH', keys[2], args[1])
end
if redis.call('PTTL', keys[3]) < life then
    redis.call('PEXPIRE', keys[2], 2 * life)
    redis.call('PEXPIRE', keys[3], 2 * life)
end
return 0
"#
    };
}

/// The safe floors' next waiter, written once: pops entries until one that has not
/// expired (`TIME` read once) into `next`, which is false when the queue ran out.
macro_rules! safe_next {
    () => {
        r#"
local now, next
while true do
    next = redis.call('LPOP', keys[2])
    if not next then
        break
    end
    local due = redis.call('HGET', keys[3], next)
    redis.call('HDEL', keys[3], next)
    if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
    end
    if due and tonumber(due) > now then
        break
    end
end
"#
    };
}

/// The queue floors' scripts, as [`FLOOR_BODIES`] are written (`keys`, `args`).
/// KEYS: the lock, its queue (a list), its entries (a hash, the safe shapes only).
/// take ARGV: holder, lease ms, entry lifetime ms; 1 when taken, 0 when queued.
/// give ARGV: holder, lease ms, grant channel prefix; 1 when handed over, 0 when freed,
/// an error when the caller did not hold it.
const QUEUE_FLOOR_BODIES: [(&str, &str); 6] = [
    (
        "floor_take",
        r#"
if redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2]) then
    return 1
end
redis.call('RPUSH', keys[2], args[1])
return 0
"#,
    ),
    (
        "floor_give",
        concat!(
            r#"
if redis.call('GET', keys[1]) ~= args[1] then
    return redis.error_reply('queue floor: not the holder')
end
local next = redis.call('LPOP', keys[2])
"#,
            set_hand!()
        ),
    ),
    (
        "safefloor_take",
        concat!(
            r#"
if redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2]) then
    return 1
end
"#,
            safe_join!()
        ),
    ),
    (
        "safefloor_give",
        concat!(
            r#"
if redis.call('GET', keys[1]) ~= args[1] then
    return redis.error_reply('safe floor: not the holder')
end
"#,
            safe_next!(),
            set_hand!()
        ),
    ),
    ("safehash_take", concat!(hash_take!(), safe_join!())),
    (
        "safehash_give",
        concat!(
            hash_leave!(),
            safe_next!(),
            r#"
if next then
    redis.call('HSET', keys[1], next, 1)
    redis.call('PEXPIRE', keys[1], args[2])
    redis.call('PUBLISH', args[3] .. next, 'g')
    return 1
end
return 0
"#
        ),
    ),
];

/// A queue floor's entries hash: beside its queue list.
fn entries_key(queue: &str) -> String {
    format!("{queue}:e")
}

/// The floor of a fair lock that hands over without polling, queueing its waiters in
/// Redis and waking the next one with a PUBLISH as `Lock` and `FairLock` do: the least
/// such a lock can do, measured under the same contention as they are. (Another wake-up,
/// such as a blocking pop per waiter, would be another design with another floor.) A
/// waiter that finds the lock taken joins a FIFO list and blocks on its own channel
/// (subscribed once, before the run); the holder's release pops the next waiter, makes it
/// the holder and PUBLISHes one grant to it. So a handed-over acquisition costs exactly
/// two script requests (the take that queues, the give that hands over) and one PUBLISH
/// delivered to a subscriber. Its [`QueueShape`] says what else it keeps.
///
/// Left out, which is why it is a lower bound and not a lock to use: no ticket or
/// sequence number (a late grant cannot be told from a current one), no expiry of queue
/// entries in the bare shape (a waiter that dies stays queued and is handed a lock it
/// never uses, until the lease runs out), no crash safety beyond the lease, no lease
/// renewal (the lease only has to outlast the bench's 1 ms holds) nor refresh of a
/// waiter's entry, no reentrancy but in the hash shape, no confirmation that the grant
/// was received, no timeout or cancellation of a wait, no fencing token, no check that a
/// name is one kind, and one subscriber connection per waiter instead of one shared per
/// client. A grant reaches only a waiter already subscribed, so each subscribes before
/// its first take.
pub struct QueueFloorLock {
    shape: QueueShape,
    fcall: bool,
    take: redis::Script,
    give: redis::Script,
}

impl QueueFloorLock {
    /// Issue 29's fair floor, run as EVALSHA.
    pub fn new() -> QueueFloorLock {
        QueueFloorLock::with(QueueShape::Bare, false)
    }

    /// A floor of `shape`, run as FCALL of the floors' library
    /// ([`ScriptFloor::load_library`], loaded first) or as EVALSHA.
    pub fn with(shape: QueueShape, fcall: bool) -> QueueFloorLock {
        let evalsha = |op: &str| {
            let name = format!("{}_{op}", shape.prefix());
            let (_, body) = QUEUE_FLOOR_BODIES
                .iter()
                .find(|(n, _)| *n == name)
                .expect("a queue floor body");
            redis::Script::new(&body.replace("keys[", "KEYS[").replace("args[", "ARGV["))
        };
        QueueFloorLock {
            shape,
            fcall,
            take: evalsha("take"),
            give: evalsha("give"),
        }
    }

    fn call(
        &self,
        con: &mut redis::Connection,
        op: &str,
        key: &str,
        queue: &str,
        args: (&str, u64, Option<&str>),
    ) -> i64 {
        let entries = entries_key(queue);
        // The bare shape has no entries hash: two keys, as its scripts read.
        let keys: &[&str] = if self.shape == QueueShape::Bare {
            &[key, queue]
        } else {
            &[key, queue, &entries]
        };
        let reply = if self.fcall {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(format!("{}_{op}", self.shape.prefix()))
                .arg(keys.len())
                .arg(keys)
                .arg(args.0)
                .arg(args.1)
                .arg(args.2);
            cmd.query(con)
        } else {
            let script = if op == "take" { &self.take } else { &self.give };
            let mut call = script.prepare_invoke();
            for k in keys {
                call.key(*k);
            }
            call.arg(args.0).arg(args.1);
            // (None: the bare take reads no third argument, and is sent none.)
            if let Some(a) = args.2 {
                call.arg(a);
            }
            call.invoke(con)
        };
        reply.unwrap_or_else(|e| panic!("{} {op} (not the holder?): {e}", self.shape.prefix()))
    }

    /// Subscribes `sub` (a connection of its own, used for nothing else) to the grant
    /// channel of `me`; a wait longer than `timeout` fails the bench instead of hanging it.
    pub fn subscribe(sub: &mut redis::Connection, prefix: &str, me: &str, timeout: Duration) {
        let channel = format!("{prefix}{me}");
        sub.send_packed_command(&redis::cmd("SUBSCRIBE").arg(&channel).get_packed_command())
            .expect("SUBSCRIBE");
        let reply = sub.recv_response().expect("SUBSCRIBE reply");
        let kind: Vec<redis::Value> = redis::from_redis_value(reply).expect("SUBSCRIBE reply");
        let kind: String = redis::from_redis_value(kind[0].clone()).expect("SUBSCRIBE reply");
        assert_eq!(kind, "subscribe", "unexpected reply to SUBSCRIBE");
        sub.set_read_timeout(Some(timeout))
            .expect("set the grant read timeout");
    }

    /// Takes `key` as `me`: at once when it is free, else queued on `queue` until the
    /// holder's give PUBLISHes the grant on `sub` (subscribed with [`Self::subscribe`]).
    /// A queue entry lives for `lease_ms` too.
    pub fn lock(
        &self,
        con: &mut redis::Connection,
        sub: &mut redis::Connection,
        key: &str,
        queue: &str,
        me: &str,
        lease_ms: u64,
    ) {
        let life = lease_ms.to_string();
        let life = (self.shape != QueueShape::Bare).then_some(life.as_str());
        if self.call(con, "take", key, queue, (me, lease_ms, life)) == 1 {
            return;
        }
        let value = sub.recv_response().unwrap_or_else(|e| {
            panic!("queue floor: no grant for {me} within the read timeout ({e}): a lost handoff")
        });
        let msg = redis::Msg::from_owned_value(value).expect("a grant message");
        let payload: String = msg.get_payload().expect("grant payload");
        assert_eq!(payload, "g", "unexpected grant payload");
    }

    /// Gives `key` back as `me`: to the next queued waiter (its grant PUBLISHed on
    /// `{prefix}{next}`), or freed when none waits. Fails the bench if `me` did not hold it.
    pub fn unlock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        queue: &str,
        me: &str,
        lease_ms: u64,
        prefix: &str,
    ) {
        let given = self.call(con, "give", key, queue, (me, lease_ms, Some(prefix)));
        assert!(given >= 0, "{} give: not the holder", self.shape.prefix());
    }
}

/// A multi-process bench's `main`: a re-executed worker (`role_env` set) runs `child`
/// with its role, the bench itself runs `parent`.
pub fn dispatch(role_env: &str, child: impl FnOnce(&str), parent: impl FnOnce()) {
    match std::env::var(role_env) {
        Ok(role) => child(&role),
        Err(_) => parent(),
    }
}

// ---------------------------------------------------------------------------------------
// The worker protocol the multi-process benches share: the parent spawns workers, each
// says `ready`, the parent sends them all one window `go <start> <end>` (CLOCK_MONOTONIC
// ns), each works until `end` and reports `acq <acquired> <releasing>` lines, then `done`.

/// Spawns `n` worker processes of role `role` (set in `role_env`), each with `envs`.
pub fn spawn_workers(
    n: usize,
    role_env: &str,
    role: &str,
    envs: &[(&str, &str)],
) -> Vec<ChildProc> {
    (0..n)
        .map(|_| {
            let mut all = vec![(role_env, role)];
            all.extend_from_slice(envs);
            ChildProc::spawn(role, &all)
        })
        .collect()
}

/// Sends every worker the same window: `secs` long, starting 50 ms from now (time for
/// the lines to arrive). Returns the window's start and end.
pub fn start_window(children: &mut [ChildProc], secs: f64) -> (u64, u64) {
    let start = mono_ns() + 50_000_000;
    let end = start + (secs * 1e9) as u64;
    for c in children {
        c.send(&format!("go {start} {end}"));
    }
    (start, end)
}

/// Each worker's `acq` events in order, read until its `done` (a worker silent for
/// `deadline` fails the bench as `hung`), once it exited successfully.
pub fn collect_events(
    children: Vec<ChildProc>,
    deadline: Duration,
    hung: &str,
) -> Vec<Vec<(u64, u64)>> {
    let mut events = Vec::new();
    for c in children {
        let mut mine = Vec::new();
        loop {
            let line = c.try_line(deadline).unwrap_or_else(|| panic!("{hung}"));
            if line == "done" {
                break;
            }
            let mut w = line.split_whitespace();
            assert_eq!(w.next(), Some("acq"), "unexpected worker line {line:?}");
            let acq = parse_u64(w.next().unwrap_or(""));
            let rel = parse_u64(w.next().unwrap_or(""));
            mine.push((acq, rel));
        }
        // Exited: its clients are gone, every command they sent is counted after this.
        c.wait_success();
        events.push(mine);
    }
    events
}

/// What the workers took in one timed window.
pub struct Acquisitions {
    /// Per process: (acquired, release started) in CLOCK_MONOTONIC ns.
    pub by_process: Vec<Vec<(u64, u64)>>,
    /// The window's start.
    pub start: u64,
}

impl Acquisitions {
    /// Starts the window of `secs` for the ready `children` and reads what each took (one
    /// silent past the window and `stuck` fails the bench as `hung`).
    pub fn run(mut children: Vec<ChildProc>, secs: f64, stuck: Duration, hung: &str) -> Self {
        let (start, _) = start_window(&mut children, secs);
        let deadline = Duration::from_secs_f64(secs) + stuck;
        let by_process = collect_events(children, deadline, hung);
        Acquisitions { by_process, start }
    }

    /// Acquisitions per process.
    pub fn counts(&self) -> Vec<u64> {
        self.by_process.iter().map(|e| e.len() as u64).collect()
    }

    pub fn total(&self) -> u64 {
        self.counts().iter().sum()
    }

    /// From the start to the last release.
    pub fn seconds(&self) -> f64 {
        let end = self
            .by_process
            .iter()
            .flatten()
            .map(|&(_, rel)| rel)
            .max()
            .unwrap_or(self.start);
        end.saturating_sub(self.start) as f64 / 1e9
    }

    /// Acquisitions per second.
    pub fn rate(&self) -> f64 {
        self.total() as f64 / self.seconds()
    }
}

/// In a worker: the window the parent sent (`go <start> <end>`).
pub fn read_window() -> (u64, u64) {
    let line = read_line();
    let mut w = line.split_whitespace();
    assert_eq!(w.next(), Some("go"), "unexpected parent line {line:?}");
    let start = parse_u64(w.next().unwrap_or(""));
    let end = parse_u64(w.next().unwrap_or(""));
    (start, end)
}

/// In a worker: the loop every contention worker runs from `start` until `end`: take
/// (`acquire`), hold (`hold`), give back (`release`), and note when it held and when it
/// began to give back.
pub fn work_window<H>(
    (start, end): (u64, u64),
    mut acquire: impl FnMut() -> H,
    hold: impl Fn(),
    mut release: impl FnMut(H),
) -> Vec<(u64, u64)> {
    sleep_until_mono(start);
    let mut events = Vec::new();
    while mono_ns() < end {
        let held = acquire();
        let acquired = mono_ns();
        hold();
        let releasing = mono_ns();
        release(held);
        events.push((acquired, releasing));
    }
    events
}

/// In a worker: tells the parent its events, then `done`.
pub fn report_events<'a>(events: impl IntoIterator<Item = &'a (u64, u64)>) {
    for (a, r) in events {
        say(&format!("acq {a} {r}"));
    }
    say("done");
}
