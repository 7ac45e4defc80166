//! `MultiLockGuard`: a thread's hold of a [`MultiLock`](crate::MultiLock), released on
//! every lock at once when dropped.

use std::cell::OnceCell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::primitives::release::Freed;
use crate::runtime::connection::fanout::{self, Call};
use crate::runtime::holds::loss::{Quorum, Timed, Watcher};
use crate::{Error, LockGuard, LossReason, LostLease};

/// Proof that the current thread holds a [`MultiLock`](crate::MultiLock): one level of
/// its lock on each of the servers that granted it (a quorum at least).
///
/// Dropping the guard releases every level, on all servers at once, best effort; call
/// [`unlock`](MultiLockGuard::unlock) to learn whether that worked. Not `Send`, like every
/// guard: the hold belongs to the thread.
///
/// # Guarantees
///
/// - Released on every lock at once, once: [`unlock`](MultiLockGuard::unlock) is `Ok`
///   when a quorum of the releases succeeded, and what a server failed to release ends
///   with its lease.
/// - A loss is told, and stays told: once fewer than the quorum of its levels stand, or a
///   fixed lease's validity ended, [`is_lease_lost`](MultiLockGuard::is_lease_lost) is
///   true (never back), [`lost`](MultiLockGuard::lost) is sent what was lost (a release
///   only closes it) and `unlock` fails with [`Error::LeaseLost`].
///
/// ```no_run
/// # fn work(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
/// let guard = lock.lock()?;
/// // ... critical section ...
/// if guard.is_lease_lost() {
///     // Fewer than a quorum of the holds still stand: someone else may hold it now.
/// }
/// guard.unlock()?;
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// fn send<T: Send>() {}
/// send::<redmutex::MultiLockGuard>();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct MultiLockGuard {
    // One per lock of the MultiLock, in its order: the level held there, if granted.
    holds: Vec<Option<LockGuard>>,
    quorum: usize,
    // A fixed lease: when its validity ends (the lease less the acquisition's time and
    // the drift allowance). A renewed lease has none.
    valid_until: Option<Instant>,
    member_timeout: Duration,
    released: bool,
    // What `lost()` waits on, made on its first call.
    lost: OnceCell<(Arc<Quorum>, Receiver<LostLease>)>,
}

impl MultiLockGuard {
    pub(crate) fn new(
        holds: Vec<Option<LockGuard>>,
        quorum: usize,
        valid_until: Option<Instant>,
        member_timeout: Duration,
    ) -> MultiLockGuard {
        MultiLockGuard {
            holds,
            quorum,
            valid_until,
            member_timeout,
            released: false,
            lost: OnceCell::new(),
        }
    }

