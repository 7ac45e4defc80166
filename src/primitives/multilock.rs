//! `MultiLock`: one lock over several [`Lock`]s, held while a quorum of them is: RedLock
//! across independent Redis masters, or several resources taken all at once.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Select;

use crate::primitives::cancel::{self, CancelToken};
use crate::primitives::lock::Grant;
use crate::primitives::multi_guard::release_all;
use crate::primitives::wait::NEXT_TICKET;
use crate::runtime::client::IO_GRACE;
use crate::runtime::fanout::{self, Call};
use crate::runtime::keys::{holder_id, thread_token};
use crate::runtime::lease::{millis, Lease};
use crate::runtime::queue::{self, Notice};
use crate::runtime::subscriber::Subscription;
use crate::runtime::telemetry;
use crate::{Error, Lock, LockGuard, MultiLockGuard, Plain};
use crate::LockOptions;

/// How long a round of calls waits for a server by default: far below any lease, so that
/// a server down or frozen delays each acquisition by this much at most.
const MEMBER_TIMEOUT: Duration = Duration::from_millis(250);

/// The longest random pause after rounds that split the locks with other callers (each
/// got some, none a quorum, all gave theirs back), doubling with each split in a row up to
/// eight times this: without it they would all try again at the same instant and could
/// split again and again.
const SPLIT_PAUSE_MS: u64 = 1;

