//! `MultiLock`: one lock over several [`Lock`]s, held while a quorum of them is: RedLock
//! across independent Redis masters, or several resources taken all at once.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::primitives::cancel::CancelToken;
use crate::runtime::fanout::{self, Call};
use crate::runtime::lease::{fixed, Lease};
use crate::{Error, Lock, MultiLockGuard};

/// How long a round of calls waits for a server by default: far below any lease, so that
/// a server down or frozen delays each acquisition by this much at most.
const MEMBER_TIMEOUT: Duration = Duration::from_millis(250);

/// One lock over several [`Lock`]s, each on its own [`Client`](crate::Client): held by a
/// thread while a quorum of them is held by it.
///
/// [`red_lock`](MultiLock::red_lock) is the RedLock algorithm: the same name on N ≥ 3
/// independent Redis masters, held when a majority granted it. A master may fail (crash,
/// lose its data, freeze) without two holders ever having the majority, and with no
/// replication between them there is no failover that could lose a grant. See
/// [`guide::topologies`](crate::guide::topologies) for the validity arithmetic, and for
/// what it does not promise (clocks, pauses): use fencing where correctness depends on it.
/// [`new`](MultiLock::new) takes several locks (different names, or different
/// deployments) all at once, or none.
///
/// Every acquisition sends its calls to all servers at once and reads the replies as they
/// come, so it costs about one round trip whatever N is; the calls to one server (several
/// locks on one client) go as one `MULTI`/`EXEC` transaction. Releases and queue-leaving
/// are always sent to every server, also to one that failed a call a moment ago (which
/// acquisitions skip for a second). It is granted when the quorum granted within the
/// lease's validity: the lease, less the time the round took, less an allowance for
/// clock drift between the servers (1% of the lease plus 2 ms). Anything
/// less is given back at once (again to all servers at once), and the thread waits:
/// queued on every server whose lock was held, woken by whichever release comes first
/// (pub/sub, no polling), or by the end of a holder's lease.
///
/// The guard is reentrant per thread like a [`Lock`]'s, its leases renewed by each
/// client's watchdog. It reports its lease lost when fewer than the quorum of its holds
/// still stand, and `unlock` releases everywhere at once.
///
/// ```no_run
/// use redmutex::{Client, MultiLock};
///
/// let masters = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let locks = masters
///     .iter()
///     .map(|url| Ok(Client::open(*url)?.lock("nightly-export")))
///     .collect::<Result<Vec<_>, redmutex::Error>>()?;
/// let lock = MultiLock::red_lock(locks)?;   // held on any 2 of the 3
/// let guard = lock.lock()?;
/// // ... while guard.is_lease_lost() is false, no other thread anywhere holds it ...
/// guard.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub struct MultiLock {
    pub(super) members: Arc<[Lock]>,
    pub(super) quorum: usize,
    pub(super) member_timeout: Duration,
}

impl Clone for MultiLock {
    fn clone(&self) -> Self {
        MultiLock {
            members: self.members.clone(),
            quorum: self.quorum,
            member_timeout: self.member_timeout,
        }
    }
}

