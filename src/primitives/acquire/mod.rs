//! Acquiring, for every kind: the one slow path behind every public acquisition. Here the
//! entry of a `Lock<K>` (what is checked before anything is sent, the holder token, and
//! the give-back of a hold the call may not keep); `wait/` the `Wait` state machine
//! between its attempts and the pickup of a hold handed over to it; `attempt.rs` one
//! attempt's script call and `settle.rs` what comes of it; `bounds.rs` the leases and
//! time bounds they use; `multi_wait/` a `MultiLock`'s rounds over its member locks.

pub(crate) mod attempt;
pub(crate) mod bounds;
pub(crate) mod multi_wait;
pub(crate) mod settle;
pub(crate) mod wait;

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use crate::primitives::acquire::wait::Wait;
use crate::primitives::cancel::CancellationToken;
use crate::primitives::kind::{sealed::Sealed, Kind};
use crate::primitives::lock::Lock;
use crate::runtime::holds::lease::Lease;
use crate::runtime::keys::{fresh_token, holder_id, thread_token};
use crate::runtime::scripting::calls;
use crate::runtime::scripting::scripts;
use crate::runtime::telemetry;
use crate::{Error, LockGuard};

/// Numbers each waiting call, so that a message meant for an earlier call of the same
/// thread (one that already left the queue) is never taken for this one's.
pub(crate) static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);

impl<K: Kind> Lock<K> {
    /// [`acquire_cancellable`](Lock::acquire_cancellable) that nothing cancels.
    pub(crate) fn acquire(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
    ) -> Result<Option<LockGuard<K>>, Error> {
        self.acquire_cancellable(lease, deadline, amount, None)
    }

