//! A `Lock<K>`'s one acquisition path (`acquire_cancellable`, behind every public acquisition), and `Wait`: one call
//! waiting for the lock, the state machine between its attempts (`attempt.rs`), its place
//! in the queue and its subscription, until it holds the lock or gives up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::primitives::acquire::attempt::{Grant, Refused};
use crate::primitives::cancel::{self, CancellationToken};
use crate::primitives::kind::{self, sealed::Sealed, Kind};
use crate::primitives::lock::Lock;
use crate::runtime::connection::pool::Room;
use crate::runtime::holds::lease::{self, Lease};
use crate::runtime::keys::{fresh_token, holder_id, thread_token};
use crate::runtime::scripting::calls;
use crate::runtime::scripting::queue::{self, Notice};
use crate::runtime::scripting::scripts;
use crate::runtime::subscriber::Subscription;
use crate::runtime::telemetry;
use crate::{Error, LockGuard};

/// Numbers each waiting call, so that a message meant for an earlier call of the same
/// thread (one that already left the queue) is never taken for this one's.
pub(crate) static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);

impl<K: Kind> Lock<K> {
    /// [`acquire_cancellable`](Lock::acquire_cancellable) that nothing cancels.
    pub(crate) fn acquire(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
    ) -> Result<Option<LockGuard<K>>, Error> {
        self.acquire_cancellable(lease, deadline, amount, None)
    }

