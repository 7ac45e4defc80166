//! The per-client table of what this process holds (`Inner::holds`): each thread's levels
//! and leases on each lock, and the attempts, doubts, waits and handed-on locks the
//! watchdog thread (`watchdog.rs`) looks after. One hold and the table's filing of them are
//! `hold.rs`; the table's operations are split by concept: acquisitions and releases here,
//! attempts in doubt (`attempts.rs`), queue entries and handed-on locks (`waits.rs`),
//! renewal rounds (`renewal.rs`), and losses (`loss/`: what a guard is told, and the
//! table's judgements in `loss/found.rs`).

mod attempts;
mod hold;
pub(crate) mod lease;
pub(crate) mod loss;
mod renewal;
mod tasks;
#[cfg(test)]
mod tests;
mod waits;
pub(crate) mod watchdog;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex, MutexGuard};

use self::lease::Lease;
use crate::runtime::holds::loss::{Hook, Loss, LossReason, Notifier, Timed};
use crate::runtime::keys::LockKeys;

use self::hold::{live_levels, remove_hold, Hold, HoldKey, Holds};
use self::tasks::Waiting;

pub(crate) use self::hold::{LossAt, RoundKind, Watched};
pub(crate) use self::tasks::{Doubtful, Kick, KICK_TRIES};

/// What a guard keeps of its registration.
pub(crate) struct Registration {
    pub(crate) level: u64,
    pub(crate) lost: Arc<Loss>,
    /// The hold's holder id, shared by its guards rather than copied into each.
    pub(crate) holder: Arc<str>,
}

/// How the table wakes the watchdog thread: the sender the running thread listens on, and
/// when it wakes by itself next.
#[derive(Default)]
pub(crate) struct Alarm {
    // Set by the thread's start (`Watchdog::ensure_running`); dropping it (with the
    // client) stops the thread at once.
    wake: Mutex<Option<Sender<()>>>,
    // When the thread wakes by itself next; `None` while it is awake (it will look at
    // every extension and check before it sleeps again).
    pub(super) planned: Mutex<Option<Instant>>,
}

impl Alarm {
    /// From now on the running thread listens on `wake`.
    pub(super) fn set(&self, wake: Sender<()>) {
        *self.wake.lock() = Some(wake);
    }

    /// Wakes the thread if it would otherwise sleep past `due` (a handoff happens per
    /// acquisition under contention: waking the thread for each would cost more than the
    /// handoff itself).
    pub(super) fn nudge_for(&self, due: Instant) {
        if self.planned.lock().is_none_or(|planned| due < planned) {
            self.nudge();
        }
    }

    /// Wakes the thread to look at its timers again (or clean up a doubtful attempt).
    pub(super) fn nudge(&self) {
        if let Some(wake) = &*self.wake.lock() {
            let _ = wake.try_send(());
        }
    }
}

/// What this process holds, and what its watchdog thread looks after: every thread's
/// levels and leases on every lock, acquire attempts in flight or in doubt, this client's
/// queue entries, and the locks it handed on.
pub(crate) struct HoldTable {
    // lock key -> thread token -> hold.
    holds: Mutex<Holds>,
    // The holds that may have an extension pending (`Hold::extend_at`): a superset, pruned
    // as it is read. A hint, so that finding the next extension due looks at these few
    // rather than at every hold: it is looked for on every wake-up of the thread, about
    // one per handoff under contention, and a client may hold 100,000 locks. Locked after
    // `holds`.
    extending: Mutex<HashSet<(HoldKey, u64)>>,
    // Signalled when a renewal round is over, for threads waiting on `Hold::renewing`.
    renewed: Condvar,
    next_level: AtomicU64,
    pub(super) doubts: Mutex<Vec<Doubtful>>,
    // Signalled when a clean-up call is over, for attempts waiting on `in_flight`.
    pub(super) cleaned: Condvar,
    // (lock key, thread token) -> a queue entry of this client.
    waiting: Mutex<HashMap<(Vec<u8>, u64), Waiting>>,
    // (side's hold key, holder token): a call of a hold on that side of a read-write lock
    // whose outcome is unknown (a doubt with no level held there) while the hold goes on
    // under the same token on another side. The late call would undo a new hold of that
    // side under the token, so none is taken (`Error::InDoubt`) until the hold is over.
    pub(super) in_doubt: Mutex<Vec<(Vec<u8>, u64)>>,
    // lock key -> the check due after this client handed it on.
    kicks: Mutex<HashMap<Vec<u8>, Kick>>,
    // Wakes the thread that renews what the table holds, checks handed-on locks and
    // cleans up after doubtful attempts, when the table has something due.
    pub(super) alarm: Alarm,
    // The threads that mark holds lost when their time is up, and that call the hook.
    pub(crate) notifier: Notifier,
    // `force_unlock` notices that found no hold of their token on a side, kept a while for
    // a grant of it still on its way (`force_unlocked`), oldest first. Locked after `holds`.
    pub(super) forced: Mutex<VecDeque<Forced>>,
}

