//! `LockGuard<K>`: one level of a held lock of any kind, released when dropped.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::primitives::kind::{sealed::Sealed, Fenced, Kind, Plain};
use crate::runtime::client::Inner;
use crate::runtime::holds::Registration;
use crate::runtime::keys::LockKeys;
use crate::runtime::lease::{millis, Lease};
use crate::runtime::queue;
use crate::runtime::scripts::ScriptCall;
use crate::{Error, Lock};

/// Proof that the current thread holds a [`Lock`] (one level of it, when nested).
///
/// Dropping the guard releases that level, best effort: an error is only logged. Call
/// [`unlock`](LockGuard::unlock) to learn whether the release worked. The guard is not
/// `Send`: a lock belongs to the thread that took it, and only that thread may release it.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let guard = client.lock("ledger").lock()?;
/// // ... critical section ...
/// if guard.is_lease_lost() {
///     // Redis lost or expired the lock meanwhile: another holder may have run too.
/// }
/// guard.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
///
/// Guards of every kind stay on their thread:
///
/// ```compile_fail
/// fn send<T: Send>() {}
/// send::<redmutex::LockGuard<redmutex::Fair>>();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<K: Kind = Plain> {
    // The client's internals and the lock's names, not a `Lock`: a guard may release after
    // every `Client` is dropped, but does not keep the watchdog renewing (see `Client`).
    inner: Arc<Inner>,
    keys: Arc<LockKeys>,
    token: u64,
    holder: Arc<str>,
    lease: Lease,
    acquired: Instant,
    level: u64,
    lost: Arc<AtomicBool>,
    fence: Option<u64>,
    // The primary it was granted on (see `Target::generation`): a hold missing after a
    // failover was lost by it, whatever its lease.
    generation: u64,
    released: bool,
    // Holder ids are per thread: releasing from another thread would be refused by Redis.
    // (A semaphore's permits are held by the acquisition, not the thread: they may move.)
    _owner: PhantomData<<K as Sealed>::Owner>,
}

/// Proof that the current thread holds a [`FencedLock`](crate::FencedLock), with the
/// hold's fencing token. Released on drop like any [`LockGuard`]; not `Send`.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.fenced_lock("exports");
/// let outer = lock.lock()?;
/// let inner = lock.lock()?;                  // re-entry: the same hold, the same token
/// assert_eq!(outer.token(), inner.token());
/// # Ok::<(), redmutex::Error>(())
/// ```
pub type FencedGuard = LockGuard<Fenced>;

impl LockGuard<Fenced> {
    /// The fencing token of this hold: larger than that of every earlier hold of the lock
    /// name, and the same for every nested level of this hold.
    pub fn token(&self) -> u64 {
        self.fence
            .expect("a fenced acquisition always reports its token")
    }
}

impl<K: Kind> LockGuard<K> {
    pub(crate) fn new(
        lock: &Lock<K>,
        token: u64,
        holder: String,
        lease: Lease,
        acquired: Instant,
        registration: Registration,
        fence: Option<u64>,
    ) -> LockGuard<K> {
        debug_assert_eq!(*registration.holder, holder, "one holder id per thread");
        LockGuard {
            inner: lock.client.inner.clone(),
            keys: lock.keys.clone(),
            token,
            holder: registration.holder,
            lease,
            acquired,
            level: registration.level,
            lost: registration.lost,
            fence,
            generation: lock.client.inner.generation(),
            released: false,
            _owner: PhantomData,
        }
    }

    /// Releases this level of the lock and reports the outcome.
    ///
    /// Fails with [`Error::LeaseLost`] whenever [`is_lease_lost`](LockGuard::is_lease_lost)
    /// is true by then (its fixed lease ran out, the watchdog found the lease gone or could
    /// not renew it in time, a failover lost the hold), whatever Redis still holds: the
    /// hold is given back if it is still this thread's, but the guard cannot vouch for the
    /// time in between. Fails with [`Error::NotHeld`] when Redis no longer had the hold
    /// although nothing had told the guard (`force_unlock`, a data loss the watchdog had
    /// not seen yet), or with a Redis error; the lock then frees itself when its lease
    /// ends.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    /// True once this guard's hold is known to be gone, or about to go: the watchdog found
    /// the lock no longer held by this thread; a later acquisition by this thread found it
    /// gone on the server; every `Client` was dropped, so nothing renews it any more; or
    /// this guard's fixed lease has run out with no other level of the thread's hold
    /// keeping the lock (an outer fixed lease covered by a nested watchdog level is not
    /// lost); or the lock was handed to this thread by a release and its one-second
    /// pickup window ended before the watchdog could extend it (Redis unreachable); or no
    /// renewal reached Redis for as long as the lease lasts (Redis frozen, unreachable or
    /// cut off), so the key may have expired there. Another holder may then have entered
    /// the critical section. Never goes back to false.
    pub fn is_lease_lost(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        let watchdog = &self.inner.watchdog;
        if watchdog.pickup_lapsed(self.keys.hold(), self.token, &self.lost) {
            return true;
        }
        match self.lease {
            Lease::Fixed(ms) => {
                self.acquired.elapsed() >= Duration::from_millis(ms)
                    && watchdog.lease_over(self.keys.hold(), self.token, &self.lost)
            }
            Lease::Watchdog => watchdog.lease_expired(self.keys.hold(), self.token, &self.lost),
        }
    }