    /// The one acquisition path. `deadline` None waits forever; a deadline already past
    /// makes exactly one attempt. `amount`: the permits asked for (1 for the locks).
    /// `cancel`: a token that stops the wait (`Err(Cancelled)`, holding nothing).
    pub(crate) fn acquire_cancellable(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<LockGuard<K>>, Error> {
        self.acquisition(lease, deadline, amount, cancel)
            .map_err(|e| e.on_lock(self.name()))
    }

    fn acquisition(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
        amount: u32,
        cancel: Option<&CancellationToken>,
    ) -> Result<Option<LockGuard<K>>, Error> {
        self.check_name()?;
        let inner = &self.client.inner;
        inner.exec.check_process()?;
        if cancel.is_some_and(CancellationToken::is_cancelled) {
            return Err(Error::CANCELLED);
        }
        // The client listens on its own channel before anything is sent (see
        // `Subscriber::listen`), within the call's bounds.
        let (listen_by, answer_by) = self.listen_bounds(lease, deadline);
        inner.subscriber.listen(inner, listen_by);
        if let Some(refused) = inner.subscriber.refusal() {
            // The server refuses the client's own channel: a force_unlock of a hold could
            // not be told, nor a release to a waiter. Nothing is written.
            return Err(refused);
        }
        let keys = &self.keys;
        let table = &inner.holds;
        // The holder token: a semaphore's permits and an owned hold are holders of their
        // own, never the thread's (they neither re-enter its holds nor are re-entered by
        // them). A thread's hold of the object is re-entered under its token; a new hold
        // gets a token never used before, so a call of an earlier hold that runs late (its
        // outcome unknown to this process) finds nothing of this one to release.
        let thread = (!keys.ops.per_call && !<K as Sealed>::OWN_HOLDER).then(thread_token);
        let token = thread
            .and_then(|thread| table.token_of_thread(keys, thread))
            .unwrap_or_else(fresh_token);
        if table.is_in_doubt(keys, token) {
            return Err(Error::IN_DOUBT);
        }
        if let Some(read_hold) = keys.read_hold() {
            // Reading without writing: asking to write, or for the upgradeable side (whose
            // upgrade would wait for this read hold), would wait for itself. (A writer
            // that also reads, mid-downgrade, may re-enter the write side.)
            if !table.holds_locally(keys.hold(), token) {
                // Unless it also holds the upgradeable side: then a write is an upgrade,
                // which waits for the others' read holds only.
                let upgrading = keys
                    .upgradeable_hold()
                    .is_some_and(|hold| table.holds_locally(&hold, token));
                if !upgrading && table.holds_locally(&read_hold, token) {
                    return Err(Error::WOULD_DEADLOCK);
                }
                let over = thread.and_then(|t| table.forget_over_of_thread(&read_hold, t));
                if let Some(read_token) = over {
                    // A read hold whose lease ran out here may live a moment longer on the
                    // server (its lease counts from when Redis ran the acquire), where it
                    // would refuse this write: it is given back first.
                    self.give_back_read(read_token, self.io_until(deadline))?;
                }
            }
        }
        if lease == Lease::Watchdog {
            // Before anything is written: a lease nobody renews must not be handed out.
            inner.watchdog.ensure_running(inner)?;
        }
        let once = deadline.is_some_and(|d| d <= Instant::now());
        // A thread that holds the lock re-enters at once (the scripts grant a re-entry
        // whoever waits): it never queues, so that leaving the call can never give up a
        // level it holds.
        let reentry = inner.holds.holds_locally(keys.hold(), token);
        let ticket = NEXT_TICKET.fetch_add(1, Ordering::Relaxed);
        let mut wait = Wait {
            lock: self,
            token,
            holder: holder_id(&inner.exec.id, token),
            lease,
            lease_ms: self.lease_ms(lease),
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
            // A process that listens on this lock already (others of its threads wait, or
            // did a moment ago) queues with its first attempt: no extra round trip.
            sub: if once {
                None
            } else {
                inner.subscriber.rejoin(self.keys.channel(), token)
            },
        };
        let (name, holder) = (
            telemetry::Name(keys.name()),
            telemetry::Holder(&inner.exec.id, token),
        );
        telemetry::acquisition(K::NAME, &name, &holder, || {
            let guard = wait.run()?;
            // The client's first hold learns whether the server lets it listen on its own
            // channel (see `Subscriber::listen`): refused, the hold is given back, so that
            // a call that fails holds nothing.
            if guard.is_some() {
                inner.subscriber.listen(inner, answer_by);
            }
            match (guard, inner.subscriber.refusal()) {
                (Some(guard), Some(refused)) => {
                    if let Err(e) = guard.unlock() {
                        tracing::debug!(target: "redmutex", "redmutex: giving back a hold after a refusal failed: {e}");
                    }
                    Err(refused)
                }
                (guard, _) => Ok(guard),
            }
        })
    }

    /// Gives back this thread's read hold of a read-write lock (`self` is its write side)
    /// whose lease is over here, in case Redis still keeps it a moment longer.
    fn give_back_read(&self, token: u64, until: Option<Instant>) -> Result<(), Error> {
        let keys = &self.keys;
        let read = &scripts::READ;
        let holder = holder_id(&self.client.inner.exec.id, token);
        let cancel = calls::cancel_as(read, keys, &holder, 0, 0, false);
        let exec = &self.client.inner.exec;
        let reply: Vec<i64> = exec.run_until(until, |con| exec.eval(con, &cancel))?;
        if reply[..] == [0, 1] {
            self.client
                .inner
                .watchdog
                .handed_on(&self.client.inner, keys);
        }
        Ok(())
    }
}

/// One call waiting for a lock: its attempts, its place in the queue, its subscription.
pub(in crate::primitives) struct Wait<'a, K: Kind> {
    pub(in crate::primitives) lock: &'a Lock<K>,
    pub(in crate::primitives) token: u64,
    pub(in crate::primitives) holder: String,
    pub(in crate::primitives) lease: Lease,
    pub(in crate::primitives) lease_ms: u64,
    pub(in crate::primitives) deadline: Option<Instant>,
    // Another thread may stop the wait through it.
    pub(in crate::primitives) cancel: Option<&'a CancellationToken>,
    // A single attempt (try_lock): it never queues.
    pub(in crate::primitives) once: bool,
    // The permits asked for (1 for the locks).
    pub(in crate::primitives) amount: u32,
    // The call's first ticket: every ticket of this call is at least this, every one of
    // the thread's earlier calls below it.
    pub(in crate::primitives) first_ticket: u64,
    // The ticket of the latest attempt that could queue, and when it was sent: a grant
    // carrying it was made from the queue entry that attempt wrote, so after it ran.
    pub(in crate::primitives) ticket: u64,
    pub(in crate::primitives) joined: Option<Instant>,
    // The server's time when that attempt queued the thread, from its reply: a grant's
    // own server time is set against it (see `pick_up`).
    pub(in crate::primitives) queued_at: Option<u64>,
    // The client's topology epoch when that attempt was sent: a grant heard under
    // another was perhaps timed by another server's clock (see `window_start`).
    pub(in crate::primitives) joined_topology: u64,
    // The thread held the lock when the call began: its attempts never queue.
    pub(in crate::primitives) reentry: bool,
    // An attempt of this call may have queued the thread: leaving, it must leave the queue.
    pub(in crate::primitives) queued: bool,
    pub(in crate::primitives) sub: Option<Subscription>,
}

