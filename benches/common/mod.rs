//! What the benchmark harnesses share (`mod common;` in each): a toolbox of
//! connections, clocks, statistics and the printed tables. The servers and child
//! processes come from `tests/support`, like the tests'.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redmutex::Client;

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
        let passed = self.rows.iter().filter(|r| r[3] == "PASS").count();
        let _ = writeln!(
            out,
            "targets: {passed} PASS, {} FAIL",
            self.rows.len() - passed
        );
        out
    }
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
        .build()
        .expect("build client")
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
