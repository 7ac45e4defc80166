//! The watchdog thread: renews the leases and queue entries in the client's hold table,
//! checks the locks this client handed on, and cleans up after doubtful attempts. The
//! client's [`Watchdog`] (the thread's handle) starts it, handing it a `Weak` of what it
//! needs of the client ([`Owner`]); the table wakes it through its alarm. Its timings
//! are the client's lease policy (`lease.rs`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::Mutex;

use crate::runtime::connection::executor::Executor;
use crate::runtime::holds::{Doubtful, HoldTable, RoundKind, Watched, KICK_TRIES};
use crate::runtime::keys::LockKeys;
use crate::runtime::scripting::calls;
use crate::runtime::telemetry;
use crate::Error;

/// Leases and queue entries renewed by one script call. Bounded so that one call never
/// blocks Redis for long; 1,000 locks or waiters still take only two round trips.
const RENEW_BATCH: usize = 500;
/// Queue entries kept alive by one call with no hold to renew (each hold takes the room of
/// `ENTRY_BATCH / RENEW_BATCH` entries). More than holds, as they cost Redis less each (the
/// script reads and writes a lock's entries 500 at a time: about 1.6 µs an entry, where a
/// hold's renewal takes three commands); not all of a lock's at once, which for 10,000
/// waiters would block Redis some 20 ms.
const ENTRY_BATCH: usize = 1_000;

/// What the watchdog thread works for: its client, as far as the thread needs it. The
/// thread holds it by a `Weak` and ends once the client is gone (as r2d2's reaper does),
/// so that it never keeps a dropped client alive.
pub(crate) trait Owner: Send + Sync {
    /// Runs the thread's calls.
    fn executor(&self) -> &Executor;
    /// What the client holds.
    fn holds(&self) -> &HoldTable;
    /// The thread's handle.
    fn watchdog(&self) -> &Watchdog;
    /// Tells thread `token`, if it waits on `channel`, to try again: its queue entry was
    /// dropped (see `Subscriber::recheck`).
    fn recheck(&self, channel: &[u8], token: u64);
    /// Whether any `Client` (or `Lock`) of the client is still alive.
    fn has_handles(&self) -> bool;
}

/// A client's watchdog: the handle of the thread that renews the client's hold table
/// ([`Owner::holds`]), checks the locks handed on and cleans up after doubtful attempts
/// (started when first needed, and again if it died).
pub(crate) struct Watchdog {
    // The running thread; the table's alarm holds the sender that wakes it.
    thread: Mutex<Option<JoinHandle<()>>>,
    // Every hold is to be checked against Redis at once (see `check_holds`).
    check: AtomicBool,
}

impl Watchdog {
    pub(crate) fn new() -> Watchdog {
        Watchdog {
            thread: Mutex::new(None),
            check: AtomicBool::new(false),
        }
    }

