//! The kinds of [`Lock`](crate::Lock): what an acquisition asks of the scripts.

use crate::runtime::scripting::flags;
use crate::runtime::scripting::scripts::{self, Ops};

pub(crate) mod sealed {
    use crate::runtime::scripting::scripts::Ops;

    /// What makes a thread's guard `!Send`. Its name is for the compiler's message when a
    /// guard is moved to another thread ("required because it appears within the type
    /// `ThreadHoldSeeLockOwned`"): a hold of a thread is released by that thread, and a
    /// hold that moves is taken through `Lock::owned`.
    pub struct ThreadHoldSeeLockOwned(std::marker::PhantomData<*const ()>);

    pub trait Sealed {
        /// The scripts the kind runs and how its holds are kept.
        const OPS: &'static Ops;
        /// What makes its guards `!Send` (a hold owned by a thread), or `()`.
        type Owner;
        /// Whether each acquisition is a holder of its own (a fresh token), not the
        /// calling thread: an owned hold, or a semaphore's permits.
        const OWN_HOLDER: bool = false;
    }
}

/// A kind of lock: [`Plain`], [`Fair`], [`Fenced`], or the [`Read`], [`Write`] and
/// [`Upgradeable`] sides of a [`ReadWriteLock`](crate::ReadWriteLock). Every kind has the whole lock surface
/// ([`Lock<K>`](crate::Lock), [`LockGuard<K>`](crate::LockGuard)); a kind only changes how
/// an acquisition behaves. Sealed: the kinds are this crate's.
///
/// Code written once for any kind:
///
/// ```no_run
/// use redmutex::{Kind, Lock};
///
/// fn with_lock<K: Kind>(lock: &Lock<K>, work: impl FnOnce()) -> Result<(), redmutex::Error> {
///     let guard = lock.lock()?;
///     work();
///     guard.unlock()
/// }
///
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// with_lock(&client.lock("a"), || {})?;
/// with_lock(&client.fair_lock("b"), || {})?;
/// with_lock(&client.read_write_lock("c").read_lock(), || {})?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub trait Kind: sealed::Sealed + Send + Sync + 'static {
    /// The kind's name, for `Debug` output.
    const NAME: &'static str;
}

/// The default kind of [`Lock`](crate::Lock): a running thread may take a free lock past
/// sleeping waiters while the first of them has waited less than 2 ms; after that the
/// lock is handed to the waiters in turn.
#[derive(Debug)]
pub enum Plain {}

/// The kind of [`FairLock`](crate::FairLock): strictly first come, first served, every
/// turn handed over by the release before it.
#[derive(Debug)]
pub enum Fair {}

/// The kind of [`FencedLock`](crate::FencedLock): a [`Plain`] lock whose holds carry
/// fencing tokens ([`FencedGuard::token`](crate::FencedGuard::token)).
#[derive(Debug)]
pub enum Fenced {}

/// The kind of [`ReadLock`](crate::ReadLock): the shared side of a
/// [`ReadWriteLock`](crate::ReadWriteLock).
#[derive(Debug)]
pub enum Read {}

/// The kind of [`WriteLock`](crate::WriteLock): the exclusive side of a
/// [`ReadWriteLock`](crate::ReadWriteLock).
#[derive(Debug)]
pub enum Write {}

/// The kind of [`UpgradeableLock`](crate::UpgradeableLock): the upgradeable read side of
/// a [`ReadWriteLock`](crate::ReadWriteLock), shared with readers, exclusive among
/// upgradeable readers and writers, and able to become the write side
/// ([`UpgradeableGuard::upgrade`](crate::UpgradeableGuard::upgrade)).
#[derive(Debug)]
pub enum Upgradeable {}

/// The permits of a [`Semaphore`](crate::Semaphore): each acquisition is a holder of its
/// own, so its guard may move between threads.
#[derive(Debug)]
pub(crate) enum Permits {}

macro_rules! kinds {
    ($($kind:ty: $name:literal, $ops:expr, $owner:ty;)+) => {$(
        impl sealed::Sealed for $kind {
            const OPS: &'static Ops = $ops;
            type Owner = $owner;
        }

        impl Kind for $kind {
            const NAME: &'static str = $name;
        }
    )+};
}

kinds! {
    Plain: "Lock", &scripts::PLAIN, sealed::ThreadHoldSeeLockOwned;
    Fair: "FairLock", &scripts::FAIR, sealed::ThreadHoldSeeLockOwned;
    Fenced: "FencedLock", &scripts::FENCED, sealed::ThreadHoldSeeLockOwned;
    Read: "ReadLock", &scripts::READ, sealed::ThreadHoldSeeLockOwned;
    Write: "WriteLock", &scripts::WRITE, sealed::ThreadHoldSeeLockOwned;
    Upgradeable: "UpgradeableLock", &scripts::UPGRADEABLE, sealed::ThreadHoldSeeLockOwned;
    Permits: "Semaphore", &scripts::PERMITS, ();
}

/// An owned hold of a lock of kind `K` ([`Lock::owned`](crate::Lock::owned)):
/// the same scripts and keys as `K`, but each acquisition is a holder of its own, so its
/// guard may move between threads. Never constructed: a type-level marker only.
#[derive(Debug)]
pub(crate) enum Owned<K> {
    #[allow(dead_code)]
    Never(
        std::convert::Infallible,
        std::marker::PhantomData<fn() -> K>,
    ),
}

impl<K: Kind> sealed::Sealed for Owned<K> {
    const OPS: &'static Ops = K::OPS;
    type Owner = ();
    const OWN_HOLDER: bool = true;
}

impl<K: Kind> Kind for Owned<K> {
    const NAME: &'static str = K::NAME;
}

/// Whether holds of kind `K` draw fencing tokens.
pub(crate) fn is_fenced<K: Kind>() -> bool {
    K::OPS.flags & flags::FENCED != 0
}
