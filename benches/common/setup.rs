//! A bench's connections, clients and settings, and what a run was taken on.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::KIND_ENV;
use redmutex::Client;

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