    /// Has the thread check every hold against Redis at once, fixed leases too (a check
    /// round: see [`RoundKind::Check`]): a hold found gone is marked lost, as a renewal
    /// marks it. For when a `force_unlock` of any hold may have been told to nobody: the
    /// client's pub/sub connection was down (and a fixed lease is never renewed, a
    /// watchdog lease only a third of the lease later).
    pub(crate) fn check_holds<C: Owner + 'static>(&self, client: &Arc<C>) {
        if !client.holds().holds_any() {
            return;
        }
        self.check.store(true, Ordering::SeqCst);
        // (Not started: a watchdog hold's renewal finds it gone still; a fixed lease ends
        // by itself.)
        self.wake(
            client,
            "check the holds after the pub/sub connection was down",
        );
    }

    /// Has the thread look at the table now, starting it if it is not running; `what` the
    /// warning says cannot be done when it cannot be started.
    fn wake<C: Owner + 'static>(&self, client: &Arc<C>, what: &str) {
        if let Err(e) = self.ensure_running(client) {
            tracing::warn!(target: "redmutex", error = %e, "redmutex: cannot {what}");
            return;
        }
        client.holds().alarm.nudge();
    }

    /// Makes sure the renewal thread runs, starting it (again, if it died) when needed.
    /// Called before a watchdog lease is taken, so that a thread that cannot be started
    /// fails the acquisition before anything is written.
    pub(crate) fn ensure_running<C: Owner + 'static>(&self, client: &Arc<C>) -> Result<(), Error> {
        let mut thread = self.thread.lock();
        if let Some(handle) = &*thread {
            if !handle.is_finished() {
                return Ok(());
            }
            tracing::warn!(
                target: "redmutex",
                "redmutex: the watchdog thread had stopped; starting it again"
            );
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let weak: Weak<dyn Owner> = Arc::downgrade(client) as Weak<C>;
        let handle = thread::Builder::new()
            .name("redmutex-watchdog".to_owned())
            .spawn(move || run(weak, rx))
            .map_err(Error::Thread)?;
        client.holds().alarm.set(tx);
        *thread = Some(handle);
        Ok(())
    }

    /// Checks the lock once the pickup window of a handoff just made is over.
    pub(crate) fn handed_on<C: Owner + 'static>(&self, client: &Arc<C>, keys: &Arc<LockKeys>) {
        if let Err(e) = self.ensure_running(client) {
            // The waiters' own timers still find the lock free, at the lease they saw.
            tracing::warn!(
                target: "redmutex",
                error = %e,
                "redmutex: cannot check a handed-on lock"
            );
            return;
        }
        client.holds().schedule_kick(keys);
    }

    /// Records an attempt whose outcome is unknown and wakes the watchdog thread to give
    /// back the level it may have taken.
    pub(crate) fn doubt<C: Owner + 'static>(
        &self,
        client: &Arc<C>,
        keys: &Arc<LockKeys>,
        token: u64,
        holder: &str,
        expected: usize,
    ) {
        client.holds().record_doubt(keys, token, holder, expected);
        self.wake(client, "clean up a call whose outcome is unknown");
    }
}

fn run(client: Weak<dyn Owner>, wake: Receiver<()>) {
    let mut next_round = Instant::now();
    loop {
        let clean_bound = match client.upgrade() {
            Some(inner) => {
                let lease = &inner.executor().config.lease;
                if next_round <= Instant::now() {
                    next_round = Instant::now() + lease.renew_every();
                }
                // Published before the dues are read: one added in between nudges.
                let table = &inner.holds();
                *table.alarm.planned.lock() = Some(next_round);
                if let Some(due) = table.next_due() {
                    let mut planned = table.alarm.planned.lock();
                    *planned = planned.map(|p| p.min(due));
                }
                lease.chore_bound()
            }
            None => return,
        };
        let wake_at = client
            .upgrade()
            .and_then(|inner| *inner.holds().alarm.planned.lock())
            .unwrap_or(next_round);
        let woken = wake.recv_deadline(wake_at);
        if let Some(inner) = client.upgrade() {
            *inner.holds().alarm.planned.lock() = None;
            if inner.watchdog().check.swap(false, Ordering::SeqCst)
                && catch_unwind(AssertUnwindSafe(|| {
                    renew_round(&*inner, RoundKind::Check, false)
                }))
                .is_err()
            {
                tracing::error!(target: "redmutex", "redmutex: a check of the holds panicked");
            }
        }
        match woken {
            Ok(()) => {
                // Woken for a doubtful attempt, or a new extension or check to schedule.
                // Renewals come first: clean up now only if that cannot delay the next
                // round.
                if next_round.saturating_duration_since(Instant::now()) > clean_bound {
                    if let Some(inner) = client.upgrade() {
                        clean_doubtful(&*inner);
                    }
                }
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(inner) = client.upgrade() else {
            return;
        };
        let inner = &*inner;
        let full = Instant::now() >= next_round;
        if full && !inner.has_handles() {
            // Every Client and Lock is gone; only guards (perhaps forgotten ones) remain.
            // Their leases run out within a watchdog timeout.
            inner.holds().abandon();
            return;
        }
        // A bug in one round must not end renewals for every lock of the client.
        if catch_unwind(AssertUnwindSafe(|| renew_all(inner, full))).is_err() {
            tracing::error!(
                target: "redmutex",
                "redmutex: a lease renewal round panicked; renewing again next round"
            );
        }
        if catch_unwind(AssertUnwindSafe(|| kick_due(inner))).is_err() {
            tracing::error!(target: "redmutex", "redmutex: a check of a handed-on lock panicked");
        }
        if full {
            clean_doubtful(inner);
        }
    }
}

/// Checks the locks this client handed on whose pickup window is over: a free lock with
/// waiters goes to the next one (and is checked again after its window).
fn kick_due(inner: &dyn Owner) {
    let table = &inner.holds();
    for kick in table.due_kicks() {
        // (Runs on the watchdog thread itself: no need to wake it for a reschedule.)
        let keys = kick.keys.clone();
        let until = Instant::now() + inner.executor().config.lease.chore_bound();
        let call = calls::kick(&keys);
        let check = |con: &mut _| inner.executor().eval::<(i64, i64)>(con, &call);
        let result =
            inner
                .executor()
                .run_minding(Some(until), &mut extensions_meanwhile(inner), check);
        match result {
            // It handed the lock on again: check that handoff in its turn.
            Ok((_, 1)) => table.kick_again(kick, KICK_TRIES),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: checking a handed-on lock failed"
                );
                let tries_left = kick.tries_left - 1;
                if tries_left > 0 {
                    table.kick_again(kick, tries_left);
                }
            }
        }
    }
}

