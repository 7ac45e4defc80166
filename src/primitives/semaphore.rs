//! `Semaphore`: at most N permits held at once, each with an owner and a lease.

use std::fmt;
use std::time::{Duration, Instant};

use crate::primitives::kind::Permits;
use crate::runtime::calls;
use crate::runtime::con::Con;
use crate::runtime::keys::Object;
use crate::runtime::lease::Lease;
use crate::{CancelToken, Client, Error, Lock, Permit};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = u32::MAX;

/// A named counting semaphore shared by every thread and process that uses the name: at
/// most its number of permits are held at once.
///
/// Unlike Redisson's `RSemaphore`, **every held permit has an owner and a lease**: the
/// acquisition that took it, renewed by the client's watchdog thread while its [`Permit`]
/// lives. A crashed holder's permits come back when its lease ends (a watchdog timeout),
/// with no permit ids to keep; a dropped `Permit` gives them back at once.
///
/// Waiting does not poll: a thread that cannot have its permits joins the semaphore's
/// queue and sleeps until a release hands them to it directly. The queue is first come,
/// first served (a newcomer queues behind anyone waiting, so a request for many permits is
/// not starved by requests for few), and a release of `n` permits hands them to the
/// waiters at the head of the queue that they cover, in order, and wakes nobody else.
///
/// The number of permits is the semaphore's definition in Redis: the first use of the name
/// creates it with the number this handle was made with, and from then on the number in
/// Redis counts (operators change it with [`add_permits`](Semaphore::add_permits),
/// [`reduce_permits`](Semaphore::reduce_permits) and [`set_permits`](Semaphore::set_permits);
/// like a fencing counter, it never expires). A semaphore lives in keys of its own
/// (`<prefix>!sem:…`): a lock of the same name is a different object.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let api = client.semaphore("partner-api", 4);
/// let permit = api.acquire()?;             // blocks while 4 calls run, in any process
/// // ... call the partner's API ...
/// permit.release()?;                       // the next waiter gets it directly
/// # Ok::<(), redmutex::Error>(())
/// ```
pub struct Semaphore {
    permits: Lock<Permits>,
}

impl Semaphore {
    pub(crate) fn new(client: &Client, name: Vec<u8>, permits: u32) -> Semaphore {
        let mut handle: Lock<Permits> = client.handle(name, Object::Semaphore);
        handle.initial = permits;
        Semaphore { permits: handle }
    }

