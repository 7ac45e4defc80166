//! `FairLock`: a `Lock` handed to its waiters strictly in the order they asked.

use std::fmt;
use std::time::{Duration, Instant};

use crate::{Error, Lock, LockGuard};

/// A [`Lock`] whose waiters get it first come, first served, across threads and processes.
///
/// A thread that cannot take the lock at once joins a queue kept beside the lock in Redis,
/// in the order its request reached the server. A release that finds waiters makes the
/// first live one the holder inside the release script and sends one message to that
/// waiter's client: the waiting thread returns holding the lock, with no further round
/// trip, and no other thread wakes. Re-entries by the holding thread never queue.
///
/// A waiter whose process died is skipped by the release itself (its client no longer
/// listens); a waiter whose deadline passed leaves the queue with its call; a grant that
/// its waiter does not pick up (a frozen process) lapses after one second and passes on.
/// See the README for the layout and the exact bounds.
///
/// Guards are [`LockGuard`]s with the same semantics as a [`Lock`]'s: reentrant per
/// thread, released on drop, not `Send`. The same name through [`Client::lock`] is the
/// same lock: while a fair waiter is queued, plain acquisitions queue too.
///
/// [`Client::lock`]: crate::Client::lock
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.fair_lock("payouts");
/// let guard = lock.lock()?;        // waits its turn behind every earlier waiter
/// guard.unlock()?;                 // hands the lock to the next waiter in line
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone)]
pub struct FairLock {
    lock: Lock,
}

impl FairLock {
    pub(crate) fn new(lock: Lock) -> FairLock {
        FairLock { lock }
    }

    /// Blocks until this thread holds the lock, in its turn, as [`Lock::lock`].
    pub fn lock(&self) -> Result<LockGuard, Error> {
        self.lock.lock()
    }

    /// Blocks until this thread holds the lock for a fixed `lease`, as
    /// [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        self.lock.lock_with_lease(lease)
    }

    /// One attempt without waiting, as [`Lock::try_lock`]: `Ok(None)` also when the lock
    /// is free but others are queued for it.
    pub fn try_lock(&self) -> Result<Option<LockGuard>, Error> {
        self.lock.try_lock()
    }

    /// Waits at most `wait` in line, as [`Lock::try_lock_for`]. A call that times out
    /// leaves the queue atomically; if the lock was handed to it meanwhile, it returns
    /// the guard rather than `None`.
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        self.lock.try_lock_for(wait)
    }

    /// Waits in line until `deadline`, as [`Lock::try_lock_until`].
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>, Error> {
        self.lock.try_lock_until(deadline)
    }

    /// Waits at most `wait` and holds for a fixed `lease`, as
    /// [`Lock::try_lock_with_lease_for`].
    pub fn try_lock_with_lease_for(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        self.lock.try_lock_with_lease_for(wait, lease)
    }

    /// Waits until `deadline` and holds for a fixed `lease`, as
    /// [`Lock::try_lock_with_lease_until`].
    pub fn try_lock_with_lease_until(
        &self,
        deadline: Instant,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        self.lock.try_lock_with_lease_until(deadline, lease)
    }

    /// Whether anyone holds the lock, as [`Lock::is_locked`].
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.lock.is_locked()
    }

    /// Whether the calling thread holds the lock, as [`Lock::is_held_by_current_thread`].
    pub fn is_held_by_current_thread(&self) -> Result<bool, Error> {
        self.lock.is_held_by_current_thread()
    }

    /// The calling thread's reentry depth, as [`Lock::hold_count`].
    pub fn hold_count(&self) -> Result<u32, Error> {
        self.lock.hold_count()
    }

    /// The holder's remaining lease, as [`Lock::remaining_lease`].
    pub fn remaining_lease(&self) -> Result<Option<Duration>, Error> {
        self.lock.remaining_lease()
    }

    /// Frees the lock whoever holds it, as [`Lock::force_unlock`]; the first queued
    /// waiter gets it next.
    pub fn force_unlock(&self) -> Result<bool, Error> {
        self.lock.force_unlock()
    }

    /// The name the lock was made with.
    pub fn name(&self) -> &[u8] {
        self.lock.name()
    }
}

impl fmt::Debug for FairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FairLock").field(&self.lock).finish()
    }
}