/// Gives back the levels doubtful attempts may have left. Each call is the release script
/// told the thread held one level more than the attempt was told: if the attempt never ran
/// it finds fewer and changes nothing; if the thread released or re-took the lock since,
/// the count no longer matches either. Only this thread's own field is ever touched.
fn clean_doubtful(inner: &dyn Owner) {
    let table = &inner.holds();
    let batch = claim_doubts(table);
    let mut handed = Vec::new();
    for doubtful in batch {
        let (expected, need, until) = give_back_terms(inner, &doubtful);
        let Doubtful {
            id, keys, holder, ..
        } = doubtful;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let cancel = |con: &mut _| {
                let cancel = calls::cancel(keys.ops, &keys, &holder, expected, need, false);
                inner.executor().eval::<Vec<i64>>(con, &cancel)
            };
            inner
                .executor()
                .run_minding(Some(until), &mut extensions_meanwhile(inner), cancel)
        }));
        let mut doubts = table.doubts.lock();
        if let Some(at) = doubts.iter().position(|d| d.id == id) {
            let d = &mut doubts[at];
            d.in_flight = false;
            match result {
                Ok(Ok(reply)) => {
                    if reply[..] == [0, 1] {
                        handed.push(keys.clone());
                    }
                    tracing::debug!(
                        target: "redmutex",
                        lock = %telemetry::Name(keys.name()),
                        ?reply,
                        "redmutex: cleaned up after a doubtful attempt"
                    );
                    d.runs_left -= 1;
                    if d.runs_left == 0 {
                        doubts.remove(at);
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(
                        target: "redmutex",
                        error = %e,
                        "redmutex: clean-up of a doubtful attempt failed"
                    )
                }
                Err(_) => {
                    tracing::error!(
                        target: "redmutex",
                        "redmutex: clean-up of a doubtful attempt panicked"
                    );
                    doubts.remove(at);
                }
            }
        }
        drop(doubts);
        table.cleaned.notify_all();
    }
    for keys in handed {
        table.schedule_kick(&keys);
    }
}

/// The doubtful attempts to clean up now (those neither in flight nor paused), marked in
/// flight: copies, as the table's stay for the thread's next grant to adopt.
fn claim_doubts(table: &HoldTable) -> Vec<Doubtful> {
    let mut doubts = table.doubts.lock();
    doubts
        .iter_mut()
        .filter(|d| !d.in_flight && !d.paused)
        .map(|d| {
            d.in_flight = true;
            Doubtful {
                keys: d.keys.clone(),
                holder: d.holder.clone(),
                ..*d
            }
        })
        .collect()
}

/// How the level a doubtful attempt may have taken is given back: how many levels the
/// cancel script is told the thread holds (never fewer than it holds now, so that a
/// clean-up never takes one of them, whatever the attempt was told: its thread cannot
/// attempt meanwhile), the lease the thread's hold still needs, and the call's deadline
/// (the watchdog's chore bound).
fn give_back_terms(inner: &dyn Owner, d: &Doubtful) -> (usize, u64, Instant) {
    let table = inner.holds();
    let watchdog_ms = inner.executor().config.lease.watchdog_ms();
    let need = table.need_ms(d.keys.hold(), d.token, watchdog_ms);
    let expected = d.expected.max(table.levels_now(d.keys.hold(), d.token));
    let until = Instant::now() + inner.executor().config.lease.chore_bound();
    (expected, need, until)
}

