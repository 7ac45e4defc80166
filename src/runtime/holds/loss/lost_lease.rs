//! `LostLease`: what the client-wide hook ([`ClientBuilder::on_lease_lost`]) and a guard's
//! `lost()` channel are told when a hold of this process is lost.
//!
//! [`ClientBuilder::on_lease_lost`]: crate::ClientBuilder::on_lease_lost

use std::fmt;
use std::sync::Arc;

use crate::runtime::keys::LockKeys;

/// Why a hold was lost ([`LostLease::reason`]).
///
/// ```no_run
/// use redmutex::LossReason;
/// let client = redmutex::Client::builder()
///     .on_lease_lost(|lost| match lost.reason() {
///         // Expected when a holder overruns: its cap ended the hold.
///         LossReason::MaxHold => eprintln!("{:?} ran past its max_hold", lost.name_lossy()),
///         // Redis or the network: worth an alert.
///         reason => eprintln!("lost {:?}: {reason}", lost.name_lossy()),
///     })
///     .build()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// Its fixed lease ran out (by this process's clock), and no other level of the hold
    /// needed the lock any longer.
    LeaseExpired,
    /// The server no longer had the hold although its lease had time left: it was deleted
    /// ([`force_unlock`](crate::Lock::force_unlock)) and perhaps taken by another holder, or
    /// the server lost its data without a failover being seen.
    Deleted,
    /// A failover (a new primary) lost the hold: it was missing on the server this client
    /// talks to now.
    ServerLost,
    /// No renewal reached the server for as long as the lease lasts (Redis frozen,
    /// unreachable or cut off), or, with
    /// [`sync_replicas`](crate::ClientBuilder::sync_replicas), none reached the replicas
    /// (a failover would keep only the last lease they have), or a hold handed over by a
    /// release could not be confirmed within its pickup window: the key may have expired
    /// there.
    RenewalFailed,
    /// The hold reached its [`max_hold`](crate::ClientBuilder::max_hold): the watchdog
    /// stopped renewing it, and its lease ran out.
    MaxHold,
    /// Every [`Client`](crate::Client) (and every lock handle) was dropped while the hold
    /// relied on the watchdog: nothing renews it any more.
    ClientDropped,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::LeaseExpired => "its fixed lease ran out",
            LossReason::Deleted => "the server no longer had it (deleted or taken by another)",
            LossReason::ServerLost => "a failover lost it",
            LossReason::RenewalFailed => "no renewal reached the server within the lease",
            LossReason::MaxHold => "it reached its max_hold",
            LossReason::ClientDropped => "every Client was dropped, so nothing renewed it",
        })
    }
}

/// A hold this process lost, as told to the hook set with
/// [`ClientBuilder::on_lease_lost`](crate::ClientBuilder::on_lease_lost): the hook is
/// called once per lost hold (a thread's reentrant levels of one lock are one hold),
/// never for a hold released normally. Each guard's [`lost`](crate::LockGuard::lost)
/// channel is sent the same (a release only closes it).
///
/// ```no_run
/// let client = redmutex::Client::builder()
///     .on_lease_lost(|lost: &redmutex::LostLease| {
///         eprintln!("lost {} {:?}: {}", lost.kind(), lost.name_lossy(), lost.reason());
///     })
///     .build()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone)]
pub struct LostLease {
    keys: Arc<LockKeys>,
    kind: &'static str,
    reason: LossReason,
}

impl LostLease {
    pub(crate) fn new(keys: Arc<LockKeys>, kind: &'static str, reason: LossReason) -> LostLease {
        LostLease { keys, kind, reason }
    }

    /// The lock's name, as it was given when the handle was made.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .on_lease_lost(|lost: &redmutex::LostLease| {
    ///         if lost.name().starts_with(b"payments:") {
    ///             eprintln!("a payment lock was lost: page someone");
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn name(&self) -> &[u8] {
        self.keys.name()
    }

    /// [`name`](LostLease::name) as text, invalid UTF-8 replaced.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .on_lease_lost(|lost: &redmutex::LostLease| {
    ///         eprintln!("lost the lock {:?}", lost.name_lossy());
    ///     })
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(self.keys.name()).into_owned()
    }

    /// The kind of what was held: `"Lock"`, `"FairLock"`, `"FencedLock"`, `"ReadLock"`,
    /// `"WriteLock"`, `"UpgradeableLock"` or `"Semaphore"` (an owned hold's is its
    /// lock's).
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .on_lease_lost(|lost: &redmutex::LostLease| {
    ///         if lost.kind() == "WriteLock" {
    ///             eprintln!("a writer lost its lock: readers may have seen a partial write");
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Why the hold was lost.
    ///
    /// ```no_run
    /// use redmutex::LossReason;
    /// let client = redmutex::Client::builder()
    ///     .on_lease_lost(|lost: &redmutex::LostLease| {
    ///         match lost.reason() {
    ///             LossReason::MaxHold => eprintln!("a holder overran its max_hold"),
    ///             other => eprintln!("lost {:?}: {other}", lost.name_lossy()),
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn reason(&self) -> LossReason {
        self.reason
    }
}

impl fmt::Debug for LostLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostLease")
            .field("name", &String::from_utf8_lossy(self.keys.name()))
            .field("kind", &self.kind)
            .field("reason", &self.reason)
            .finish()
    }
}
