//! The values of flags: durations, and the bounds redmutex puts on them.

use std::time::Duration;

/// `500ms`, `30s`, `5m`, `1h 30m`: humantime's format.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 5m)"))
}

/// The longest lease the library takes (ten years).
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `--lease`: the library's bounds on a watchdog timeout, said of the flag.
pub(crate) fn lease(s: &str) -> Result<Duration, String> {
    let lease = duration(s)?;
    if lease < Duration::from_millis(3) {
        return Err("--lease must be at least 3ms".to_owned());
    }
    if lease > MAX_LEASE {
        return Err("--lease must be at most 10 years".to_owned());
    }
    Ok(lease)
}

pub(crate) fn connect_timeout(s: &str) -> Result<Duration, String> {
    let timeout = duration(s)?;
    if timeout.is_zero() {
        return Err("--connect-timeout must be longer than zero".to_owned());
    }
    Ok(timeout)
}
