//! The values of flags: durations, and the bounds redmutex puts on them.

use std::time::Duration;

/// `500ms`, `30s`, `5m`, `1h 30m`: humantime's format; a number without a unit (`5`,
/// `0.5`) is seconds, as flock(1) reads `-w 5`.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    if let Ok(seconds) = s.trim().parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|_| {
            format!("{s:?} is not a number of seconds (write durations like 5, 500ms, 30s, 5m)")
        });
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e} (write durations like 5 (seconds), 500ms, 30s, 5m)"))
}

/// `-n N`: a number of permits. flock's `-n` (do not wait) is `--no-wait` here, and a
/// user who typed flock's `-n job ...` is told so.
pub(crate) fn permits(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("a semaphore needs at least 1 permit".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "-n is the number of permits of a semaphore here (a number, 1 or more), not \
             {s:?}; flock's -n (do not wait) is --no-wait: `redmutex run --no-wait NAME \
             COMMAND`"
        )),
    }
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