    fn release(&mut self) -> Result<(), Error> {
        let held = match self.begin_release()? {
            Ok(call) => call,
            Err(done) => return done,
        };
        let inner = &self.inner;
        let keys = &self.keys;
        let reply = inner.run(|con| {
            let (left, served): (i64, i64) = inner.eval(con, &held.cmd)?;
            let shortfall = if left >= 0 {
                inner.await_replicas(con, keys.key())?
            } else {
                None
            };
            Ok((left, served, shortfall))
        });
        self.end_release(held.levels, reply)
    }

    /// The first half of a release: unregisters this level, so that from here on the
    /// watchdog never renews for it, and returns the release script's call; or the
    /// outcome already, when this level is no longer held (`Err`).
    pub(crate) fn begin_release(&mut self) -> Result<Result<Release, Result<(), Error>>, Error> {
        self.released = true;
        let inner = &self.inner;
        // In a fork()ed child the holder id is the parent's: releasing would free its lock.
        inner.check_process()?;
        let keys = &self.keys;
        let watchdog_ms = millis(inner.config.watchdog_timeout);
        // Whatever made the guard say (or would make it say) its lease is lost marks the
        // hold lost here, before anything is sent: the release below still gives the hold
        // back if Redis has it, but its outcome is `LeaseLost` (see `end_release`).
        self.is_lease_lost();
        let Some((need, held)) =
            inner
                .watchdog
                .releasing(keys.hold(), self.token, self.level, watchdog_ms)
        else {
            // The hold this guard belonged to is over (lost, or replaced by a newer
            // acquisition of this thread): releasing in Redis would take a level from
            // the newer one.
            return Ok(Err(Err(self.not_held())));
        };
        Ok(Ok(Release {
            cmd: queue::release(keys, &self.holder, need, held),
            levels: held,
        }))
    }

    /// The second half of a release, given the script's reply `(left, served)` and the
    /// replicas' shortfall, if any.
    pub(crate) fn end_release(
        &self,
        held: usize,
        reply: Result<(i64, i64, Option<Error>), Error>,
    ) -> Result<(), Error> {
        let inner = &self.inner;
        let keys = &self.keys;
        let (left, served, shortfall) = reply?;
        if served == 1 {
            // A waiter was told its turn: make sure it took it once its window is over.
            inner.watchdog.handed_on(inner, keys);
        }
        if self.lost.load(Ordering::SeqCst) {
            // Said lost before the release was sent (or found so meanwhile): whatever the
            // script found, the hold was not vouched for until now.
            return Err(Error::LeaseLost);
        }
        if left < 0 {
            return Err(self.not_held());
        }
        if left == 0 && held > 1 {
            // The lock is free although outer levels were registered: their leases were
            // over (or the count was off); their guards must not look held.
            inner.watchdog.hold_ended(keys.hold(), &self.lost);
        }
        shortfall.map_or(Ok(()), Err)
    }

    /// The client this guard's lock belongs to.
    pub(crate) fn client(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The names of this guard's lock.
    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn not_held(&self) -> Error {
        if self.lost.load(Ordering::SeqCst) || self.generation != self.inner.generation() {
            Error::LeaseLost
        } else {
            Error::NotHeld
        }
    }
}

/// A release under way: the script's call, and the levels it was told the thread holds.
pub(crate) struct Release {
    pub(crate) cmd: ScriptCall,
    pub(crate) levels: usize,
}

impl<K: Kind> Drop for LockGuard<K> {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.release() {
                log::warn!(
                    "redmutex: releasing lock {:?} on drop failed: {e}",
                    String::from_utf8_lossy(self.keys.name())
                );
            }
        }
    }
}

impl<K: Kind> fmt::Debug for LockGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("kind", &K::NAME)
            .field("lock", &String::from_utf8_lossy(self.keys.name()))
            .field("holder", &self.holder)
            .field("lease", &self.lease)
            .field("lease_lost", &self.is_lease_lost())
            .field("token", &self.fence)
            .finish()
    }
}
