//! `Lock<K>`: a named reentrant lock shared by every thread and process that uses the name,
//! one type over its kinds (plain, fair, fenced): the waiting, deadline, lease and guard
//! logic exists once.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::primitives::kind::{Fair, Fenced, Kind, Owned, Plain};
use crate::runtime::connection::executor::CALL_MEMORY;
use crate::runtime::holds::lease::Lease;
use crate::runtime::keys::{holder_id, thread_token, LockKeys};
use crate::runtime::scripting::calls;
use crate::runtime::scripting::scripts::ScriptCall;
use crate::runtime::subscriber;
use crate::{Client, Error, LockGuard};
use crate::{LockOptions, OwnedLock};

/// A named distributed lock, reentrant per thread; one type over its kinds.
///
/// `Lock` is `Lock<Plain>`; [`FairLock`] is `Lock<Fair>` and [`FencedLock`] is
/// `Lock<Fenced>`. Every kind has the same surface and the same guard semantics
/// ([`LockGuard<K>`](LockGuard)); a kind only changes how an acquisition behaves, so code
/// written once for `Lock<K: Kind>` runs with any of them.
///
/// A thread that holds the lock may take it again (nested critical sections); it is free
/// for others once every guard of that thread is released. Ownership belongs to the thread,
/// which is why [`LockGuard`] is not `Send`. Different threads, different [`Client`]s and
/// different processes all exclude each other.
/// A hold that must outlive its thread or move to another one (a job handed to a worker
/// of a pool) is taken through [`owned`](Lock::owned) instead: its
/// [`OwnedGuard`](crate::OwnedGuard) is `Send`, and the hold is not reentrant.
///
/// `Lock` is a cheap handle (clone it freely); making one touches no network. Waiting
/// does not poll: a blocked thread joins the lock's queue and sleeps until the release
/// before its turn tells it (one message, to its client only), or until the holder's
/// lease runs out if the holder crashed.
///
/// A running thread may take a free lock past sleeping waiters (cheaper than waking one),
/// but only while the first of them has waited less than 2 ms: until then a release wakes
/// it to try, after that releases hand the lock to the waiters in turn, so none starves
/// (under steady contention every handoff is direct, as with a `FairLock`). Also a
/// `try_lock` that finds the lock free takes it past such a young waiter, where a
/// `FairLock`'s returns `None`. For strict first come, first served use
/// [`FairLock`](crate::FairLock), the same lock without barging.
///
/// Who holds a lock (holder ids, leases, waiters) is read with
/// [`Client::inspect`](crate::Client::inspect); what each hold records beside its holder
/// id for operators (a host, a pid) is set once for the client, with
/// [`ClientBuilder::metadata`](crate::ClientBuilder::metadata), not per lock.
///
/// # Guarantees
///
/// - No two threads anywhere hold the lock at once while Redis keeps its data and every
///   holder finishes within its lease (the watchdog renews it while the guard lives).
///   A holder paused past its lease can overlap the next one: use a
///   [`FencedLock`](crate::FencedLock) where that must not corrupt anything.
/// - A lost hold is reported, never silent: [`is_lease_lost`](LockGuard::is_lease_lost),
///   [`lost`](LockGuard::lost), and [`unlock`](LockGuard::unlock) returning
///   [`Error::LeaseLost`](crate::Error::LeaseLost).
/// - A crashed holder's lock frees itself when its lease ends; a waiter then gets it
///   within about a millisecond, with no polling meanwhile.
/// - Bounded calls (`try_lock*`) return by their deadline plus 250 ms, even when Redis
///   is frozen or unreachable.
///
/// [`guide::guarantees`](crate::guide::guarantees) lists every guarantee with the fault
/// tests behind it, and [`guide::topologies`](crate::guide::topologies) what failover,
/// Sentinel, Cluster and RedLock change.
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
pub struct Lock<K: Kind = Plain> {
    pub(crate) client: Client,
    pub(crate) keys: Arc<LockKeys>,
    // A semaphore's permits when it does not exist yet (unused by the locks).
    pub(crate) initial: u32,
    // How long the watchdog may renew a hold taken through this handle (`max_hold`).
    pub(crate) max_hold: Option<Duration>,
    kind: PhantomData<fn() -> K>,
}