impl<K: Kind> Wait<'_, K> {
    pub(in crate::primitives) fn run(&mut self) -> Result<Option<LockGuard<K>>, Error> {
        let lock = self.lock;
        let inner = &lock.client.inner;
        let room = self.before_first()?;
        let mut sent = Instant::now();
        let mut pttl = match self.attempt(room)? {
            Ok(grant) => return Ok(Some(self.granted(grant, sent))),
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
            let Some(s) = &self.sub else {
                // The queue needs the watchdog (its entries are kept alive each round).
                inner.watchdog.ensure_running(inner)?;
                // Subscribe, and queue only once the server confirmed it: a message sent
                // before that would be lost, and this waiter taken for dead.
                let s = inner.subscriber.subscribe(
                    &inner.exec,
                    lock.keys.channel(),
                    self.token,
                    lock.io_until(self.deadline),
                    true,
                )?;
                s.saw_lease_end(Instant::now() + lock.wait_bound(pttl));
                self.sub = Some(s);
                continue;
            };
            // Never sleep past the holder's lease: a crashed holder hands nothing on.
            let lease_end = s.next_try().unwrap_or(now);
            let until = self.deadline.map_or(lease_end, |d| d.min(lease_end));
            // Whether the try below is the process's one try on the lease timer.
            let mut claimed = false;
            let signal = self.cancel.map(CancellationToken::signal);
            if !s.is_confirmed() {
                let confirmed = match s.wait_confirmed(until, signal) {
                    Ok(confirmed) => confirmed,
                    // The server's ACL refused the lock's channel: this call could never
                    // be told of a release. It leaves as a cancelled one does.
                    Err(e) => return self.leave_refused(e),
                };
                if !confirmed {
                    if !self.timed_try(s)? {
                        continue;
                    }
                    claimed = true;
                }
            } else if self.queued {
                match s.wait(until, signal) {
                    Some(Notice::Granted { ticket, fence, at }) if ticket >= self.first_ticket => {
                        if let Some(guard) = self.pick_up(ticket, fence, at)? {
                            return Ok(Some(guard));
                        }
                        // The grant lapsed before it could be confirmed (the message came
                        // late): this turn is over, and the try below queues again.
                    }
                    Some(Notice::Wake { ticket }) if ticket >= self.first_ticket => {}
                    Some(Notice::Recheck) => {}
                    // For an earlier call of this thread, long over.
                    Some(_) => continue,
                    None => {
                        if !self.timed_try(s)? {
                            continue;
                        }
                        claimed = true;
                    }
                }
            }
            sent = Instant::now();
            match self.attempt(None) {
                Ok(Ok(grant)) => {
                    if let Some(s) = &self.sub {
                        // The others of this process now wait for our release (or lease).
                        s.saw_lease_end(sent + Duration::from_millis(self.lease_ms));
                    }
                    return Ok(Some(self.granted(grant, sent)));
                }
                Ok(Err(refused)) => {
                    pttl = refused.pttl;
                    if let Some(s) = &self.sub {
                        s.saw_lease_end(Instant::now() + lock.wait_bound(pttl));
                    }
                }
                Err(e) => {
                    if claimed {
                        if let Some(s) = &self.sub {
                            s.unclaim();
                        }
                    }
                    return Err(e);
                }
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
    fn attempt(&mut self, room: Option<Room>) -> Result<Result<Grant, Refused>, Error> {
        let lock = self.lock;
        let inner = &lock.client.inner;
        let join =
            !self.once && !self.reentry && self.sub.as_ref().is_some_and(|s| s.is_confirmed());
        let join = join.then(|| {
            // A ticket of its own: a grant that echoes it was made after this attempt ran
            // (see `pick_up`). The call's first attempt that queues keeps the first one.
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
        let outcome = lock.attempt(
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
    /// one try on the lease timer (false: another thread does, or the deadline passed;
    /// the caller loops and sleeps again).
    fn timed_try(&self, s: &Subscription) -> Result<bool, Error> {
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) || cancel::is_cancelled(self.cancel) {
            return Ok(false);
        }
        let window = self.lock.client.inner.exec.config.command_timeout;
        Ok(s.claim_try(now, window).is_ok())
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
            let cancel = calls::cancel(keys, &self.holder, held, need, keep);
            inner.exec.eval(con, &cancel)
        })?;
        match reply[..] {
            [1, _, fence] if keep => {
                // Handed over meanwhile: ours if still within its pickup window. (Still
                // marked queued until then: a failure leaves the level to the watchdog.)
                let guard = self.confirm(fence as u64)?;
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

    /// The lock was handed to this thread by a release, in a message with `ticket`,
    /// `fence` (the token the release drew) and `at` (the server's time of the release):
    /// the guard, or `None` when the grant's pickup window was over first.
    ///
    /// The window (a lease of at most [`lease::PICKUP`], or the call's own lease if shorter)
    /// starts at the release, on the server. A grant that carries the ticket of this call's
    /// latest attempt that could queue was made from the queue entry that attempt wrote, so
    /// after the attempt ran, so after it was sent; and as much later than the attempt ran
    /// as the server's clock says (`at` against the time the attempt's reply carried). So
    /// its lease ends no earlier than the send time, plus that span, plus the window, by
    /// this machine's clock: the message's own delay does not count, nor how long the
    /// thread waited. While at least half the window is left the guard is returned at once,
    /// its lease counted from that moment, and the watchdog extends the hold when the lease
    /// needs more than the window. Otherwise ([`Wait::confirm`]) the grant may have lapsed
    /// and passed on, and the server is asked; so too when the client saw the deployment
    /// change during the wait (see [`Wait::window_start`]): then the two server times may
    /// come from two clocks, and the confirmation places the hold from its own send time.
    fn pick_up(
        &mut self,
        ticket: u64,
        fence: u64,
        at: Option<u64>,
    ) -> Result<Option<LockGuard<K>>, Error> {
        let Some(since) = self.window_start(ticket, at) else {
            return self.confirm(fence);
        };
        telemetry::handoff();
        if let Some(s) = &self.sub {
            // The others of this process now wait for our release (or lease).
            s.saw_lease_end(Instant::now() + Duration::from_millis(self.lease_ms));
        }
        let grant = Grant {
            count: 1,
            fence: kind::is_fenced::<K>().then_some(fence),
        };
        self.left_queue();
        let lock = self.lock;
        Ok(Some(lock.granted(
            self.token,
            self.holder.clone(),
            grant,
            self.lease,
            since,
            true,
        )))
    }

    /// When the pickup window of a grant with `ticket` made at the server time `at` began
    /// at the earliest, by this machine's clock, if that shows the grant still has half its
    /// window or more left; `None` when it may not (the server must be asked), when the
    /// ticket is an earlier attempt's (that grant lapsed before the later attempt ran, or
    /// the attempt would have been granted), with `sync_replicas` (the replicas must
    /// confirm it), and when the client saw the deployment change since the attempt was
    /// sent (or cannot see it: a cluster).
    ///
    /// The last because the two server times must come from one clock: after a failover,
    /// a reconnect or a slot's move, the entry may have been timed by one server and the
    /// grant by another. A grant clock ahead by δ whose message took δ or more to arrive
    /// is not "placed after its own arrival", yet placed δ late: the watchdog's extension,
    /// a third into the window, could then land after the window closed on the server.
    fn window_start(&self, ticket: u64, at: Option<u64>) -> Option<Instant> {
        let exec = &self.lock.client.inner.exec;
        if ticket != self.ticket
            || exec.config.sync_replicas.is_some()
            || !exec.same_topology_since(self.joined_topology)
        {
            return None;
        }
        let start = queue::grant_seen_from(self.joined?, self.queued_at, at);
        let now = Instant::now();
        if start > now {
            // A grant placed after its own arrival: the two times came from clocks that
            // disagree (another server's, after a failover or a slot's move).
            return None;
        }
        let window = Duration::from_millis(self.lease_ms).min(lease::PICKUP);
        let left = start.checked_add(window)?.checked_duration_since(now)?;
        (left >= window / 2 + lease::pickup_margin(window)).then_some(start)
    }

    /// Confirms a hold handed to this thread (`fence`: the token the release drew) with the
    /// server before it is returned: `None` when its pickup window was over first.
    ///
    /// Nothing here can tell how long the grant's message took, or how long ago the grant
    /// was written when the call's leave-the-queue script reports it: a grant that arrived
    /// late may have lapsed and passed on. One renewal-script call settles it: it extends
    /// the hold to this call's lease if it is still ours (the extension the watchdog would
    /// otherwise make a third into the window), and with `sync_replicas` its `WAIT`
    /// confirms the hold on the replicas before the guard exists.
    fn confirm(&mut self, fence: u64) -> Result<Option<LockGuard<K>>, Error> {
        let lock = self.lock;
        let sent = Instant::now();
        let held = lock.pick_up(&self.holder, self.lease_ms, lock.io_until(self.deadline))?;
        if !held {
            return Ok(None);
        }
        telemetry::handoff();
        if let Some(s) = &self.sub {
            // The others of this process now wait for our release (or lease).
            s.saw_lease_end(sent + Duration::from_millis(self.lease_ms));
        }
        let grant = Grant {
            count: 1,
            fence: kind::is_fenced::<K>().then_some(fence),
        };
        Ok(Some(self.granted(grant, sent)))
    }

    fn granted(&mut self, grant: Grant, sent: Instant) -> LockGuard<K> {
        self.left_queue();
        self.lock.granted(
            self.token,
            self.holder.clone(),
            grant,
            self.lease,
            sent,
            false,
        )
    }

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
