//! `FencedLock`: a `Lock` whose holds carry strictly increasing fencing tokens.

use std::fmt;
use std::time::{Duration, Instant};

use crate::{Error, FencedGuard, Lock};

/// A [`Lock`] whose every new hold gets a fencing token: a number that strictly grows with
/// each outermost acquisition of the name, by any client, and stays the same for nested
/// re-entries.
///
/// A lease can run out while its holder still believes it holds the lock: a long GC-like
/// pause, a frozen VM, a slow network. The next holder then works concurrently with the
/// old one, and no lock can prevent it. Fencing lets the guarded resource refuse the
/// stale holder: send [`FencedGuard::token`] with every write, and have the resource
/// reject a write whose token is lower than the highest it has seen. In Redis itself that
/// check is one script (compare the token stored beside the data, write only if the new
/// one is not lower); in SQL, a `WHERE fence <= $token` on the update.
///
/// The token is drawn inside the acquire script (no extra round trip) from a counter key
/// beside the lock (`<prefix>!fence:<key>`, in the lock's hash slot and in a key namespace
/// that no lock name can produce) that never expires. Tokens are only as durable as
/// Redis's data: a Redis that loses its data starts counting again.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.fenced_lock("exports");
/// let guard = lock.lock()?;
/// let token = guard.token();
/// // storage.write_if_token_not_older(token, data)?;
/// guard.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone)]
pub struct FencedLock {
    lock: Lock,
}

impl FencedLock {
    pub(crate) fn new(lock: Lock) -> FencedLock {
        FencedLock { lock }
    }

    /// Blocks until this thread holds the lock, as [`Lock::lock`].
    pub fn lock(&self) -> Result<FencedGuard, Error> {
        self.lock.lock().map(FencedGuard::new)
    }

    /// Blocks until this thread holds the lock for a fixed `lease`, as
    /// [`Lock::lock_with_lease`].
    pub fn lock_with_lease(&self, lease: Duration) -> Result<FencedGuard, Error> {
        self.lock.lock_with_lease(lease).map(FencedGuard::new)
    }

    /// One attempt without waiting, as [`Lock::try_lock`].
    pub fn try_lock(&self) -> Result<Option<FencedGuard>, Error> {
        Ok(self.lock.try_lock()?.map(FencedGuard::new))
    }

    /// Waits at most `wait`, as [`Lock::try_lock_for`].
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<FencedGuard>, Error> {
        Ok(self.lock.try_lock_for(wait)?.map(FencedGuard::new))
    }

    /// Waits until `deadline`, as [`Lock::try_lock_until`].
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<FencedGuard>, Error> {
        Ok(self.lock.try_lock_until(deadline)?.map(FencedGuard::new))
    }

    /// Waits at most `wait` and holds for a fixed `lease`, as
    /// [`Lock::try_lock_with_lease_for`].
    pub fn try_lock_with_lease_for(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<FencedGuard>, Error> {
        Ok(self
            .lock
            .try_lock_with_lease_for(wait, lease)?
            .map(FencedGuard::new))
    }

    /// Waits until `deadline` and holds for a fixed `lease`, as
    /// [`Lock::try_lock_with_lease_until`].
    pub fn try_lock_with_lease_until(
        &self,
        deadline: Instant,
        lease: Duration,
    ) -> Result<Option<FencedGuard>, Error> {
        Ok(self
            .lock
            .try_lock_with_lease_until(deadline, lease)?
            .map(FencedGuard::new))
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

    /// Frees the lock whoever holds it, as [`Lock::force_unlock`]. The next hold still
    /// gets a larger token.
    pub fn force_unlock(&self) -> Result<bool, Error> {
        self.lock.force_unlock()
    }

    /// The name the lock was made with.
    pub fn name(&self) -> &[u8] {
        self.lock.name()
    }
}

impl fmt::Debug for FencedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FencedLock").field(&self.lock).finish()
    }
}