/// A [`Lock`] whose waiters get it first come, first served, across threads and processes.
///
/// A thread that cannot take the lock at once joins a queue kept beside the lock in Redis,
/// in the order its request reached the server. A release that finds waiters makes the
/// first live one the holder inside the release script and sends one message to that
/// waiter's client, and no other thread wakes. The hold starts with a lease of one second
/// (the pickup window, or the waiter's lease if shorter) from the release. A waiting
/// thread that hears of it within half a second of sending its last attempt (the grant
/// cannot be older: it was made from the queue entry that attempt wrote) returns holding
/// the lock with no further round trip, and its watchdog extends the hold to its lease a
/// third into the window. One that hears later, or one whose client uses
/// [`sync_replicas`](crate::ClientBuilder::sync_replicas), first confirms the hold with one
/// round trip that also extends it (and waits for the replicas). Only this machine's
/// elapsed time is used: the client's and the server's clocks are never compared.
/// Re-entries by the holding thread never queue; a `try_lock` returns `None` when the lock
/// is free but others are queued.
///
/// A waiter whose process died is skipped by the release itself (its client no longer
/// listens); a waiter whose deadline passed leaves the queue with its call (and if the lock
/// was handed to it meanwhile, the call returns the guard); a grant that is not extended
/// within one second of the release (a frozen process, a message delayed on a slow link)
/// lapses and passes on. A confirmation that comes later is refused, and the waiter queues
/// again rather than return a hold it lost; a hold already returned whose extension comes
/// too late says so ([`is_lease_lost`](LockGuard::is_lease_lost)) from the end of its
/// window, counted from before the release. See [`guide::how_it_works`](crate::guide::how_it_works)
/// for the exact bounds and [`guide::redis_layout`](crate::guide::redis_layout) for the
/// keys.
///
/// Guards are [`LockGuard`]s with the same semantics as a [`Lock`]'s: reentrant per
/// thread, released on drop, not `Send`. The same name through [`Client::lock`] is the
/// same lock: while a fair waiter is queued, plain acquisitions queue too.
///
/// # Guarantees
///
/// Those of [`Lock`], and: waiters get the lock in the order they asked (a re-entry of
/// the holding thread never queues); a `try_lock` never takes it past anyone queued; a
/// waiter that died or does not pick up its turn within one second is passed over, so it
/// holds up the queue for no longer.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.fair_lock("payouts");
/// let guard = lock.lock()?;        // waits its turn behind every earlier waiter
/// guard.unlock()?;                 // hands the lock to the next waiter in line
/// # Ok::<(), redmutex::Error>(())
/// ```
pub type FairLock = Lock<Fair>;

/// A [`Lock`] whose every new hold gets a fencing token: a number that strictly grows with
/// each outermost acquisition of the name, by any client, and stays the same for nested
/// re-entries.
///
/// A lease can run out while its holder still believes it holds the lock: a long GC-like
/// pause, a frozen VM, a slow network. The next holder then works concurrently with the
/// old one, and no lock can prevent it. Fencing lets the guarded resource refuse the
/// stale holder: send [`FencedGuard::token`](crate::FencedGuard::token) with every write,
/// and have the resource reject a write whose token is lower than the highest it has seen.
/// In Redis itself that check is one script (compare the token stored beside the data,
/// write only if the new one is not lower); in SQL, a `WHERE fence <= $token` on the
/// update.
///
/// The token is drawn inside the acquire script (no extra round trip) from a counter key
/// beside the lock (`<prefix>!fence:<key>`, in the lock's hash slot and in a key namespace
/// that no lock name can produce) that expires a day after its last draw. A counter made
/// anew (the name's first hold, a name left alone for a day, a Redis that lost its data)
/// starts from the server's clock in microseconds, past every token drawn before it, and
/// grows by one per hold.
///
/// # Guarantees
///
/// Those of [`Lock`], and: each outermost hold's token is larger than that of every
/// earlier hold of the name, by any client, while Redis keeps its data; the nested levels
/// of one hold share its token.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.fenced_lock("exports");
/// let guard = lock.lock()?;
/// let token = guard.token();
/// // storage.write_if_token_not_older(token, data)?;
/// guard.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub type FencedLock = Lock<Fenced>;

impl<K: Kind> Clone for Lock<K> {
    fn clone(&self) -> Self {
        self.as_kind()
    }
}

