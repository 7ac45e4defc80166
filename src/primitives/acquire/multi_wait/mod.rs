//! A `MultiLock`'s one acquisition path (`acquire_cancellable`, behind every public
//! acquisition), and `MultiWait`: one call waiting for it, its rounds of attempts on every
//! lock at once (`round.rs`), its place in each lock's queue and the leaving of them
//! (`leave.rs`), until it holds a quorum or gives up.

mod leave;
mod round;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Select;

use self::round::Seen;
use crate::primitives::acquire::NEXT_TICKET;
use crate::primitives::cancel::{self, CancellationToken};
use crate::primitives::multi_guard::release_all;
use crate::primitives::multilock::MultiLock;
use crate::runtime::holds::lease::{Lease, IO_GRACE};
use crate::runtime::keys::{fresh_token, holder_id, thread_token};
use crate::runtime::scripting::queue::Notice;
use crate::runtime::subscriber::Subscription;
use crate::runtime::telemetry;
use crate::{Error, LockGuard, MultiLockGuard};

/// The longest random pause after rounds that split the locks with other callers (each
/// got some, none a quorum, all gave theirs back), doubling with each split in a row up to
/// eight times this: without it they would all try again at the same instant and could
/// split again and again.
const SPLIT_PAUSE_MS: u64 = 1;

/// How many more rounds a single try (`try_lock`) makes after rounds that split free locks
/// with other tries of the same moment. Ten tries at once settle within two in tests;
/// the bound keeps a try against a fresh holder short (six rounds, ~20 ms of pauses).
const SPLIT_RETRIES: u32 = 6;

impl MultiLock {
    /// [`acquire_cancellable`](MultiLock::acquire_cancellable) that nothing cancels.
    pub(in crate::primitives) fn acquire(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
    ) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire_cancellable(lease, deadline, None)
    }

    /// The one acquisition path; `deadline` and `cancel` as in [`Lock`](crate::Lock)'s.
    /// Decides whether the call may begin (nothing written yet when it may not), runs its
    /// [`MultiWait`], and gives back a hold a member's client may not keep.
    pub(in crate::primitives) fn acquire_cancellable(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<MultiLockGuard>, Error> {
        let bounds = self.ready_to_send(lease, deadline, cancel)?;
        let (mut wait, fresh) = MultiWait::new(self, lease, deadline, cancel);
        let names = telemetry::Names(self.members.iter().map(|m| m.name()));
        let holder = telemetry::Holder(&self.members[0].client.inner.exec.id, fresh);
        telemetry::acquisition("MultiLock", &names, &holder, || {
            let guard = wait.run()?;
            self.keep_unless_refused(guard, &bounds)
        })
    }

    /// Whether anything may be sent for this call: every member's client in the process
    /// that made it, not cancelled, each listening on its own channel unless a server
    /// refuses it, and each renewing leases when the call asks for the watchdog. Returns
    /// each member's bounds of the wait for its channel (see `Lock::listen_bounds`).
    fn ready_to_send(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Vec<(Instant, Instant)>, Error> {
        for m in self.members.iter() {
            m.client.inner.exec.check_process()?;
        }
        if cancel::is_cancelled(cancel) {
            return Err(Error::CANCELLED);
        }
        // Each member's client listens on its own channel before anything is sent, as for
        // a `Lock` (see `Subscriber::listen`): their readers started together, so that
        // the waits overlap.
        let bounds: Vec<_> = self
            .members
            .iter()
            .map(|m| m.listen_bounds(lease, deadline))
            .collect();
        for m in self.members.iter() {
            m.client.inner.subscriber.start(&m.client.inner);
        }
        for (m, &(by, _)) in self.members.iter().zip(&bounds) {
            m.client.inner.subscriber.listen(&m.client.inner, by);
        }
        // A member whose client's own channel the server refuses: as for a `Lock` (see
        // `Subscriber::refusal`), nothing is written.
        self.refusal()?;
        for m in self.members.iter() {
            let inner = &m.client.inner;
            if lease == Lease::Watchdog {
                // Before anything is written: a lease nobody renews must not be handed out.
                inner.watchdog.ensure_running(inner)?;
            }
        }
        Ok(bounds)
    }

    /// Whether the call keeps what its wait got: a member's client's first hold learns
    /// whether the server lets it listen on its own channel (waited for until its `bounds`);
    /// refused, the hold is given back, as a `Lock`'s, so that a call that fails holds
    /// nothing.
    fn keep_unless_refused(
        &self,
        guard: Option<MultiLockGuard>,
        bounds: &[(Instant, Instant)],
    ) -> Result<Option<MultiLockGuard>, Error> {
        if guard.is_some() {
            for (m, &(_, by)) in self.members.iter().zip(bounds) {
                m.client.inner.subscriber.listen(&m.client.inner, by);
            }
        }
        match (guard, self.refusal()) {
            (Some(guard), Err(refused)) => {
                if let Err(e) = guard.unlock() {
                    tracing::debug!(target: "redmutex", "redmutex: giving back a hold after a refusal failed: {e}");
                }
                Err(refused)
            }
            (guard, _) => Ok(guard),
        }
    }

    /// The refusal of a member's client's own channel, if the server refuses one.
    fn refusal(&self) -> Result<(), Error> {
        for m in self.members.iter() {
            if let Some(refused) = m.client.inner.subscriber.refusal() {
                return Err(refused.on_lock(m.name()));
            }
        }
        Ok(())
    }
}

/// One call waiting for a `MultiLock`: its rounds, and its place in each lock's queue.
struct MultiWait<'a> {
    lock: &'a MultiLock,
    // Each member's holder token (`holders` are their holder ids).
    tokens: Vec<u64>,
    // A call of this wait on the member under its token had an unknown outcome (it may
    // still run): the member gets a new token before its next attempt.
    doubted: Vec<bool>,
    holders: Vec<String>,
    lease: Lease,
    deadline: Option<Instant>,
    // Another thread may stop the wait through it.
    cancel: Option<&'a CancellationToken>,
    once: bool,
    ticket: u64,
    subs: Vec<Option<Subscription>>,
    // The thread held that lock when the call began: its attempts there never queue.
    reentry: Vec<bool>,
    // In the queue of that lock (its client keeps the entry alive).
    queued: Vec<bool>,
}

