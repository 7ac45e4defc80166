//! Leaving a `MultiLock`'s wait: the queues of the locks not held, all at once, with
//! what a release handed over meanwhile kept (confirmed with its server) or given back.

use std::time::Instant;

use super::MultiWait;
use crate::primitives::acquire::attempt::Grant;
use crate::primitives::multi_guard::release_all;
use crate::runtime::connection::fanout::{self, Call};
use crate::runtime::scripting::calls;
use crate::LockGuard;

impl MultiWait<'_> {
    /// Leaves the queues of the locks not held, all at once; a lock handed over meanwhile
    /// is kept (in `guards`). With `confirm`, a kept lock is first confirmed with its
    /// server (see [`confirm_handed`](MultiWait::confirm_handed)); without, it is
    /// registered as handed over, for a caller that gives it straight back.
    pub(super) fn leave_queues(&mut self, guards: &mut [Option<LockGuard>], confirm: bool) {
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
                calls::cancel(m.keys.ops, &m.keys, &self.holders[i], levels, need, true),
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
                    guards[i] = Some(m.guard_for_grant(
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
        match m.confirm_handoff(holder, m.lease_ms(self.lease), Some(until)) {
            Ok(true) => {
                let grant = Grant { count, fence: None };
                Some(m.guard_for_grant(
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
    pub(super) fn give_up(&mut self) {
        let mut handed: Vec<Option<LockGuard>> = self.lock.members.iter().map(|_| None).collect();
        self.leave_queues(&mut handed, false);
        let taken: Vec<LockGuard> = handed.into_iter().flatten().collect();
        if !taken.is_empty() {
            release_all(taken, Instant::now() + self.lock.member_timeout);
        }
    }

    /// Member `i`'s queue entry is gone (left, or taken with a grant): the hold table
    /// stops keeping it alive.
    pub(super) fn left_queue(&mut self, i: usize) {
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