impl<K: Kind> Lock<K> {
    pub(crate) fn new(client: Client, keys: LockKeys) -> Lock<K> {
        Lock {
            max_hold: client.inner.exec.config.max_hold,
            client,
            keys: Arc::new(keys),
            initial: 0,
            kind: PhantomData,
        }
    }

    /// The same lock, whose acquisitions are holders of their own (see
    /// [`owned`](Lock::owned)).
    pub(crate) fn owned_kind(&self) -> Lock<Owned<K>> {
        self.as_kind()
    }

    /// The same lock and settings, as a `Lock` of kind `L` (the same kind for a clone).
    fn as_kind<L: Kind>(&self) -> Lock<L> {
        Lock {
            client: self.client.clone(),
            keys: self.keys.clone(),
            initial: self.initial,
            max_hold: self.max_hold,
            kind: PhantomData,
        }
    }

    /// This handle with its own [`max_hold`](crate::ClientBuilder::max_hold) (the client's
    /// otherwise): a watchdog hold taken through it is renewed for at most `max_hold` from
    /// its acquisition, then reported lost once its lease runs out
    /// ([`LossReason::MaxHold`](crate::LossReason::MaxHold)). A handle rather than a
    /// variant of every `lock*` call: the cap is a property of the work a handle is for.
    /// A nested level taken with a shorter cap brings the hold's cap nearer; fixed leases
    /// are not affected. Fails with [`Error::InvalidArgument`] for a duration over ten
    /// years or not longer than the client's
    /// [`command_timeout`](crate::ClientBuilder::command_timeout) (a hold taken by a slow
    /// acquire could lapse before its guard exists).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("rebuild-index").with_max_hold(Duration::from_secs(600))?;
    /// let guard = lock.lock()?;
    /// // Renewed while held, but never past ten minutes: a stuck rebuild frees the lock.
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn with_max_hold(&self, max_hold: Duration) -> Result<Lock<K>, Error> {
        crate::runtime::holds::lease::check_max_hold(
            max_hold,
            self.client.inner.exec.config.command_timeout,
        )
        .map_err(|e| e.on_lock(self.name()))?;
        let mut lock = self.clone();
        lock.max_hold = Some(max_hold);
        Ok(lock)
    }