impl MultiLock {
    /// One lock over all of `locks`: held only when every one of them is. For taking
    /// several resources at once without deadlocking against others who take them in
    /// another order; the locks may share a client.
    ///
    /// Fails with [`Error::InvalidArgument`] for no locks, a lock given twice, or a
    /// client built with [`sync_replicas`](crate::ClientBuilder::sync_replicas) (the
    /// calls here do not wait for replicas).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let both = redmutex::MultiLock::new([client.lock("account:1"), client.lock("account:2")])?;
    /// let guard = both.lock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Result<MultiLock, Error> {
        let members: Vec<Lock> = locks.into_iter().collect();
        if members.is_empty() {
            return Err(invalid("a MultiLock needs at least one lock"));
        }
        for (i, a) in members.iter().enumerate() {
            a.check_name()?;
            if a.client.inner.config.sync_replicas.is_some() {
                return Err(invalid(
                    "a MultiLock's clients must not use sync_replicas: its calls do not wait \
                     for replicas (RedLock's independent masters stand in for them)",
                ));
            }
            if members[..i].iter().any(|b| {
                Arc::ptr_eq(&a.client.inner, &b.client.inner) && a.keys.key() == b.keys.key()
            }) {
                return Err(invalid("a MultiLock cannot hold the same lock twice"));
            }
        }
        Ok(MultiLock {
            quorum: members.len(),
            members: members.into(),
            member_timeout: MEMBER_TIMEOUT,
        })
    }

    /// RedLock: one lock over `locks`, each on a client of its own independent Redis
    /// master (no replication between them), held when a majority (N/2 + 1) of them is.
    ///
    /// Fails with [`Error::InvalidArgument`] for fewer than three locks (a majority of one
    /// or two survives no failure), for two locks on one [`Client`](crate::Client), and
    /// as [`new`](MultiLock::new) does. Two clients of the same server cannot be told apart
    /// here: that is for the caller to avoid.
    ///
    /// ```no_run
    /// # use redmutex::{Client, MultiLock};
    /// let locks = ["redis://a/", "redis://b/", "redis://c/", "redis://d/", "redis://e/"]
    ///     .iter()
    ///     .map(|url| Ok(Client::open(*url)?.lock("ledger")))
    ///     .collect::<Result<Vec<_>, redmutex::Error>>()?;
    /// let lock = MultiLock::red_lock(locks)?;
    /// assert_eq!(lock.quorum(), 3);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn red_lock(locks: impl IntoIterator<Item = Lock>) -> Result<MultiLock, Error> {
        let mut lock = MultiLock::new(locks)?;
        let n = lock.members.len();
        if n < 3 {
            return Err(invalid(
                "RedLock needs at least three masters: a majority of one or two survives no failure",
            ));
        }
        for (i, a) in lock.members.iter().enumerate() {
            if lock.members[..i]
                .iter()
                .any(|b| Arc::ptr_eq(&a.client.inner, &b.client.inner))
            {
                return Err(invalid(
                    "RedLock's locks must each be on a client of its own master",
                ));
            }
        }
        lock.quorum = n / 2 + 1;
        Ok(lock)
    }

    /// The same locks with another quorum: how many of them a thread must hold to hold
    /// this lock. Defaults to all of them ([`new`](MultiLock::new)) or a majority
    /// ([`red_lock`](MultiLock::red_lock)). Fails with [`Error::InvalidArgument`] unless
    /// it is more than half of the locks (else two holders could each have a quorum) and
    /// at most all of them.
    pub fn with_quorum(mut self, quorum: usize) -> Result<MultiLock, Error> {
        let n = self.members.len();
        if quorum <= n / 2 || quorum > n {
            return Err(invalid(&format!(
                "a quorum of {quorum} out of {n} locks: it must be more than half of them and \
                 at most all"
            )));
        }
        self.quorum = quorum;
        Ok(self)
    }

    /// The same locks with another bound on how long one round of calls waits for a
    /// server's reply (or connection) before counting it as failed. Defaults to 250 ms.
    /// Keep it far below the lease: each server that is down or frozen can delay an
    /// acquisition by this much. Fails with [`Error::InvalidArgument`] for zero.
    pub fn with_member_timeout(mut self, timeout: Duration) -> Result<MultiLock, Error> {
        if timeout.is_zero() {
            return Err(invalid("a member timeout must be longer than zero"));
        }
        self.member_timeout = timeout;
        Ok(self)
    }

    /// How many of the locks a thread must hold to hold this lock.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The locks this lock is made of.
    pub fn locks(&self) -> &[Lock] {
        &self.members
    }

    /// Blocks until this thread holds the lock on a quorum, its leases (each client's
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout)) renewed by the
    /// watchdogs until the guard is released. Fails with [`Error::NoQuorum`] when too many
    /// of the servers cannot be reached for a quorum to be possible.
    pub fn lock(&self) -> Result<MultiLockGuard, Error> {
        Ok(self
            .acquire(Lease::Watchdog, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// Blocks until this thread holds the lock, for a fixed `lease` that is never renewed.
    pub fn lock_with_lease(&self, lease: Duration) -> Result<MultiLockGuard, Error> {
        Ok(self
            .acquire(fixed(lease)?, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// The lock if it can be had at once, else `None`: one round, or a few more (a few
    /// milliseconds) when the round split the locks with other tries of the same moment,
    /// each holder's lease just granted, so that of several tries on free locks one gets
    /// it. Locks that share a client are asked for in one transaction, so that on one
    /// server no other call comes between them.
    pub fn try_lock(&self) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire(Lease::Watchdog, Some(Instant::now()))
    }

    /// Waits up to `wait` for the lock; `None` if it was not acquired by then.
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<MultiLockGuard>, Error> {
        match Instant::now().checked_add(wait) {
            Some(deadline) => self.try_lock_until(deadline),
            None => self.lock().map(Some),
        }
    }

    /// Waits until `deadline` for the lock; `None` if it was not acquired by then. Fails
    /// with [`Error::NoQuorum`] if, at the deadline, too many servers were failing for a
    /// quorum to be possible.
    ///
    /// ```no_run
    /// # fn get(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// use std::time::{Duration, Instant};
    /// match lock.try_lock_until(Instant::now() + Duration::from_secs(2))? {
    ///     Some(guard) => guard.unlock()?,
    ///     None => println!("held elsewhere"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire(Lease::Watchdog, Some(deadline))
    }

    /// Blocks until this thread holds the lock, as [`lock`](MultiLock::lock), or until
    /// `cancel` is cancelled: then it leaves every queue, gives back whatever a release
    /// handed it meanwhile, and fails with [`Error::Cancelled`], holding nothing (see
    /// [`CancelToken`]).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let both = redmutex::MultiLock::new([client.lock("a"), client.lock("b")])?;
    /// let token = redmutex::CancelToken::new();
    /// match both.lock_cancellable(&token) {
    ///     Ok(guard) => guard.unlock()?,
    ///     Err(redmutex::Error::Cancelled) => println!("gave up waiting"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock_cancellable(&self, cancel: &CancelToken) -> Result<MultiLockGuard, Error> {
        Ok(self
            .acquire_cancellable(Lease::Watchdog, None, Some(cancel))?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// Waits until `deadline` for the lock (`None` if it was not acquired by then), as
    /// [`try_lock_until`](MultiLock::try_lock_until), or until `cancel` is cancelled
    /// ([`Error::Cancelled`]).
    pub fn try_lock_until_cancellable(
        &self,
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire_cancellable(Lease::Watchdog, Some(deadline), Some(cancel))
    }

    /// Waits up to `wait` for the lock and holds it for a fixed `lease`, never renewed.
    pub fn try_lock_with_lease_for(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<MultiLockGuard>, Error> {
        match Instant::now().checked_add(wait) {
            Some(deadline) => self.try_lock_with_lease_until(deadline, lease),
            None => self.acquire(fixed(lease)?, None),
        }
    }

    /// Waits until `deadline` for the lock and holds it for a fixed `lease`, never renewed.
    pub fn try_lock_with_lease_until(
        &self,
        deadline: Instant,
        lease: Duration,
    ) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire(fixed(lease)?, Some(deadline))
    }

    /// Whether a quorum of the locks is held (by anyone) right now. Fails with
    /// [`Error::NoQuorum`] when too few servers answer to tell.
    pub fn is_locked(&self) -> Result<bool, Error> {
        let calls: Vec<Call<'_>> = self
            .members
            .iter()
            .map(|m| {
                let mut cmd = redis::cmd("EXISTS");
                cmd.arg(m.keys.key());
                Call::plain(&m.client.inner, cmd)
            })
            .collect();
        let replies = fanout::run::<bool>(&calls, Instant::now() + self.member_timeout);
        let locked = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let free = replies.iter().filter(|r| matches!(r, Ok(false))).count();
        if locked >= self.quorum {
            return Ok(true);
        }
        if free > self.members.len() - self.quorum {
            return Ok(false);
        }
        Err(self.no_quorum(locked + free, replies.into_iter().filter_map(Result::err)))
    }

    /// Frees every one of the locks whoever holds them (see [`Lock::force_unlock`]), on
    /// all servers at once; true if any was held. Fails with [`Error::NoQuorum`] if it
    /// could not reach a quorum.
    pub fn force_unlock(&self) -> Result<bool, Error> {
        let calls: Vec<Call<'_>> = self
            .members
            .iter()
            .map(|m| Call::script(&m.client.inner, m.force_unlock_cmd()))
            .collect();
        let replies = fanout::run_always::<i64>(&calls, Instant::now() + self.member_timeout);
        let reached = replies.iter().filter(|r| r.is_ok()).count();
        let freed = replies.iter().any(|r| matches!(r, Ok(1)));
        if reached >= self.quorum {
            Ok(freed)
        } else {
            Err(self.no_quorum(reached, replies.into_iter().filter_map(Result::err)))
        }
    }

    pub(super) fn no_quorum(
        &self,
        reached: usize,
        errors: impl IntoIterator<Item = Error>,
    ) -> Error {
        Error::NoQuorum {
            reached,
            members: self.members.len(),
            required: self.quorum,
            source: Box::new(errors.into_iter().last().unwrap_or(Error::NOT_HELD)),
        }
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("locks", &self.members)
            .field("quorum", &self.quorum)
            .field("member_timeout", &self.member_timeout)
            .finish()
    }
}

fn invalid(what: &str) -> Error {
    Error::InvalidArgument(what.to_owned())
}
