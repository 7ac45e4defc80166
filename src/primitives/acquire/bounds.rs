//! The leases and time bounds of an acquisition of a `Lock<K>`: the lease a level asks
//! for, how long a waiter sleeps on a holder's lease, and when its I/O and its wait for the
//! client's own channel give up.

use std::time::{Duration, Instant};

use crate::primitives::kind::Kind;
use crate::primitives::lock::Lock;
use crate::runtime::holds::lease::{millis, Lease, IO_GRACE};

impl<K: Kind> Lock<K> {
    /// The lease a level taken with `lease` asks for, in ms.
    pub(crate) fn lease_ms(&self, lease: Lease) -> u64 {
        match lease {
            // A cap shorter than the watchdog lease shortens the first lease too: the hold
            // ends at its cap whatever it is.
            Lease::Watchdog => {
                let ms = self.client.inner.exec.config.lease.watchdog_ms();
                self.max_hold.map_or(ms, |cap| ms.min(millis(cap)))
            }
            Lease::Fixed(ms) => ms,
        }
    }

    /// How long after a refusal that saw the holder's lease end in `pttl` ms a waiter
    /// tries again, when no message wakes it first.
    pub(crate) fn wait_bound(&self, pttl: i64) -> Duration {
        match pttl {
            // No expiry at all (someone wrote the key by hand): look again after a lease
            // rather than never.
            -1 => self.client.inner.exec.config.lease.watchdog(),
            // PTTL rounds down: the lease may last up to a millisecond more, and waking
            // before it ends would only cost a wasted try.
            ms if ms >= 0 => Duration::from_millis(ms as u64 + 1),
            // Gone between the check and the PTTL: try again at once.
            _ => Duration::ZERO,
        }
    }

    /// How long an acquisition begun now with `deadline` and `lease` waits for the client's
    /// own channel's subscription to be answered (see `Subscriber::listen`): before it
    /// sends anything, until its deadline (a call that may not wait at all sends at once);
    /// once it holds, until its I/O bound ends, and never past half its lease (counted
    /// from no earlier than now), so a guard is never handed out with its lease over;
    /// either at most the command timeout from now.
    pub(crate) fn listen_bounds(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
    ) -> (Instant, Instant) {
        let now = Instant::now();
        let command = now + self.client.inner.exec.config.command_timeout;
        let before = deadline.map_or(command, |d| d.min(command));
        let half_lease = now + Duration::from_millis(self.lease_ms(lease) / 2);
        let after = self
            .io_until(deadline)
            .map_or(command, |io| io.min(command));
        (before, after.min(half_lease))
    }

    /// The instant I/O of an attempt must give up at: none for unbounded calls, the
    /// deadline (or now, past it) plus a grace for the round trip under way for bounded
    /// ones, plus the replicas' WAIT when `sync_replicas` is on.
    pub(in crate::primitives) fn io_until(&self, deadline: Option<Instant>) -> Option<Instant> {
        let deadline = deadline?;
        let mut grace = IO_GRACE;
        if let Some((_, wait_ms)) = self.client.inner.exec.config.sync_replicas {
            grace += Duration::from_millis(wait_ms);
        }
        Some(deadline.max(Instant::now()) + grace)
    }
}
