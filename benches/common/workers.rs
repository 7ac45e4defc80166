//! The worker protocol of the multi-process benches: roles, the shared window, the events workers report.

use std::io::BufRead;
use std::time::Duration;

use super::{mono_ns, parse_u64, sleep_until_mono};
use crate::support::child::{say, ChildProc};

/// What a bench's parent tells the workers it starts (its own binary, run again): the
/// role (set only in a worker), the kind of lock, the server and the key prefix. Each
/// bench's workers are its own, so one set of names serves every bench.
pub const ROLE_ENV: &str = "REDMUTEX_BENCH_ROLE";
pub const KIND_ENV: &str = "REDMUTEX_BENCH_KIND";
pub const URL_ENV: &str = "REDMUTEX_BENCH_URL";
pub const PREFIX_ENV: &str = "REDMUTEX_BENCH_PREFIX";

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
