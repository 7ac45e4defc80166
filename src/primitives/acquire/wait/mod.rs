//! `Wait`: one call waiting for a `Lock<K>`, the state machine between its attempts
//! (`attempt.rs`), its place in the queue and its subscription, until it holds the lock or
//! gives up. The pickup of a hold a release handed to it is `handoff.rs`.

mod handoff;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::primitives::acquire::attempt::{Grant, Refused};
use crate::primitives::acquire::NEXT_TICKET;
use crate::primitives::cancel::{self, CancellationToken};
use crate::primitives::kind::Kind;
use crate::primitives::lock::Lock;
use crate::runtime::connection::pool::Room;
use crate::runtime::holds::lease::Lease;
use crate::runtime::keys::holder_id;
use crate::runtime::scripting::calls;
use crate::runtime::scripting::queue::Notice;
use crate::runtime::subscriber::Subscription;
use crate::runtime::telemetry;
use crate::{Error, LockGuard};

/// One call waiting for a lock: its attempts, its place in the queue, its subscription.
pub(in crate::primitives) struct Wait<'a, K: Kind> {
    lock: &'a Lock<K>,
    token: u64,
    holder: String,
    lease: Lease,
    lease_ms: u64,
    deadline: Option<Instant>,
    // Another thread may stop the wait through it.
    cancel: Option<&'a CancellationToken>,
    // A single attempt (try_lock): it never queues.
    once: bool,
    // The permits asked for (1 for the locks).
    amount: u32,
    // The call's first ticket: every ticket of this call is at least this, every one of
    // the thread's earlier calls below it.
    first_ticket: u64,
    // The ticket of the latest attempt that could queue, and when it was sent: a grant
    // carrying it was made from the queue entry that attempt wrote, so after it ran.
    ticket: u64,
    joined: Option<Instant>,
    // The server's time when that attempt queued the thread, from its reply: a grant's
    // own server time is set against it (see `take_handoff`).
    queued_at: Option<u64>,
    // The client's topology epoch when that attempt was sent: a grant heard under
    // another was perhaps timed by another server's clock (see `window_start`).
    joined_topology: u64,
    // The thread held the lock when the call began: its attempts never queue.
    reentry: bool,
    // An attempt of this call may have queued the thread: leaving, it must leave the queue.
    queued: bool,
    sub: Option<Subscription>,
}

/// What one sleep of a [`Wait`] ended with.
enum Woke<K: Kind> {
    /// The call is over with this outcome (a grant picked up, a channel refused).
    Over(Result<Option<LockGuard<K>>, Error>),
    /// Nothing to try: look at the cancel and the deadline, and sleep again.
    Again,
    /// Try now; `claimed`: as the process's one try on the lease timer.
    Try { claimed: bool },
}

impl<'a, K: Kind> Wait<'a, K> {
    /// The wait of a call under holder `token`: a thread that holds the lock re-enters at
    /// once (the scripts grant a re-entry whoever waits), so it never queues, and leaving
    /// the call can never give up a level it holds; a process that listens on the lock
    /// already queues with the call's first attempt.
    pub(in crate::primitives) fn new(
        lock: &'a Lock<K>,
        token: u64,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
        cancel: Option<&'a CancellationToken>,
    ) -> Wait<'a, K> {
        let inner = &lock.client.inner;
        let once = deadline.is_some_and(|d| d <= Instant::now());
        let reentry = inner.holds.holds_locally(lock.keys.hold(), token);
        let ticket = NEXT_TICKET.fetch_add(1, Ordering::Relaxed);
        Wait {
            lock,
            token,
            holder: holder_id(&inner.exec.id, token),
            lease,
            lease_ms: lock.lease_ms(lease),
            deadline,
            cancel,
            once,
            amount,
            first_ticket: ticket,
            ticket,
            joined: None,
            queued_at: None,
            joined_topology: 0,
            reentry,
            queued: false,
            // (Others of its threads wait, or did a moment ago: no extra round trip.)
            sub: if once {
                None
            } else {
                inner.subscriber.rejoin(lock.keys.channel(), token)
            },
        }
    }
}