    /// Blocks until one permit is held.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let permit = client.semaphore("encoders", 2).acquire()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn acquire(&self) -> Result<Permit, Error> {
        self.acquire_many(1)
    }

    /// Blocks until `n` permits are held, all at once (never some of them while waiting).
    ///
    /// Fails with [`Error::InvalidArgument`] for zero, and at once, writing nothing, for
    /// more than the semaphore's number of permits (no release could ever cover it: it
    /// would wait forever, and everyone queued behind it too). A call already waiting when
    /// [`reduce_permits`](Semaphore::reduce_permits) or
    /// [`set_permits`](Semaphore::set_permits) takes the number below its `n` fails so
    /// then, leaving the queue to the waiters behind it. The same holds for every
    /// `try_acquire_many*`.
    pub fn acquire_many(&self, n: u32) -> Result<Permit, Error> {
        Ok(self
            .take(n, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One attempt at one permit, without waiting: `Ok(None)` when none is free (or others
    /// wait for them first).
    pub fn try_acquire(&self) -> Result<Option<Permit>, Error> {
        self.take(1, Some(Instant::now()))
    }

    /// One attempt at `n` permits, without waiting.
    pub fn try_acquire_many(&self, n: u32) -> Result<Option<Permit>, Error> {
        self.take(n, Some(Instant::now()))
    }

    /// Waits at most `wait` for one permit: `Ok(None)` if it was not had in time.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let api = client.semaphore("partner-api", 4);
    /// match api.try_acquire_for(Duration::from_secs(2))? {
    ///     Some(_permit) => { /* call the API */ }
    ///     None => eprintln!("too busy, try later"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_acquire_for(&self, wait: Duration) -> Result<Option<Permit>, Error> {
        self.try_acquire_many_for(1, wait)
    }

    /// Waits for one permit until `deadline`: `Ok(None)` if it was not had by then.
    pub fn try_acquire_until(&self, deadline: Instant) -> Result<Option<Permit>, Error> {
        self.take(1, Some(deadline))
    }

    /// Waits at most `wait` for `n` permits.
    pub fn try_acquire_many_for(&self, n: u32, wait: Duration) -> Result<Option<Permit>, Error> {
        match Instant::now().checked_add(wait) {
            Some(deadline) => self.try_acquire_many_until(n, deadline),
            None => self.take(n, None),
        }
    }

    /// Waits for `n` permits until `deadline`.
    pub fn try_acquire_many_until(
        &self,
        n: u32,
        deadline: Instant,
    ) -> Result<Option<Permit>, Error> {
        self.take(n, Some(deadline))
    }

    /// Blocks until one permit is held, as [`acquire`](Semaphore::acquire), or until
    /// `cancel` is cancelled: then it leaves the queue and fails with
    /// [`Error::Cancelled`], holding nothing (see [`CancelToken`]).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let token = redmutex::CancelToken::new();
    /// let permit = client.semaphore("encoders", 2).acquire_cancellable(&token)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn acquire_cancellable(&self, cancel: &CancelToken) -> Result<Permit, Error> {
        self.acquire_many_cancellable(1, cancel)
    }

    /// Blocks until `n` permits are held, as [`acquire_many`](Semaphore::acquire_many), or
    /// until `cancel` is cancelled ([`Error::Cancelled`]).
    pub fn acquire_many_cancellable(&self, n: u32, cancel: &CancelToken) -> Result<Permit, Error> {
        Ok(self
            .take_cancellable(n, None, Some(cancel))?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// Waits for one permit until `deadline` (`Ok(None)` if it was not had by then), or
    /// until `cancel` is cancelled ([`Error::Cancelled`]).
    pub fn try_acquire_until_cancellable(
        &self,
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<Option<Permit>, Error> {
        self.take_cancellable(1, Some(deadline), Some(cancel))
    }

    /// Waits for `n` permits until `deadline`, or until `cancel` is cancelled
    /// ([`Error::Cancelled`]).
    pub fn try_acquire_many_until_cancellable(
        &self,
        n: u32,
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<Option<Permit>, Error> {
        self.take_cancellable(n, Some(deadline), Some(cancel))
    }

    /// The permits free right now (the number of permits less those held; 0 when more are
    /// held than there are, after a [`reduce_permits`](Semaphore::reduce_permits)).
    pub fn available_permits(&self) -> Result<u32, Error> {
        let (total, used) = self.permits_op("get", 0)?;
        Ok(total.saturating_sub(used))
    }

    /// The semaphore's number of permits, held or not.
    pub fn permits(&self) -> Result<u32, Error> {
        Ok(self.permits_op("get", 0)?.0)
    }

    /// Adds `n` permits (handed to waiters at once) and returns the new number. Fails with
    /// [`Error::InvalidArgument`], changing nothing, past [`MAX_PERMITS`].
    pub fn add_permits(&self, n: u32) -> Result<u32, Error> {
        Ok(self.permits_op("add", n)?.0)
    }

    /// Takes `n` permits away and returns the new number. Permits already held stay with
    /// their holders; nobody else gets one until enough are released. Fails with
    /// [`Error::InvalidArgument`], changing nothing, when there are fewer than `n`. Waiting
    /// calls that ask for more permits than remain fail with [`Error::InvalidArgument`].
    pub fn reduce_permits(&self, n: u32) -> Result<u32, Error> {
        Ok(self.permits_op("reduce", n)?.0)
    }

    /// Sets the number of permits (more are handed to waiters at once; waiting calls that
    /// ask for more than the new number fail with [`Error::InvalidArgument`]).
    pub fn set_permits(&self, n: u32) -> Result<(), Error> {
        self.permits_op("set", n).map(drop)
    }

    /// The name the semaphore was made with.
    pub fn name(&self) -> &[u8] {
        self.permits.name()
    }

    /// Frees every permit whoever holds them (see [`Client::force_unlock`]): the client
    /// frees a name's objects without knowing how a semaphore keeps its permits.
    pub(crate) fn force_unlock(&self) -> Result<bool, Error> {
        self.permits.force_unlock()
    }

    fn check(&self) -> Result<(), Error> {
        if self.permits.initial == 0 {
            return Err(Error::InvalidArgument(
                "a semaphore must be made with at least one permit".to_owned(),
            ));
        }
        Ok(())
    }

    fn take(&self, n: u32, deadline: Option<Instant>) -> Result<Option<Permit>, Error> {
        self.take_cancellable(n, deadline, None)
    }

    fn take_cancellable(
        &self,
        n: u32,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<Option<Permit>, Error> {
        self.check()?;
        if n == 0 {
            return Err(Error::InvalidArgument(
                "acquire at least one permit".to_owned(),
            ));
        }
        let guard = self
            .permits
            .acquire_cancellable(Lease::Watchdog, deadline, n, cancel)?;
        Ok(guard.map(|guard| Permit::new(guard, n)))
    }

    /// Runs `sem_permits.lua`: (permits, held) after the operation.
    fn permits_op(&self, op: &str, n: u32) -> Result<(u32, u32), Error> {
        self.check()?;
        crate::name::check(self.permits.name(), "semaphore names must not be empty")?;
        let lock = &self.permits;
        let inner = &lock.client.inner;
        inner.check_process()?;
        let keys = &lock.keys;
        let permits = calls::sem_permits(keys, op, n, lock.initial, MAX_PERMITS);
        let call = |con: &mut Con| inner.eval(con, &permits);
        // Adding or taking away twice (a retry after a lost reply) would change the count
        // twice: those run once, and a dropped connection is the caller's error.
        let (first, second): (i64, i64) = match op {
            "add" | "reduce" => inner.run_once(call),
            _ => inner.run(call),
        }
        .map_err(|e| e.on_lock(self.name()))?;
        if first < 0 {
            return Err(Error::InvalidArgument(match op {
                "add" => format!(
                    "adding {n} permits to {second} would pass the maximum of {MAX_PERMITS}"
                ),
                _ => format!("cannot take {n} permits away from {second}"),
            }));
        }
        let clamp = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
        Ok((clamp(first), clamp(second)))
    }
}

impl Clone for Semaphore {
    fn clone(&self) -> Self {
        Semaphore {
            permits: self.permits.clone(),
        }
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("key", &String::from_utf8_lossy(self.permits.keys.key()))
            .field("permits", &self.permits.initial)
            .finish()
    }
}