/// One renewal round: every watchdog hold and every queue entry of this client (`full`),
/// or just the handed-over holds due for extension, in batches of one script call each. A
/// batch that fails (Redis unreachable) is simply tried again next round; its leases still
/// have a third of their time left. Each call gives up after a third of the lease, so one
/// slow round cannot use up the time of the next one.
pub(crate) fn renew_all(inner: &dyn Owner, full: bool) {
    let kind = if full {
        RoundKind::Full
    } else {
        RoundKind::Due
    };
    renew_round(inner, kind, false);
}

/// The extensions due now, run in the pauses of a call of the watchdog thread that waits
/// out a settling cluster (see `Inner::run_minding`): a hold handed over has only its
/// pickup window, shorter than such a wait may last (a slot split by a migration refuses
/// a multi-key script until its keys are together again).
fn extensions_meanwhile(inner: &dyn Owner) -> impl FnMut() + '_ {
    move || {
        if !inner.executor().is_cluster() {
            // (Elsewhere nothing refuses one call that another of the same client gets
            // through: the extension would wait out the same refusal.)
            return;
        }
        if catch_unwind(AssertUnwindSafe(|| {
            renew_round(inner, RoundKind::Due, true)
        }))
        .is_err()
        {
            tracing::error!(
                target: "redmutex",
                "redmutex: an extension of a handed-over hold panicked"
            );
        }
    }
}

/// A round of `kind` ([`renew_all`]'s, or a check of every hold); `nested` when run in
/// the pause of another call (whose own pauses then run nothing more).
fn renew_round(inner: &dyn Owner, kind: RoundKind, nested: bool) {
    let watchdog_ms = inner.executor().config.lease.watchdog_ms();
    let table = &inner.holds();
    let mut round = Round {
        table,
        watched: table.watched(kind, watchdog_ms),
    };
    // (Queue entries are the full round's: a reconnect has every waiter look again.)
    let mut waiters = if kind == RoundKind::Full {
        table.waiters(&inner.executor().config.lease)
    } else {
        Vec::new()
    };
    // Each lock's entries next to each other: the script refreshes them together.
    waiters.sort_by(|(a, ..), (b, ..)| a.key().cmp(b.key()));
    // On a cluster one script may only touch keys of one slot: a batch is one slot's
    // holds and queue entries (locks of different names share a call when their tags
    // hash alike), sorted so that they are neighbours. Elsewhere every lock shares one
    // batch.
    let cluster = inner.executor().is_cluster();
    let group = |key: &[u8]| -> u16 {
        if cluster {
            slot(key)
        } else {
            0
        }
    };
    let give_up_after = inner.executor().config.lease.renewal_bound();
    if cluster {
        // A handed-over hold's extension goes alone, first: a call of several keys is
        // refused while a migration splits its slot (`TRYAGAIN`), for as long as the split
        // lasts, while a lock's hash alone is served by whichever node has it (the
        // source, or the target after `ASK`). It waits out other refusals only as long as
        // its pickup window lasts: past it the hold is lost anyway.
        round.watched.sort_by_key(|w| !w.extension);
        let alone = round.watched.iter().take_while(|w| w.extension).count();
        for one in round.watched[..alone].chunks(1) {
            let sent = Instant::now();
            let until = one[0]
                .pickup_ends
                .map_or(sent + give_up_after, |ends| ends.min(sent + give_up_after));
            renew_batch(inner, one, &[], until, None);
        }
        round.watched.drain(..alone);
        round.watched.sort_by_cached_key(|w| group(w.keys.key()));
        waiters.sort_by_cached_key(|(keys, ..)| group(keys.key()));
    }
    let mut meanwhile = extensions_meanwhile(inner);
    let mut holds: &[Watched] = &round.watched;
    let mut waits = waiters.as_slice();
    while !holds.is_empty() || !waits.is_empty() {
        let next = match (holds.first(), waits.first()) {
            (Some(h), Some((w, ..))) => group(h.keys.key()).min(group(w.key())),
            (Some(h), None) => group(h.keys.key()),
            (None, Some((w, ..))) => group(w.key()),
            (None, None) => unreachable!(),
        };
        let same = holds
            .iter()
            .take(RENEW_BATCH)
            .take_while(|h| group(h.keys.key()) == next)
            .count();
        let (batch, rest) = holds.split_at(same);
        holds = rest;
        let same = waits
            .iter()
            .take(ENTRY_BATCH - batch.len() * ENTRY_BATCH / RENEW_BATCH)
            .take_while(|(w, ..)| group(w.key()) == next)
            .count();
        let (wait_batch, rest) = waits.split_at(same);
        waits = rest;
        let until = Instant::now() + give_up_after;
        let meanwhile: Option<&mut dyn FnMut()> = if nested || !cluster {
            None
        } else {
            Some(&mut meanwhile)
        };
        renew_batch(inner, batch, wait_batch, until, meanwhile);
    }
}

