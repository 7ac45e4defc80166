//! `LockInfo`: what Redis records of one lock (or other object of a name) at one instant.

use std::time::Duration;

use crate::{HolderMetadata, LockKind};

/// What Redis records of one object of a name right now: a lock, a read-write lock, a
/// semaphore or a count-down latch, read in one step ([`Client::inspect`],
/// [`Client::list`]). For operators and tools (the `redmutex` command's `status`); a
/// program deciding whether to work should try to lock instead, since this may be stale
/// as soon as it returns. A semaphore is there from its first use on, while its number of
/// permits is defined, held or not; the other kinds while they are held, waited for or
/// (a latch) counting.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// for info in client.inspect("nightly-report")? {
///     println!("{} {}: held by {:?}, {} waiting", info.kind, info.name, info.holders, info.waiters.len());
/// }
/// # Ok::<(), redmutex::Error>(())
/// ```
///
/// [`Client::inspect`]: crate::Client::inspect
/// [`Client::list`]: crate::Client::list
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The name the object was made with (lossy UTF-8).
    pub name: String,
    /// Which kind of object it is ([`LockKind::Foreign`] when the object's key holds data
    /// that is not a redmutex object: someone else's key); `{}` writes `lock`,
    /// `read-write lock`, `semaphore`, `count-down latch` or `foreign`.
    pub kind: LockKind,
    /// Its Redis key.
    pub key: String,
    /// Each holder id (`<client-uuid>:<thread-token>`) with its reentry count; a
    /// read-write lock's are `r:<id>` (readers), `u:<id>` (the upgradeable reader) and
    /// `w:<id>` (the writer); a semaphore's
    /// count is the permits that holder has. A read-write lock's or semaphore's hold whose
    /// own lease has ended is not listed, even before a script has dropped it.
    pub holders: Vec<(String, u64)>,
    /// The time left on the key's lease: `None` when there is no key (only waiters, or a
    /// semaphore with no permit held) or it has no expiry.
    pub remaining_lease: Option<Duration>,
    /// The holder ids of the waiters, in the order they are served.
    pub waiters: Vec<String>,
    /// A fenced hold's token (a lock), if the hold has one.
    pub token: Option<u64>,
    /// A semaphore's number of permits, or a count-down latch's count.
    pub count: Option<u64>,
    /// The metadata of the current holds taken by clients that have some
    /// ([`ClientBuilder::metadata`](crate::ClientBuilder::metadata)), in the order of
    /// [`holders`](LockInfo::holders); empty when none has. A record lives exactly as
    /// long as its hold (it is released, force-unlocked or expires with it).
    pub metadata: Vec<HolderMetadata>,
}
