//! `UpgradeableGuard`: the upgradeable read hold of a read-write lock, and its upgrade to
//! the write hold.

use std::time::{Duration, Instant};

use crate::primitives::kind::{Upgradeable, Write};
use crate::runtime::keys::{LockKeys, Object};
use crate::runtime::scripting::scripts;
use crate::{Client, Error, Lock, LockGuard, WriteGuard};

/// Proof that the current thread holds the upgradeable read side of a
/// [`ReadWriteLock`](crate::ReadWriteLock) (one level): it reads alongside the plain
/// readers, while no writer and no other upgradeable reader holds the lock, and may
/// [`upgrade`](UpgradeableGuard::upgrade) to the write side without letting a writer in
/// between. Released on drop like any [`LockGuard`]; not `Send`.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let cache = client.read_write_lock("cache");
/// let u = cache.upgradeable_lock().lock()?; // readers may still come in; writers wait
/// let stale = true;                     // ... read, decide ...
/// if stale {
///     let w = u.upgrade()?;             // waits for the readers to leave, then alone
///     // ... write ...
///     w.unlock()?;                      // back to reading, upgradeable
/// }
/// u.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub type UpgradeableGuard = LockGuard<Upgradeable>;

impl LockGuard<Upgradeable> {
    /// Blocks until this thread holds the write side of the lock, waiting only for the
    /// plain readers that hold it to leave: the upgrade goes ahead of every writer and
    /// reader that waits, and the readers that come meanwhile wait behind it, so a stream
    /// of readers cannot starve it. The release of the last reader hands it the write
    /// hold (no polling).
    ///
    /// The [`WriteGuard`] is a level of the write side, as [`WriteLock::lock`]'s
    /// (reentrant, kept alive by the watchdog, released on drop); the upgradeable hold
    /// stays meanwhile, so releasing the write guard goes back to upgradeable reading (a
    /// downgrade) and no writer can come in between. Release this guard when done, before
    /// or after the write guard.
    ///
    /// Never deadlocks: there is one upgradeable reader at a time, so no other upgrade
    /// waits for this one, and a thread holding a plain read hold cannot take the
    /// upgradeable side ([`Error::WouldDeadlock`]). Fails with [`Error::LeaseLost`] when
    /// this guard's hold is gone when an attempt of the upgrade reaches Redis (its lease
    /// ran out, `force_unlock`), whether or not the guard knew it yet: a writer may have
    /// come in since the reads it made. Once the upgrade waits at the head of the queue,
    /// no writer passes it: the write hold it is handed follows the reads with no writer
    /// in between, even if the upgradeable hold ended meanwhile (this guard then says so).
    ///
    /// [`WriteLock::lock`]: crate::Lock::lock
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let cache = client.read_write_lock("cache");
    /// let u = cache.upgradeable_lock().lock()?;  // read, with the right to upgrade
    /// let w = u.upgrade()?;                        // waits for the plain readers, then writes
    /// // ... write ...
    /// w.unlock()?;                                 // back to upgradeable reading
    /// u.unlock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn upgrade(&self) -> Result<WriteGuard, Error> {
        Ok(self
            .upgrade_until(None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One attempt to upgrade, without waiting: `Ok(None)` while other threads read.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let u = client.read_write_lock("cache").upgradeable_lock().lock()?;
    /// match u.try_upgrade()? {
    ///     Some(w) => w.unlock()?,                  // wrote at once
    ///     None => println!("readers still inside"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_upgrade(&self) -> Result<Option<WriteGuard>, Error> {
        self.upgrade_until(Some(Instant::now()))
    }

    /// Waits at most `wait` for the upgrade ([`upgrade`](LockGuard::upgrade)): `Ok(None)`
    /// if the readers were still there, and then the upgrade's place in the queue is
    /// given up (the readers and writers behind it go on). This guard's upgradeable hold
    /// is kept either way. A `wait` too long to add to the current time waits for as long
    /// as it takes.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let u = client.read_write_lock("cache").upgradeable_lock().lock()?;
    /// if let Some(w) = u.try_upgrade_for(Duration::from_millis(200))? {
    ///     // ... write ...
    ///     w.unlock()?;
    /// } // else: still reading, upgradeable; the hold is kept
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_upgrade_for(&self, wait: Duration) -> Result<Option<WriteGuard>, Error> {
        self.upgrade_until(Instant::now().checked_add(wait))
    }

    /// Waits until `deadline` for the upgrade, as
    /// [`try_upgrade_for`](LockGuard::try_upgrade_for).
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let u = client.read_write_lock("cache").upgradeable_lock().lock()?;
    /// let deadline = Instant::now() + Duration::from_millis(200);
    /// if let Some(w) = u.try_upgrade_until(deadline)? {
    ///     w.unlock()?;
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_upgrade_until(&self, deadline: Instant) -> Result<Option<WriteGuard>, Error> {
        self.upgrade_until(Some(deadline))
    }

    fn upgrade_until(&self, deadline: Option<Instant>) -> Result<Option<WriteGuard>, Error> {
        if self.is_lease_lost() {
            return Err(Error::LEASE_LOST.on_lock(self.keys().name()));
        }
        // The write side of the same lock, taken by this thread while it holds the
        // upgradeable side: the scripts make that an upgrade, and refuse it if that hold
        // is gone meanwhile (the guard may not know yet).
        let inner = self.client();
        let keys = LockKeys::new(
            &inner.exec.config.key_prefix,
            self.keys().name().to_vec(),
            &inner.exec.id,
            Object::ReadWrite,
            &scripts::UPGRADE,
        );
        let write: Lock<Write> = Lock::new(Client::of(inner), keys);
        match deadline {
            None => write.lock().map(Some),
            Some(deadline) => write.try_lock_until(deadline),
        }
    }
}