impl<'a> MultiWait<'a> {
    /// The wait of a call on `lock`, with each member's holder token (returned: the one
    /// never used before that the members the thread holds none of share). Where the
    /// thread holds a member already, the call re-enters it under its hold's token (the
    /// scripts grant a re-entry whoever waits): it never queues there, so that leaving the
    /// call can never give up a level the thread holds. Elsewhere a fresh token: a late
    /// call of an earlier hold finds nothing of this one (as for a `Lock`).
    fn new(
        lock: &'a MultiLock,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&'a CancellationToken>,
    ) -> (MultiWait<'a>, u64) {
        let thread = thread_token();
        let fresh = fresh_token();
        let tokens: Vec<u64> = lock
            .members
            .iter()
            .map(|m| {
                let table = &m.client.inner.holds;
                table.token_of_thread(&m.keys, thread).unwrap_or(fresh)
            })
            .collect();
        let n = lock.members.len();
        let reentry = lock
            .members
            .iter()
            .zip(&tokens)
            .map(|(m, &token)| m.client.inner.holds.holds_locally(m.keys.hold(), token))
            .collect();
        let wait = MultiWait {
            lock,
            holders: lock
                .members
                .iter()
                .zip(&tokens)
                .map(|(m, &token)| holder_id(&m.client.inner.exec.id, token))
                .collect(),
            doubted: vec![false; tokens.len()],
            tokens,
            lease,
            deadline,
            cancel,
            once: deadline.is_some_and(|d| d <= Instant::now()),
            ticket: NEXT_TICKET.fetch_add(1, Ordering::Relaxed),
            subs: (0..n).map(|_| None).collect(),
            reentry,
            queued: vec![false; n],
        };
        (wait, fresh)
    }
}