    /// A channel told when this hold is lost, as
    /// [`is_lease_lost`](MultiLockGuard::is_lease_lost) tells, and closed when it is
    /// released: see [`LockGuard::lost`], which this is for a `MultiLock`. `recv()` returns
    /// `Ok` with the [`LostLease`] of the member whose loss left fewer than the quorum
    /// standing, or, when a fixed lease's validity ended, the first member's with
    /// [`LossReason::LeaseExpired`]; `Err` once released.
    ///
    /// ```no_run
    /// # fn work(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// let guard = lock.lock()?;
    /// let lost = guard.lost();
    /// crossbeam_channel::select! {
    ///     // Lost: the release reports it (`Error::LeaseLost`).
    ///     recv(lost) -> lost => {
    ///         if let Ok(lost) = lost {
    ///             eprintln!("lost on {:?}: {}", lost.name_lossy(), lost.reason());
    ///         }
    ///         return guard.unlock();
    ///     }
    ///     default(std::time::Duration::from_secs(1)) => {} // ... work ...
    /// }
    /// guard.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> Receiver<LostLease> {
        let (_, rx) = self.lost.get_or_init(|| {
            // One slot: a loss is sent once, and its send never blocks.
            let (tx, rx) = crossbeam_channel::bounded(1);
            let granted = self.holds.iter().flatten().count();
            let expired = self
                .holds
                .iter()
                .flatten()
                .next()
                .map(|first| first.lost_lease(LossReason::LeaseExpired));
            let quorum = Arc::new(Quorum::new(granted, self.quorum, tx, expired));
            for member in self.holds.iter().flatten() {
                member.watch(Watcher::Quorum(quorum.clone()));
            }
            if let Some(until) = self.valid_until {
                if let Some(member) = self.holds.iter().flatten().next() {
                    member.push_timer(until, Timed::Quorum(Arc::downgrade(&quorum)));
                }
            }
            (quorum, rx)
        });
        rx.clone()
    }

    /// On how many of the locks this hold stands now (those granted whose lease is not
    /// known lost).
    ///
    /// ```no_run
    /// # fn work(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// let guard = lock.lock()?;
    /// println!("held on {} of {} masters", guard.held_on(), lock.locks().len());
    /// # Ok(()) }
    /// ```
    pub fn held_on(&self) -> usize {
        self.holds
            .iter()
            .flatten()
            .filter(|g| !g.is_lease_lost())
            .count()
    }

    /// True once fewer than the quorum of this hold's levels still stand (each lost as
    /// [`LockGuard::is_lease_lost`] tells: expired, force-unlocked, lost by its server, or
    /// not renewed for a whole lease because its server was down or unreachable), or a
    /// fixed lease's validity ended. Another thread may then hold the lock. Never goes
    /// back to false.
    ///
    /// ```no_run
    /// # fn work(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// let guard = lock.lock()?;
    /// for step in 0..10 {
    ///     if guard.is_lease_lost() {
    ///         break; // fewer than the quorum stand: someone else may hold it now
    ///     }
    ///     // ... step `step` of the work ...
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        self.valid_until.is_some_and(|v| Instant::now() >= v) || self.held_on() < self.quorum
    }

    /// Releases this level on every lock at once and reports the outcome: `Ok` when a
    /// quorum of the releases succeeded; [`Error::LeaseLost`] when the hold was already
    /// lost (see [`is_lease_lost`](MultiLockGuard::is_lease_lost)); [`Error::NoQuorum`]
    /// when too many servers failed to answer (what they hold ends with its lease).
    ///
    /// ```no_run
    /// use redmutex::Error;
    /// # fn work(lock: &redmutex::MultiLock) -> Result<(), redmutex::Error> {
    /// let guard = lock.lock()?;
    /// // ... critical section ...
    /// match guard.unlock() {
    ///     Ok(()) => {}
    ///     Err(Error::LeaseLost { .. }) => eprintln!("the quorum was lost before the release"),
    ///     Err(e @ Error::NoQuorum { .. }) => eprintln!("{e}: the rest ends with its lease"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        self.released = true;
        if let Some((quorum, _)) = self.lost.get() {
            quorum.released();
        }
        let lost = self.is_lease_lost();
        let members = self.holds.len();
        let holds: Vec<LockGuard> = self.holds.iter_mut().filter_map(Option::take).collect();
        let results = release_all(holds, Instant::now() + self.member_timeout);
        if lost {
            return Err(Error::LEASE_LOST);
        }
        let released = results.iter().filter(|r| r.is_ok()).count();
        if released >= self.quorum {
            return Ok(());
        }
        let gone = results
            .iter()
            .filter(|r| matches!(r, Err(Error::NotHeld { .. } | Error::LeaseLost { .. })))
            .count();
        if gone > members - self.quorum {
            return Err(Error::LEASE_LOST);
        }
        Err(Error::NoQuorum {
            reached: released + gone,
            members,
            required: self.quorum,
            source: Box::new(
                results
                    .into_iter()
                    .filter_map(Result::err)
                    .last()
                    .unwrap_or(Error::NOT_HELD),
            ),
        })
    }
}

/// Releases `holds` (each a level on its own client, or several on one), every call sent
/// at once, none waiting for its server past `until`.
pub(crate) fn release_all(mut holds: Vec<LockGuard>, until: Instant) -> Vec<Result<(), Error>> {
    let mut results: Vec<Option<Result<(), Error>>> = holds.iter().map(|_| None).collect();
    let mut pending = Vec::new();
    for (i, guard) in holds.iter_mut().enumerate() {
        match guard.begin_release() {
            Ok(Ok(release)) => pending.push((i, release)),
            Ok(Err(done)) => results[i] = Some(done),
            Err(e) => results[i] = Some(Err(e)),
        }
    }
    let calls: Vec<Call<'_>> = pending
        .iter()
        .map(|(i, release)| Call::script(holds[*i].client(), release.cmd.clone()))
        .collect();
    let replies = fanout::run_always::<Freed>(&calls, until);
    for ((i, release), reply) in pending.into_iter().zip(replies) {
        let reply = reply.map(|freed| (freed, None));
        // (A call the fanout ran again after a dropped connection is not told apart: a
        // member found gone is taken as lost, which at worst reports a loss too many.)
        results[i] = Some(holds[i].end_release(release.levels, reply, false));
    }
    results
        .into_iter()
        .map(|r| r.expect("every release has an outcome"))
        .collect()
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.release() {
                // (Also when its hold was lost: a quorum's validity running out is said
                // nowhere else.)
                tracing::warn!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: releasing a MultiLock on drop failed"
                );
            }
        }
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("holds", &self.holds)
            .field("quorum", &self.quorum)
            .field("lease_lost", &self.is_lease_lost())
            .finish()
    }
}
