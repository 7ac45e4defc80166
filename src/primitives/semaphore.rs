//! `Semaphore`: at most N permits held at once, each with an owner and a lease.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::primitives::kind::Permits;
use crate::runtime::connection::con::Con;
use crate::runtime::holds::lease::{millis, Lease, MAX_LEASE, PICKUP};
use crate::runtime::keys::{self, Object};
use crate::runtime::scripting::calls;
use crate::{CancellationToken, Client, Error, Lock, LockOptions, Permit};

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
/// [`reduce_permits`](Semaphore::reduce_permits) and [`set_permits`](Semaphore::set_permits)).
/// A handle made with a number the semaphore neither was defined with nor has now is
/// refused at every acquisition with [`Error::InvalidArgument`] naming both, and nothing
/// changes: `client.semaphore("x", 5)` on a name defined with 3 never silently gets 3.
/// (Handles made with the number it was defined with keep working after an operator
/// changes it, and so do handles made with the new number; reading the number is no
/// acquisition.) The definition lives while the semaphore is used and
/// [`expire_after`](Semaphore::with_expire_after) (a day unless the handle says otherwise)
/// past its last use, never while a permit is held: names made per entity leave nothing
/// behind. A semaphore lives in keys of its own (`<prefix>!sem:…`): a lock of the same name
/// is a different object.
///
/// # Guarantees
///
/// - Never more permits held at once than the semaphore's number, across every client,
///   while Redis keeps its data (a number reduced below those held takes none back).
/// - A crashed holder's permits come back when their lease ends; a lost lease is
///   reported ([`Permit::is_lease_lost`], [`Permit::lost`], `release` failing with
///   [`Error::LeaseLost`]).
/// - First come, first served: a request for many permits is not starved by requests for
///   few, and a release wakes only the waiters it covers.
/// - Bounded calls (`try_acquire*`) return by their deadline plus 250 ms, even when Redis
///   is frozen or unreachable.
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
        Semaphore::made(client, name, permits, keys::DEFAULT_EXPIRE_AFTER_MS)
    }

    fn made(client: &Client, name: Vec<u8>, permits: u32, expire_after_ms: u64) -> Semaphore {
        let mut handle: Lock<Permits> = client.handle(name, Object::Semaphore);
        handle.initial = permits;
        Arc::get_mut(&mut handle.keys)
            .expect("a handle just made shares its keys with nobody")
            .set_expire_after_ms(expire_after_ms);
        Semaphore { permits: handle }
    }

    /// How long a semaphore's definition outlives its last use unless
    /// [`with_expire_after`](Semaphore::with_expire_after) says otherwise: a day.
    pub const DEFAULT_EXPIRE_AFTER: Duration = Duration::from_millis(keys::DEFAULT_EXPIRE_AFTER_MS);

    /// This semaphore with its definition (its number of permits in Redis) kept
    /// `expire_after` past its last use, rather than
    /// [`DEFAULT_EXPIRE_AFTER`](Semaphore::DEFAULT_EXPIRE_AFTER) (a day).
    ///
    /// The definition never expires while a permit is held: each acquisition and each
    /// renewal of a permit's lease sets it to expire no sooner than `expire_after` past
    /// that lease's end, each of the other calls (`permits`, `add_permits`, …) no sooner
    /// than `expire_after` from then, and no call ever brings its expiry nearer. So it
    /// goes between `expire_after` and `expire_after` plus a lease after the last permit
    /// is given back (with the number of permits an operator gave it), and the next use
    /// makes it anew with the handle's number.
    ///
    /// A handle rather than a variant of every call, as
    /// [`Lock::with_max_hold`](crate::Lock::with_max_hold): how long a definition is
    /// worth keeping is a property of what the semaphore is for. Names made per entity
    /// (`"export:{customer}"`) want a short one; a semaphore whose number an operator
    /// changes and that is used less than daily, a long one.
    ///
    /// Fails with [`Error::InvalidArgument`] under a second (a permit handed to a waiter
    /// must be picked up within a second, and the definition outlives it) or over ten
    /// years; nothing is sent.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// # let customer = 42;
    /// let exports = client
    ///     .semaphore(format!("export:{customer}"), 2)
    ///     .with_expire_after(Duration::from_secs(600))?;
    /// let permit = exports.acquire()?;
    /// // Ten minutes after the last export of this customer, nothing of it is left in Redis.
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn with_expire_after(&self, expire_after: Duration) -> Result<Semaphore, Error> {
        if expire_after < PICKUP || expire_after > MAX_LEASE {
            return Err(Error::invalid(format!(
                "a semaphore's expire_after must be at least {PICKUP:?} and at most ten \
                 years, not {expire_after:?}"
            ))
            .on_lock(self.name()));
        }
        Ok(Semaphore::made(
            &self.permits.client,
            self.name().to_vec(),
            self.permits.initial,
            millis(expire_after),
        ))
    }

    /// Blocks until one permit is held, its lease renewed by the watchdog while the
    /// [`Permit`] lives. Several permits at once, a fixed lease, a cancellation token:
    /// [`try_acquire_with`](Semaphore::try_acquire_with).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let permit = client.semaphore("encoders", 2).acquire()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn acquire(&self) -> Result<Permit, Error> {
        Ok(self
            .take(Lease::Watchdog, 1, None, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One attempt at one permit, without waiting: `Ok(None)` when none is free (or others
    /// wait for them first).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.semaphore("encoders", 2).try_acquire()? {
    ///     Some(permit) => permit.release()?,
    ///     None => println!("both encoders busy"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_acquire(&self) -> Result<Option<Permit>, Error> {
        self.take(Lease::Watchdog, 1, Some(Instant::now()), None)
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
        self.take(Lease::Watchdog, 1, Instant::now().checked_add(wait), None)
    }

    /// Waits for one permit until `deadline`: `Ok(None)` if it was not had by then.
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let deadline = Instant::now() + Duration::from_secs(2);
    /// let permit = client.semaphore("partner-api", 4).try_acquire_until(deadline)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_acquire_until(&self, deadline: Instant) -> Result<Option<Permit>, Error> {
        self.take(Lease::Watchdog, 1, Some(deadline), None)
    }

    /// Acquires with [`LockOptions`]: a number of [`permits`](LockOptions::permits), all
    /// at once (never some of them while waiting), a fixed lease, a bound on the wait, a
    /// [`CancellationToken`](crate::CancellationToken) (then [`Error::Cancelled`], holding
    /// nothing). `Ok(None)` only when the options' wait ran out.
    ///
    /// Fails with [`Error::InvalidArgument`] for zero permits, and at once, writing
    /// nothing, for more than the semaphore's number of permits (no release could ever
    /// cover it: it would wait forever, and everyone queued behind it too), or through a
    /// handle made with a number the semaphore neither was defined with nor has (see
    /// [`Semaphore`]). A call already waiting when
    /// [`reduce_permits`](Semaphore::reduce_permits) or
    /// [`set_permits`](Semaphore::set_permits) takes the number below its request, or
    /// away from its handle's, fails so at its next attempt, leaving the queue to the
    /// waiters behind it. The other ways to acquire fail the same.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redmutex::LockOptions;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let gpus = client.semaphore("gpus", 8);
    /// let options = LockOptions::new().permits(3).wait_for(Duration::from_secs(10));
    /// if let Some(permit) = gpus.try_acquire_with(options)? {
    ///     assert_eq!(permit.permits(), 3);
    ///     // ... train on three GPUs ...
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "acquire_many")]
    #[doc(alias = "tryAcquire")]
    pub fn try_acquire_with(&self, options: LockOptions) -> Result<Option<Permit>, Error> {
        let o = options
            .for_semaphore()
            .map_err(|e| e.on_lock(self.name()))?;
        self.take(o.lease, o.permits, o.deadline, o.cancel)
    }

    /// The permits free right now (the number of permits less those held; 0 when more are
    /// held than there are, after a [`reduce_permits`](Semaphore::reduce_permits)).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let encoders = client.semaphore("encoders", 2);
    /// let _permit = encoders.acquire()?;
    /// println!("{} encoder(s) free", encoders.available_permits()?);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "availablePermits")]
    pub fn available_permits(&self) -> Result<u32, Error> {
        let (total, used) = self.permits_op("get", 0)?;
        Ok(total.saturating_sub(used))
    }

    /// The semaphore's number of permits, held or not.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// assert_eq!(client.semaphore("fresh-name", 3).permits()?, 3); // made on first use
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn permits(&self) -> Result<u32, Error> {
        Ok(self.permits_op("get", 0)?.0)
    }

    /// Sets the number of permits to `n` only if the semaphore has none defined yet
    /// (Redisson's `trySetPermits`): `Ok(true)` if it set them, `Ok(false)` if the name
    /// already had a number (left unchanged). A semaphore is defined by its first use,
    /// with the number its handle was made with ([`Client::semaphore`]); this defines it
    /// without acquiring, as a first use with `n` would (handles made with another number
    /// are then refused). [`set_permits`](Semaphore::set_permits) overwrites instead.
    /// Fails with [`Error::InvalidArgument`] for zero. Not repeated after a lost reply
    /// (the repeat could not tell its own set from another's).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let slots = client.semaphore("slots", 3);
    /// if slots.try_set_permits(3)? {
    ///     println!("we defined the semaphore with 3 permits");
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "trySetPermits")]
    pub fn try_set_permits(&self, n: u32) -> Result<bool, Error> {
        if n == 0 {
            return Err(Error::invalid("a semaphore has at least one permit").on_lock(self.name()));
        }
        Ok(self.permits_op("tryset", n)?.0 == 1)
    }

    /// Adds `n` permits (handed to waiters at once) and returns the new number. Fails with
    /// [`Error::InvalidArgument`], changing nothing, past [`MAX_PERMITS`].
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let now = client.semaphore("encoders", 2).add_permits(1)?; // a third encoder came up
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "addPermits")]
    #[doc(alias = "release_permits")]
    pub fn add_permits(&self, n: u32) -> Result<u32, Error> {
        Ok(self.permits_op("add", n)?.0)
    }

    /// Takes `n` permits away and returns the new number. Permits already held stay with
    /// their holders; nobody else gets one until enough are released. Fails with
    /// [`Error::InvalidArgument`], changing nothing, when there are fewer than `n`. Waiting
    /// calls that ask for more permits than remain fail with [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let now = client.semaphore("encoders", 2).reduce_permits(1)?; // one went down
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "reducePermits")]
    pub fn reduce_permits(&self, n: u32) -> Result<u32, Error> {
        Ok(self.permits_op("reduce", n)?.0)
    }

    /// Sets the number of permits, whatever it was (more are handed to waiters at once;
    /// waiting calls that ask for more than the new number fail with
    /// [`Error::InvalidArgument`]). The semaphore still remembers the number it was
    /// defined with: handles made with that one or with `n` may acquire. To set it only
    /// where it is not defined yet, see [`try_set_permits`](Semaphore::try_set_permits).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// client.semaphore("encoders", 2).set_permits(4)?; // an operator's resize
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "setPermits")]
    pub fn set_permits(&self, n: u32) -> Result<(), Error> {
        self.permits_op("set", n).map(drop)
    }

    /// The name the semaphore was made with.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// assert_eq!(client.semaphore("encoders", 2).name(), b"encoders");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
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
            return Err(Error::invalid(
                "a semaphore must be made with at least one permit",
            ));
        }
        Ok(())
    }

    fn take(
        &self,
        lease: Lease,
        n: u32,
        deadline: Option<Instant>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<Permit>, Error> {
        self.check().map_err(|e| e.on_lock(self.name()))?;
        let guard = self
            .permits
            .acquire_cancellable(lease, deadline, n, cancel)?;
        Ok(guard.map(|guard| Permit::new(guard, n)))
    }

    /// Runs `sem_permits.lua`: (permits, held) after the operation; a failure names the
    /// semaphore.
    fn permits_op(&self, op: &str, n: u32) -> Result<(u32, u32), Error> {
        self.permits_script(op, n)
            .map_err(|e| e.on_lock(self.name()))
    }

    fn permits_script(&self, op: &str, n: u32) -> Result<(u32, u32), Error> {
        self.check()?;
        crate::name::check(self.permits.name(), "semaphore names must not be empty")?;
        let lock = &self.permits;
        let exec = &lock.client.inner.exec;
        exec.check_process()?;
        let keys = &lock.keys;
        let permits = calls::sem_permits(keys, op, n, lock.initial, MAX_PERMITS);
        let call = |con: &mut Con| exec.eval(con, &permits);
        // Adding or taking away twice (a retry after a lost reply) would change the count
        // twice: those run once, and a dropped connection is the caller's error.
        let (first, second): (i64, i64) = match op {
            "add" | "reduce" | "tryset" => exec.run_once(call),
            _ => exec.run(call),
        }?;
        if first < 0 {
            return Err(Error::invalid(match op {
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
            .field(
                "expire_after",
                &Duration::from_millis(self.permits.keys.expire_after_ms()),
            )
            .finish()
    }
}