impl MultiWait<'_> {
    /// Runs the wait: rounds until one gets a quorum still valid, the call is cancelled,
    /// its deadline passes or too many servers fail; between rounds it subscribes to the
    /// locks found held and sleeps until a message or the earliest lease end.
    fn run(&mut self) -> Result<Option<MultiLockGuard>, Error> {
        let lock = self.lock;
        let n = lock.members.len();
        let mut splits = 0u32;
        let called = Instant::now();
        loop {
            if cancel::is_cancelled(self.cancel) {
                // What was handed over meanwhile goes back with the queues left.
                self.give_up();
                return Err(Error::CANCELLED);
            }
            let start = Instant::now();
            let (mut guards, seen) = self.round(start);
            let granted = guards.iter().flatten().count();
            if granted >= lock.quorum && self.validity(start).is_some() {
                if let Some(guard) = self.take_quorum(&mut guards, start) {
                    return Ok(Some(guard));
                }
            }
            // Not enough, or too late (RedLock's rule: a quorum granted after its lease's
            // validity is no hold): what the round took goes back, to all at once, and
            // the call tries again within its wait, or returns None.
            self.give_back_round(guards);
            telemetry::waiting(self.once);
            let failed = seen.iter().filter(|s| matches!(s, Seen::Failed(_))).count();
            if failed > n - lock.quorum {
                self.wait_out_failures(start, seen, failed)?;
                continue;
            }
            let split = granted > 0 && granted < lock.quorum;
            if self.past(Instant::now()) {
                if self.once && split && self.split_among_contenders(&seen, called, splits) {
                    // A try that split free locks with other tries of the same moment (each
                    // got some, all gave theirs back): without another round none of them
                    // would get the lock. Again after a random pause, so that one round runs
                    // alone; whoever then finds the lock taken gets nothing and stops.
                    pause_after_split(splits);
                    splits += 1;
                    continue;
                }
                self.give_up();
                return Ok(None);
            }
            if split {
                // A split: some granted, not a quorum. Most often the holder's release is
                // still on its way to the others, and the next message ends it; after
                // splits in a row, other callers are splitting with this one: see
                // `SPLIT_PAUSE_MS`.
                if splits > 0 {
                    pause_after_split(splits);
                }
                splits += 1;
            }
            let subscribed = self.subscribe_held(&seen)?;
            let until = self.next_look(start, &seen);
            if subscribed {
                // Queue only once the server confirmed the subscription: a message sent
                // before that would be lost. Then straight to the next round.
                self.await_confirmations(until)?;
                continue;
            }
            self.sleep(until);
        }
    }

    /// Whether the call is over once this round is: a single try, or past its deadline.
    fn past(&self, now: Instant) -> bool {
        self.once || self.deadline.is_some_and(|d| now >= d)
    }

    /// The quorum a round that started at `start` got, once the queues of the other locks
    /// are left (and what was handed over meanwhile confirmed): the guard, or `None` when
    /// that took so long that its validity, still counted from the round's start, is over
    /// (`guards` then holds what must go back).
    fn take_quorum(
        &mut self,
        guards: &mut Vec<Option<LockGuard>>,
        start: Instant,
    ) -> Option<MultiLockGuard> {
        self.leave_queues(guards, true);
        let validity = self.validity(start)?;
        let lock = self.lock;
        let valid_until = match self.lease {
            Lease::Fixed(_) => Some(validity),
            Lease::Watchdog => None,
        };
        Some(MultiLockGuard::new(
            std::mem::take(guards),
            lock.quorum,
            valid_until,
            lock.member_timeout,
        ))
    }

    /// Gives back, to all at once, what a round that got no valid quorum took; a member
    /// whose give-back had an unknown outcome gets a fresh holder token next round.
    fn give_back_round(&mut self, guards: Vec<Option<LockGuard>>) {
        let (members, taken): (Vec<usize>, Vec<LockGuard>) = guards
            .into_iter()
            .enumerate()
            .filter_map(|(i, g)| g.map(|g| (i, g)))
            .unzip();
        let given_back = release_all(taken, Instant::now() + self.lock.member_timeout);
        for (i, result) in members.into_iter().zip(given_back) {
            if let Err(e) = result {
                tracing::debug!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: giving back a partial MultiLock hold failed"
                );
                self.doubted[i] |= e.outcome_unknown();
            }
        }
    }

    /// Too many servers failed (`failed` of them) for any quorum: the caller hears it now
    /// (no deadline) or at its deadline (`Err`), meanwhile looking again each member
    /// timeout after the round's `start` (`Ok`: a server coming back has no pub/sub to
    /// announce it).
    fn wait_out_failures(
        &mut self,
        start: Instant,
        seen: Vec<Seen>,
        failed: usize,
    ) -> Result<(), Error> {
        let lock = self.lock;
        let now = Instant::now();
        if self.deadline.is_none() || self.past(now) {
            self.give_up();
            let errors = seen.into_iter().filter_map(|s| match s {
                Seen::Failed(e) => Some(e),
                _ => None,
            });
            return Err(lock.no_quorum(lock.members.len() - failed, errors));
        }
        let next = (start + lock.member_timeout).min(self.deadline.unwrap_or(now));
        cancel::sleep_until(next, self.cancel);
        Ok(())
    }

    /// Subscribes to every lock the round found held and this call does not listen on
    /// yet, so that the next round queues there: whether it subscribed to any.
    fn subscribe_held(&mut self, seen: &[Seen]) -> Result<bool, Error> {
        let lock = self.lock;
        let mut subscribed = false;
        for (i, s) in seen.iter().enumerate() {
            if matches!(s, Seen::Held(_)) && self.subs[i].is_none() {
                let m = &lock.members[i];
                let inner = &m.client.inner;
                // The queue needs the watchdog (its entries are kept alive each round).
                inner.watchdog.ensure_running(inner)?;
                let until = self.deadline.map(|d| d.max(Instant::now()) + IO_GRACE);
                self.subs[i] = Some(inner.subscriber.subscribe(
                    &inner.exec,
                    m.keys.channel(),
                    self.tokens[i],
                    until,
                    true,
                )?);
                subscribed = true;
            }
        }
        Ok(subscribed)
    }

    /// When the call looks again without a message: the earliest end of a holder's lease
    /// the round (from `start`) saw, since a crashed holder hands nothing on; never past
    /// the deadline.
    fn next_look(&self, start: Instant, seen: &[Seen]) -> Instant {
        let lock = self.lock;
        let lease_end = seen
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Seen::Held(pttl) => Some(start + lock.members[i].wait_bound(*pttl)),
                _ => None,
            })
            .min()
            .unwrap_or(start);
        self.deadline.map_or(lease_end, |d| d.min(lease_end))
    }

    /// Waits (until `until`) for the servers to confirm this call's subscriptions; a
    /// member's ACL that refuses its channel ends the call, since it could never be told
    /// of a release there.
    fn await_confirmations(&mut self, until: Instant) -> Result<(), Error> {
        let signal = self.cancel.map(CancellationToken::signal);
        for (i, s) in self.subs.iter().enumerate() {
            let Some(s) = s else { continue };
            match s.wait_confirmed(until, signal) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    self.give_up();
                    return Err(e.on_lock(self.lock.members[i].name()));
                }
            }
        }
        Ok(())
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
}

