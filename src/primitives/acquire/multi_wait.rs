//! A `MultiLock`'s one acquisition path (`acquire_cancellable`, behind every public acquisition), and `MultiWait`: one
//! call waiting for it, its rounds of attempts on every lock at once (`attempt.rs`), its
//! place in each lock's queue, until it holds a quorum or gives up.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Select;

use crate::primitives::acquire::attempt::{AcquireReply, Grant};
use crate::primitives::acquire::wait::NEXT_TICKET;
use crate::primitives::cancel::{self, CancellationToken};
use crate::primitives::multi_guard::release_all;
use crate::primitives::multilock::MultiLock;
use crate::runtime::connection::fanout::{self, Call};
use crate::runtime::holds::lease::{millis, Lease, IO_GRACE};
use crate::runtime::keys::{fresh_token, holder_id, thread_token};
use crate::runtime::scripting::calls;
use crate::runtime::scripting::queue::Notice;
use crate::runtime::subscriber::Subscription;
use crate::runtime::telemetry;
use crate::{Error, Lock, LockGuard, MultiLockGuard, Plain};

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

    /// The one acquisition path; `deadline` and `cancel` as in [`Lock`]'s.
    pub(in crate::primitives) fn acquire_cancellable(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<MultiLockGuard>, Error> {
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
        // Each member's holder token: the thread's hold of it re-entered under its own,
        // every member it holds none of under one token never used before (see
        // `Lock::acquire_cancellable`: a late call of an earlier hold finds nothing of
        // this one).
        let thread = thread_token();
        let fresh = fresh_token();
        let tokens: Vec<u64> = self
            .members
            .iter()
            .map(|m| {
                let table = &m.client.inner.holds;
                table.token_of_thread(&m.keys, thread).unwrap_or(fresh)
            })
            .collect();
        let n = self.members.len();
        // Where this thread holds a member already, the call re-enters it (the scripts
        // grant a re-entry whoever waits): it never queues there, so that leaving the call
        // can never give up a level the thread holds.
        let reentry = self
            .members
            .iter()
            .zip(&tokens)
            .map(|(m, &token)| m.client.inner.holds.holds_locally(m.keys.hold(), token))
            .collect();
        let mut wait = MultiWait {
            lock: self,
            holders: self
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
        let names = telemetry::Names(self.members.iter().map(|m| m.name()));
        let holder = telemetry::Holder(&self.members[0].client.inner.exec.id, fresh);
        telemetry::acquisition("MultiLock", &names, &holder, || {
            let guard = wait.run()?;
            if guard.is_some() {
                for (m, &(_, by)) in self.members.iter().zip(&bounds) {
                    m.client.inner.subscriber.listen(&m.client.inner, by);
                }
            }
            match (guard, self.refusal()) {
                // Learned with the first hold of a member's client: given back, as a
                // `Lock`'s, so that a call that fails holds nothing.
                (Some(guard), Err(refused)) => {
                    if let Err(e) = guard.unlock() {
                        tracing::debug!(target: "redmutex", "redmutex: giving back a hold after a refusal failed: {e}");
                    }
                    Err(refused)
                }
                (guard, _) => Ok(guard),
            }
        })
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
                return Err(Error::CANCELLED);
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
            let (members, taken): (Vec<usize>, Vec<LockGuard>) = guards
                .into_iter()
                .enumerate()
                .filter_map(|(i, g)| g.map(|g| (i, g)))
                .unzip();
            let given_back = release_all(taken, Instant::now() + lock.member_timeout);
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
                        &inner.exec,
                        m.keys.channel(),
                        self.tokens[i],
                        until,
                        true,
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
                let signal = self.cancel.map(CancellationToken::signal);
                for (i, s) in self.subs.iter().enumerate() {
                    let Some(s) = s else { continue };
                    match s.wait_confirmed(until, signal) {
                        Ok(true) => {}
                        Ok(false) => break,
                        // Refused by the member's ACL: it could never be told of a release.
                        Err(e) => {
                            self.give_up();
                            return Err(e.on_lock(lock.members[i].name()));
                        }
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
        for i in 0..n {
            self.fresh_holder_if_in_doubt(i);
        }
        for (i, m) in lock.members.iter().enumerate() {
            let inner = &m.client.inner;
            let join = !self.once
                && !self.reentry[i]
                && self.subs[i].as_ref().is_some_and(|s| s.is_confirmed());
            let join = join.then(|| {
                (
                    self.ticket,
                    inner.exec.config.lease.entry_ttl_ms(self.deadline),
                )
            });
            if join.is_some() && !self.queued[i] {
                self.queued[i] = true;
                inner
                    .holds
                    .waiting(&m.keys, self.tokens[i], &self.holders[i], self.deadline);
            }
            let held = match inner
                .holds
                .begin_attempt(m.keys.hold(), self.tokens[i], Some(bound))
            {
                Ok(held) => held,
                // This member sends nothing this round: it counts as failed.
                Err(e) => {
                    seen[i] = Seen::Failed(e);
                    continue;
                }
            };
            let listen = self.subs[i].as_ref().map_or(0, |s| s.listen_flags());
            let cmd = m.acquire_cmd(
                &self.holders[i],
                m.lease_ms(self.lease),
                held,
                1,
                join,
                listen,
            );
            tried.push((i, held, join.is_some()));
            calls.push(Call::script(inner, cmd));
        }
        let replies = fanout::run::<AcquireReply>(&calls, bound);
        for ((i, held, joined), reply) in tried.into_iter().zip(replies) {
            let m = &lock.members[i];
            let holder = self.holders[i].clone();
            let outcome = reply.and_then(|r| Lock::<Plain>::grant_of(&r.0)?);
            match m.settle_attempt((self.tokens[i], &holder), held, joined, outcome) {
                Ok(Ok(grant)) => {
                    // The script took the thread out of the queue with the grant.
                    self.left_queue(i);
                    guards[i] =
                        Some(m.granted(self.tokens[i], holder, grant, self.lease, start, false));
                }
                Ok(Err(refused)) => {
                    if self.reentry[i] {
                        // A re-entry is granted while the hold stands: it is gone there
                        // (expired, force-unlocked, lost by the server). Its guards must
                        // say so, and from here on this lock is an ordinary acquisition,
                        // which may queue; a grant there is a new hold.
                        self.reentry[i] = false;
                        let generation = m.client.inner.exec.generation();
                        m.client
                            .inner
                            .holds
                            .hold_gone(m.keys.hold(), self.tokens[i], generation);
                    }
                    seen[i] = Seen::Held(refused.pttl);
                }
                Err(e) => {
                    self.doubted[i] |= e.outcome_unknown();
                    seen[i] = Seen::Failed(e);
                }
            }
        }
        (guards, seen)
    }

    /// Member `i` gets a holder token never used before when an earlier call of this wait
    /// on it is in doubt (an attempt, a give-back or a queue leave whose outcome is
    /// unknown, left to the watchdog's clean-up): that call, or its clean-up, may still
    /// run, and would undo a grant this wait took under the same token in a later round.
    /// (A member the thread held before the call keeps its hold's token: its doubts are
    /// about levels beyond those it holds, which the count rule keeps apart.) Its queue
    /// entry and subscription go with the old token: the clean-up removes the one, and the
    /// next round that finds the member held subscribes again.
    fn fresh_holder_if_in_doubt(&mut self, i: usize) {
        let m = &self.lock.members[i];
        let inner = &m.client.inner;
        let in_doubt = self.doubted[i] || inner.holds.in_doubt_for(m.keys.hold(), self.tokens[i]);
        if self.reentry[i] || !in_doubt {
            return;
        }
        self.doubted[i] = false;
        if self.queued[i] {
            self.queued[i] = false;
            inner.holds.done_waiting(m.keys.key(), self.tokens[i]);
        }
        self.subs[i] = None;
        self.tokens[i] = fresh_token();
        self.holders[i] = holder_id(&inner.exec.id, self.tokens[i]);
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
            let watchdog_ms = inner.exec.config.lease.watchdog_ms();
            let levels = inner.holds.levels(m.keys.hold(), self.tokens[i]);
            let need = inner
                .holds
                .need_ms(m.keys.hold(), self.tokens[i], watchdog_ms);
            left.push(i);
            calls.push(Call::script(
                inner,
                calls::cancel(&m.keys, &self.holders[i], levels, need, true),
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
                        self.tokens[i],
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
                    tracing::debug!(
                        target: "redmutex",
                        error = %e,
                        "redmutex: leaving a MultiLock queue failed"
                    );
                    let levels = inner.holds.levels(m.keys.hold(), self.tokens[i]);
                    inner
                        .watchdog
                        .doubt(inner, &m.keys, self.tokens[i], &self.holders[i], levels);
                    self.doubted[i] = true;
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
    fn confirm_handed(&mut self, i: usize, count: i64) -> Option<LockGuard> {
        let m = &self.lock.members[i];
        let inner = &m.client.inner;
        let holder = &self.holders[i];
        let sent = Instant::now();
        let until = sent + self.lock.member_timeout;
        match m.pick_up(holder, m.lease_ms(self.lease), Some(until)) {
            Ok(true) => {
                let grant = Grant { count, fence: None };
                Some(m.granted(
                    self.tokens[i],
                    holder.clone(),
                    grant,
                    self.lease,
                    sent,
                    false,
                ))
            }
            // Lapsed, and handed on or taken by another client: not ours to count.
            Ok(false) => None,
            Err(e) => {
                // The renewal may have run and extended the hold to a whole lease: the
                // watchdog gives back any level beyond those the thread holds (none here:
                // a thread that held the lock never queued on it), off this path.
                tracing::debug!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: confirming a MultiLock member handed over failed"
                );
                let levels = inner.holds.levels_now(m.keys.hold(), self.tokens[i]);
                inner
                    .watchdog
                    .doubt(inner, &m.keys, self.tokens[i], holder, levels);
                self.doubted[i] = true;
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
                .holds
                .done_waiting(m.keys.key(), self.tokens[i]);
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

/// A random number, for the pause after a split: std's per-process random hash keys, fed
/// the time, are plenty for spreading retries apart.
fn random() -> u64 {
    RandomState::new().hash_one(Instant::now())
}
