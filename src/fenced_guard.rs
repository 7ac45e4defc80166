//! `FencedGuard`: one level of a held `FencedLock`, with the hold's fencing token.

use std::fmt;

use crate::{Error, LockGuard};

/// Proof that the current thread holds a [`FencedLock`](crate::FencedLock), with the
/// hold's fencing token. Released on drop like a [`LockGuard`]; not `Send`.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.fenced_lock("exports");
/// let outer = lock.lock()?;
/// let inner = lock.lock()?;                  // re-entry: the same hold, the same token
/// assert_eq!(outer.token(), inner.token());
/// # Ok::<(), redmutex::Error>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct FencedGuard {
    guard: LockGuard,
    token: u64,
}

impl FencedGuard {
    pub(crate) fn new(guard: LockGuard) -> FencedGuard {
        let token = guard
            .fence()
            .expect("a fenced acquisition always reports its token");
        FencedGuard { guard, token }
    }

    /// The fencing token of this hold: larger than that of every earlier hold of the lock
    /// name, and the same for every nested level of this hold.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Releases this level of the lock and reports the outcome, as [`LockGuard::unlock`].
    pub fn unlock(self) -> Result<(), Error> {
        self.guard.unlock()
    }

    /// True once this guard's lease is known to be gone, as [`LockGuard::is_lease_lost`].
    pub fn is_lease_lost(&self) -> bool {
        self.guard.is_lease_lost()
    }
}

impl fmt::Debug for FencedGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedGuard")
            .field("guard", &self.guard)
            .field("token", &self.token)
            .finish()
    }
}
