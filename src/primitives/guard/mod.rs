//! `LockGuard<K>`: one level of a held lock of any kind, released when dropped.

mod release_level;

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::primitives::kind::{sealed::Sealed, Fenced, Kind, Plain};
use crate::runtime::holds::lease::{fixed, millis, Lease};
use crate::runtime::holds::loss::{Loss, Watcher};
use crate::runtime::holds::Registration;
use crate::runtime::inner::Inner;
use crate::runtime::keys::LockKeys;
use crate::runtime::scripting::calls;
use crate::runtime::telemetry;
use crate::{Error, Lock, LossReason, LostLease};

/// Proof that the current thread holds a [`Lock`] (one level of it, when nested).
///
/// Dropping the guard releases that level, best effort: an error is only logged. Call
/// [`unlock`](LockGuard::unlock) to learn whether the release worked.
///
/// The guard is not `Send`: a lock belongs to the thread that took it (nested sections of
/// that thread re-enter it), and only that thread may release it. Moving a guard into
/// another thread fails to compile with "`*const ()` cannot be sent between threads
/// safely … within the type `ThreadHoldSeeLockOwned`": a hold that moves to another
/// thread (a job handed to a worker) is taken through [`Lock::owned`], whose
/// [`OwnedGuard`](crate::OwnedGuard) is `Send`.
///
/// # Guarantees
///
/// - **One level, released once**: dropping the guard or [`unlock`](LockGuard::unlock)
///   releases this level only (the thread's other nested levels keep the lock), never
///   twice. A release that fails leaves the lock to free itself when its lease ends.
/// - **Renewed while it lives**: a watchdog lease is renewed by the client's watchdog
///   thread until the guard is released (for at most
///   [`max_hold`](crate::ClientBuilder::max_hold), if set, and while a
///   [`Client`](crate::Client) or a lock handle of it lives); a fixed lease is not.
/// - **A loss is told, and stays told**: [`is_lease_lost`](LockGuard::is_lease_lost) turns
///   true (never back), [`lost`](LockGuard::lost) is sent what was lost and why (a
///   release only closes it) and `unlock` fails with [`Error::LeaseLost`], whichever call
///   or thread found the hold gone.
/// - **It stays on its thread**: not `Send`, so only the thread that holds the lock
///   releases it.
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
    // A fixed lease: how long after `acquired` it ends, in ms (`extend` moves it on).
    fixed_ms: AtomicU64,
    level: u64,
    lost: Arc<Loss>,
    // The receiver `lost()` hands out, made on its first call.
    lost_rx: OnceLock<Receiver<LostLease>>,
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
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("exports").lock()?;
    /// let token = guard.token();
    /// // Send the token with every write; the storage refuses one older than the newest seen.
    /// println!("writing as holder #{token}");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
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
            fixed_ms: AtomicU64::new(match lease {
                Lease::Fixed(ms) => ms,
                Lease::Watchdog => 0,
            }),
            level: registration.level,
            lost: registration.lost,
            lost_rx: OnceLock::new(),
            fence,
            generation: lock.client.inner.exec.generation(),
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
    /// time in between. Also fails with [`Error::LeaseLost`] when Redis no longer had the
    /// hold although nothing had told the guard yet (`force_unlock`, a data loss the
    /// watchdog had not seen): the hold is marked lost then, so the guards of its other
    /// levels and the [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) hook are told
    /// at once (the hook once per hold), as by any call that finds a hold gone (a
    /// re-entry, [`extend`](LockGuard::extend)). Fails with [`Error::NotHeld`] only when
    /// the release's reply was lost and its repeat found nothing (the first run may have
    /// released it), or with a Redis error; the lock then frees itself when its lease
    /// ends.
    ///
    /// ```no_run
    /// use redmutex::Error;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("ledger").lock()?;
    /// // ... critical section ...
    /// match guard.unlock() {
    ///     Ok(()) => {}
    ///     Err(Error::LeaseLost { .. }) => eprintln!("another holder may have run meanwhile"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    /// True once this guard's hold is known to be gone, or about to go: the watchdog found
    /// the lock no longer held by this thread; a `force_unlock` freed it; a later
    /// acquisition, an `extend` or a release of another level by this thread found it gone
    /// on the server; every `Client` was dropped, so nothing renews it any more; or
    /// this guard's fixed lease has run out with no other level of the thread's hold
    /// keeping the lock (an outer fixed lease covered by a nested watchdog level is not
    /// lost); or the lock was handed to this thread by a release and its one-second
    /// pickup window ended before the watchdog could extend it (Redis unreachable); or no
    /// renewal reached Redis for as long as the lease lasts (Redis frozen, unreachable or
    /// cut off), so the key may have expired there; or it reached its
    /// [`max_hold`](crate::ClientBuilder::max_hold) and its last lease ran out. Another
    /// holder may then have entered the critical section. Never goes back to false.
    /// [`lost`](LockGuard::lost) is told of the same, without polling.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("ledger").lock()?;
    /// for step in 0..10 {
    ///     if guard.is_lease_lost() {
    ///         break; // the lock is no longer ours: stop before the next write
    ///     }
    ///     // ... step `step` of the work ...
    /// }
    /// # drop(guard);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        if self.lost.is_lost() {
            return true;
        }
        let table = &self.inner.holds;
        if table.pickup_lapsed(self.keys.hold(), self.token, &self.lost) {
            return true;
        }
        match self.lease {
            Lease::Fixed(_) => {
                let ms = self.fixed_ms.load(Ordering::SeqCst);
                self.acquired.elapsed() >= Duration::from_millis(ms)
                    && table.lease_over(self.keys.hold(), self.token, &self.lost)
            }
            Lease::Watchdog => table.lease_expired(self.keys.hold(), self.token, &self.lost),
        }
    }

    /// Extends this level's fixed lease to `lease` from now, if the hold is still this
    /// thread's: one script on the server that raises the lock's expiry only if this
    /// holder still has it, and never lowers it, so a longer lease another level of the
    /// hold needs is kept (an extension to less than what is left changes nothing). The
    /// guard then counts its lease from now ([`is_lease_lost`](LockGuard::is_lease_lost),
    /// [`lost`](LockGuard::lost)).
    ///
    /// Fails with [`Error::InvalidArgument`] for a zero lease or one over ten years, and
    /// for a guard whose lease the watchdog renews (there is nothing to extend: see
    /// [`ClientBuilder::max_hold`](crate::ClientBuilder::max_hold) for the opposite); with
    /// [`Error::LeaseLost`] when the hold is lost already (nothing is sent) or the server no
    /// longer has it; nothing changes then. A Redis error leaves the lease as it was, or
    /// extended if the script ran: the guard keeps counting from its old end, which is
    /// never later than the lock's.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let options = redmutex::LockOptions::new().lease(Duration::from_secs(10));
    /// let guard = client.lock("import").try_lock_with(options)?.expect("no wait bound set");
    /// // ... the import takes longer than planned ...
    /// guard.extend(Duration::from_secs(10))?; // ten more seconds from now
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn extend(&self, lease: Duration) -> Result<(), Error> {
        self.extend_lease(lease)
            .map_err(|e| e.on_lock(self.keys.name()))
    }

    fn extend_lease(&self, lease: Duration) -> Result<(), Error> {
        let Lease::Fixed(_) = self.lease else {
            return Err(Error::invalid(
                "extend is for a fixed lease; the watchdog renews this one",
            ));
        };
        let Lease::Fixed(lease_ms) = fixed(lease)? else {
            unreachable!("a fixed lease is fixed");
        };
        let inner = &self.inner;
        inner.exec.check_process()?;
        if self.is_lease_lost() {
            return Err(Error::LEASE_LOST);
        }
        let call = calls::confirm(&self.keys, &self.holder, lease_ms);
        let sent = Instant::now();
        let gone = inner.exec.run(|con| {
            let (lost, _): (Vec<i64>, Vec<i64>) = inner.exec.eval(con, &call)?;
            Ok(!lost.is_empty())
        })?;
        let table = &inner.holds;
        if gone {
            let reason = self.lost.gone_reason(inner.exec.generation());
            table.hold_lost(self.keys.hold(), &self.lost, reason);
            return Err(Error::LEASE_LOST);
        }
        let ends = sent + Duration::from_millis(lease_ms);
        if !table.extended_level(&self.keys, self.token, &self.lost, self.level, ends) {
            // Found lost meanwhile (its old lease ran out before the reply): that stands.
            return Err(Error::LEASE_LOST);
        }
        let ms = millis(ends.saturating_duration_since(self.acquired));
        self.fixed_ms.fetch_max(ms, Ordering::SeqCst);
        Ok(())
    }

    /// A channel told when this hold is lost, and closed when this guard is released
    /// (unlocked or dropped), whichever comes first: wait for it in a
    /// [`select!`](crossbeam_channel::select) beside your own work to stop as soon as the
    /// lock is no longer yours, without polling
    /// [`is_lease_lost`](LockGuard::is_lease_lost).
    ///
    /// What `recv()` returns tells the two apart:
    ///
    /// - `Ok(lost)`: the hold was lost. The [`LostLease`] says which lock and why
    ///   ([`reason`](LostLease::reason)), as the client's
    ///   [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) hook is told. It is sent
    ///   once, then the channel is closed: a later `recv()` returns `Err(RecvError)`.
    /// - `Err(RecvError)` at once: the guard was released (or the loss was received
    ///   already). A loss found by this guard's own release is said by that release's
    ///   error ([`Error::LeaseLost`]), not here.
    ///
    /// Either way a `recv(lost) -> msg` arm of `select!` fires, at once and on every
    /// later try. The message arrives within the same bound as `is_lease_lost()` turns
    /// true: the instant a fixed lease runs out or a lease goes unrenewed for its whole
    /// length (a thread of the client wakes for it; nobody needs to poll), when a
    /// `force_unlock` freed it (its client is told at once, on its own channel), or when a
    /// renewal, a later acquisition, an `extend` or a release of another level finds the
    /// hold gone. Every guard of a nested hold is told of its loss; releasing one level
    /// closes only that guard's channel. Each call returns a clone of the same receiver,
    /// and the one message goes to whichever clone receives first: wait for it in one
    /// place (after an `Err`, [`is_lease_lost`](LockGuard::is_lease_lost) still says
    /// whether the hold was lost).
    ///
    /// ```no_run
    /// use crossbeam_channel::{select, Receiver};
    /// # fn work_items() -> Receiver<u32> { crossbeam_channel::never() }
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("ledger").lock()?;
    /// let lost = guard.lost();
    /// let items = work_items();
    /// loop {
    ///     select! {
    ///         recv(items) -> item => match item {
    ///             Ok(item) => { /* ... process item under the lock ... */ }
    ///             Err(_) => break,
    ///         },
    ///         recv(lost) -> lost => {
    ///             // Ok: the lock is no longer ours, and another holder may run now.
    ///             // Stop; the release reports it too (`Error::LeaseLost`).
    ///             if let Ok(lost) = lost {
    ///                 eprintln!("lost {:?}: {}", lost.name_lossy(), lost.reason());
    ///             }
    ///             return guard.unlock();
    ///         }
    ///     }
    /// }
    /// guard.unlock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    ///
    /// Waiting on another thread until the work is over either way:
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("ledger").lock()?;
    /// let lost = guard.lost();
    /// let watcher = std::thread::spawn(move || match lost.recv() {
    ///     Ok(lost) => eprintln!("lost the ledger lock: {}", lost.reason()),
    ///     Err(_) => {} // released normally
    /// });
    /// // ... the work ...
    /// guard.unlock()?;
    /// watcher.join().unwrap();
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "on_lost")]
    #[doc(alias = "lost_channel")]
    pub fn lost(&self) -> Receiver<LostLease> {
        self.lost_rx
            .get_or_init(|| {
                // One slot: a loss is sent once, and its send never blocks.
                let (tx, rx) = crossbeam_channel::bounded(1);
                self.watch(Watcher::Guard(tx));
                rx
            })
            .clone()
    }

    /// What this hold's loss for `reason` is told as.
    pub(crate) fn lost_lease(&self, reason: LossReason) -> LostLease {
        self.lost.lease(reason)
    }

    /// Lets `watcher` know of this hold's loss (or of this guard's release).
    pub(crate) fn watch(&self, watcher: Watcher) {
        self.inner.holds.watch_loss(
            &self.inner,
            &self.keys,
            self.token,
            &self.lost,
            self.level,
            watcher,
        );
    }

    /// Has the loss thread of this guard's client look at `what` at `at`.
    pub(crate) fn push_timer(&self, at: Instant, what: crate::runtime::holds::loss::Timed) {
        let notifier = &self.inner.holds.notifier;
        if let Err(e) = notifier.ensure_running(&self.inner) {
            tracing::warn!(
                target: "redmutex",
                error = %e,
                "redmutex: cannot start the loss thread"
            );
        }
        notifier.push(at, what);
    }

    /// The fencing token of the hold, for a fenced kind.
    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The client this guard's lock belongs to.
    pub(crate) fn client(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The names of this guard's lock.
    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }
}

impl<K: Kind> Drop for LockGuard<K> {
    fn drop(&mut self) {
        if !self.released {
            match self.release() {
                Ok(()) => {}
                // The hold's loss was said at WARN when it was marked: once is enough.
                Err(e @ Error::LeaseLost { .. }) if self.lost.is_lost() => tracing::debug!(
                    target: "redmutex",
                    lock = %telemetry::Name(self.keys.name()),
                    error = %e,
                    "redmutex: releasing a lock on drop found its lease lost"
                ),
                Err(e) => tracing::warn!(
                    target: "redmutex",
                    lock = %telemetry::Name(self.keys.name()),
                    error = %e,
                    "redmutex: releasing a lock on drop failed"
                ),
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