impl Drop for MultiWait<'_> {
    fn drop(&mut self) {
        for i in 0..self.queued.len() {
            if self.queued[i] {
                // Left with an error: the entry (and a grant made to it meanwhile) is given
                // up by that client's watchdog thread, off this caller's path.
                let m = &self.lock.members[i];
                let inner = &m.client.inner;
                inner.holds.done_waiting(m.keys.key(), self.tokens[i]);
                // Told the levels the thread holds there (none: a thread that held the
                // lock never queued on it), so that the clean-up can never take one.
                let held = inner.holds.levels_now(m.keys.hold(), self.tokens[i]);
                inner
                    .watchdog
                    .doubt(inner, &m.keys, self.tokens[i], &self.holders[i], held);
            }
        }
    }
}

/// The random pause after `splits` rounds in a row that split the locks with other
/// callers (see `SPLIT_PAUSE_MS`).
fn pause_after_split(splits: u32) {
    let cap = (SPLIT_PAUSE_MS << splits.min(3)) * 1000;
    std::thread::sleep(Duration::from_micros(random() % cap));
}

/// A random number, for the pause after a split: std's per-process random hash keys, fed
/// the time, are plenty for spreading retries apart.
fn random() -> u64 {
    RandomState::new().hash_one(Instant::now())
}
