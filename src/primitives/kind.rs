//! The kinds of [`Lock`](crate::Lock): what an acquisition asks of the scripts.

mod sealed {
    pub trait Sealed {}
}

/// A kind of lock: [`Plain`], [`Fair`] or [`Fenced`]. Every kind has the whole lock
/// surface ([`Lock<K>`](crate::Lock), [`LockGuard<K>`](crate::LockGuard)); a kind only
/// changes how an acquisition behaves. Sealed: the kinds are this crate's.
pub trait Kind: sealed::Sealed + Send + Sync + 'static {
    /// The kind's name, for `Debug` output.
    const NAME: &'static str;
    #[doc(hidden)]
    /// Flags the scripts are given: 1 fair (never passes the queue), 2 fenced.
    const FLAGS: u8;
}

/// The default kind of [`Lock`](crate::Lock): a running thread may take a free lock past
/// sleeping waiters while the first of them has waited less than 10 ms; after that the
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

impl sealed::Sealed for Plain {}
impl sealed::Sealed for Fair {}
impl sealed::Sealed for Fenced {}

impl Kind for Plain {
    const NAME: &'static str = "Lock";
    const FLAGS: u8 = 0;
}

impl Kind for Fair {
    const NAME: &'static str = "FairLock";
    const FLAGS: u8 = 1;
}

impl Kind for Fenced {
    const NAME: &'static str = "FencedLock";
    const FLAGS: u8 = 2;
}

/// Whether holds of kind `K` draw fencing tokens.
pub(crate) fn is_fenced<K: Kind>() -> bool {
    K::FLAGS & 2 != 0
}