impl<K: Kind> Wait<'_, K> {
    /// Runs the wait: a first attempt, then, until the lock is held, the call is
    /// cancelled or its deadline passes, a subscription to the lock's channel and sleeps
    /// until a message or the holder's lease end says to try again.
    pub(in crate::primitives) fn run(&mut self) -> Result<Option<LockGuard<K>>, Error> {
        let lock = self.lock;
        let room = self.before_first()?;
        let sent = Instant::now();
        let mut pttl = match self.try_acquire(room)? {
            Ok(grant) => return Ok(Some(self.keep_grant(grant, sent))),
            Err(refused) => refused.pttl,
        };
        telemetry::waiting(self.once);
        if let Some(s) = &self.sub {
            // Queued with the first try: the timer goes by the lease that try saw, not by
            // one an earlier wait of this process left behind.
            s.saw_lease_end(Instant::now() + lock.wait_bound(pttl));
        }
        loop {
            if cancel::is_cancelled(self.cancel) {
                return self.leave_cancelled();
            }
            let now = Instant::now();
            if self.deadline.is_some_and(|d| now >= d) {
                return self.give_up();
            }
            if self.sub.is_none() {
                self.subscribe(pttl)?;
                continue;
            }
            let claimed = match self.sleep(now)? {
                Woke::Over(outcome) => return outcome,
                Woke::Again => continue,
                Woke::Try { claimed } => claimed,
            };
            match self.try_again(claimed)? {
                Ok(guard) => return Ok(Some(guard)),
                Err(refused) => pttl = refused,
            }
        }
    }

    /// Subscribes to the lock's channel (the holder's lease seen ends in `pttl` ms), so
    /// that the next attempt queues: only once the server confirmed it, since a message
    /// sent before that would be lost, and this waiter taken for dead.
    fn subscribe(&mut self, pttl: i64) -> Result<(), Error> {
        let lock = self.lock;
        let inner = &lock.client.inner;
        // The queue needs the watchdog (its entries are kept alive each round).
        inner.watchdog.ensure_running(inner)?;
        let s = inner.subscriber.subscribe(
            &inner.exec,
            lock.keys.channel(),
            self.token,
            lock.io_until(self.deadline),
            true,
        )?;
        s.saw_lease_end(Instant::now() + lock.wait_bound(pttl));
        self.sub = Some(s);
        Ok(())
    }

    /// Sleeps (from `now`) until the subscription is confirmed, a message for this call
    /// arrives, or the holder's lease ends, and decides what comes next: a grant picked
    /// up ends the call, a wake-up tries again, a lease end tries only as the process's
    /// one try on the lease timer.
    fn sleep(&mut self, now: Instant) -> Result<Woke<K>, Error> {
        let Some(s) = &self.sub else {
            return Ok(Woke::Again);
        };
        // Never sleep past the holder's lease: a crashed holder hands nothing on.
        let lease_end = s.next_try().unwrap_or(now);
        let until = self.deadline.map_or(lease_end, |d| d.min(lease_end));
        let signal = self.cancel.map(CancellationToken::signal);
        if !s.is_confirmed() {
            let confirmed = match s.wait_confirmed(until, signal) {
                Ok(confirmed) => confirmed,
                // The server's ACL refused the lock's channel: this call could never
                // be told of a release. It leaves as a cancelled one does.
                Err(e) => return Ok(Woke::Over(self.leave_refused(e))),
            };
            if !confirmed {
                return self.timed_try(s);
            }
        } else if self.queued {
            match s.wait(until, signal) {
                Some(Notice::Granted { ticket, fence, at }) if ticket >= self.first_ticket => {
                    if let Some(guard) = self.take_handoff(ticket, fence, at)? {
                        return Ok(Woke::Over(Ok(Some(guard))));
                    }
                    // The grant lapsed before it could be confirmed (the message came
                    // late): this turn is over, and the try queues again.
                }
                Some(Notice::Wake { ticket }) if ticket >= self.first_ticket => {}
                Some(Notice::Recheck) => {}
                // For an earlier call of this thread, long over.
                Some(_) => return Ok(Woke::Again),
                None => return self.timed_try(s),
            }
        }
        Ok(Woke::Try { claimed: false })
    }

    /// An attempt after a sleep (`claimed`: the process's one try on the lease timer):
    /// the guard, or the holder's remaining lease in ms when refused. The others of this
    /// process go by what it saw.
    fn try_again(&mut self, claimed: bool) -> Result<Result<LockGuard<K>, i64>, Error> {
        let sent = Instant::now();
        match self.try_acquire(None) {
            Ok(Ok(grant)) => {
                if let Some(s) = &self.sub {
                    // The others of this process now wait for our release (or lease).
                    s.saw_lease_end(sent + Duration::from_millis(self.lease_ms));
                }
                Ok(Ok(self.keep_grant(grant, sent)))
            }
            Ok(Err(refused)) => {
                if let Some(s) = &self.sub {
                    s.saw_lease_end(Instant::now() + self.lock.wait_bound(refused.pttl));
                }
                Ok(Err(refused.pttl))
            }
            Err(e) => {
                if claimed {
                    if let Some(s) = &self.sub {
                        s.unclaim();
                    }
                }
                Err(e)
            }
        }
    }

    /// Before the first attempt: room in the pool for it, and the process's subscription
    /// to the lock's channel if it has one by then, confirmed, so that the attempt queues
    /// the thread with its one call. A thread of a burst may wait long for room, while
    /// others of its process, refused, subscribe: a subscription looked for only when the
    /// call began, or not yet confirmed, would cost it a second call (one that cannot
    /// queue, then one that does), for thousands of threads at once. The confirmation is
    /// awaited without the room (it may take a round trip of the pub/sub connection), up
    /// to the lease end the others saw, or the deadline, or the command timeout.
    fn before_first(&mut self) -> Result<Option<Room>, Error> {
        // (Neither a single attempt nor a re-entry ever queues.)
        if self.once || self.reentry {
            return Ok(None);
        }
        let lock = self.lock;
        let inner = &lock.client.inner;
        let mut room = None;
        if self.sub.is_none() {
            room = Some(inner.exec.enter(lock.io_until(self.deadline))?);
            self.sub = inner.subscriber.rejoin(lock.keys.channel(), self.token);
        }
        let Some(s) = self.sub.as_ref().filter(|s| !s.is_confirmed()) else {
            return Ok(room);
        };
        drop(room.take());
        let now = Instant::now();
        let bound = now + inner.exec.config.command_timeout;
        // (No lease end seen yet: the thread that subscribed has not told it.)
        let until = s
            .next_try()
            .unwrap_or(bound)
            .min(self.deadline.unwrap_or(bound))
            .min(bound);
        // Not confirmed (a refusal, or not yet): the attempt does not queue, and the wait
        // goes on as for a call that began without the subscription.
        let _ = s.wait_confirmed(until, self.cancel.map(CancellationToken::signal));
        if cancel::is_cancelled(self.cancel) {
            return Err(Error::CANCELLED);
        }
        Ok(None)
    }

    /// One attempt, in `room` if the caller took one; it queues the thread when this
    /// client listens for its turn.
    fn try_acquire(&mut self, room: Option<Room>) -> Result<Result<Grant, Refused>, Error> {
        let lock = self.lock;
        let inner = &lock.client.inner;
        let join =
            !self.once && !self.reentry && self.sub.as_ref().is_some_and(|s| s.is_confirmed());
        let join = join.then(|| {
            // A ticket of its own: a grant that echoes it was made after this attempt ran
            // (see `take_handoff`). The call's first attempt that queues keeps the first one.
            if self.joined.is_some() {
                self.ticket = NEXT_TICKET.fetch_add(1, Ordering::Relaxed);
            }
            (
                self.ticket,
                inner.exec.config.lease.entry_ttl_ms(self.deadline),
            )
        });
        let newly_queued = join.is_some() && !self.queued;
        if newly_queued {
            // Entries are kept alive, and handed-over holds extended, by the watchdog.
            inner.watchdog.ensure_running(inner)?;
            self.queued = true;
        }
        if join.is_some() {
            // Before anything is sent, so before the script can have run.
            self.joined_topology = inner.exec.topology_epoch();
            self.joined = Some(Instant::now());
            self.queued_at = None;
        }
        let outcome = lock.send_attempt(
            (self.token, &self.holder),
            self.lease_ms,
            self.amount,
            join,
            self.sub.as_ref().map_or(0, Subscription::listen_flags),
            lock.io_until(self.deadline),
            room,
        );
        let outcome = match outcome {
            // It never ran (see `Executor::run_until`): no entry to leave for the watchdog.
            Err(e @ Error::PoolExhausted { .. }) if newly_queued => {
                self.left_queue();
                return Err(e);
            }
            outcome => outcome?,
        };
        if let (Some(_), Err(refused)) = (join, &outcome) {
            self.queued_at = refused.queued_at;
            // Kept alive once the entry exists: a renewal round while the attempt waited
            // for room in the pool would find none, and have the thread queue again.
            inner
                .holds
                .waiting(&lock.keys, self.token, &self.holder, self.deadline);
        }
        match outcome {
            // The script took the thread out of the queue with the grant.
            Ok(_) => self.left_queue(),
            Err(_) if self.reentry => {
                // A re-entry is granted while the hold stands: it is gone on the server
                // (expired, force-unlocked, lost). Its guards must say so, and from here on
                // the call is an ordinary acquisition, which may queue.
                self.reentry = false;
                inner
                    .holds
                    .hold_gone(lock.keys.hold(), self.token, inner.exec.generation());
            }
            Err(_) => {}
        }
        Ok(outcome)
    }

    /// After a wait that ended without a message: whether this thread makes the process's
    /// one try on the lease timer (`Again`: another thread does, or the deadline passed;
    /// the caller loops and sleeps again).
    fn timed_try(&self, s: &Subscription) -> Result<Woke<K>, Error> {
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) || cancel::is_cancelled(self.cancel) {
            return Ok(Woke::Again);
        }
        let window = self.lock.client.inner.exec.config.command_timeout;
        Ok(match s.claim_try(now, window) {
            Ok(_) => Woke::Try { claimed: true },
            Err(_) => Woke::Again,
        })
    }

    /// The deadline passed: leave the queue, in one step with learning whether the lock
    /// was handed to this thread meanwhile (then it is ours: `Some`).
    fn give_up(&mut self) -> Result<Option<LockGuard<K>>, Error> {
        self.leave(true)
    }

    /// The call was cancelled: leave the queue, and in the same script give back the lock
    /// if it was handed to this thread meanwhile, handing it on to the next waiter; the
    /// caller holds nothing. (A failure leaves the entry, and any such hold, to the
    /// watchdog's clean-up, as for any call that fails while queued.)
    fn leave_cancelled(&mut self) -> Result<Option<LockGuard<K>>, Error> {
        // Told not to keep, the script never reports a hold (`None`).
        drop(self.leave(false)?);
        Err(Error::CANCELLED)
    }

    /// The server refused the lock's channel (`e`): leave the queue as
    /// [`leave_cancelled`](Wait::leave_cancelled) does, holding nothing, and fail with `e`.
    fn leave_refused(&mut self, e: Error) -> Result<Option<LockGuard<K>>, Error> {
        // The refusal is what the caller must hear; a queue entry the leaving failed to
        // remove is cleaned up by the watchdog (see `Drop`).
        if let Err(left) = self.leave(false) {
            tracing::debug!(target: "redmutex", "redmutex: leaving the queue after a refused channel failed: {left}");
        }
        Err(e)
    }

    /// Leaves the queue, in one step with learning whether the lock was handed to this
    /// thread meanwhile: with `keep` it is then ours (`Some`), otherwise given back and
    /// handed on.
    fn leave(&mut self, keep: bool) -> Result<Option<LockGuard<K>>, Error> {
        if !self.queued {
            return Ok(None);
        }
        let lock = self.lock;
        let inner = &lock.client.inner;
        let keys = &lock.keys;
        // The levels the thread holds (none: a thread that held the lock never queued),
        // never fewer: leaving must not give one of them up.
        let held = inner.holds.levels_now(keys.hold(), self.token);
        let need = inner.holds.need_ms(
            keys.hold(),
            self.token,
            inner.exec.config.lease.watchdog_ms(),
        );
        let reply: Vec<i64> = inner.exec.run_until(lock.io_until(self.deadline), |con| {
            let cancel = calls::cancel(keys.ops, keys, &self.holder, held, need, keep);
            inner.exec.eval(con, &cancel)
        })?;
        match reply[..] {
            [1, _, fence] if keep => {
                // Handed over meanwhile: ours if still within its pickup window. (Still
                // marked queued until then: a failure leaves the level to the watchdog.)
                let guard = self.confirm_grant(fence as u64)?;
                self.left_queue();
                Ok(guard)
            }
            [0, served] => {
                self.left_queue();
                if served == 1 {
                    inner.watchdog.handed_on(inner, keys);
                }
                Ok(None)
            }
            _ => Err(Error::redis(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply from the cancel script",
            )))),
        }
    }

    /// The guard a grant this call's attempt (sent at `sent`) got becomes; the thread is
    /// out of the queue.
    fn keep_grant(&mut self, grant: Grant, sent: Instant) -> LockGuard<K> {
        self.left_queue();
        self.lock.guard_for_grant(
            self.token,
            self.holder.clone(),
            grant,
            self.lease,
            sent,
            false,
        )
    }

    /// The thread's queue entry is gone (left, or taken with a grant): the hold table
    /// stops keeping it alive.
    fn left_queue(&mut self) {
        if self.queued {
            self.queued = false;
            let inner = &self.lock.client.inner;
            inner.holds.done_waiting(self.lock.keys.key(), self.token);
        }
    }
}

impl<K: Kind> Drop for Wait<'_, K> {
    fn drop(&mut self) {
        if self.queued {
            // Left with an error: the thread's entry (and a grant it may have been made
            // meanwhile) is given up by the watchdog thread, off this caller's path.
            let inner = &self.lock.client.inner;
            let keys = &self.lock.keys;
            inner.holds.done_waiting(keys.key(), self.token);
            // Told the levels the thread holds (none: a thread that held the lock never
            // queued), so that the clean-up can never take one of them.
            let held = inner.holds.levels_now(keys.hold(), self.token);
            inner
                .watchdog
                .doubt(inner, keys, self.token, &self.holder, held);
        }
    }
}
