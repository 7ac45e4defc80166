//! `OwnedLock<K>`: a lock's owned form, whose holds belong to the acquisition, not a thread.

use std::fmt;
use std::time::{Duration, Instant};

use crate::primitives::kind::{Kind, Owned, Plain};
use crate::runtime::holds::lease::Lease;
use crate::{Error, Lock, LockOptions, OwnedGuard};

/// A [`Lock`]'s owned form ([`Lock::owned`]): the same lock (the same queue, handoffs
/// and watchdog lease), with the same acquisition names, whose holds belong to the
/// acquisition rather than to the calling thread. Its guards ([`OwnedGuard`]) are `Send`:
/// they may move into a job, to a worker of a thread pool, into a struct shared between
/// threads, and be released wherever they end up.
///
/// Every owned acquisition is a holder of its own, so an owned hold is **not reentrant**:
/// it waits for every other hold of the lock, the calling thread's own included, and a
/// second owned acquisition waits for the first. Use the thread-owned [`Lock`] for nested
/// critical sections.
///
/// # Guarantees
///
/// Those of [`Lock`] (one holder at a time, losses reported, a crashed holder's lock
/// freed when its lease ends, bounded calls returning by their deadline plus 250 ms),
/// whichever thread ends up with the guard; the watchdog renews a watchdog lease while the
/// guard lives, on any thread.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let export = client.lock("nightly-export").owned();
/// let guard = export.lock()?;
/// let job = std::thread::spawn(move || {
///     // ... the export runs here, under the lock ...
///     guard.unlock() // released by the thread that finished the work
/// });
/// job.join().unwrap()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub struct OwnedLock<K: Kind = Plain> {
    lock: Lock<Owned<K>>,
}

impl<K: Kind> OwnedLock<K> {
    pub(crate) fn new(lock: Lock<Owned<K>>) -> OwnedLock<K> {
        OwnedLock { lock }
    }

    /// Blocks until an owned acquisition holds the lock, as [`Lock::lock`] (a watchdog
    /// lease), whose guard may be moved to another thread and released there.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("report").owned().lock()?;
    /// std::thread::spawn(move || drop(guard)); // released on the other thread
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock(&self) -> Result<OwnedGuard<K>, Error> {
        Ok(self
            .take(Lease::Watchdog, None, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One owned attempt, without waiting: `Ok(None)` when the lock is held (by anyone,
    /// the calling thread included), as [`Lock::try_lock`].
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if let Some(guard) = client.lock("cron:cleanup").owned().try_lock()? {
    ///     std::thread::spawn(move || { /* clean up */ drop(guard) });
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock(&self) -> Result<Option<OwnedGuard<K>>, Error> {
        self.take(Lease::Watchdog, Some(Instant::now()), None)
    }

    /// Waits at most `wait` for an owned hold, as [`Lock::try_lock_for`]: `Ok(None)` if
    /// it was not acquired in time.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("report").owned().try_lock_for(Duration::from_secs(2))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<OwnedGuard<K>>, Error> {
        self.take(Lease::Watchdog, Instant::now().checked_add(wait), None)
    }

    /// Waits for an owned hold until `deadline`, as [`Lock::try_lock_until`]: `Ok(None)`
    /// if it was not acquired by then.
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let deadline = Instant::now() + Duration::from_secs(2);
    /// let guard = client.lock("report").owned().try_lock_until(deadline)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<OwnedGuard<K>>, Error> {
        self.take(Lease::Watchdog, Some(deadline), None)
    }

    /// Acquires an owned hold with [`LockOptions`] (a fixed lease, a bound on the wait, a
    /// cancellation token), as [`Lock::try_lock_with`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redmutex::LockOptions;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let options = LockOptions::new()
    ///     .wait_for(Duration::from_secs(1))
    ///     .lease(Duration::from_secs(30));
    /// let guard = client.lock("report").owned().try_lock_with(options)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock_with(&self, options: LockOptions) -> Result<Option<OwnedGuard<K>>, Error> {
        let o = options.for_lock().map_err(|e| e.on_lock(self.name()))?;
        self.take(o.lease, o.deadline, o.cancel)
    }

    /// The name the lock was made with.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// assert_eq!(client.lock("report").owned().name(), b"report");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn name(&self) -> &[u8] {
        self.lock.name()
    }

    fn take(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&crate::CancellationToken>,
    ) -> Result<Option<OwnedGuard<K>>, Error> {
        let guard = self.lock.acquire_cancellable(lease, deadline, 1, cancel)?;
        Ok(guard.map(|guard| OwnedGuard { guard }))
    }
}

impl<K: Kind> Clone for OwnedLock<K> {
    fn clone(&self) -> Self {
        OwnedLock {
            lock: self.lock.clone(),
        }
    }
}

impl<K: Kind> fmt::Debug for OwnedLock<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLock")
            .field("lock", &self.lock)
            .finish()
    }
}
