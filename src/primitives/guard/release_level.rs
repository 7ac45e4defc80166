//! Releasing one level of a `LockGuard<K>`: unregistering it, the release script's call,
//! and what its reply means for the hold and the thread's other levels.

use crate::primitives::kind::Kind;
use crate::primitives::release::{Freed, Release};
use crate::runtime::telemetry;
use crate::{Error, LockGuard};

impl<K: Kind> LockGuard<K> {
    /// Releases this level (on `unlock` or drop), telling the telemetry its outcome.
    pub(super) fn release(&mut self) -> Result<(), Error> {
        let outcome = self
            .release_level()
            .map_err(|e| e.on_lock(self.keys.name()));
        telemetry::released(K::NAME, &self.keys, &self.holder, self.acquired, &outcome);
        outcome
    }

    /// One release of this level, in its two halves around the script's call.
    fn release_level(&mut self) -> Result<(), Error> {
        let held = match self.begin_release()? {
            Ok(call) => call,
            Err(done) => return done,
        };
        let levels = held.levels;
        let (reply, repeated) = held.send(&self.inner, &self.keys, &self.lost);
        self.end_release(levels, reply, repeated)
    }

    /// The first half of a release: unregisters this level, so that from here on the
    /// watchdog never renews for it, and returns the release script's call; or the
    /// outcome already, when this level is no longer held (`Err`).
    pub(crate) fn begin_release(&mut self) -> Result<Result<Release, Result<(), Error>>, Error> {
        self.released = true;
        let inner = &self.inner;
        // In a fork()ed child the holder id is the parent's: releasing would free its lock.
        inner.exec.check_process()?;
        let keys = &self.keys;
        let watchdog_ms = inner.exec.config.lease.watchdog_ms();
        // Whatever made the guard say (or would make it say) its lease is lost marks the
        // hold lost here, before anything is sent: the release below still gives the hold
        // back if Redis has it, but its outcome is `LeaseLost` (see `end_release`).
        self.is_lease_lost();
        // This level is over for whoever waits on `lost()`, whatever the release finds.
        self.lost.released(self.level);
        let window_ends = inner
            .holds
            .pickup_pending(keys.hold(), self.token, &self.lost);
        let Some((need, held, lease_ends)) =
            inner
                .holds
                .releasing(keys.hold(), self.token, self.level, watchdog_ms)
        else {
            // The hold this guard belonged to is over (lost, or replaced by a newer
            // acquisition of this thread): releasing in Redis would take a level from
            // the newer one.
            return Ok(Err(Err(self.not_held())));
        };
        Ok(Ok(Release::new(
            keys,
            &self.holder,
            need,
            held,
            window_ends,
            lease_ends,
        )))
    }

    /// The second half of a release, given the script's reply and the replicas'
    /// shortfall, if any. `repeated`: the script was sent more than once (a reply lost on
    /// the way), so a first run may have freed the hold itself.
    pub(crate) fn end_release(
        &self,
        held: usize,
        reply: Result<(Freed, Option<Error>), Error>,
        repeated: bool,
    ) -> Result<(), Error> {
        let inner = &self.inner;
        let keys = &self.keys;
        if repeated || !matches!(&reply, Ok((freed, _)) if freed.left >= 0) {
            // A run whose reply was lost (this one failed, or a repeat found the hold
            // gone, or a fanout's rerun did: it does not tell) may have handed the lock to
            // a thread of this client, whose message was in that reply: this client's
            // threads waiting on the lock look again, as after a pub/sub message lost in a
            // reconnect (an attempt of the thread the lock went to is granted the level
            // it was handed).
            inner.subscriber.recheck_all(keys.channel());
        }
        if let Err(e) = &reply {
            if held == 1 && e.outcome_unknown() {
                // The release of the hold's last level may still run (its request slow on
                // the wire), or may never: the watchdog gives the hold back, as it does a
                // level a doubtful acquisition may have left, so a release that never
                // arrives does not keep the lock for a whole lease. Safe to repeat, and
                // safe whenever it runs: no later hold of this thread uses this holder
                // token again (see `HoldTable::token_of_thread`).
                inner
                    .watchdog
                    .doubt(inner, keys, self.token, &self.holder, 0);
            }
        }
        let (Freed { left, served, told }, shortfall) = reply?;
        // First: a waiting thread of this client the lock went to waits for this.
        inner.subscriber.deliver_own(keys.channel(), &told);
        if served == 1 {
            // A waiter was told its turn: make sure it took it once its window is over.
            inner.watchdog.handed_on(inner, keys);
        }
        if self.lost.is_lost() {
            // Said lost before the release was sent (or found so meanwhile): whatever the
            // script found, the hold was not vouched for until now.
            return Err(Error::LEASE_LOST);
        }
        if left < 0 {
            if repeated {
                // Gone after a first run whose reply was lost: that run may have freed
                // it (no loss), or found it gone already. Nothing can vouch either way.
                return Err(self.not_held());
            }
            // The hold this guard had is gone on the server (force-unlocked, deleted,
            // lapsed, lost by the server): it is lost, and everyone waiting on it (the
            // guards of the outer levels, the hook) is told now, not at a renewal.
            let reason = self.lost.gone_reason(inner.exec.generation());
            inner.holds.hold_lost(keys.hold(), &self.lost, reason);
            return Err(Error::LEASE_LOST);
        }
        if left == 0 && held > 1 {
            // The lock is free although outer levels were registered: their leases were
            // over (or the count was off); their guards must not look held.
            inner.holds.hold_ended(keys.hold(), &self.lost);
        }
        shortfall.map_or(Ok(()), Err)
    }

    /// The error of a release that found this level not held: `LeaseLost` when the hold
    /// is known lost (or its connection's generation is over), `NotHeld` otherwise.
    fn not_held(&self) -> Error {
        if self.lost.is_lost() || self.generation != self.inner.exec.generation() {
            Error::LEASE_LOST
        } else {
            Error::NOT_HELD
        }
    }
}