/// A `force_unlock` notice kept for a hold not registered yet: the side's hold key, the
/// holder token, and until when it is kept.
pub(super) struct Forced {
    pub(super) hold: Vec<u8>,
    pub(super) token: u64,
    pub(super) until: Instant,
}

/// At most this many notices are kept (the oldest go first): a notice of a hold not yet
/// registered is needed only for a moment, and only races make one, so a flood of them
/// (every side of each name freed without a race makes some) must not grow the table.
pub(super) const FORCED_KEPT: usize = 1024;

/// What an acquisition tells the table besides its lease.
pub(crate) struct Acquisition {
    /// The lock's kind, for the hook.
    pub(crate) kind: &'static str,
    /// The primary it was granted on (`Target::generation`).
    pub(crate) generation: u64,
    /// `max_hold`: how long the watchdog may renew it.
    pub(crate) max_hold: Option<Duration>,
    /// The thread whose hold it is (`keys::thread_token`), whose later acquisitions of the
    /// lock's object re-enter it; `None` for a hold of its own (a permit, an owned hold).
    pub(crate) thread: Option<u64>,
}

impl HoldTable {
    pub(crate) fn new(hook: Option<Hook>) -> HoldTable {
        HoldTable {
            notifier: Notifier::new(hook),
            holds: Mutex::new(HashMap::new()),
            extending: Mutex::new(HashSet::new()),
            renewed: Condvar::new(),
            next_level: AtomicU64::new(1),
            doubts: Mutex::new(Vec::new()),
            cleaned: Condvar::new(),
            waiting: Mutex::new(HashMap::new()),
            in_doubt: Mutex::new(Vec::new()),
            kicks: Mutex::new(HashMap::new()),
            alarm: Alarm::default(),
            forced: Mutex::new(VecDeque::new()),
        }
    }

