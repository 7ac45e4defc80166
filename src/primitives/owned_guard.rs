//! `OwnedGuard<K>`: a hold of a lock that belongs to the acquisition, not to a thread, so
//! that it may be moved to (and released on) another thread.

use std::fmt;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::primitives::cancel::CancelToken;
use crate::primitives::kind::{Fenced, Kind, Owned, Plain};
use crate::runtime::lease::{fixed, Lease};
use crate::{Error, Lock, LockGuard};

/// Proof that an owned acquisition ([`Lock::lock_owned`] and its variants) holds a
/// [`Lock`]. Unlike a [`LockGuard`], it belongs to no thread: it is `Send + Sync +
/// 'static`, so it may be moved into a job, handed to a worker of a thread pool, or kept
/// in a struct shared between threads, and released wherever it ends up.
///
/// Every owned acquisition is a holder of its own (its holder id is drawn for it, never a
/// thread's), so an owned hold is **not reentrant**: a second acquisition of the same lock,
/// owned or by a thread, waits for it like any other holder would, even on the thread that
/// took it (and an owned acquisition waits for a hold of its own thread the same way).
/// Blocking on the lock while holding it is therefore a deadlock until the lease ends; use
/// the thread-owned [`lock`](Lock::lock) for nested critical sections.
/// [`Lock::hold_count`] and [`Lock::is_held_by_current_thread`] count thread holds only.
/// An owned hold of an [`UpgradeableLock`](crate::UpgradeableLock) is an upgradeable read
/// hold that cannot [`upgrade`](crate::UpgradeableGuard::upgrade) (its writer would be
/// another holder); take the thread guard to upgrade.
///
/// Everything else is as for a [`LockGuard`]: the watchdog renews a watchdog lease while
/// the guard lives, whichever thread has it; [`lost`](OwnedGuard::lost),
/// [`is_lease_lost`](OwnedGuard::is_lease_lost) and the client's
/// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) hook are told of its loss;
/// dropping it releases it, best effort, from the thread that drops it; call
/// [`unlock`](OwnedGuard::unlock) to learn whether the release worked.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let guard = client.lock("nightly-export").lock_owned()?;
/// let job = std::thread::spawn(move || {
///     // ... the export runs here, under the lock ...
///     guard.unlock() // released by the thread that finished the work
/// });
/// job.join().unwrap()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct OwnedGuard<K: Kind = Plain> {
    guard: LockGuard<Owned<K>>,
}

impl<K: Kind> OwnedGuard<K> {
    /// Releases the hold and reports the outcome, from any thread: see
    /// [`LockGuard::unlock`] for the errors ([`Error::LeaseLost`] once
    /// [`is_lease_lost`](OwnedGuard::is_lease_lost) is true or Redis no longer had the
    /// hold, [`Error::NotHeld`] when a repeated release cannot tell).
    pub fn unlock(self) -> Result<(), Error> {
        self.guard.unlock()
    }

    /// True once this hold is known to be gone, or about to go (its fixed lease ran out,
    /// the watchdog found it gone or could not renew it in time, a failover lost it,
    /// [`max_hold`](crate::ClientBuilder::max_hold) ended it): see
    /// [`LockGuard::is_lease_lost`]. Never goes back to false.
    pub fn is_lease_lost(&self) -> bool {
        self.guard.is_lease_lost()
    }

    /// A channel that becomes ready (disconnected) once this hold is lost, or once the
    /// guard is released, whichever comes first: see [`LockGuard::lost`]. Like the guard,
    /// the receiver may be used on any thread.
    ///
    /// ```no_run
    /// use crossbeam_channel::select;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("ledger").lock_owned()?;
    /// std::thread::spawn(move || {
    ///     let lost = guard.lost();
    ///     select! {
    ///         recv(lost) -> _ => { /* the lock is no longer ours: stop the work */ }
    ///         default(std::time::Duration::from_secs(5)) => { let _ = guard.unlock(); }
    ///     }
    /// });
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lost(&self) -> Receiver<()> {
        self.guard.lost()
    }

    /// Extends this hold's fixed lease to `lease` from now, if it is still held: see
    /// [`LockGuard::extend`] (the same script, errors and guarantees).
    pub fn extend(&self, lease: Duration) -> Result<(), Error> {
        self.guard.extend(lease)
    }
}

