//! `OwnedGuard<K>`: a hold of a lock that belongs to the acquisition, not to a thread, so
//! that it may be moved to (and released on) another thread.

use std::fmt;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::primitives::kind::{Fenced, Kind, Owned, Plain};
use crate::{Error, LockGuard, LostLease};

/// Proof that an owned acquisition (through [`Lock::owned`](crate::Lock::owned), an
/// [`OwnedLock`](crate::OwnedLock)) holds a [`Lock`](crate::Lock). Unlike a [`LockGuard`], it belongs to no thread: it is `Send + Sync +
/// 'static`, so it may be moved into a job, handed to a worker of a thread pool, or kept
/// in a struct shared between threads, and released wherever it ends up.
///
/// Every owned acquisition is a holder of its own (its holder id is drawn for it, never a
/// thread's), so an owned hold is **not reentrant**: a second acquisition of the same lock,
/// owned or by a thread, waits for it like any other holder would, even on the thread that
/// took it (and an owned acquisition waits for a hold of its own thread the same way).
/// Blocking on the lock while holding it is therefore a deadlock until the lease ends; use
/// the thread-owned [`Lock::lock`](crate::Lock::lock) for nested critical sections.
/// [`Lock::hold_count`](crate::Lock::hold_count) and
/// [`Lock::is_held_by_current_thread`](crate::Lock::is_held_by_current_thread) count thread
/// holds only.
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
/// # Guarantees
///
/// Those of a [`LockGuard`] (released once, renewed while it lives, a loss told and
/// staying told), on whichever thread the guard is; being `Send`, it is the one guard of
/// a lock that may be released by another thread than the one that took it.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let guard = client.lock("nightly-export").owned().lock()?;
/// let job = std::thread::spawn(move || {
///     // ... the export runs here, under the lock ...
///     guard.unlock() // released by the thread that finished the work
/// });
/// job.join().unwrap()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct OwnedGuard<K: Kind = Plain> {
    pub(crate) guard: LockGuard<Owned<K>>,
}

impl<K: Kind> OwnedGuard<K> {
    /// Releases the hold and reports the outcome, from any thread: see
    /// [`LockGuard::unlock`] for the errors ([`Error::LeaseLost`] once
    /// [`is_lease_lost`](OwnedGuard::is_lease_lost) is true or Redis no longer had the
    /// hold, [`Error::NotHeld`] when a repeated release cannot tell).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("nightly-export").owned().lock()?;
    /// let job = std::thread::spawn(move || guard.unlock()); // released on another thread
    /// job.join().unwrap()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn unlock(self) -> Result<(), Error> {
        self.guard.unlock()
    }

    /// True once this hold is known to be gone, or about to go (its fixed lease ran out,
    /// the watchdog found it gone or could not renew it in time, a failover lost it,
    /// [`max_hold`](crate::ClientBuilder::max_hold) ended it): see
    /// [`LockGuard::is_lease_lost`]. Never goes back to false.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("nightly-export").owned().lock()?;
    /// std::thread::spawn(move || {
    ///     for batch in 0..100 {
    ///         if guard.is_lease_lost() {
    ///             break; // another holder may run now: stop
    ///         }
    ///         // ... export batch `batch` ...
    ///     }
    /// });
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        self.guard.is_lease_lost()
    }

    /// A channel told when this hold is lost (`recv()` returns `Ok` with the
    /// [`LostLease`]: which lock, and why), and closed when the guard is released
    /// (`Err`), whichever comes first: see [`LockGuard::lost`]. Like the guard, the
    /// receiver may be used on any thread.
    ///
    /// ```no_run
    /// use crossbeam_channel::select;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("ledger").owned().lock()?;
    /// std::thread::spawn(move || {
    ///     let lost = guard.lost();
    ///     select! {
    ///         recv(lost) -> lost => {
    ///             // Ok(lost): the lock is no longer ours: stop the work.
    ///             if let Ok(lost) = lost {
    ///                 eprintln!("lost: {}", lost.reason());
    ///             }
    ///         }
    ///         default(std::time::Duration::from_secs(5)) => { let _ = guard.unlock(); }
    ///     }
    /// });
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lost(&self) -> Receiver<LostLease> {
        self.guard.lost()
    }

    /// Extends this hold's fixed lease to `lease` from now, if it is still held: see
    /// [`LockGuard::extend`] (the same script, errors and guarantees).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let options = redmutex::LockOptions::new().lease(Duration::from_secs(10));
    /// let guard = client.lock("import").owned().try_lock_with(options)?.expect("no wait bound set");
    /// guard.extend(Duration::from_secs(10))?; // ten more seconds from now
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn extend(&self, lease: Duration) -> Result<(), Error> {
        self.guard.extend(lease)
    }
}

impl OwnedGuard<Fenced> {
    /// The fencing token of this hold: larger than that of every earlier hold of the lock
    /// name (see [`FencedGuard::token`](crate::FencedGuard::token)).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("exports").owned().lock()?;
    /// let token = guard.token();
    /// std::thread::spawn(move || {
    ///     // ... write to the storage with `token`; it refuses older ones ...
    ///     guard.unlock()
    /// });
    /// # Ok::<(), redmutex::Error>(())
    /// ```
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
