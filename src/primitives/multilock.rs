//! `MultiLock`: one lock over several [`Lock`]s, held while a quorum of them is: RedLock
//! across independent Redis masters, or several resources taken all at once.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::primitives::cancel;
use crate::runtime::connection::fanout::{self, Call};
use crate::runtime::holds::lease::Lease;
use crate::LockOptions;
use crate::{Error, Lock, MultiLockGuard};

/// How long a round of calls waits for a server by default: far below any lease, so that
/// a server down or frozen delays each acquisition by this much at most.
const MEMBER_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a key of the check that members are distinct (`MultiLock::check_distinct`)
/// lives if its removal fails: far beyond the check's rounds, which each give a server
/// the member timeout.
const PROBE_TTL_MS: u64 = 10_000;

/// What the servers said of a `MultiLock`'s members: `None`, distinct; `Some((i, j))`,
/// members `i` and `j` are one key of one server.
type Distinct = Option<(usize, usize)>;

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
    pub(super) members: Arc<[Lock]>,
    pub(super) quorum: usize,
    pub(super) member_timeout: Duration,
    // Set once the servers told whether two clients' members are one key (see
    // `check_distinct`): clones share it, so it is asked once.
    distinct: Arc<OnceLock<Distinct>>,
}

impl Clone for MultiLock {
    fn clone(&self) -> Self {
        MultiLock {
            members: self.members.clone(),
            quorum: self.quorum,
            member_timeout: self.member_timeout,
            distinct: self.distinct.clone(),
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
    /// A lock given twice through two clients of one server (one URL with `localhost`,
    /// the other with `127.0.0.1`; a proxy; the same server by two names) cannot be told
    /// without asking the servers, which making a `MultiLock` does not: the first
    /// acquisition asks them (only where two clients' locks have the same key), and
    /// refuses such a `MultiLock` with the same [`Error::InvalidArgument`], holding and
    /// leaving nothing, as does every acquisition after it (clones included). It would
    /// otherwise never be acquired: each of the two waits for the other. The same name in
    /// another database of the server, or under another key prefix, is another lock.
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
            if a.client.inner.exec.config.sync_replicas.is_some() {
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
        let distinct = OnceLock::new();
        if suspects(&members).is_empty() {
            // No two clients' locks share a key: nothing to ask the servers.
            let _ = distinct.set(None);
        }
        Ok(MultiLock {
            quorum: members.len(),
            members: members.into(),
            member_timeout: MEMBER_TIMEOUT,
            distinct: Arc::new(distinct),
        })
    }

    /// RedLock: one lock over `locks`, each on a client of its own independent Redis
    /// master (no replication between them), held when a majority (N/2 + 1) of them is.
    ///
    /// Fails with [`Error::InvalidArgument`] for fewer than three locks (a majority of one
    /// or two survives no failure), for two locks on one [`Client`](crate::Client), and
    /// as [`new`](MultiLock::new) does: one name reached through two clients of the same
    /// server (two "masters" that are one) is refused by the first acquisition.
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
        self.check_distinct()?;
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
        self.check_distinct()?;
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
        let deadline = Instant::now().checked_add(wait);
        self.check_distinct()?;
        self.acquire(Lease::Watchdog, deadline)
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
        self.check_distinct()?;
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
    ///     Err(redmutex::Error::Cancelled { .. }) => println!("gave up waiting"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "tryLock")]
    pub fn try_lock_with(&self, options: LockOptions) -> Result<Option<MultiLockGuard>, Error> {
        let o = options.for_lock()?;
        if !cancel::is_cancelled(o.cancel) {
            // (A token cancelled already fails the call with nothing sent.)
            self.check_distinct()?;
        }
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

    /// Refuses a `MultiLock` two of whose members, on two clients, are one key of one
    /// server: it could never be acquired. Asked of the servers the first time (until
    /// every pair that shares a key answered), in three rounds each bounded by the member
    /// timeout: each such member sets a key of its own beside its lock (`SET ... PX`,
    /// under its prefix, in its slot), then each pair looks, through one member's client,
    /// for the other's key (`EXISTS`), and the keys are removed (`DEL`). Two members see
    /// each other's key exactly when they share a keyspace, whatever their URLs say. A
    /// server that does not answer leaves its pairs to the next acquisition; a user whose
    /// ACL refuses `SET` or `EXISTS` is not asked again (the check is skipped).
    fn check_distinct(&self) -> Result<(), Error> {
        if let Some(verdict) = self.distinct.get() {
            return self.refused(*verdict);
        }
        let pairs = suspects(&self.members);
        for m in self.members.iter() {
            m.client.inner.exec.check_process()?;
        }
        let mut probed: Vec<usize> = pairs.iter().flat_map(|&(i, j)| [i, j]).collect();
        probed.sort_unstable();
        probed.dedup();
        let nonce = uuid::Uuid::new_v4().as_u64_pair().0;
        let key = |i: usize| self.members[i].keys.probe(nonce.wrapping_add(i as u64));
        let call = |i: usize, cmd: redis::Cmd| Call::plain(&self.members[i].client.inner, cmd);
        let set: Vec<Call<'_>> = probed
            .iter()
            .map(|&i| {
                let mut cmd = redis::cmd("SET");
                cmd.arg(key(i)).arg(1).arg("PX").arg(PROBE_TTL_MS);
                call(i, cmd)
            })
            .collect();
        let set = fanout::run::<redis::Value>(&set, Instant::now() + self.member_timeout);
        let was_set = |i: usize| {
            probed
                .iter()
                .position(|&p| p == i)
                .is_some_and(|at| set[at].is_ok())
        };
        let asked: Vec<(usize, usize)> = pairs
            .iter()
            .copied()
            .filter(|&(i, j)| was_set(i) && was_set(j))
            .collect();
        let exists: Vec<Call<'_>> = asked
            .iter()
            .map(|&(i, j)| {
                let mut cmd = redis::cmd("EXISTS");
                cmd.arg(key(j));
                call(i, cmd)
            })
            .collect();
        let seen = fanout::run::<i64>(&exists, Instant::now() + self.member_timeout);
        let del: Vec<Call<'_>> = probed
            .iter()
            .filter(|&&i| was_set(i))
            .map(|&i| {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(key(i));
                call(i, cmd)
            })
            .collect();
        // Every key set is removed, also on a server that failed a call a moment ago.
        let _ = fanout::run_always::<redis::Value>(&del, Instant::now() + self.member_timeout);
        let refusal = set
            .iter()
            .filter_map(|r| r.as_ref().err())
            .chain(seen.iter().filter_map(|r| r.as_ref().err()))
            .find(|e| matches!(e, Error::NoPermission { .. }));
        if let Some(refusal) = refusal {
            tracing::debug!(
                target: "redmutex",
                "redmutex: a MultiLock cannot ask whether two of its clients reach one server \
                 ({refusal}); not asked again"
            );
            let _ = self.distinct.set(None);
            return Ok(());
        }
        for (&pair, seen) in asked.iter().zip(&seen) {
            if matches!(seen, Ok(n) if *n > 0) {
                let _ = self.distinct.set(Some(pair));
                return self.refused(Some(pair));
            }
        }
        if asked.len() == pairs.len() && seen.iter().all(Result::is_ok) {
            let _ = self.distinct.set(None);
        }
        Ok(())
    }

    /// The error of members `pair` found to be one key of one server, if they were.
    fn refused(&self, pair: Distinct) -> Result<(), Error> {
        match pair {
            None => Ok(()),
            Some((i, j)) => Err(Error::invalid(format!(
                "a MultiLock cannot hold the same lock twice: its locks {i} and {j} ({:?}) are \
                 one key of one server, reached through two clients",
                String::from_utf8_lossy(self.members[i].name())
            ))),
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
    Error::invalid(what)
}

/// The pairs of members (`i < j`) whose locks have the same key on two clients: the same
/// lock twice if the clients reach one server.
fn suspects(members: &[Lock]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for (j, b) in members.iter().enumerate() {
        for (i, a) in members[..j].iter().enumerate() {
            if a.keys.key() == b.keys.key() && !Arc::ptr_eq(&a.client.inner, &b.client.inner) {
                pairs.push((i, j));
            }
        }
    }
    pairs
}
