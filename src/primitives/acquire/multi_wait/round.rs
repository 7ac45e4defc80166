//! One round of a `MultiLock`'s wait: an attempt on every member at once, what each
//! granted or showed, and what the round tells (how long a quorum stays valid, whether it
//! split the locks with other callers).

use std::time::{Duration, Instant};

use super::{MultiWait, SPLIT_RETRIES};
use crate::primitives::acquire::attempt::AcquireReply;
use crate::runtime::connection::fanout::{self, Call};
use crate::runtime::holds::lease::{millis, IO_GRACE};
use crate::runtime::keys::{fresh_token, holder_id};
use crate::{Error, Lock, LockGuard, Plain};

/// What one round saw of each lock.
pub(super) enum Seen {
    Granted,
    Held(i64),
    Failed(Error),
}

impl<'a> MultiWait<'a> {
    /// One round: an attempt on every lock, all sent at once; what each lock granted
    /// (its guard) or showed.
    pub(super) fn round(&mut self, start: Instant) -> (Vec<Option<LockGuard>>, Vec<Seen>) {
        let n = self.lock.members.len();
        let mut guards: Vec<Option<LockGuard>> = (0..n).map(|_| None).collect();
        let mut seen: Vec<Seen> = (0..n).map(|_| Seen::Granted).collect();
        let mut tried = Vec::new();
        let mut calls = Vec::new();
        let bound = self.round_bound(start);
        for i in 0..n {
            self.fresh_holder_if_in_doubt(i);
        }
        for (i, seen) in seen.iter_mut().enumerate() {
            match self.member_call(i, bound) {
                Ok((held, joined, call)) => {
                    tried.push((i, held, joined));
                    calls.push(call);
                }
                // This member sends nothing this round: it counts as failed.
                Err(e) => *seen = Seen::Failed(e),
            }
        }
        let replies = fanout::run::<AcquireReply>(&calls, bound);
        for ((i, held, joined), reply) in tried.into_iter().zip(replies) {
            match self.settle_member(i, held, joined, reply, start) {
                Ok(guard) => guards[i] = Some(guard),
                Err(s) => seen[i] = s,
            }
        }
        (guards, seen)
    }

    /// The attempt on member `i` this round (bounded by `bound`): it queues the thread
    /// where its client listens for its turn (registered as waiting from then on). With
    /// the levels the thread holds there, and whether it queues.
    fn member_call(&mut self, i: usize, bound: Instant) -> Result<(usize, bool, Call<'a>), Error> {
        let lock = self.lock;
        let m = &lock.members[i];
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
        let held = inner
            .holds
            .begin_attempt(m.keys.hold(), self.tokens[i], Some(bound))?;
        let listen = self.subs[i].as_ref().map_or(0, |s| s.listen_flags());
        let cmd = m.acquire_cmd(
            &self.holders[i],
            m.lease_ms(self.lease),
            held,
            1,
            join,
            listen,
        );
        Ok((held, join.is_some(), Call::script(inner, cmd)))
    }

    /// Settles member `i`'s attempt of the round that started at `start` (`held`, `joined`
    /// as sent) from its `reply`: the guard when granted, otherwise what the round saw. A
    /// re-entry refused there means the thread's hold is gone.
    fn settle_member(
        &mut self,
        i: usize,
        held: usize,
        joined: bool,
        reply: Result<AcquireReply, Error>,
        start: Instant,
    ) -> Result<LockGuard, Seen> {
        let m = &self.lock.members[i];
        let holder = self.holders[i].clone();
        let outcome = reply.and_then(|r| Lock::<Plain>::grant_of(&r.0)?);
        match m.settle_attempt((self.tokens[i], &holder), held, joined, outcome) {
            Ok(Ok(grant)) => {
                // The script took the thread out of the queue with the grant.
                self.left_queue(i);
                Ok(m.guard_for_grant(self.tokens[i], holder, grant, self.lease, start, false))
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
                Err(Seen::Held(refused.pttl))
            }
            Err(e) => {
                self.doubted[i] |= e.outcome_unknown();
                Err(Seen::Failed(e))
            }
        }
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
    pub(super) fn validity(&self, start: Instant) -> Option<Instant> {
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
    pub(super) fn split_among_contenders(
        &self,
        seen: &[Seen],
        called: Instant,
        splits: u32,
    ) -> bool {
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
}