/// How many more rounds a single try (`try_lock`) makes after rounds that split free locks
/// with other tries of the same moment. Ten tries at once settle within two in tests;
/// the bound keeps a try against a fresh holder short (six rounds, ~20 ms of pauses).
const SPLIT_RETRIES: u32 = 6;

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
/// It is acquired as a [`Lock`] is: [`lock`](MultiLock::lock),
/// [`try_lock`](MultiLock::try_lock), [`try_lock_for`](MultiLock::try_lock_for),
/// [`try_lock_until`](MultiLock::try_lock_until), and
/// [`try_lock_with`](MultiLock::try_lock_with) for a fixed lease or a cancellation token.
///
/// # Guarantees
///
/// - **One holder at a time**: two threads never both hold a quorum (more than half of
///   the locks; with [`new`](MultiLock::new), all of them) while the servers that granted
///   it keep their data and their clocks drift apart by less than the allowance. One
///   master crashing, restarting empty, freezing or cut off changes nothing while a
///   quorum of the others stands.
/// - **Never granted too late**: a quorum whose validity was used up by the round (slow
///   servers, a pause) is given back, and the call goes on only within its wait; a try
///   returns `None`, never a guard whose time is already over.
/// - **Nothing half held**: a round short of the quorum gives back what it took, on every
///   server at once, before it waits, so callers that split the locks do not block each
///   other.
/// - **Losses reported**: [`MultiLockGuard::is_lease_lost`], [`MultiLockGuard::lost`] and
///   `unlock` failing with [`Error::LeaseLost`] once fewer than the quorum of its holds
///   stand or a fixed lease's validity ended; a crashed holder's locks free themselves
///   when their leases end.
/// - **Failing servers cost a bounded time**: each round waits at most the
///   [member timeout](MultiLock::with_member_timeout) (250 ms) for a server; with too many
///   failing for a quorum, `lock` fails at once with [`Error::NoQuorum`] and the bounded
///   calls at their deadline, leaving nothing held.
///
/// Not promised: safety against a paused holder (it may act after its validity, as with
/// any lease) or a master's clock jumping; no fencing tokens. See
/// [`guide::topologies`](crate::guide::topologies).
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
    members: Arc<[Lock]>,
    quorum: usize,
    member_timeout: Duration,
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
    ///
    /// ```no_run
    /// # use redmutex::{Client, MultiLock};
    /// # let locks = ["redis://a/", "redis://b/", "redis://c/", "redis://d/", "redis://e/"]
    /// #     .iter()
    /// #     .map(|url| Ok(Client::open(*url)?.lock("ledger")))
    /// #     .collect::<Result<Vec<_>, redmutex::Error>>()?;
    /// // Five masters; hold on four of them instead of three.
    /// let lock = MultiLock::red_lock(locks)?.with_quorum(4)?;
    /// assert_eq!(lock.quorum(), 4);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
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
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use redmutex::{Client, MultiLock};
    /// # let locks = ["redis://a/", "redis://b/", "redis://c/", "redis://d/", "redis://e/"]
    /// #     .iter()
    /// #     .map(|url| Ok(Client::open(*url)?.lock("ledger")))
    /// #     .collect::<Result<Vec<_>, redmutex::Error>>()?;
    /// // Masters far away: allow each 500 ms per round.
    /// let lock = MultiLock::red_lock(locks)?.with_member_timeout(Duration::from_millis(500))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn with_member_timeout(mut self, timeout: Duration) -> Result<MultiLock, Error> {
        if timeout.is_zero() {
            return Err(invalid("a member timeout must be longer than zero"));
        }
        self.member_timeout = timeout;
        Ok(self)
    }

    /// How many of the locks a thread must hold to hold this lock.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let all = redmutex::MultiLock::new([client.lock("a"), client.lock("b")])?;
    /// assert_eq!(all.quorum(), 2); // new(): every lock
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The locks this lock is made of.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let both = redmutex::MultiLock::new([client.lock("a"), client.lock("b")])?;
    /// for lock in both.locks() {
    ///     println!("{}", String::from_utf8_lossy(lock.name()));
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn locks(&self) -> &[Lock] {
        &self.members
    }

    /// Blocks until this thread holds the lock on a quorum, its leases (each client's
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout)) renewed by the
    /// watchdogs until the guard is released. Fails with [`Error::NoQuorum`] when too many
    /// of the servers cannot be reached for a quorum to be possible.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let both = redmutex::MultiLock::new([client.lock("from"), client.lock("to")])?;
    /// let guard = both.lock()?;                // both held, or neither
    /// // ... move the money ...
    /// guard.unlock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock(&self) -> Result<MultiLockGuard, Error> {
        Ok(self
            .acquire(Lease::Watchdog, None)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// The lock if it can be had at once, else `None`: one round, or a few more (a few
    /// milliseconds) when the round split the locks with other tries of the same moment,
    /// each holder's lease just granted, so that of several tries on free locks one gets
    /// it. Locks that share a client are asked for in one transaction, so that on one
    /// server no other call comes between them.
    ///
    /// ```no_run
    /// # fn get(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// if let Some(guard) = lock.try_lock()? {
    ///     guard.unlock()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_lock(&self) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire(Lease::Watchdog, Some(Instant::now()))
    }

    /// Waits up to `wait` for the lock; `None` if it was not acquired by then.
    ///
    /// ```no_run
    /// # fn get(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// use std::time::Duration;
    /// match lock.try_lock_for(Duration::from_secs(2))? {
    ///     Some(guard) => guard.unlock()?,
    ///     None => println!("held elsewhere"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire(Lease::Watchdog, Instant::now().checked_add(wait))
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

    /// Acquires with [`LockOptions`]: a fixed lease (never renewed, on every member), a
    /// bound on the wait, a [`CancellationToken`](crate::CancellationToken) (then it
    /// leaves every queue, gives back whatever a release handed it meanwhile, and fails
    /// with [`Error::Cancelled`], holding nothing). `Ok(None)` only when the options' wait
    /// ran out.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redmutex::{CancellationToken, LockOptions, MultiLock};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let both = MultiLock::new([client.lock("a"), client.lock("b")])?;
    /// let token = CancellationToken::new();
    /// let options = LockOptions::new()
    ///     .lease(Duration::from_secs(30))
    ///     .wait_for(Duration::from_secs(5))
    ///     .cancellable(&token);
    /// match both.try_lock_with(options) {
    ///     Ok(Some(guard)) => guard.unlock()?,
    ///     Ok(None) => println!("held elsewhere"),
    ///     Err(redmutex::Error::Cancelled) => println!("gave up waiting"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "tryLock")]
    pub fn try_lock_with(&self, options: LockOptions) -> Result<Option<MultiLockGuard>, Error> {
        let o = options.for_lock()?;
        self.acquire_cancellable(o.lease, o.deadline, o.cancel)
    }

    /// Whether a quorum of the locks is held (by anyone) right now. Fails with
    /// [`Error::NoQuorum`] when too few servers answer to tell.
    ///
    /// ```no_run
    /// # fn check(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// if lock.is_locked()? {
    ///     println!("held on a quorum, by someone");
    /// }
    /// # Ok(()) }
    /// ```
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
    ///
    /// ```no_run
    /// # fn free(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// // An operator frees a lock whose holder is stuck, on every server.
    /// let freed = lock.force_unlock()?;
    /// # Ok(()) }
    /// ```
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

    fn no_quorum(&self, reached: usize, errors: impl IntoIterator<Item = Error>) -> Error {
        Error::NoQuorum {
            reached,
            members: self.members.len(),
            required: self.quorum,
            source: Box::new(errors.into_iter().last().unwrap_or(Error::NOT_HELD)),
        }
    }

    /// [`acquire_cancellable`](MultiLock::acquire_cancellable) that nothing cancels.
    fn acquire(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
    ) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire_cancellable(lease, deadline, None)
    }

    /// The one acquisition path; `deadline` and `cancel` as in [`Lock`]'s.
    fn acquire_cancellable(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&CancelToken>,
    ) -> Result<Option<MultiLockGuard>, Error> {
        for m in self.members.iter() {
            m.client.inner.check_process()?;
        }
        if cancel::is_cancelled(cancel) {
            return Err(Error::Cancelled);
        }
        for m in self.members.iter() {
            let inner = &m.client.inner;
            if lease == Lease::Watchdog {
                // Before anything is written: a lease nobody renews must not be handed out.
                inner.watchdog.ensure_running(inner)?;
            }
        }
        let token = thread_token();
        let n = self.members.len();
        // Where this thread holds a member already, the call re-enters it (the scripts
        // grant a re-entry whoever waits): it never queues there, so that leaving the call
        // can never give up a level the thread holds.
        let reentry = self
            .members
            .iter()
            .map(|m| m.client.inner.watchdog.holds_locally(m.keys.hold(), token))
            .collect();
        let mut wait = MultiWait {
            lock: self,
            token,
            holders: self
                .members
                .iter()
                .map(|m| holder_id(&m.client.inner.id, token))
                .collect(),
            lease,
            deadline,
            cancel,
            once: deadline.is_some_and(|d| d <= Instant::now()),
            ticket: NEXT_TICKET.fetch_add(1, Ordering::Relaxed),
            subs: (0..n).map(|_| None).collect(),
            reentry,
            queued: vec![false; n],
        };
        let names = telemetry::Names(self.members.iter().map(|m| m.name()));
        let holder = telemetry::Holder(&self.members[0].client.inner.id, token);
        telemetry::acquisition("MultiLock", &names, &holder, || wait.run())
    }
}