/// One renewal call: the holds of `batch` and the queue entries of `wait_batch`, all of
/// one slot on a cluster, given up at `until`.
fn renew_batch(
    inner: &dyn Owner,
    batch: &[Watched],
    wait_batch: &[(Arc<LockKeys>, u64, String, u64)],
    until: Instant,
    meanwhile: Option<&mut dyn FnMut()>,
) {
    let holds: Vec<(&LockKeys, &str, u64)> = batch
        .iter()
        .map(|w| (&*w.keys, &*w.holder, w.lease_ms))
        .collect();
    let entries = wait_batch
        .iter()
        .map(|(keys, _, holder, ttl)| (&**keys, holder.as_str(), *ttl));
    let call = calls::renew(&holds, entries);
    let sent = Instant::now();
    let table = &inner.holds();
    let renew = |con: &mut _| {
        let reply = inner
            .executor()
            .eval::<(Vec<usize>, Vec<usize>)>(con, &call)?;
        // With `sync_replicas`, a renewal extends the guards' validity only once the
        // replicas have it: a failover to a replica without it would end the holds at the
        // earlier expiry the replica has (the protocol model's finding 2). A WAIT that
        // fails or falls short leaves the validity as it was, so a hold whose renewals
        // reach no replica is told lost when its last replicated lease ends.
        let replicated = match batch.first() {
            Some(w) => matches!(inner.executor().await_replicas(con, w.keys.key()), Ok(None)),
            None => true,
        };
        Ok((reply, replicated))
    };
    let result = match meanwhile {
        Some(meanwhile) => inner.executor().run_minding(Some(until), meanwhile, renew),
        // Ahead of calls waiting for room in the pool: leases run out meanwhile.
        None => inner.executor().run_urgent(Some(until), renew),
    };
    match result {
        Ok(((lost, gone), replicated)) => {
            // Those lost are forgotten below; the others are extended.
            table.extended(batch, true);
            let lost_at: Vec<usize> = lost.iter().filter_map(|i| i.checked_sub(1)).collect();
            // (A hold only checked, lease 0, was not renewed.)
            let renewed = (0..batch.len())
                .filter(|i| batch[*i].lease_ms > 0 && !lost_at.contains(i))
                .count();
            telemetry::renewed(renewed);
            if replicated {
                table.confirmed(batch, sent, &lost_at);
            }
            for i in lost {
                let Some(w) = i.checked_sub(1).and_then(|i| batch.get(i)) else {
                    continue;
                };
                // (Said once, at WARN, by the mark.)
                w.lost
                    .mark(w.lost.gone_reason(inner.executor().generation()));
                table.forget_lost(w.keys.hold(), &w.lost);
            }
            for j in gone {
                // Dropped from the queue (taken for dead while this client was
                // disconnected, or lapsed): the thread must ask again.
                if let Some((keys, token, ..)) = j.checked_sub(1).and_then(|j| wait_batch.get(j)) {
                    inner.recheck(keys.channel(), *token);
                }
            }
        }
        Err(e) => {
            // (Said at WARN there, once.)
            telemetry::renewal_failed(batch.len(), &e);
            table.extended(batch, false);
        }
    }
    table.renewed(batch);
}

/// The Redis Cluster slot of `key` (or of a shard channel).
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % 16384
}

/// The part of `key` Redis Cluster hashes to find its slot: between the first `{` and
/// the first `}` after it when that is not empty, else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// One renewal round's snapshot. Dropping it ends the round for every hold in it, even if
/// the round panicked: threads waiting for it must never wait forever.
struct Round<'a> {
    table: &'a HoldTable,
    watched: Vec<Watched>,
}

impl Drop for Round<'_> {
    fn drop(&mut self) {
        self.table.renewed(&self.watched);
    }
}
