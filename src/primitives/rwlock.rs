//! `ReadWriteLock`: many readers or one writer, and a waiting writer is never starved.

use std::fmt;

use crate::primitives::kind::{Read, Upgradeable, Write};
use crate::runtime::keys::Object;
use crate::{Client, Lock, LockGuard};

/// A named read-write lock: many threads may read at once, across processes, or one thread
/// may write, alone.
///
/// [`read`](ReadWriteLock::read) and [`write`](ReadWriteLock::write) are its two sides,
/// and [`upgradeable`](ReadWriteLock::upgradeable) a read side that may become the write
/// side. Each is a [`Lock`] with the whole lock surface (`lock`, `try_lock*`, the
/// `_with_lease_` variants, `hold_count`, `force_unlock`, …) and [`LockGuard`]s that are
/// released on drop and stay on their thread.
///
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
/// - **Upgradeable reads**: [`upgradeable`](ReadWriteLock::upgradeable) is a third side,
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
///     let _r = config.read().lock()?;      // readers share the lock
///     // ... read the configuration ...
/// }
/// let w = config.write().lock()?;          // a writer waits for the readers, then is alone
/// let r = config.read().lock()?;           // downgrade: read while still writing
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

    /// The read side: any number of threads may hold it at once, while nobody writes.
    pub fn read(&self) -> ReadLock {
        self.read.clone()
    }

    /// The write side: one thread holds it, while nobody else reads or writes.
    pub fn write(&self) -> WriteLock {
        self.write.clone()
    }

    /// The upgradeable read side: one thread at a time holds it, alongside any number of
    /// readers, while nobody writes; its guard may
    /// [`upgrade`](crate::UpgradeableGuard::upgrade) to the write side.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let config = client.read_write_lock("config");
    /// let u = config.upgradeable().lock()?; // readers still come in, writers wait
    /// let w = u.upgrade()?;                 // waits for the readers, then writes alone
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn upgradeable(&self) -> UpgradeableLock {
        self.upgradeable.clone()
    }

    /// The name the lock was made with.
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