    /// Blocks while a renewal round that includes this thread's hold is in flight.
    fn settled<'a>(&'a self, key: &[u8], token: u64) -> MutexGuard<'a, Holds> {
        let mut holds = self.holds.lock();
        while holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .is_some_and(|hold| hold.renewing)
        {
            self.renewed.wait(&mut holds);
        }
        holds
    }

    /// Records a granted acquisition whose reentry count is now `count`. Runs on the
    /// acquiring thread before the guard exists, so a lock is never held unregistered.
    /// `sent` is when the acquire script was sent: a fixed lease is counted from there.
    /// `handoff`: a release handed the lock over, with a lease of the pickup window (or
    /// `lease_ms`, if shorter) from the release, and nothing confirmed it yet: a waiter
    /// that heard of the grant early in its window (`Wait::take_handoff`; `sent` is then an
    /// instant known to precede the release), or a `MultiLock` member found handed over as
    /// its call gives up, about to be given back. The window, the fixed leases and the
    /// extension a third of the way in are all counted from `sent`.
    // (The lease and the timing come in pairs, the rest in `Acquisition`: one more
    // struct for the few left would only rename them.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquired(
        &self,
        keys: &Arc<LockKeys>,
        token: u64,
        holder: &str,
        count: i64,
        (lease, lease_ms): (Lease, u64),
        (sent, handoff): (Instant, bool),
        acq: &Acquisition,
    ) -> Registration {
        let key = keys.hold();
        let level = self.next_level.fetch_add(1, Ordering::Relaxed);
        let mut holds = self.settled(key, token);
        let by_token = match holds.get_mut(key) {
            Some(by_token) => by_token,
            None => holds.entry(HoldKey(keys.clone())).or_default(),
        };
        let fresh = || {
            let loss = Loss::new(keys, acq.kind, acq.generation, self.notifier.events());
            Hold::new(keys, holder, acq.thread, loss)
        };
        let hold = by_token.or_insert_with(token, fresh);
        if count == 1 {
            // Redis shows no earlier level of ours: a new hold.
            hold.restart(acq.generation, fresh);
        }
        if self.forced_before(key, token) {
            // Freed by a force_unlock after its grant, whose notice came before this
            // registration (see `force_unlocked`): lost from the start.
            hold.lost.mark(LossReason::Deleted);
        }
        let extend = hold.add_level(level, (lease, lease_ms), (sent, handoff), acq.max_hold);
        if extend.is_some() {
            self.extending.lock().insert((HoldKey(keys.clone()), token));
        }
        let registration = Registration {
            level,
            lost: hold.lost.clone(),
            holder: hold.holder.clone(),
        };
        // A level may bring the loss nearer (a watchdog level under a long fixed one).
        let timer = if self.notifier.has_hook() || hold.lost.is_watched() {
            hold.arm(sent)
        } else {
            None
        };
        drop(holds);
        if let Some(at) = timer {
            self.notifier.push(
                at,
                Timed::Hold {
                    keys: keys.clone(),
                    token,
                    loss: Arc::downgrade(&registration.lost),
                },
            );
        }
        if let Some(due) = extend {
            self.alarm.nudge_for(due);
        }
        registration
    }

    /// The holder token under which thread `thread` holds the object of `keys` here (on any
    /// of its sides: a read-write lock's read, write and upgradeable holds share one), if it
    /// has a live hold of it: its acquisitions of the object re-enter that hold and use its
    /// token. `None` when it holds none: its next acquisition is a new hold, under a token
    /// never used before, so that a call of an earlier hold of the thread that runs late
    /// (a release or a cancel whose outcome was unknown) can never touch it.
    pub(crate) fn token_of_thread(&self, keys: &LockKeys, thread: u64) -> Option<u64> {
        let holds = self.holds.lock();
        let now = Instant::now();
        let find = |key: &[u8]| {
            let by_token = holds.get(key)?;
            by_token
                .iter()
                .find(|(_, h)| h.thread == Some(thread) && h.live_levels(now) > 0)
                .map(|(token, _)| token)
        };
        if !keys.has_sides() {
            return find(keys.hold());
        }
        let mut side = keys.hold().to_vec();
        LockKeys::HOLD_MARKS.iter().find_map(|&mark| {
            side[0] = mark;
            find(&side)
        })
    }

    /// Whether `token` has a hold of the object of `keys` on a side other than `keys`'
    /// own, live or not: its token then stays in use, by this thread's later acquisitions.
    pub(super) fn held_on_another_side(&self, keys: &LockKeys, token: u64) -> bool {
        if !keys.has_sides() {
            return false;
        }
        let holds = self.holds.lock();
        let mut side = keys.hold().to_vec();
        LockKeys::HOLD_MARKS.iter().any(|&mark| {
            side[0] = mark;
            side[..] != *keys.hold()
                && holds
                    .get(&side[..])
                    .is_some_and(|b| b.get(&token).is_some())
        })
    }

    /// Whether a new hold of `keys`' side under `token` must be refused (see `in_doubt`).
    /// Entries of tokens no longer held on any side are dropped on the way: their holds are
    /// over, and no later hold uses the token.
    pub(crate) fn is_in_doubt(&self, keys: &LockKeys, token: u64) -> bool {
        let mut in_doubt = self.in_doubt.lock();
        if in_doubt.is_empty() {
            return false;
        }
        let holds = self.holds.lock();
        in_doubt.retain(|(side, t)| {
            let mut key = side.clone();
            LockKeys::HOLD_MARKS.iter().any(|&mark| {
                key[0] = mark;
                holds.get(&key[..]).is_some_and(|b| b.get(t).is_some())
            })
        });
        in_doubt
            .iter()
            .any(|(side, t)| *t == token && side[..] == *keys.hold())
    }

    /// Takes thread `thread`'s hold of the lock `key` out of the table if it is over here
    /// (lost, or every lease of it ran out) while guards of it live, and returns its token:
    /// Redis may still keep it a moment longer (see [`forget_over`](HoldTable::forget_over)).
    pub(crate) fn forget_over_of_thread(&self, key: &[u8], thread: u64) -> Option<u64> {
        let now = Instant::now();
        let token = {
            let holds = self.holds.lock();
            let found = holds.get(key)?.iter().find(|(_, h)| {
                h.thread == Some(thread) && !h.levels.is_empty() && h.live_levels(now) == 0
            });
            found.map(|(token, _)| token)?
        };
        self.forget_over(key, token).then_some(token)
    }

    /// The levels this thread holds of the lock, as far as this process knows: what the
    /// acquire script is told, so that a repeated call cannot count a level twice.
    pub(crate) fn levels(&self, key: &[u8], token: u64) -> usize {
        live_levels(&self.settled(key, token), key, token)
    }

    /// Whether this thread has a live hold of the lock here: not known lost, and with a
    /// level whose lease is not over.
    pub(crate) fn holds_locally(&self, key: &[u8], token: u64) -> bool {
        self.levels_now(key, token) > 0
    }

    /// [`levels`](HoldTable::levels) without waiting for a renewal round in flight.
    pub(crate) fn levels_now(&self, key: &[u8], token: u64) -> usize {
        live_levels(&self.holds.lock(), key, token)
    }

    /// Forgets this thread's hold of the lock if it is over here (lost, or every lease of
    /// it ran out) while guards of it live: true if there was one. Redis may still keep it
    /// for a moment (a fixed lease ends there a little later than here); its guards report
    /// it lost, and their releases find nothing to release.
    pub(crate) fn forget_over(&self, key: &[u8], token: u64) -> bool {
        let now = Instant::now();
        let mut holds = self.holds.lock();
        let over = holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .is_some_and(|hold| !hold.levels.is_empty() && hold.live_levels(now) == 0);
        if over {
            remove_hold(&mut holds, key, token);
        }
        over
    }

    /// Marks this thread's hold of the lock lost and forgets it: the server (its primary
    /// now being `generation`) showed it gone.
    pub(crate) fn hold_gone(&self, key: &[u8], token: u64, generation: u64) {
        let gone = remove_hold(&mut self.holds.lock(), key, token);
        if let Some(hold) = gone {
            // (Said once, at WARN, by the mark.)
            hold.lost.mark(hold.lost.gone_reason(generation));
        }
    }

    /// The lease in ms the levels this thread now holds need (0 for none): what a rolled
    /// back nested acquisition leaves on the key.
    pub(crate) fn need_ms(&self, key: &[u8], token: u64, watchdog_ms: u64) -> u64 {
        let holds = self.holds.lock();
        holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .map_or(0, |hold| hold.need_ms(watchdog_ms, Instant::now()))
    }

    /// Forgets the guard `level`; after this returns the watchdog never renews on its
    /// behalf (a renewal already in flight for the hold is waited for). Returns the lease
    /// the levels still held need (0 when none needs more time) and how many levels were
    /// held before this release, or `None` when the guard's hold is already over (lost or
    /// superseded). When this was the hold's last level, also when the hold is lost by the
    /// clock alone, and why (see `Hold::loss_at`): nothing renews it or watches it from
    /// now on, so a release that waits (refused by a split slot, a failover under way)
    /// must tell its loss itself if that instant passes meanwhile.
    pub(crate) fn releasing(
        &self,
        key: &[u8],
        token: u64,
        level: u64,
        watchdog_ms: u64,
    ) -> Option<(u64, usize, Option<LossAt>)> {
        let mut holds = self.settled(key, token);
        let by_token = holds.get_mut(key)?;
        let hold = by_token.get_mut(&token)?;
        let at = hold.levels.iter().position(|l| l.id == level)?;
        let held = hold.levels.len();
        let ends = (held == 1).then(|| hold.loss_at()).flatten();
        hold.levels.remove(at);
        let need = hold.need_ms(watchdog_ms, Instant::now());
        if hold.levels.is_empty() {
            by_token.remove(&token);
            if by_token.is_empty() {
                holds.remove(key);
            }
        }
        Some((need, held, ends))
    }

    /// `extend` raised the key's expiry: the fixed level `level` of the hold `loss`
    /// belongs to needs the lock until `ends` (never earlier than it did). False if that
    /// hold is lost or over by now: the extension does not bring it back.
    pub(crate) fn extended_level(
        &self,
        keys: &Arc<LockKeys>,
        token: u64,
        loss: &Arc<Loss>,
        level: u64,
        ends: Instant,
    ) -> bool {
        let now = Instant::now();
        let mut holds = self.holds.lock();
        let Some(hold) = holds
            .get_mut(keys.hold())
            .and_then(|by_token| by_token.get_mut(&token))
            .filter(|hold| Arc::ptr_eq(&hold.lost, loss))
        else {
            return false;
        };
        if hold.live_levels(now) == 0 {
            return false;
        }
        let Some(level) = hold.levels.iter_mut().find(|l| l.id == level) else {
            return false;
        };
        // (No end is a lease too long to count: it stays endless.)
        if let Some(old) = level.ends {
            level.ends = Some(old.max(ends));
        }
        hold.valid_until = hold.valid_until.max(Some(ends));
        // (A timer already kept for the hold finds the later end and waits for it.)
        true
    }
}