impl OwnedGuard<Fenced> {
    /// The fencing token of this hold: larger than that of every earlier hold of the lock
    /// name (see [`FencedGuard::token`](crate::FencedGuard::token)).
    pub fn token(&self) -> u64 {
        self.guard
            .fence()
            .expect("a fenced acquisition always reports its token")
    }
}

impl<K: Kind> fmt::Debug for OwnedGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedGuard")
            .field("guard", &self.guard)
            .finish()
    }
}

/// Owned acquisitions: holds that belong to the acquisition rather than to the calling
/// thread, with guards that may move between threads ([`OwnedGuard`]).
impl<K: Kind> Lock<K> {
    /// Blocks until an owned acquisition holds the lock: as [`lock`](Lock::lock) (the same
    /// queue, handoffs and watchdog lease), but the hold is a holder of its own, whose
    /// [`OwnedGuard`] may be moved to another thread and released there. Not reentrant:
    /// it waits for every other hold of the lock, including the calling thread's own.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("report").lock_owned()?;
    /// std::thread::spawn(move || drop(guard)); // released on the other thread
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock_owned(&self) -> Result<OwnedGuard<K>, Error> {
        Ok(self
            .acquire_owned(Lease::Watchdog, None, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// Blocks until an owned acquisition holds the lock for a fixed `lease`, never
    /// renewed, as [`lock_with_lease`](Lock::lock_with_lease). Fails with
    /// [`Error::InvalidArgument`] for a zero or absurdly long (over ten years) lease.
    pub fn lock_owned_with_lease(&self, lease: Duration) -> Result<OwnedGuard<K>, Error> {
        let lease = fixed(lease)?;
        Ok(self
            .acquire_owned(lease, None, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One owned attempt, without waiting: `Ok(None)` when the lock is held (by anyone,
    /// the calling thread included), as [`try_lock`](Lock::try_lock).
    pub fn try_lock_owned(&self) -> Result<Option<OwnedGuard<K>>, Error> {
        self.acquire_owned(Lease::Watchdog, Some(Instant::now()), None)
    }

    /// Waits at most `wait` for an owned hold of the lock, as
    /// [`try_lock_for`](Lock::try_lock_for): `Ok(None)` if it was not acquired in time.
    pub fn try_lock_owned_for(&self, wait: Duration) -> Result<Option<OwnedGuard<K>>, Error> {
        self.acquire_owned(Lease::Watchdog, Instant::now().checked_add(wait), None)
    }

    /// Waits for an owned hold of the lock until `deadline`, as
    /// [`try_lock_until`](Lock::try_lock_until): `Ok(None)` if it was not acquired by
    /// then.
    pub fn try_lock_owned_until(&self, deadline: Instant) -> Result<Option<OwnedGuard<K>>, Error> {
        self.acquire_owned(Lease::Watchdog, Some(deadline), None)
    }

    /// Waits at most `wait` for an owned hold of the lock, held for a fixed `lease`, never
    /// renewed, as [`try_lock_with_lease_for`](Lock::try_lock_with_lease_for).
    pub fn try_lock_owned_with_lease_for(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<OwnedGuard<K>>, Error> {
        let lease = fixed(lease)?;
        self.acquire_owned(lease, Instant::now().checked_add(wait), None)
    }

    /// Blocks until an owned acquisition holds the lock, as
    /// [`lock_owned`](Lock::lock_owned), or until `cancel` is cancelled: then it leaves
    /// the queue and fails with [`Error::Cancelled`], holding nothing, as
    /// [`lock_cancellable`](Lock::lock_cancellable).
    pub fn lock_owned_cancellable(&self, cancel: &CancelToken) -> Result<OwnedGuard<K>, Error> {
        Ok(self
            .acquire_owned(Lease::Watchdog, None, Some(cancel))?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// Waits for an owned hold of the lock until `deadline` (`Ok(None)` if it was not
    /// acquired by then), or until `cancel` is cancelled (then [`Error::Cancelled`]), as
    /// [`try_lock_until_cancellable`](Lock::try_lock_until_cancellable).
    pub fn try_lock_owned_until_cancellable(
        &self,
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<Option<OwnedGuard<K>>, Error> {
        self.acquire_owned(Lease::Watchdog, Some(deadline), Some(cancel))
    }

    fn acquire_owned(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<Option<OwnedGuard<K>>, Error> {
        let guard = self
            .owned()
            .acquire_cancellable(lease, deadline, 1, cancel)?;
        Ok(guard.map(|guard| OwnedGuard { guard }))
    }
}