    /// The one acquisition path. `deadline` None waits forever; a deadline already past
    /// makes exactly one attempt. `amount`: the permits asked for (1 for the locks).
    /// `cancel`: a token that stops the wait (`Err(Cancelled)`, holding nothing).
    pub(crate) fn acquire_cancellable(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<LockGuard<K>>, Error> {
        self.acquisition(lease, deadline, amount, cancel)
            .map_err(|e| e.on_lock(self.name()))
    }

    /// Decides whether the call may begin (nothing written yet when it may not), under
    /// which holder token, and runs its [`Wait`]; a hold its client may not keep is given
    /// back.
    fn acquisition(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<LockGuard<K>>, Error> {
        let answer_by = self.ready_to_send(lease, deadline, cancel)?;
        let inner = &self.client.inner;
        let keys = &self.keys;
        let (thread, token) = self.holder_token();
        if inner.holds.is_in_doubt(keys, token) {
            return Err(Error::IN_DOUBT);
        }
        self.refuse_waiting_for_own_read(thread, token, deadline)?;
        if lease == Lease::Watchdog {
            // Before anything is written: a lease nobody renews must not be handed out.
            inner.watchdog.ensure_running(inner)?;
        }
        let mut wait = Wait::new(self, token, lease, deadline, amount, cancel);
        let (name, holder) = (
            telemetry::Name(keys.name()),
            telemetry::Holder(&inner.exec.id, token),
        );
        telemetry::acquisition(K::NAME, &name, &holder, || {
            let guard = wait.run()?;
            self.keep_unless_refused(guard, answer_by)
        })
    }

    /// Whether anything may be sent for this call: a valid name, the process that made
    /// the client, not cancelled, and the client listening on its own channel (within the
    /// call's bounds, see `Subscriber::listen`) unless the server refuses it. Returns how
    /// long the first hold waits for that channel's answer.
    fn ready_to_send(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Instant, Error> {
        self.check_name()?;
        let inner = &self.client.inner;
        inner.exec.check_process()?;
        if cancel.is_some_and(CancellationToken::is_cancelled) {
            return Err(Error::CANCELLED);
        }
        let (listen_by, answer_by) = self.listen_bounds(lease, deadline);
        inner.subscriber.listen(inner, listen_by);
        if let Some(refused) = inner.subscriber.refusal() {
            // The server refuses the client's own channel: a force_unlock of a hold could
            // not be told, nor a release to a waiter. Nothing is written.
            return Err(refused);
        }
        Ok(answer_by)
    }

    /// The holder token the call acquires under, and the thread's own token when its holds
    /// are the thread's. A semaphore's permits and an owned hold are holders of their own,
    /// never the thread's (they neither re-enter its holds nor are re-entered by them). A
    /// thread's hold of the object is re-entered under its token; a new hold gets a token
    /// never used before, so a call of an earlier hold that runs late (its outcome unknown
    /// to this process) finds nothing of this one to release.
    fn holder_token(&self) -> (Option<u64>, u64) {
        let keys = &self.keys;
        let thread = (!keys.ops.per_call && !<K as Sealed>::OWN_HOLDER).then(thread_token);
        let token = thread
            .and_then(|thread| self.client.inner.holds.token_of_thread(keys, thread))
            .unwrap_or_else(fresh_token);
        (thread, token)
    }

    /// Refuses (`WouldDeadlock`) a write, or the upgradeable side, asked for by a thread
    /// that only reads the lock: it would wait for itself. A writer that also reads,
    /// mid-downgrade, may re-enter the write side, and one that holds the upgradeable side
    /// upgrades (waiting for the others' read holds only). A read hold of the thread's
    /// whose lease ran out here is given back first.
    fn refuse_waiting_for_own_read(
        &self,
        thread: Option<u64>,
        token: u64,
        deadline: Option<Instant>,
    ) -> Result<(), Error> {
        let keys = &self.keys;
        let table = &self.client.inner.holds;
        let Some(read_hold) = keys.read_hold() else {
            return Ok(());
        };
        if table.holds_locally(keys.hold(), token) {
            return Ok(());
        }
        let upgrading = keys
            .upgradeable_hold()
            .is_some_and(|hold| table.holds_locally(&hold, token));
        if !upgrading && table.holds_locally(&read_hold, token) {
            return Err(Error::WOULD_DEADLOCK);
        }
        let over = thread.and_then(|t| table.forget_over_of_thread(&read_hold, t));
        if let Some(read_token) = over {
            // A read hold whose lease ran out here may live a moment longer on the
            // server (its lease counts from when Redis ran the acquire), where it
            // would refuse this write.
            self.give_back_read(read_token, self.io_until(deadline))?;
        }
        Ok(())
    }

    /// Whether the call keeps what its wait got. The client's first hold learns whether
    /// the server lets it listen on its own channel (see `Subscriber::listen`, waited for
    /// until `answer_by`): refused, the hold is given back, so that a call that fails holds
    /// nothing.
    fn keep_unless_refused(
        &self,
        guard: Option<LockGuard<K>>,
        answer_by: Instant,
    ) -> Result<Option<LockGuard<K>>, Error> {
        let inner = &self.client.inner;
        if guard.is_some() {
            inner.subscriber.listen(inner, answer_by);
        }
        match (guard, inner.subscriber.refusal()) {
            (Some(guard), Some(refused)) => {
                if let Err(e) = guard.unlock() {
                    tracing::debug!(target: "redmutex", "redmutex: giving back a hold after a refusal failed: {e}");
                }
                Err(refused)
            }
            (guard, _) => Ok(guard),
        }
    }

    /// Gives back this thread's read hold of a read-write lock (`self` is its write side)
    /// whose lease is over here, in case Redis still keeps it a moment longer.
    fn give_back_read(&self, token: u64, until: Option<Instant>) -> Result<(), Error> {
        let keys = &self.keys;
        let read = &scripts::READ;
        let holder = holder_id(&self.client.inner.exec.id, token);
        let cancel = calls::cancel(read, keys, &holder, 0, 0, false);
        let exec = &self.client.inner.exec;
        let reply: Vec<i64> = exec.run_until(until, |con| exec.eval(con, &cancel))?;
        if reply[..] == [0, 1] {
            self.client
                .inner
                .watchdog
                .handed_on(&self.client.inner, keys);
        }
        Ok(())
    }
}
