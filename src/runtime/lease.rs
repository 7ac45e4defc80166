//! How long a hold lasts: renewed by the watchdog or fixed, the longest lease accepted, and
//! the whole milliseconds the scripts count in.

use std::time::Duration;

use crate::Error;

/// The longest lease accepted (ten years): anything longer is surely a mistake, and it keeps
/// every deadline computed from a lease far from overflowing.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How a level of a lock keeps its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog while held.
    Watchdog,
    /// A fixed lease in milliseconds, never renewed.
    Fixed(u64),
}

/// Whole milliseconds, rounded up so that a sub-millisecond duration is never zero.
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if d > Duration::from_millis(ms as u64) {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

pub(crate) fn fixed(lease: Duration) -> Result<Lease, Error> {
    if lease.is_zero() {
        return Err(Error::InvalidArgument(
            "a lease must be longer than zero".to_owned(),
        ));
    }
    if lease > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "a lease of {lease:?} is longer than the maximum of ten years"
        )));
    }
    Ok(Lease::Fixed(millis(lease)))
}

/// Checks a `max_hold`: longer than the command timeout, since it may be a hold's first
/// lease, and a lock taken by a slow acquire must not lapse before its guard exists (as
/// for `watchdog_timeout`); and no longer than [`MAX_LEASE`].
pub(crate) fn check_max_hold(max_hold: Duration, command_timeout: Duration) -> Result<(), Error> {
    if max_hold <= command_timeout || max_hold > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "max_hold ({max_hold:?}) must be longer than command_timeout ({command_timeout:?}) \
             and at most ten years"
        )));
    }
    Ok(())
}
