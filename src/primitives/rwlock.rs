//! `ReadWriteLock`: many readers or one writer, and a waiting writer is never starved.

use std::fmt;
use std::time::{Duration, Instant};

use crate::primitives::kind::{Read, Upgradeable, Write};
use crate::runtime::keys::Object;
use crate::{Client, Error, Lock, LockGuard};

/// A named read-write lock: many threads may read at once, across processes, or one thread
/// may write, alone.
///
/// [`read`](ReadWriteLock::read) and [`write`](ReadWriteLock::write) return guards, as
/// std's and parking_lot's `RwLock` do (with `try_read`, `try_write` and their `_for` and
/// `_until` forms). The sides themselves are [`read_lock`](ReadWriteLock::read_lock),
/// [`write_lock`](ReadWriteLock::write_lock) (Redisson's `readLock()`/`writeLock()`) and
/// [`upgradeable_lock`](ReadWriteLock::upgradeable_lock), a read side that may become the
/// write side: each a [`Lock`] with the whole lock surface (`lock`, `try_lock*`,
/// `try_lock_with` for a fixed lease or a cancellation token, `owned`, `hold_count`,
/// `force_unlock`, …). Guards are released on drop and stay on their thread.
///
/// # Guarantees
///
/// Those of [`Lock`] on every side (losses reported, a crashed holder's share freed when
/// its lease ends, bounded calls returning by their deadline plus 250 ms), and:
///
/// - **Never a reader beside a writer**, nor two writers, nor two upgradeable readers.
/// - **Reentrant** on every side, per thread.
/// - **Downgrade**: a thread holding the write side may take the read side (or the
///   upgradeable side); releasing the write side then leaves it reading, and lets the
///   other readers in.
/// - **No upgrade of a plain read**: a thread holding only the read side that asks for the
///   write side gets [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once (it
///   would wait for its own read hold forever), never a hang; a read that may have to
///   become a write takes the upgradeable side (below).
/// - **Writers are not starved**: first come, first served between readers and writers.
///   Once anyone waits, a newcomer queues behind it (a re-entry does not), so a stream of
///   readers never keeps a waiting writer out. A release hands the lock on directly to the
///   head of the queue: one writer, or every reader up to the next writer, at once.
/// - **A lease per hold**: every reader's hold has its own lease, renewed by the client's
///   one watchdog thread in its batched round. A crashed reader frees its share when its
///   lease ends; the other readers keep theirs (and so does a crashed upgradeable reader).
/// - **Upgradeable reads**: [`upgradeable_lock`](ReadWriteLock::upgradeable_lock) is a third side,
///   a read hold that one thread at a time may have, alongside the plain readers (it
///   excludes writers and other upgradeable readers), and that
///   [`upgrade`](crate::UpgradeableGuard::upgrade)s to the write side once the plain
///   readers have left, ahead of every waiting writer and without letting new readers
///   starve it. A thread holding a plain read hold cannot take it
///   ([`Error::WouldDeadlock`](crate::Error::WouldDeadlock)); the upgradeable reader's
///   own thread may also take the read side, at once (then release the upgradeable side
///   to go on reading as a plain reader).
///
/// On any side, `is_locked` tells whether anyone holds the lock in any mode,
/// `remaining_lease` is the longest lease of any hold, and `force_unlock` frees every
/// reader, the upgradeable reader and the writer. A read-write lock lives in keys of its
/// own (`<prefix>!rw:…`): a [`Lock`] of the same name is a different object.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let config = client.read_write_lock("config");
/// {
///     let _r = config.read()?;             // readers share the lock
///     // ... read the configuration ...
/// }
/// let w = config.write()?;                 // a writer waits for the readers, then is alone
/// let r = config.read()?;                  // downgrade: read while still writing
/// w.unlock()?;                             // now reading only; other readers come in
/// r.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub struct ReadWriteLock {
    read: ReadLock,
    write: WriteLock,
    upgradeable: UpgradeableLock,
}

/// The read side of a [`ReadWriteLock`]: shared with other readers.
pub type ReadLock = Lock<Read>;

/// The write side of a [`ReadWriteLock`]: exclusive.
pub type WriteLock = Lock<Write>;

/// The upgradeable read side of a [`ReadWriteLock`]: shared with plain readers, exclusive
/// among upgradeable readers and writers; its guards
/// ([`UpgradeableGuard`](crate::UpgradeableGuard)) upgrade to the write side.
pub type UpgradeableLock = Lock<Upgradeable>;

/// Proof that the current thread holds the read side of a [`ReadWriteLock`] (one level).
pub type ReadGuard = LockGuard<Read>;

/// Proof that the current thread holds the write side of a [`ReadWriteLock`] (one level).
pub type WriteGuard = LockGuard<Write>;

impl ReadWriteLock {
    pub(crate) fn new(client: &Client, name: Vec<u8>) -> ReadWriteLock {
        ReadWriteLock {
            read: client.handle(name.clone(), Object::ReadWrite),
            write: client.handle(name.clone(), Object::ReadWrite),
            upgradeable: client.handle(name, Object::ReadWrite),
        }
    }

