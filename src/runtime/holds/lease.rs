//! How long a hold lasts: renewed by the watchdog or fixed, the longest lease accepted, the
//! whole milliseconds the scripts count in, and the lease policy: every timing the client
//! derives from its watchdog timeout (how often the watchdog renews, how long its calls may
//! take, how long a queue entry lives), the pickup window of a handoff and the grace of a
//! bounded call. One place, so that the renewal period and the deadlines it must meet are
//! never worked out twice, differently.

use std::time::{Duration, Instant};

use crate::Error;

/// The longest lease accepted (ten years): anything longer is surely a mistake, and it keeps
/// every deadline computed from a lease far from overflowing.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How long past its deadline a bounded call (`try_lock*`) waits for a round trip already
/// under way: Redis's answer to an attempt sent just before the deadline. A server that
/// does not answer by then (frozen, unreachable) fails the call with [`Error::Timeout`]
/// or [`Error::Pool`] instead of holding it for the command or connect timeout.
pub(crate) const IO_GRACE: Duration = Duration::from_millis(250);

/// How long a hold handed to a waiter lasts until it is extended, counted from the
/// release on the server (a waiter with a shorter lease gets its own). A waiter that hears
/// of the grant early enough (`Wait::take_handoff`) returns at once and its watchdog extends the
/// hold a third into the window; later, the waiting call confirms it first (`renew.lua`),
/// and a grant it hears of only after the window is refused there. A waiter that cannot
/// (its process froze, or died right after the grant) stalls the lock this long, then the
/// lock passes on.
pub(crate) const PICKUP: Duration = Duration::from_secs(1);

/// [`PICKUP`] in the milliseconds the scripts are told.
pub(crate) fn pickup_ms() -> u64 {
    PICKUP.as_millis() as u64
}

/// A plain `Lock` lets a running thread take a free lock past the queue (cheaper than
/// waking a sleeping one) until the first waiter has waited this long; from then on the
/// lock is handed to the waiters in turn. Each release before that wakes the first waiter
/// to try, and its try is wasted whenever the releaser takes the lock back first (as a
/// thread looping on the lock nearly always does): with 10 ms and 1 ms holds that was
/// most releases, 2.7-2.8 requests per contended acquisition against 2.0 for direct
/// handoffs, for no throughput (issue 18). 2 ms, about one hold and the handoff of the
/// bench, keeps barging for a waiter that just arrived and hands the lock on in turn
/// under steady contention.
pub(crate) const STARVATION_BOUND: Duration = Duration::from_millis(2);

/// [`STARVATION_BOUND`] in the milliseconds the scripts are told (`scripts.rs`'s `constants`).
pub(crate) fn starve_ms() -> u64 {
    STARVATION_BOUND.as_millis() as u64
}

/// When the watchdog extends a hold handed over at `sent`: a third of the way into its
/// pickup window, leaving two thirds for the extension to get through.
pub(crate) fn extend_at(sent: Instant) -> Instant {
    sent + PICKUP / 3
}

/// Whether a lease of the pickup window ending at `ends` is due for its extension at `now`:
/// from a third of the way into the window (the rule of [`extend_at`]) on.
pub(crate) fn extension_due(ends: Instant, now: Instant) -> bool {
    ends.saturating_duration_since(now) <= PICKUP * 2 / 3
}

/// How much sooner than this machine's clock says a handed-over hold's window of `window`
/// may end on the server: its millisecond rounding, and a clock running up to 0.1 % fast
/// against this one.
pub(crate) fn pickup_margin(window: Duration) -> Duration {
    Duration::from_millis(1) + window / 1000
}

/// How long after a handoff the releasing client makes sure the lock did not lapse with
/// nobody told: past the pickup window, with room for the grant's own round trip.
pub(crate) const KICK_AFTER: Duration = Duration::from_millis(1_050);

/// The timings a client derives from its watchdog timeout: the lease of a watchdog hold,
/// renewed every third of it, each renewal call given up after a third (so one slow round
/// cannot use up the next one's time, and a lease still has a third left when a round
/// fails), and the watchdog thread's other calls bounded by a sixth (they must not delay
/// a round).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeasePolicy {
    watchdog: Duration,
}

impl LeasePolicy {
    /// The policy of a client whose watchdog timeout is `watchdog_timeout` (checked by the
    /// builder: at least 3 ms, at most [`MAX_LEASE`]).
    pub(crate) fn new(watchdog_timeout: Duration) -> LeasePolicy {
        LeasePolicy {
            watchdog: watchdog_timeout,
        }
    }

    /// The lease of a watchdog hold (`ClientBuilder::watchdog_timeout`).
    pub(crate) fn watchdog(&self) -> Duration {
        self.watchdog
    }

    /// [`watchdog`](LeasePolicy::watchdog) in the milliseconds the scripts are told.
    pub(crate) fn watchdog_ms(&self) -> u64 {
        millis(self.watchdog)
    }

    /// How often the watchdog thread renews every hold: a third of the lease.
    pub(crate) fn renew_every(&self) -> Duration {
        self.watchdog / 3
    }

    /// How long one renewal call may take before it is given up (it is tried again the
    /// next round): a third of the lease, so that one slow round cannot use up the next.
    pub(crate) fn renewal_bound(&self) -> Duration {
        self.watchdog / 3
    }

    /// How long one of the watchdog thread's other calls (a check of a handed-on lock, a
    /// clean-up after a doubtful attempt) may take, and how far ahead of a round a
    /// clean-up may start: a sixth of the lease, so that renewals are never late for them.
    pub(crate) fn chore_bound(&self) -> Duration {
        self.watchdog / 6
    }

    /// How long a waiter's queue entry lives unless renewed, in ms: a watchdog timeout,
    /// and no longer than the waiter's deadline (plus the grace of a round trip under
    /// way) allows, so the entry of a call that could not leave the queue lapses by then.
    pub(crate) fn entry_ttl_ms(&self, deadline: Option<Instant>) -> u64 {
        entry_ttl_ms(deadline, self.watchdog_ms())
    }
}

/// [`LeasePolicy::entry_ttl_ms`] for a watchdog lease of `watchdog_ms`.
pub(crate) fn entry_ttl_ms(deadline: Option<Instant>, watchdog_ms: u64) -> u64 {
    match deadline {
        Some(d) => millis(d.saturating_duration_since(Instant::now()) + IO_GRACE).min(watchdog_ms),
        None => watchdog_ms,
    }
}

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
        return Err(Error::invalid("a lease must be longer than zero"));
    }
    if lease > MAX_LEASE {
        return Err(Error::invalid(format!(
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
        return Err(Error::invalid(format!(
            "max_hold ({max_hold:?}) must be longer than command_timeout ({command_timeout:?}) \
             and at most ten years"
        )));
    }
    Ok(())
}
