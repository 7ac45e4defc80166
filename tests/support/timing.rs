//! Waiting on state that sends no signal, and timing a call.

use std::thread;
use std::time::{Duration, Instant};

/// Re-checks `cond` every 2 ms until it holds or `timeout` passes; returns
/// whether it held. Only for state in another process that sends no signal
/// (e.g. a key expiring inside Redis): prefer waiting on a real signal
/// (channel, join handle) whenever the code under test offers one.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// What `f` returned, and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// Asserts that a call which took `took` returned in less than `bound`; `message` is the
/// failure's text (it names the call and its time).
#[track_caller]
pub fn assert_under(took: Duration, bound: Duration, message: std::fmt::Arguments) {
    assert!(took < bound, "{message}");
}
