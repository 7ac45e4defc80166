//! `Lock`: a named reentrant lock shared by every thread and process that uses the name.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::keys::{holder_id, thread_token, LockKeys};
use crate::scripts;
use crate::watchdog::Lease;
use crate::{Client, Error, LockGuard};

/// The longest lease accepted (ten years): anything longer is surely a mistake, and it keeps
/// every deadline computed from a lease far from overflowing.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A named distributed lock, reentrant per thread.
///
/// A thread that holds the lock may take it again (nested critical sections); it is free
/// for others once every guard of that thread is released. Ownership belongs to the thread,
/// which is why [`LockGuard`] is not `Send`. Different threads, different [`Client`]s and
/// different processes all exclude each other.
///
/// `Lock` is a cheap handle (clone it freely); making one touches no network. Waiting
/// does not poll: a blocked thread sleeps until a release message from Redis pub/sub
/// wakes it, or until the holder's lease runs out if the holder crashed.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("inventory");
/// let outer = lock.lock()?;             // blocks until held; lease kept alive by the watchdog
/// let inner = lock.lock()?;             // the same thread re-enters at once
/// assert_eq!(lock.hold_count()?, 2);
/// drop(inner);
/// outer.unlock()?;                      // now other threads and processes may take it
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone)]
pub struct Lock {
    pub(crate) client: Client,
    pub(crate) keys: Arc<LockKeys>,
    // Acquisitions draw fencing tokens (see `FencedLock`).
    fenced: bool,
}

impl Lock {
    pub(crate) fn new(client: Client, keys: LockKeys, fenced: bool) -> Lock {
        Lock {
            client,
            keys: Arc::new(keys),
            fenced,
        }
    }

