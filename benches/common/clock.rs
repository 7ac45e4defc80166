//! One clock for every process of the machine (CLOCK_MONOTONIC ns).

use std::thread;
use std::time::Duration;

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