/// One call waiting for a `MultiLock`: its rounds, and its place in each lock's queue.
struct MultiWait<'a> {
    lock: &'a MultiLock,
    token: u64,
    holders: Vec<String>,
    lease: Lease,
    deadline: Option<Instant>,
    // Another thread may stop the wait through it.
    cancel: Option<&'a CancelToken>,
    once: bool,
    ticket: u64,
    subs: Vec<Option<Subscription>>,
    // The thread held that lock when the call began: its attempts there never queue.
    reentry: Vec<bool>,
    // In the queue of that lock (its client keeps the entry alive).
    queued: Vec<bool>,
}

/// What one round saw of each lock.
enum Seen {
    Granted,
    Held(i64),
    Failed(Error),
}

impl MultiWait<'_> {
    fn run(&mut self) -> Result<Option<MultiLockGuard>, Error> {
        let lock = self.lock;
        let n = lock.members.len();
        let mut splits = 0u32;
        let called = Instant::now();
        loop {
            if cancel::is_cancelled(self.cancel) {
                // What was handed over meanwhile goes back with the queues left.
                self.give_up();
                return Err(Error::Cancelled);
            }
            let start = Instant::now();
            let (mut guards, seen) = self.round(start);
            let granted = guards.iter().flatten().count();
            let validity = self.validity(start);
            if granted >= lock.quorum && validity.is_some() {
                self.leave_queues(&mut guards, true);
                // Leaving the queues (and confirming what was handed over meanwhile) took
                // time too: the quorum's validity still counts from the round's start.
                if let Some(validity) = self.validity(start) {
                    let valid_until = match self.lease {
                        Lease::Fixed(_) => Some(validity),
                        Lease::Watchdog => None,
                    };
                    return Ok(Some(MultiLockGuard::new(
                        guards,
                        lock.quorum,
                        valid_until,
                        lock.member_timeout,
                    )));
                }
            }
            // Not enough, or too late (RedLock's rule: a quorum granted after its lease's
            // validity is no hold): what the round took goes back, to all at once, and
            // the call tries again within its wait, or returns None.
            let taken: Vec<LockGuard> = guards.into_iter().flatten().collect();
            for e in release_all(taken, Instant::now() + lock.member_timeout)
                .into_iter()
                .filter_map(Result::err)
            {
                log::debug!("redmutex: giving back a partial MultiLock hold failed: {e}");
            }
            telemetry::waiting(self.once);
            let failed = seen.iter().filter(|s| matches!(s, Seen::Failed(_))).count();
            let past = |now: Instant| self.once || self.deadline.is_some_and(|d| now >= d);
            if failed > n - lock.quorum {
                // Too many servers failed for any quorum: the caller hears it now (no
                // deadline) or at its deadline, meanwhile looking again each member
                // timeout (a server coming back has no pub/sub to announce it).
                let now = Instant::now();
                if self.deadline.is_none() || past(now) {
                    self.give_up();
                    let errors = seen.into_iter().filter_map(|s| match s {
                        Seen::Failed(e) => Some(e),
                        _ => None,
                    });
                    return Err(lock.no_quorum(n - failed, errors));
                }
                let next = (start + lock.member_timeout).min(self.deadline.unwrap_or(now));
                cancel::sleep_until(next, self.cancel);
                continue;
            }
            if past(Instant::now()) {
                if self.once
                    && granted > 0
                    && granted < lock.quorum
                    && self.split_among_contenders(&seen, called, splits)
                {
                    // A try that split free locks with other tries of the same moment (each
                    // got some, all gave theirs back): without another round none of them
                    // would get the lock. Again after a random pause, so that one round runs
                    // alone; whoever then finds the lock taken gets nothing and stops.
                    let cap = (SPLIT_PAUSE_MS << splits.min(3)) * 1000;
                    std::thread::sleep(Duration::from_micros(random() % cap));
                    splits += 1;
                    continue;
                }
                self.give_up();
                return Ok(None);
            }
            if granted > 0 && granted < lock.quorum {
                // A split: some granted, not a quorum. Most often the holder's release is
                // still on its way to the others, and the next message ends it; after
                // splits in a row, other callers are splitting with this one: see
                // `SPLIT_PAUSE_MS`.
                if splits > 0 {
                    let cap = (SPLIT_PAUSE_MS << splits.min(3)) * 1000;
                    std::thread::sleep(Duration::from_micros(random() % cap));
                }
                splits += 1;
            }
            // Listen on every lock that was held, then queue with the next round.
            let mut subscribed = false;
            for (i, s) in seen.iter().enumerate() {
                if matches!(s, Seen::Held(_)) && self.subs[i].is_none() {
                    let m = &lock.members[i];
                    let inner = &m.client.inner;
                    // The queue needs the watchdog (its entries are kept alive each round).
                    inner.watchdog.ensure_running(inner)?;
                    let until = self.deadline.map(|d| d.max(Instant::now()) + IO_GRACE);
                    self.subs[i] = Some(inner.subscriber.subscribe(
                        inner,
                        m.keys.channel(),
                        self.token,
                        until,
                    )?);
                    subscribed = true;
                }
            }
            // The earliest end of a holder's lease: a crashed holder hands nothing on.
            let lease_end = seen
                .iter()
                .enumerate()
                .filter_map(|(i, s)| match s {
                    Seen::Held(pttl) => Some(start + lock.members[i].wait_bound(*pttl)),
                    _ => None,
                })
                .min()
                .unwrap_or(start);
            let until = self.deadline.map_or(lease_end, |d| d.min(lease_end));
            if subscribed {
                // Queue only once the server confirmed the subscription: a message sent
                // before that would be lost. Then straight to the next round.
                let signal = self.cancel.map(CancelToken::signal);
                for s in self.subs.iter().flatten() {
                    if !s.wait_confirmed(until, signal) {
                        break;
                    }
                }
                continue;
            }
            self.sleep(until);
        }
    }

    /// One round: an attempt on every lock, all sent at once.
    fn round(&mut self, start: Instant) -> (Vec<Option<LockGuard>>, Vec<Seen>) {
        let lock = self.lock;
        let n = lock.members.len();
        let mut guards: Vec<Option<LockGuard>> = (0..n).map(|_| None).collect();
        let mut seen: Vec<Seen> = (0..n).map(|_| Seen::Granted).collect();
        let mut tried = Vec::new();
        let mut calls = Vec::new();
        let bound = self.round_bound(start);
        for (i, m) in lock.members.iter().enumerate() {
            let inner = &m.client.inner;
            let join = !self.once
                && !self.reentry[i]
                && self.subs[i].as_ref().is_some_and(|s| s.is_confirmed());
            let join = join.then(|| {
                let watchdog_ms = millis(inner.config.watchdog_timeout);
                (self.ticket, queue::entry_ttl_ms(self.deadline, watchdog_ms))
            });
            if join.is_some() && !self.queued[i] {
                self.queued[i] = true;
                inner
                    .watchdog
                    .waiting(&m.keys, self.token, &self.holders[i], self.deadline);
            }
            let held = match inner
                .watchdog
                .begin_attempt(m.keys.hold(), self.token, Some(bound))
            {
                Ok(held) => held,
                // This member sends nothing this round: it counts as failed.
                Err(e) => {
                    seen[i] = Seen::Failed(e);
                    continue;
                }
            };
            let cmd = m.acquire_cmd(&self.holders[i], m.lease_ms(self.lease), held, 1, join);
            tried.push((i, held, join.is_some()));
            calls.push(Call::script(inner, cmd));
        }
        let replies = fanout::run::<Vec<i64>>(&calls, bound);
        for ((i, held, joined), reply) in tried.into_iter().zip(replies) {
            let m = &lock.members[i];
            let holder = self.holders[i].clone();
            let outcome = reply.and_then(|r| Lock::<Plain>::grant_of(&r)?);
            match m.settle_attempt((self.token, &holder), held, joined, outcome) {
                Ok(Ok(grant)) => {
                    // The script took the thread out of the queue with the grant.
                    self.left_queue(i);
                    guards[i] =
                        Some(m.granted(self.token, holder, grant, self.lease, start, false));
                }
                Ok(Err(refused)) => {
                    if self.reentry[i] {
                        // A re-entry is granted while the hold stands: it is gone there
                        // (expired, force-unlocked, lost by the server). Its guards must
                        // say so, and from here on this lock is an ordinary acquisition,
                        // which may queue; a grant there is a new hold.
                        self.reentry[i] = false;
                        let generation = m.client.inner.generation();
                        m.client
                            .inner
                            .watchdog
                            .hold_gone(m.keys.hold(), self.token, generation);
                    }
                    seen[i] = Seen::Held(refused.pttl);
                }
                Err(e) => seen[i] = Seen::Failed(e),
            }
        }
        (guards, seen)
    }

    /// The lease left for certain on a quorum after a round that started at `start`: the
    /// shortest of the leases asked for, less the round's time and the drift allowance;
    /// `None` when nothing is left.
    fn validity(&self, start: Instant) -> Option<Instant> {
        let lease_ms = self
            .lock
            .members
            .iter()
            .map(|m| m.lease_ms(self.lease))
            .min()
            .unwrap_or(0);
        let drift = lease_ms / 100 + 2;
        let valid = start + Duration::from_millis(lease_ms.saturating_sub(drift));
        (valid > Instant::now()).then_some(valid)
    }

    /// Whether the locks this round did not get were, as far as it can tell, taken by other
    /// calls of the same moment rather than held: each holder's lease is (almost) whole,
    /// so it was granted within the time a round and its giving back take (two member
    /// timeouts; a hold renewed by a watchdog is a third of its lease old or more) and,
    /// if it came with a split of its own, is being given back. At most `SPLIT_RETRIES`
    /// times (`splits` so far) and within a member timeout of the call's start (`called`),
    /// so that a try stays short: a holder of a quorum granted a moment ago, with another
    /// lock free, looks the same.
    fn split_among_contenders(&self, seen: &[Seen], called: Instant, splits: u32) -> bool {
        let lock = self.lock;
        if splits >= SPLIT_RETRIES || called.elapsed() >= lock.member_timeout {
            return false;
        }
        let young = millis(lock.member_timeout * 2);
        // A split needs another caller: a round that saw no holder anywhere (it got a
        // quorum too late, or the others failed) split nothing.
        if !seen.iter().any(|s| matches!(s, Seen::Held(_))) {
            return false;
        }
        seen.iter().zip(lock.members.iter()).all(|(s, m)| match s {
            Seen::Held(pttl) => {
                *pttl >= 0 && (*pttl as u64).saturating_add(young) >= m.lease_ms(self.lease)
            }
            _ => true,
        })
    }

    /// When a round stops waiting for replies: a member timeout after its start, and for
    /// a single try not much past its deadline either.
    fn round_bound(&self, start: Instant) -> Instant {
        let bound = start + self.lock.member_timeout;
        match self.deadline {
            Some(d) if self.once => bound.min(d.max(start) + IO_GRACE),
            _ => bound,
        }
    }

    /// Sleeps until a message for this call arrives from any lock, or `until`.
    fn sleep(&mut self, until: Instant) {
        let listening: Vec<usize> = (0..self.subs.len())
            .filter(|&i| self.queued[i] && self.subs[i].is_some())
            .collect();
        loop {
            let mut select = Select::new();
            for &i in &listening {
                select.recv(self.subs[i].as_ref().expect("listening").notices());
            }
            // Last: its index is past the listening locks'.
            if let Some(c) = self.cancel {
                select.recv(c.signal());
            }
            let Ok(op) = select.select_deadline(until) else {
                return;
            };
            let Some(&i) = listening.get(op.index()) else {
                // Cancelled: the loop leaves the queues.
                let _ = op.recv(self.cancel.expect("selected").signal());
                return;
            };
            let sub = self.subs[i].as_ref().expect("listening");
            match op.recv(sub.notices()) {
                // Handed the lock: the next round's attempt there finds it held by this
                // thread and takes it as granted (the acquire script adopts a handoff),
                // as it would a handoff whose message is still on its way. A message of
                // an earlier round, whose hold is long given back, then changes nothing.
                Ok(Notice::Granted { ticket, .. } | Notice::Wake { ticket })
                    if ticket == self.ticket =>
                {
                    return
                }
                Ok(Notice::Recheck) => return,
                // For an earlier call of this thread, long over.
                Ok(_) => continue,
                Err(_) => return,
            }
        }
    }

    /// Leaves the queues of the locks not held, all at once; a lock handed over meanwhile
    /// is kept (in `guards`). With `confirm`, a kept lock is first confirmed with its
    /// server (see [`confirm_handed`](MultiWait::confirm_handed)); without, it is
    /// registered as handed over, for a caller that gives it straight back.
    fn leave_queues(&mut self, guards: &mut [Option<LockGuard>], confirm: bool) {
        let lock = self.lock;
        let mut left = Vec::new();
        let mut calls = Vec::new();
        for (i, m) in lock.members.iter().enumerate() {
            if !self.queued[i] || guards[i].is_some() {
                continue;
            }
            let inner = &m.client.inner;
            let watchdog_ms = millis(inner.config.watchdog_timeout);
            let levels = inner.watchdog.levels(m.keys.hold(), self.token);
            let need = inner
                .watchdog
                .need_ms(m.keys.hold(), self.token, watchdog_ms);
            left.push(i);
            calls.push(Call::script(
                inner,
                queue::cancel(&m.keys, &self.holders[i], levels, need, true),
            ));
        }
        if calls.is_empty() {
            return;
        }
        let replies = fanout::run_always::<Vec<i64>>(&calls, Instant::now() + lock.member_timeout);
        for (i, reply) in left.into_iter().zip(replies) {
            let m = &lock.members[i];
            let inner = &m.client.inner;
            self.left_queue(i);
            match reply.as_deref() {
                Ok(&[1, count, _]) if confirm => {
                    guards[i] = self.confirm_handed(i, count);
                }
                Ok(&[1, count, _]) => {
                    // Given straight back: the release takes the hold if it still stands,
                    // and never another holder's.
                    let grant = Grant { count, fence: None };
                    let holder = self.holders[i].clone();
                    guards[i] = Some(m.granted(
                        self.token,
                        holder,
                        grant,
                        self.lease,
                        Instant::now(),
                        true,
                    ));
                }
                Ok(&[0, 1]) => inner.watchdog.handed_on(inner, &m.keys),
                Ok(_) => {}
                Err(e) => {
                    log::debug!("redmutex: leaving a MultiLock queue failed: {e}");
                    let levels = inner.watchdog.levels(m.keys.hold(), self.token);
                    inner
                        .watchdog
                        .doubt(inner, &m.keys, self.token, &self.holders[i], levels);
                }
            }
        }
    }

    /// Lock `i` was handed to this thread by a release while its call left the queue
    /// (`count`: the levels the cancel found): confirms the hold with the server before
    /// it is counted. `None` when its pickup window was over first.
    ///
    /// The window starts at the release, on the server, up to a whole window before the
    /// cancel's reply arrives (the handoff may have come during the round before it):
    /// counted from the reply, a hold that lapsed and passed to another client would be
    /// counted as held until the watchdog's extension found it gone. One renewal call
    /// settles it (as a `Lock`'s waiter does), bounded by the member timeout; it extends
    /// the hold to this call's lease, which then counts from the confirmation's start.
    fn confirm_handed(&self, i: usize, count: i64) -> Option<LockGuard> {
        let m = &self.lock.members[i];
        let inner = &m.client.inner;
        let holder = &self.holders[i];
        let sent = Instant::now();
        let until = sent + self.lock.member_timeout;
        match m.pick_up(holder, m.lease_ms(self.lease), Some(until)) {
            Ok(true) => {
                let grant = Grant { count, fence: None };
                Some(m.granted(self.token, holder.clone(), grant, self.lease, sent, false))
            }
            // Lapsed, and handed on or taken by another client: not ours to count.
            Ok(false) => None,
            Err(e) => {
                // The renewal may have run and extended the hold to a whole lease: the
                // watchdog gives back any level beyond those the thread holds (none here:
                // a thread that held the lock never queued on it), off this path.
                log::debug!("redmutex: confirming a MultiLock member handed over failed: {e}");
                let levels = inner.watchdog.levels_now(m.keys.hold(), self.token);
                inner
                    .watchdog
                    .doubt(inner, &m.keys, self.token, holder, levels);
                None
            }
        }
    }

    /// The deadline passed: leave every queue; what was handed over meanwhile goes back
    /// (unconfirmed: its release removes the hold if it still stands, and only then).
    fn give_up(&mut self) {
        let mut handed: Vec<Option<LockGuard>> = self.lock.members.iter().map(|_| None).collect();
        self.leave_queues(&mut handed, false);
        let taken: Vec<LockGuard> = handed.into_iter().flatten().collect();
        if !taken.is_empty() {
            release_all(taken, Instant::now() + self.lock.member_timeout);
        }
    }

    fn left_queue(&mut self, i: usize) {
        if self.queued[i] {
            self.queued[i] = false;
            let m = &self.lock.members[i];
            m.client
                .inner
                .watchdog
                .done_waiting(m.keys.key(), self.token);
        }
    }
}

impl Drop for MultiWait<'_> {
    fn drop(&mut self) {
        for i in 0..self.queued.len() {
            if self.queued[i] {
                // Left with an error: the entry (and a grant made to it meanwhile) is given
                // up by that client's watchdog thread, off this caller's path.
                let m = &self.lock.members[i];
                let inner = &m.client.inner;
                inner.watchdog.done_waiting(m.keys.key(), self.token);
                // Told the levels the thread holds there (none: a thread that held the
                // lock never queued on it), so that the clean-up can never take one.
                let held = inner.watchdog.levels_now(m.keys.hold(), self.token);
                inner
                    .watchdog
                    .doubt(inner, &m.keys, self.token, &self.holders[i], held);
            }
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

/// A random number, for the pause after a split: std's per-process random hash keys, fed
/// the time, are plenty for spreading retries apart.
fn random() -> u64 {
    RandomState::new().hash_one(Instant::now())
}