    /// Blocks until this thread holds the lock. The lease is
    /// [`watchdog_timeout`](crate::ClientBuilder::watchdog_timeout) long and renewed by
    /// the watchdog until the guard is released, so a crashed holder frees the lock within
    /// that time. A fixed lease, a cancellation token: [`try_lock_with`](Lock::try_lock_with).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("report").lock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock(&self) -> Result<LockGuard<K>, Error> {
        Ok(self
            .acquire(Lease::Watchdog, None, 1)?
            .expect("an acquisition without deadline only returns once acquired"))
    }

    /// One attempt, without waiting: `Ok(None)` when another thread holds the lock.
    /// The lease is kept alive by the watchdog, as with [`lock`](Lock::lock). Waits at most
    /// 250 ms for Redis's answer, then fails with [`Error::Timeout`].
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.lock("cron:cleanup").try_lock()? {
    ///     Some(_guard) => println!("we run the cleanup"),
    ///     None => println!("someone else is on it"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock(&self) -> Result<Option<LockGuard<K>>, Error> {
        self.acquire(Lease::Watchdog, Some(Instant::now()), 1)
    }

    /// Waits at most `wait` for the lock: `Ok(None)` if it was not acquired in time.
    /// A zero `wait` makes one attempt; one too long to add to the current time (such as
    /// `Duration::MAX`) waits for as long as it takes, like [`lock`](Lock::lock).
    ///
    /// Bounded also against a Redis that stops answering: the call returns within `wait`
    /// plus a grace of 250 ms for a round trip already under way (then with
    /// [`Error::Timeout`] or [`Error::Pool`]), whatever the command and connect timeouts.
    ///
    /// Redisson's `tryLock(wait, lease)` is
    /// [`try_lock_with`](Lock::try_lock_with)`(LockOptions::new().wait_for(wait).lease(lease))`.
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
    pub fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard<K>>, Error> {
        self.acquire(Lease::Watchdog, Instant::now().checked_add(wait), 1)
    }

    /// Waits for the lock until `deadline`: `Ok(None)` if it was not acquired by then.
    /// Returns by `deadline` plus 250 ms even when Redis stops answering, as
    /// [`try_lock_for`](Lock::try_lock_for).
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// for name in ["a", "b"] {
    ///     // one deadline for both: the second waits only for what is left
    ///     let _guard = client.lock(name).try_lock_until(deadline)?;
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard<K>>, Error> {
        self.acquire(Lease::Watchdog, Some(deadline), 1)
    }

    /// Acquires with [`LockOptions`]: a fixed lease, a bound on the wait, a
    /// [`CancellationToken`](crate::CancellationToken). `Ok(None)` only when the options' wait ran out; with no wait
    /// set it blocks as [`lock`](Lock::lock) does and returns `Some`.
    /// [`Error::Cancelled`] when the token stopped the wait (nothing is held then),
    /// [`Error::InvalidArgument`] for a zero lease, one over ten years, or permits (a
    /// lock has none), with nothing sent.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redmutex::LockOptions;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("report");
    ///
    /// // Redisson's lock(10, SECONDS): blocks, then holds for 10 s, never renewed.
    /// let guard = lock.try_lock_with(LockOptions::new().lease(Duration::from_secs(10)))?;
    /// # drop(guard);
    ///
    /// // Redisson's tryLock(1, 30, SECONDS).
    /// let options = LockOptions::new()
    ///     .wait_for(Duration::from_secs(1))
    ///     .lease(Duration::from_secs(30));
    /// if let Some(guard) = lock.try_lock_with(options)? {
    ///     guard.unlock()?;
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "tryLock")]
    #[doc(alias = "lock_with_lease")]
    #[doc(alias = "lock_cancellable")]
    #[doc(alias = "lockInterruptibly")]
    pub fn try_lock_with(&self, options: LockOptions) -> Result<Option<LockGuard<K>>, Error> {
        let o = options.for_lock().map_err(|e| e.on_lock(self.name()))?;
        self.acquire_cancellable(o.lease, o.deadline, 1, o.cancel)
    }

    /// This lock's owned form: the same lock, whose acquisitions are holders of their own
    /// and whose guards ([`OwnedGuard`](crate::OwnedGuard)) are `Send`, for a hold that
    /// moves to another thread (a job handed to a worker) or outlives the thread that took
    /// it. Not reentrant: see [`OwnedLock`].
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("nightly-export").owned().lock()?;
    /// std::thread::spawn(move || {
    ///     // ... the export runs here, under the lock ...
    ///     guard.unlock() // released by the thread that finished the work
    /// });
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "lock_owned")]
    #[doc(alias = "Send")]
    pub fn owned(&self) -> OwnedLock<K> {
        OwnedLock::new(self.owned_kind())
    }

    /// Whether any thread of any client holds the lock right now.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if client.lock("deploy").is_locked()? {
    ///     println!("a deploy is running somewhere");
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn is_locked(&self) -> Result<bool, Error> {
        self.check_name()?;
        let key = self.keys.key();
        self.client
            .inner
            .exec
            .run(|con| redis::cmd("EXISTS").arg(key).query(con))
            .map_err(|e| e.on_lock(self.name()))
    }

    /// Whether the calling thread holds the lock: it has a live guard of it, and Redis still
    /// records the hold. False once the lease is lost (expired, force-unlocked, lost by
    /// Redis), even while guards of it are alive. See [`hold_count`](Lock::hold_count).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("ledger");
    /// let guard = lock.lock()?;
    /// assert!(lock.is_held_by_current_thread()?);
    /// guard.unlock()?;
    /// assert!(!lock.is_held_by_current_thread()?);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn is_held_by_current_thread(&self) -> Result<bool, Error> {
        Ok(self.hold_count()? > 0)
    }

    /// How many times the calling thread holds the lock (its reentry depth): 0 when it does
    /// not hold it.
    ///
    /// A thread with no live guard of the lock (none taken, all released, or its lease
    /// already known lost) gets 0 at once, without a round trip: a lock is held by a thread
    /// only through its guards. Otherwise Redis is asked, so a lease lost since the last
    /// renewal shows as 0. Owned holds ([`owned`](Lock::owned)) are nobody's
    /// thread's and never count.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock("ledger");
    /// let outer = lock.lock()?;
    /// let inner = lock.lock()?;                // re-entry on the same thread
    /// assert_eq!(lock.hold_count()?, 2);
    /// drop(inner);
    /// assert_eq!(lock.hold_count()?, 1);
    /// # drop(outer);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn hold_count(&self) -> Result<u32, Error> {
        self.count_held().map_err(|e| e.on_lock(self.name()))
    }

    fn count_held(&self) -> Result<u32, Error> {
        self.check_name()?;
        let inner = &self.client.inner;
        inner.exec.check_process()?;
        let keys = &self.keys;
        let table = &inner.holds;
        let Some(token) = table
            .token_of_thread(keys, thread_token())
            .filter(|&token| table.holds_locally(keys.hold(), token))
        else {
            return Ok(0);
        };
        let field = keys.ops.field(&holder_id(&inner.exec.id, token));
        if !keys.has_leases() {
            let count: Option<u32> = inner
                .exec
                .run(|con| redis::cmd("HGET").arg(keys.key()).arg(&field).query(con))?;
            return Ok(count.unwrap_or(0));
        }
        // A hold with a lease of its own counts until that lease ends, even before the
        // next script drops it.
        let (count, ends, (secs, micros)): (Option<u32>, Option<u64>, (u64, u64)) =
            inner.exec.run(|con| {
                redis::pipe()
                    .cmd("HGET")
                    .arg(keys.key())
                    .arg(&field)
                    .cmd("ZSCORE")
                    .arg(keys.leases().as_slice())
                    .arg(&field)
                    .cmd("TIME")
                    .query(con)
            })?;
        let now = secs * 1000 + micros / 1000;
        Ok(if ends.is_some_and(|e| e > now) {
            count.unwrap_or(0)
        } else {
            0
        })
    }

    /// The time left on the lease of whoever holds the lock, or `None` when it is free.
    /// (`Some(Duration::MAX)` if the key somehow has no expiry.)
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.lock("report").remaining_lease()? {
    ///     Some(left) => println!("held, lease ends in {left:?}"),
    ///     None => println!("free"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn remaining_lease(&self) -> Result<Option<Duration>, Error> {
        self.lease_left().map_err(|e| e.on_lock(self.name()))
    }

    fn lease_left(&self) -> Result<Option<Duration>, Error> {
        self.check_name()?;
        let key = self.keys.key();
        let pttl: i64 = self
            .client
            .inner
            .exec
            .run(|con| redis::cmd("PTTL").arg(key).query(con))?;
        Ok(match pttl {
            -1 => Some(Duration::MAX),
            ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
            _ => None,
        })
    }

    /// Frees the lock whoever holds it, waking its waiters; true if it was held. An
    /// administrative operation: the former holder is not stopped, but its client is told
    /// at once (on its own channel): its guards' [`lost`](LockGuard::lost) fire, the
    /// `on_lease_lost` hook is called, and its release fails with [`Error::LeaseLost`].
    ///
    /// A call whose reply was lost is sent again, and the repeat recognizes what its first
    /// run did: `Ok(true)` if that freed the lock, never "it was not locked".
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// // An operator frees a lock whose holder is stuck; the holder is told its lease is lost.
    /// if client.lock("nightly-export").force_unlock()? {
    ///     println!("freed");
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn force_unlock(&self) -> Result<bool, Error> {
        self.force_unlock_named()
            .map_err(|e| e.on_lock(self.name()))
    }

    fn force_unlock_named(&self) -> Result<bool, Error> {
        self.check_name()?;
        let call = self.force_unlock_cmd();
        let exec = &self.client.inner.exec;
        let deleted: i64 = exec.run_remembered(|con| exec.eval(con, &call))?;
        Ok(deleted == 1)
    }

    /// The force-unlock script's call (see `lua/force_unlock.lua`), with an id of its own
    /// that each run of it sends.
    pub(crate) fn force_unlock_cmd(&self) -> ScriptCall {
        let exec = &self.client.inner.exec;
        calls::force_unlock(
            &self.keys,
            &exec.call_id(),
            CALL_MEMORY,
            &subscriber::own_channel_prefix(&exec.config.key_prefix),
        )
    }

    /// The name the lock was made with.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// assert_eq!(client.lock("report").name(), b"report");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn name(&self) -> &[u8] {
        self.keys.name()
    }

    pub(crate) fn check_name(&self) -> Result<(), Error> {
        crate::name::check(self.keys.name(), "lock names must not be empty")
    }
}

impl<K: Kind> fmt::Debug for Lock<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(K::NAME)
            .field("name", &String::from_utf8_lossy(self.keys.name()))
            .field("key", &String::from_utf8_lossy(self.keys.key()))
            .finish()
    }
}
