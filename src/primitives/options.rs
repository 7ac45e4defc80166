//! `LockOptions`: everything an acquisition may ask for beyond the default, as one value.

use std::time::{Duration, Instant};

use crate::primitives::cancel::CancellationToken;
use crate::runtime::holds::lease::{fixed, Lease};
use crate::Error;

/// What an acquisition asks for beyond the default: a fixed lease, a bound on the wait, a
/// [`CancellationToken`], a number of permits. One value for every lock-like type, passed
/// to its one `try_*_with` method ([`Lock::try_lock_with`](crate::Lock::try_lock_with),
/// [`OwnedLock::try_lock_with`](crate::OwnedLock::try_lock_with),
/// [`MultiLock::try_lock_with`](crate::MultiLock::try_lock_with),
/// [`Semaphore::try_acquire_with`](crate::Semaphore::try_acquire_with)), instead of one
/// method name per combination.
///
/// What every hold of a client records for operators (a host, a pid) is not an option of
/// one acquisition but a client setting, [`ClientBuilder::metadata`](crate::ClientBuilder::metadata).
///
/// A consuming builder: start from [`LockOptions::new`] (or `Default`), set what differs.
/// The value is cheap to clone and may be kept and reused: a wait given with
/// [`wait_for`](LockOptions::wait_for) is measured from each call that uses it.
///
/// ```no_run
/// use std::time::Duration;
/// use redmutex::LockOptions;
///
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("report");
/// // Redisson's tryLock(1, 30, SECONDS): wait up to 1 s, then hold for 30 s, never renewed.
/// let options = LockOptions::new()
///     .wait_for(Duration::from_secs(1))
///     .lease(Duration::from_secs(30));
/// match lock.try_lock_with(options)? {
///     Some(guard) => guard.unlock()?,
///     None => println!("busy"),
/// }
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "options do nothing until passed to a `try_lock_with` or `try_acquire_with`"]
pub struct LockOptions {
    lease: Option<Duration>,
    wait: Wait,
    cancel: Option<CancellationToken>,
    permits: Option<u32>,
}

/// How long an acquisition waits.
#[derive(Clone, Copy, Debug, Default)]
enum Wait {
    #[default]
    Forever,
    For(Duration),
    Until(Instant),
}

/// What [`LockOptions`] come to for one call: the acquisition path's arguments.
pub(crate) struct Resolved<'a> {
    pub(crate) lease: Lease,
    /// `None`: wait as long as it takes.
    pub(crate) deadline: Option<Instant>,
    pub(crate) cancel: Option<&'a CancellationToken>,
    pub(crate) permits: u32,
}

impl LockOptions {
    /// The defaults: a watchdog lease, waiting as long as it takes, no cancellation, one
    /// permit. With them, `try_lock_with` is [`lock`](crate::Lock::lock) returning `Some`.
    ///
    /// ```no_run
    /// let options = redmutex::LockOptions::new();
    /// ```
    pub fn new() -> LockOptions {
        LockOptions::default()
    }

    /// Holds for a fixed `lease`, never renewed: after it the lock is free for others
    /// whether or not the guard was released, and the old guard's `is_lease_lost` says so
    /// and its `unlock` fails with [`Error::LeaseLost`]. Fails the call (with
    /// [`Error::InvalidArgument`], sending nothing) for a zero lease or one over ten years.
    ///
    /// Defaults to the client's
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout), renewed by the
    /// watchdog while the guard lives.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let options = redmutex::LockOptions::new().lease(Duration::from_secs(10));
    /// let guard = client.lock("report").try_lock_with(options)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "leaseTime")]
    pub fn lease(mut self, lease: Duration) -> LockOptions {
        self.lease = Some(lease);
        self
    }

    /// Waits at most `wait`, measured from each call: then the call returns `Ok(None)`. A
    /// zero wait makes one attempt; one too long to add to the current time (such as
    /// `Duration::MAX`) waits as long as it takes. Bounded also against a Redis that stops
    /// answering, as [`try_lock_for`](crate::Lock::try_lock_for).
    ///
    /// Defaults to waiting as long as it takes.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let options = redmutex::LockOptions::new().wait_for(Duration::from_millis(500));
    /// ```
    #[doc(alias = "waitTime")]
    pub fn wait_for(mut self, wait: Duration) -> LockOptions {
        self.wait = Wait::For(wait);
        self
    }

    /// Waits until `deadline`: then the call returns `Ok(None)` (a deadline already past
    /// makes one attempt).
    ///
    /// Defaults to waiting as long as it takes.
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// let options = redmutex::LockOptions::new().wait_until(deadline);
    /// ```
    pub fn wait_until(mut self, deadline: Instant) -> LockOptions {
        self.wait = Wait::Until(deadline);
        self
    }

    /// Lets `token` stop the wait, from any thread: the call then leaves the queue and
    /// fails with [`Error::Cancelled`], holding nothing (see [`CancellationToken`]). A
    /// token cancelled before the call fails it at once, with nothing sent.
    ///
    /// Defaults to no token: only the wait's end stops it.
    ///
    /// ```no_run
    /// use redmutex::{CancellationToken, Error, LockOptions};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let token = CancellationToken::new();
    /// // token.cancel() from another thread stops the wait.
    /// match client.lock("report").try_lock_with(LockOptions::new().cancellable(&token)) {
    ///     Ok(Some(guard)) => guard.unlock()?,
    ///     Ok(None) => unreachable!("no wait bound was set"),
    ///     Err(Error::Cancelled { .. }) => println!("gave up waiting"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "cancellation_token")]
    #[doc(alias = "cancel_token")]
    #[doc(alias = "with_cancellation")]
    #[doc(alias = "token")]
    pub fn cancellable(mut self, token: &CancellationToken) -> LockOptions {
        self.cancel = Some(token.clone());
        self
    }

    /// Asks a [`Semaphore`](crate::Semaphore) for `permits` at once (never some of them
    /// while waiting). Fails the call with [`Error::InvalidArgument`] for zero, or for
    /// more than one on a lock (a lock has no permits to count).
    ///
    /// Defaults to 1.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let three = client.semaphore("gpu", 8).try_acquire_with(redmutex::LockOptions::new().permits(3))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "acquire_many")]
    pub fn permits(mut self, permits: u32) -> LockOptions {
        self.permits = Some(permits);
        self
    }

    /// The options of one call of a lock (one permit only).
    pub(crate) fn for_lock(&self) -> Result<Resolved<'_>, Error> {
        let resolved = self.for_semaphore()?;
        if resolved.permits != 1 {
            return Err(Error::invalid(format!(
                "{} permits asked of a lock: permits are a Semaphore's (a lock has one holder, or its readers)",
                resolved.permits
            )));
        }
        Ok(resolved)
    }

    /// The options of one call, checked: the lease, the deadline from now.
    pub(crate) fn for_semaphore(&self) -> Result<Resolved<'_>, Error> {
        let lease = match self.lease {
            Some(lease) => fixed(lease)?,
            None => Lease::Watchdog,
        };
        let permits = self.permits.unwrap_or(1);
        if permits == 0 {
            return Err(Error::invalid("acquire at least one permit"));
        }
        let deadline = match self.wait {
            Wait::Forever => None,
            Wait::For(wait) => Instant::now().checked_add(wait),
            Wait::Until(deadline) => Some(deadline),
        };
        Ok(Resolved {
            lease,
            deadline,
            cancel: self.cancel.as_ref(),
            permits,
        })
    }
}
