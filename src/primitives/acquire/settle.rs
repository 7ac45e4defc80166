//! What comes of an attempt at a `Lock<K>`: its settlement with the hold table (a level or
//! a queue entry of unknown outcome left to the watchdog), the replicas' confirmation of a
//! grant, the confirmation of a hold a release handed over, and the guard a grant becomes.

use std::time::Instant;

use crate::primitives::acquire::attempt::{Grant, Refused};
use crate::primitives::kind::Kind;
use crate::primitives::lock::Lock;
use crate::primitives::release::Freed;
use crate::runtime::connection::con::Con;
use crate::runtime::holds::lease::Lease;
use crate::runtime::holds::Acquisition;
use crate::runtime::keys;
use crate::runtime::scripting::calls;
use crate::{Error, LockGuard};

impl<K: Kind> Lock<K> {
    /// Ends an attempt begun with `watchdog.begin_attempt` (which said `held`) and passes
    /// its outcome on: a level or a queue entry it may have left unknown to this process
    /// is given back by the watchdog.
    pub(in crate::primitives) fn settle_attempt(
        &self,
        (token, holder): (u64, &str),
        held: usize,
        joined: bool,
        outcome: Result<Result<Grant, Refused>, Error>,
    ) -> Result<Result<Grant, Refused>, Error> {
        let inner = &self.client.inner;
        let keys = &self.keys;
        let granted = matches!(outcome, Ok(Ok(_)));
        let queued = joined && matches!(outcome, Ok(Err(_)));
        inner.holds.end_attempt(keys.hold(), token, granted, queued);
        if let Err(e) = &outcome {
            if e.outcome_unknown() {
                // Redis may have run the script, or may still: a level nobody holds, or a
                // queue entry nobody waits behind.
                inner.watchdog.doubt(inner, keys, token, holder, held);
            }
        }
        outcome
    }

    /// Confirms the hold a release handed to `holder` (see `Wait::confirm_grant`; a `MultiLock`
    /// confirms a member handed over as its call left the queue the same way): true when it
    /// was still held, now with a lease of `lease_ms` from this call on; false when it had
    /// lapsed (nothing changed). With `sync_replicas`, a hold the replicas did not confirm
    /// is given back (and handed on), and the call fails as an acquisition would.
    pub(in crate::primitives) fn confirm_handoff(
        &self,
        holder: &str,
        lease_ms: u64,
        until: Option<Instant>,
    ) -> Result<bool, Error> {
        let exec = &self.client.inner.exec;
        let keys = &self.keys;
        let call = calls::confirm(keys, holder, lease_ms);
        let outcome = exec.run_until(until, |con| {
            let (lost, _): (Vec<i64>, Vec<i64>) = exec.eval(con, &call)?;
            if !lost.is_empty() {
                return Ok(Ok(false));
            }
            // The renewal always writes, so its WAIT covers the grant written before it.
            Ok(match self.replicated(con, holder, || 0, 1)? {
                None => Ok(true),
                Some(shortfall) => Err(shortfall),
            })
        });
        outcome.and_then(|confirmed| confirmed)
    }

    /// With `sync_replicas`, after a script on `con` gave `holder` a level (it now holds
    /// `held`): `None` once the replicas confirmed it (or none are asked for). A grant the
    /// replicas did not confirm, or a WAIT that failed (an ACL without +wait, a proxy
    /// without WAIT), is given back on the same connection (the levels left need `need()`
    /// ms), since a lock the caller is told it did not get must not stay taken for a whole
    /// lease: `Some(why)`. The give-back's own failure is the one reported: the level may
    /// then remain until its lease ends (or the thread's next acquisition adopts it).
    pub(super) fn replicated(
        &self,
        con: &mut Con,
        holder: &str,
        need: impl FnOnce() -> u64,
        held: usize,
    ) -> redis::RedisResult<Option<Error>> {
        let keys = &self.keys;
        let failure = match self.client.inner.exec.await_replicas(con, keys.key()) {
            Ok(None) => return Ok(None),
            Ok(Some(shortfall)) => Ok(shortfall),
            Err(e) => Err(e),
        };
        let inner = &self.client.inner;
        let rollback: redis::RedisResult<Freed> = inner
            .exec
            .eval(con, &calls::release(keys, holder, need(), held));
        if let Ok(freed) = &rollback {
            // The level given back may have gone to a waiting thread of this client,
            // whose message is in the reply (see `Freed`).
            inner.subscriber.deliver_own(keys.channel(), &freed.told);
        }
        match (failure, rollback) {
            (Ok(shortfall), Ok(_)) => Ok(Some(shortfall)),
            (Ok(_), Err(e)) | (Err(e), _) => Err(e),
        }
    }

    /// The guard a `grant` to holder `token` becomes (`sent`: when the call that got it
    /// was sent; `handoff`: handed over by a release), registered in the hold table, where
    /// the watchdog renews it and a loss is reported.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::primitives) fn guard_for_grant(
        &self,
        token: u64,
        holder: String,
        grant: Grant,
        lease: Lease,
        sent: Instant,
        handoff: bool,
    ) -> LockGuard<K> {
        let inner = &self.client.inner;
        let registration = self.client.inner.holds.acquired(
            &self.keys,
            token,
            &holder,
            grant.count,
            (lease, self.lease_ms(lease)),
            (sent, handoff),
            &Acquisition {
                kind: K::NAME,
                generation: self.client.inner.exec.generation(),
                max_hold: self.max_hold,
                thread: self.thread_owned().then(keys::thread_token),
            },
        );
        // A force_unlock of this hold is told on the client's own channel, or found by a
        // check of the holds if it may have been told to nobody (see `Subscriber::held`).
        inner.subscriber.held(inner, sent);
        LockGuard::new(self, token, holder, lease, sent, registration, grant.fence)
    }

    /// Whether this handle's holds are the acquiring thread's (re-entered by its later
    /// acquisitions), not holders of their own (a permit, an owned hold).
    pub(crate) fn thread_owned(&self) -> bool {
        !self.keys.ops.per_call && !<K as crate::primitives::kind::sealed::Sealed>::OWN_HOLDER
    }
}