    /// Blocks until this thread holds the read side, as std's and parking_lot's
    /// `RwLock::read`: any number of threads may read at once, while nobody writes. The
    /// guard's lease is renewed by the watchdog. For a fixed lease, a cancellation token or
    /// an owned hold, use the side itself: [`read_lock`](ReadWriteLock::read_lock).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let config = client.read_write_lock("config");
    /// let guard = config.read()?;              // shared with the other readers
    /// // ... read the configuration ...
    /// guard.unlock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn read(&self) -> Result<ReadGuard, Error> {
        self.read.lock()
    }

    /// Blocks until this thread holds the write side, as std's `RwLock::write`: one thread
    /// writes, while nobody else reads or writes. Fails with
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) on a thread that holds only
    /// the read side.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let config = client.read_write_lock("config");
    /// let guard = config.write()?;             // waits for the readers, then is alone
    /// // ... change the configuration ...
    /// guard.unlock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn write(&self) -> Result<WriteGuard, Error> {
        self.write.lock()
    }

    /// One attempt at the read side, without waiting: `Ok(None)` while someone writes
    /// (or a writer waits first).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if let Some(guard) = client.read_write_lock("config").try_read()? {
    ///     // ... read ...
    /// #   drop(guard);
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_read(&self) -> Result<Option<ReadGuard>, Error> {
        self.read.try_lock()
    }

    /// One attempt at the write side, without waiting: `Ok(None)` while anyone else reads
    /// or writes.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if let Some(guard) = client.read_write_lock("config").try_write()? {
    ///     // ... write ...
    /// #   drop(guard);
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_write(&self) -> Result<Option<WriteGuard>, Error> {
        self.write.try_lock()
    }

    /// Waits at most `wait` for the read side: `Ok(None)` if it was not had in time.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.read_write_lock("config").try_read_for(Duration::from_secs(1))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_read_for(&self, wait: Duration) -> Result<Option<ReadGuard>, Error> {
        self.read.try_lock_for(wait)
    }

    /// Waits at most `wait` for the write side: `Ok(None)` if it was not had in time.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.read_write_lock("config").try_write_for(Duration::from_secs(1))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_write_for(&self, wait: Duration) -> Result<Option<WriteGuard>, Error> {
        self.write.try_lock_for(wait)
    }

    /// Waits for the read side until `deadline`: `Ok(None)` if it was not had by then.
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let deadline = Instant::now() + Duration::from_secs(1);
    /// let guard = client.read_write_lock("config").try_read_until(deadline)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_read_until(&self, deadline: Instant) -> Result<Option<ReadGuard>, Error> {
        self.read.try_lock_until(deadline)
    }

    /// Waits for the write side until `deadline`: `Ok(None)` if it was not had by then.
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let deadline = Instant::now() + Duration::from_secs(1);
    /// let guard = client.read_write_lock("config").try_write_until(deadline)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_write_until(&self, deadline: Instant) -> Result<Option<WriteGuard>, Error> {
        self.write.try_lock_until(deadline)
    }

    /// The read side as a handle (Redisson's `readLock()`): a [`Lock`] with the whole
    /// surface (`try_lock_with` for a fixed lease or a cancellation token, `owned`,
    /// `hold_count`, `force_unlock`, …).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let reads = client.read_write_lock("config").read_lock();
    /// let options = redmutex::LockOptions::new().lease(Duration::from_secs(30));
    /// let guard = reads.try_lock_with(options)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "readLock")]
    pub fn read_lock(&self) -> ReadLock {
        self.read.clone()
    }

    /// The write side as a handle (Redisson's `writeLock()`), with the whole [`Lock`]
    /// surface.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let writes = client.read_write_lock("config").write_lock();
    /// let guard = writes.owned().lock()?;      // a write hold that may move threads
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "writeLock")]
    pub fn write_lock(&self) -> WriteLock {
        self.write.clone()
    }

    /// The upgradeable read side: one thread at a time holds it, alongside any number of
    /// readers, while nobody writes; its guard may
    /// [`upgrade`](crate::UpgradeableGuard::upgrade) to the write side (parking_lot's
    /// `upgradable_read`).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let config = client.read_write_lock("config");
    /// let u = config.upgradeable_lock().lock()?; // readers still come in, writers wait
    /// let w = u.upgrade()?;                      // waits for the readers, then writes alone
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "upgradable_read")]
    #[doc(alias = "upgradeable_read")]
    pub fn upgradeable_lock(&self) -> UpgradeableLock {
        self.upgradeable.clone()
    }

    /// The name the lock was made with.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// assert_eq!(client.read_write_lock("config").name(), b"config");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn name(&self) -> &[u8] {
        self.read.name()
    }
}

impl Clone for ReadWriteLock {
    fn clone(&self) -> Self {
        ReadWriteLock {
            read: self.read.clone(),
            write: self.write.clone(),
            upgradeable: self.upgradeable.clone(),
        }
    }
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("key", &String::from_utf8_lossy(self.read.keys.key()))
            .finish()
    }
}