    /// Blocks until this thread holds the lock. The lease is
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout) long and renewed by
    /// the watchdog until the guard is released, so a crashed holder frees the lock within
    /// that time.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("report").lock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock(&self) -> Result<LockGuard, Error> {
        Ok(self
            .acquire(Lease::Watchdog, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// Blocks until this thread holds the lock for `lease`. The lease is never renewed:
    /// after it the lock is free for others whether or not the guard was released, and the
    /// old guard's [`unlock`](LockGuard::unlock) then fails with [`Error::NotHeld`].
    ///
    /// Fails with [`Error::InvalidArgument`] for a zero or absurdly long (over ten years)
    /// lease.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("report").lock_with_lease(Duration::from_secs(10))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        let lease = fixed(lease)?;
        Ok(self
            .acquire(lease, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One attempt, without waiting: `Ok(None)` when another thread holds the lock.
    /// The lease is kept alive by the watchdog, as with [`lock`](Lock::lock).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.lock("cron:cleanup").try_lock()? {
    ///     Some(_guard) => println!("we run the cleanup"),
    ///     None => println!("someone else is on it"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock(&self) -> Result<Option<LockGuard>, Error> {
        self.acquire(Lease::Watchdog, Some(Instant::now()))
    }

    /// Waits at most `wait` for the lock: `Ok(None)` if it was not acquired in time.
    /// A zero `wait` makes one attempt; one too long to add to the current time fails with
    /// [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if let Some(guard) = client.lock("report").try_lock_for(Duration::from_secs(2))? {
    ///     // ...
    /// #   drop(guard);
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        self.try_lock_until(deadline(wait)?)
    }

    /// Waits for the lock until `deadline`: `Ok(None)` if it was not acquired by then.
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>, Error> {
        self.acquire(Lease::Watchdog, Some(deadline))
    }

    /// Waits at most `wait` for the lock and holds it for a fixed `lease`, never renewed
    /// (Redisson's `tryLock(waitTime, leaseTime)`).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("report");
    /// let guard = lock.try_lock_with_lease_for(Duration::from_secs(1), Duration::from_secs(30))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock_with_lease_for(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        self.try_lock_with_lease_until(deadline(wait)?, lease)
    }

    /// Waits for the lock until `deadline` and holds it for a fixed `lease`, never renewed.
    pub fn try_lock_with_lease_until(
        &self,
        deadline: Instant,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        let lease = fixed(lease)?;
        self.acquire(lease, Some(deadline))
    }

    /// Whether any thread of any client holds the lock right now.
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.check_name()?;
        let key = self.keys.key.as_slice();
        self.client
            .inner
            .run(|con| redis::cmd("EXISTS").arg(key).query(con))
    }

    /// Whether the calling thread holds the lock (according to Redis: false once its lease
    /// expired).
    pub fn is_held_by_current_thread(&self) -> Result<bool, Error> {
        Ok(self.hold_count()? > 0)
    }

    /// How many times the calling thread holds the lock (its reentry depth): 0 when it does
    /// not hold it.
    pub fn hold_count(&self) -> Result<u32, Error> {
        self.check_name()?;
        let key = self.keys.key.as_slice();
        let holder = self.holder();
        let count: Option<u32> = self
            .client
            .inner
            .run(|con| redis::cmd("HGET").arg(key).arg(&holder).query(con))?;
        Ok(count.unwrap_or(0))
    }

    /// The time left on the lease of whoever holds the lock, or `None` when it is free.
    /// (`Some(Duration::MAX)` if the key somehow has no expiry.)
    pub fn remaining_lease(&self) -> Result<Option<Duration>, Error> {
        self.check_name()?;
        let key = self.keys.key.as_slice();
        let pttl: i64 = self
            .client
            .inner
            .run(|con| redis::cmd("PTTL").arg(key).query(con))?;
        Ok(match pttl {
            -1 => Some(Duration::MAX),
            ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
            _ => None,
        })
    }

    /// Frees the lock whoever holds it, waking its waiters; true if it was held. An
    /// administrative operation: the former holder is not stopped, its release later
    /// fails with [`Error::NotHeld`] (or [`Error::LeaseLost`] once its watchdog noticed).
    pub fn force_unlock(&self) -> Result<bool, Error> {
        self.check_name()?;
        let keys = &self.keys;
        let deleted: i64 = self.client.inner.run(|con| {
            scripts::FORCE_UNLOCK
                .key(keys.key.as_slice())
                .key(keys.channel.as_slice())
                .arg(crate::keys::RELEASE_MESSAGE)
                .invoke(con)
        })?;
        Ok(deleted == 1)
    }

    /// The name the lock was made with.
    pub fn name(&self) -> &[u8] {
        &self.keys.name
    }

    fn holder(&self) -> String {
        holder_id(&self.client.inner.id, thread_token())
    }

    fn check_name(&self) -> Result<(), Error> {
        if self.keys.name.is_empty() {
            return Err(Error::InvalidName("lock names must not be empty"));
        }
        Ok(())
    }

    /// The one acquisition path. `deadline` None waits forever; a deadline already past
    /// makes exactly one attempt.
    fn acquire(&self, lease: Lease, deadline: Option<Instant>) -> Result<Option<LockGuard>, Error> {
        self.check_name()?;
        let inner = &self.client.inner;
        let token = thread_token();
        let holder = holder_id(&inner.id, token);
        let lease_ms = match lease {
            Lease::Watchdog => millis(inner.config.watchdog_timeout),
            Lease::Fixed(ms) => ms,
        };
        let mut sent = Instant::now();
        let mut pttl = match self.attempt(&holder, lease_ms)? {
            Ok(grant) => return Ok(Some(self.granted(token, holder, grant, lease, sent))),
            Err(pttl) => pttl,
        };
        let mut subscription = None;
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            // Never sleep past the holder's lease: a crashed holder publishes nothing.
            let lease_end = now + self.wait_bound(pttl);
            let until = deadline.map_or(lease_end, |d| d.min(lease_end));
            match &subscription {
                None => {
                    // Subscribe, then try again before sleeping: a release between the
                    // first attempt and the subscription would otherwise be missed.
                    let s = inner.subscriber.subscribe(inner, &self.keys.channel);
                    s.wait_confirmed(until);
                    subscription = Some(s);
                }
                Some(s) => {
                    s.wait_release(until);
                }
            }
            sent = Instant::now();
            match self.attempt(&holder, lease_ms)? {
                Ok(grant) => return Ok(Some(self.granted(token, holder, grant, lease, sent))),
                Err(left) => pttl = left,
            }
        }
    }

    /// Runs the acquire script: `Ok(grant)` when granted, `Err(pttl)` when held elsewhere.
    fn attempt(&self, holder: &str, lease_ms: u64) -> Result<Result<Grant, i64>, Error> {
        let inner = &self.client.inner;
        let keys = &self.keys;
        let held = inner.watchdog.levels(&keys.key, thread_token());
        let outcome = inner.run(|con| {
            let result = if self.fenced {
                let reply: Vec<i64> = scripts::ACQUIRE
                    .key(keys.key.as_slice())
                    .key(keys.fence.as_slice())
                    .arg(holder)
                    .arg(lease_ms)
                    .arg(held)
                    .invoke(con)?;
                match reply[..] {
                    [1, count, fence] => Ok(Grant {
                        count,
                        fence: Some(fence as u64),
                    }),
                    [_, pttl, ..] => Err(pttl),
                    _ => {
                        return Err(redis::RedisError::from((
                            redis::ErrorKind::Parse,
                            "unexpected reply from the fenced acquire script",
                        )))
                    }
                }
            } else {
                let (granted, n): (i64, i64) = scripts::ACQUIRE
                    .key(keys.key.as_slice())
                    .arg(holder)
                    .arg(lease_ms)
                    .arg(held)
                    .invoke(con)?;
                if granted == 1 {
                    Ok(Grant {
                        count: n,
                        fence: None,
                    })
                } else {
                    Err(n)
                }
            };
            if let Ok(grant) = &result {
                if let Some(shortfall) = inner.await_replicas(con)? {
                    // Give the level back on the same connection: a lock the replicas
                    // may not have must not be handed out.
                    let _: i64 = scripts::RELEASE
                        .key(keys.key.as_slice())
                        .key(keys.channel.as_slice())
                        .arg(holder)
                        .arg(lease_ms)
                        .arg(crate::keys::RELEASE_MESSAGE)
                        .arg(grant.count)
                        .invoke(con)?;
                    return Ok(Err(shortfall));
                }
            }
            Ok(Ok(result))
        })?;
        outcome
    }

    fn wait_bound(&self, pttl: i64) -> Duration {
        match pttl {
            // No expiry at all (someone wrote the key by hand): look again after a lease
            // rather than never.
            -1 => self.client.inner.config.watchdog_timeout,
            // PTTL rounds down: the lease may last up to a millisecond more, and waking
            // before it ends would only cost a wasted try.
            ms if ms >= 0 => Duration::from_millis(ms as u64 + 1),
            // Gone between the check and the PTTL: try again at once.
            _ => Duration::ZERO,
        }
    }

    fn granted(
        &self,
        token: u64,
        holder: String,
        grant: Grant,
        lease: Lease,
        sent: Instant,
    ) -> LockGuard {
        let inner = &self.client.inner;
        let registration =
            inner
                .watchdog
                .acquired(inner, &self.keys.key, token, &holder, grant.count, lease);
        LockGuard::new(self, token, holder, lease, sent, registration, grant.fence)
    }
}

/// What a granted acquire script reported.
struct Grant {
    count: i64,
    fence: Option<u64>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.keys.name))
            .field("key", &String::from_utf8_lossy(&self.keys.key))
            .finish()
    }
}

/// Whole milliseconds, rounded up so that a sub-millisecond duration is never zero.
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if d > Duration::from_millis(ms as u64) {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn fixed(lease: Duration) -> Result<Lease, Error> {
    if lease.is_zero() {
        return Err(Error::InvalidArgument(
            "a lease must be longer than zero".to_owned(),
        ));
    }
    if lease > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "a lease of {lease:?} is longer than the maximum of ten years"
        )));
    }
    Ok(Lease::Fixed(millis(lease)))
}

fn deadline(wait: Duration) -> Result<Instant, Error> {
    Instant::now()
        .checked_add(wait)
        .ok_or_else(|| Error::InvalidArgument(format!("a wait of {wait:?} overflows the clock")))
}
