//! `Permit`: permits of a semaphore, held until released or dropped.

use std::fmt;

use crate::primitives::kind::Permits;
use crate::{Error, LockGuard};

/// Proof that permits of a [`Semaphore`](crate::Semaphore) are held; dropping it gives
/// them back, best effort (an error is only logged; call [`release`](Permit::release) to
/// learn whether it worked).
///
/// Unlike a [`LockGuard`], a `Permit` is `Send`: permits are held by the acquisition, not
/// by a thread (its holder id is its own, never a thread's), so a permit taken on one
/// thread may be released on another, e.g. by the worker a job was handed to.
///
/// # Guarantees
///
/// - Its [`permits`](Permit::permits) stay held until it is released or dropped, or
///   their lease ends (renewed by the watchdog while the `Permit` lives); they are given
///   back once, never twice, all together.
/// - A loss is told, and stays told: [`is_lease_lost`](Permit::is_lease_lost),
///   [`lost`](Permit::lost), and [`release`](Permit::release) failing with
///   [`Error::LeaseLost`].
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let permit = client.semaphore("encoders", 2).acquire()?;
/// std::thread::spawn(move || {
///     // ... encode ...
///     permit.release()
/// });
/// # Ok::<(), redmutex::Error>(())
/// ```
#[must_use = "the permits are released as soon as the permit is dropped"]
pub struct Permit {
    guard: LockGuard<Permits>,
    permits: u32,
}

impl Permit {
    pub(crate) fn new(guard: LockGuard<Permits>, permits: u32) -> Permit {
        Permit { guard, permits }
    }

    /// How many permits this holds.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let options = redmutex::LockOptions::new().permits(3);
    /// let permit = client.semaphore("gpus", 8).try_acquire_with(options)?.expect("no wait bound set");
    /// assert_eq!(permit.permits(), 3);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Gives the permits back and reports the outcome: [`Error::LeaseLost`] whenever
    /// [`is_lease_lost`](Permit::is_lease_lost) is true by then, whatever Redis still holds
    /// (the permits are given back if they are still this acquisition's), and also when
    /// the release finds them gone although nothing had said so (`force_unlock`, deleted):
    /// they are marked lost then, and the hook is told; [`Error::NotHeld`] when a first
    /// try whose reply was lost may already have given them back, which the retry cannot
    /// vouch for; or a Redis error (they come back when their lease ends). Permits are
    /// never given back twice.
    ///
    /// ```no_run
    /// use redmutex::Error;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let permit = client.semaphore("encoders", 2).acquire()?;
    /// // ... encode ...
    /// match permit.release() {
    ///     Ok(()) => {}
    ///     Err(Error::LeaseLost { .. }) => eprintln!("the permit lapsed: more encoders may have run"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn release(self) -> Result<(), Error> {
        self.guard.unlock()
    }

    /// A channel told when these permits are lost (`recv()` returns `Ok` with the
    /// [`LostLease`](crate::LostLease)), and closed when they are released (`Err`): see
    /// [`LockGuard::lost`], which this is for permits. Like the permit, the receiver may be
    /// used on any thread.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let permit = client.semaphore("encoders", 2).acquire()?;
    /// let lost = permit.lost();
    /// std::thread::spawn(move || match lost.recv() {
    ///     Ok(lost) => eprintln!("the permit was lost: {}", lost.reason()),
    ///     Err(_) => {} // released
    /// });
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lost(&self) -> crossbeam_channel::Receiver<crate::LostLease> {
        self.guard.lost()
    }

    /// True once these permits are known to be gone (their lease ended: the watchdog
    /// could not renew it, or every `Client` was dropped): others may hold them now.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let permit = client.semaphore("encoders", 2).acquire()?;
    /// if permit.is_lease_lost() {
    ///     // the permit lapsed: another holder may use it now
    /// }
    /// # drop(permit);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        self.guard.is_lease_lost()
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("permits", &self.permits)
            .field("guard", &self.guard)
            .finish()
    }
}
