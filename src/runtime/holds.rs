//! The per-client table of what this process holds: each thread's levels and leases on each
//! lock, and the attempts, doubts, waits and handed-on locks the watchdog thread looks after.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::runtime::keys::LockKeys;
use crate::runtime::lease::{self, millis, Lease, LeasePolicy, KICK_AFTER, PICKUP};
use crate::runtime::loss::{Hook, Loss, LossSource, Notifier, Timed, Watcher};
use crate::runtime::lost_lease::LossReason;
use crate::Error;

/// How often a failing check of a handed-on lock is tried again before it is left to the
/// waiters' own timers.
pub(super) const KICK_TRIES: u8 = 3;
/// How soon a failed extension of a handed-over hold is tried again: several times
/// within its pickup window.
const EXTEND_RETRY: Duration = Duration::from_millis(100);

struct Level {
    id: u64,
    lease: Lease,
    // Fixed leases: when this level stops needing the lock, counted from when its acquire
    // was sent, so never later than the expiry Redis applied.
    ends: Option<Instant>,
}

impl Level {
    /// Whether this level still needs the key at `now`.
    fn needs_at(&self, now: Instant) -> bool {
        self.ends.is_none_or(|ends| ends > now)
    }
}

/// What this process knows of one thread's hold on one lock.
struct Hold {
    // One per live guard, so that a nested release can work out what the remaining guards
    // still need, and the watchdog renews while any of them is a watchdog guard.
    levels: Vec<Level>,
    holder: Arc<str>,
    keys: Arc<LockKeys>,
    // Shared with the guards of this hold; a new outermost acquisition gets a new one, so
    // a verdict about an old hold can never mark a newer one lost.
    lost: Arc<Loss>,
    // `max_hold`: past this instant the watchdog no longer renews the hold (the earliest
    // of its levels' caps).
    cap: Option<Instant>,
    // When the loss thread's timer for this hold is due, if one is kept: one per hold,
    // however often it is re-entered (others found in the heap are stale and dropped).
    timer_at: Option<Instant>,
    // Part of a renewal script now in flight. This thread's acquisitions and releases of
    // the lock wait for it, so that a renewal taken from an older snapshot can never land
    // on a later hold (a fixed lease re-taken in between would be silently extended).
    renewing: bool,
    // The hold was handed over by a release, with a lease of at most the pickup window:
    // when the watchdog must extend it to what the levels need.
    extend_at: Option<Instant>,
    // A handed-over hold not extended yet: when its lease on the server ends.
    pickup_ends: Option<Instant>,
    // The latest the key's expiry is known to reach: the send time of the last grant or
    // renewal that set it, plus the lease it set. Redis applied it later, so the key lives
    // at least this long; past it, with no renewal confirmed, the hold may be gone (Redis
    // frozen or unreachable, a partition) and another holder may have the lock.
    valid_until: Option<Instant>,
}

impl Hold {
    /// A hold of `holder` on `keys` with no level yet, not lost, not being renewed.
    fn new(keys: &Arc<LockKeys>, holder: &str, loss: Loss) -> Hold {
        Hold {
            levels: Vec::with_capacity(1),
            holder: Arc::from(holder),
            keys: keys.clone(),
            lost: Arc::new(loss),
            cap: None,
            timer_at: None,
            renewing: false,
            extend_at: None,
            pickup_ends: None,
            valid_until: None,
        }
    }

    /// The levels this hold counts at `now`: none once it is known lost, or once no level
    /// needs the key any more (fixed leases all over: the server drops the hold by itself).
    /// Such a hold is marked lost on the way, so that its guards say so from now on and a
    /// later acquisition never counts its levels again.
    fn live_levels(&self, now: Instant) -> usize {
        if self.lost.is_lost() {
            return 0;
        }
        if self.levels.iter().any(|l| l.needs_at(now)) {
            return self.levels.len();
        }
        if !self.levels.is_empty() {
            self.lost.mark(LossReason::LeaseExpired);
        }
        0
    }

    /// Adds this hold (thread `token`'s) to a renewal round's `watched` and marks it as
    /// being renewed, if the round is for it: in a `full` round when it has a watchdog
    /// level or a pending extension, otherwise when its extension is due by `now`.
    fn watch(
        &mut self,
        token: u64,
        full: bool,
        now: Instant,
        watchdog_ms: u64,
        watched: &mut Vec<Watched>,
    ) {
        if self.lost.is_lost() {
            // Its guards say it is lost: a renewal must not keep it going.
            self.extend_at = None;
            return;
        }
        let due = self.extend_at.is_some_and(|at| full || at <= now);
        if due || (full && self.has_watchdog_level()) {
            self.extend_at = None;
            let extension = self.pickup_ends.is_some();
            let lease_ms = self.need_ms(watchdog_ms, now);
            if lease_ms == 0 {
                return;
            }
            self.renewing = true;
            watched.push(Watched {
                keys: self.keys.clone(),
                token,
                holder: self.holder.clone(),
                lost: self.lost.clone(),
                lease_ms,
                extension,
                pickup_ends: self.pickup_ends,
            });
        }
    }

    fn has_watchdog_level(&self) -> bool {
        self.levels.iter().any(|l| l.lease == Lease::Watchdog)
    }

    /// The lease the key needs for these levels at `now`, in ms: the longest of them (the
    /// watchdog lease for a watchdog level, no longer than what is left until the hold's
    /// `max_hold` cap), 0 when none needs any more time.
    fn need_ms(&self, watchdog_ms: u64, now: Instant) -> u64 {
        let watchdog_ms = match self.cap {
            Some(cap) => watchdog_ms.min(millis(cap.saturating_duration_since(now))),
            None => watchdog_ms,
        };
        self.levels
            .iter()
            .map(|l| match (l.lease, l.ends) {
                (Lease::Watchdog, _) | (Lease::Fixed(_), None) => watchdog_ms,
                (Lease::Fixed(_), Some(ends)) => millis(ends.saturating_duration_since(now)),
            })
            .max()
            .unwrap_or(0)
    }

    /// Marks this hold lost if its time is up at `now`; otherwise makes sure the loss
    /// thread looks at it then: the instant to keep a timer for, unless one is kept for
    /// that instant or earlier already.
    fn arm(&mut self, now: Instant) -> Option<Instant> {
        if self.lost.is_lost() {
            return None;
        }
        let (at, why) = self.loss_at()?;
        if at <= now {
            self.lost.mark(why);
            return None;
        }
        if self.timer_at.is_some_and(|kept| kept <= at) {
            return None;
        }
        self.timer_at = Some(at);
        Some(at)
    }

    /// When no grant or renewal has confirmed this hold's key any longer, and why it is
    /// lost from then: its `max_hold` cap when that is what stopped the renewals, else
    /// renewals that did not get through.
    fn unconfirmed_after(&self) -> Option<(Instant, LossReason)> {
        self.valid_until.map(|until| {
            let why = if self.cap.is_some_and(|cap| cap <= until) {
                LossReason::MaxHold
            } else {
                LossReason::RenewalFailed
            };
            (until, why)
        })
    }

    /// When this hold is lost by the clock alone, and why, if nothing renews it: a watchdog
    /// hold when no renewal confirmed its key lives any longer, a fixed one when its last
    /// level's lease ends, a handed-over one when its pickup window ends unextended.
    fn loss_at(&self) -> Option<(Instant, LossReason)> {
        let clock = if self.has_watchdog_level() {
            self.unconfirmed_after()
        } else if self.levels.iter().all(|l| l.ends.is_some()) {
            let ends = self.levels.iter().filter_map(|l| l.ends).max();
            ends.map(|ends| (ends, LossReason::LeaseExpired))
        } else {
            None
        };
        let pickup = self
            .pickup_ends
            .map(|ends| (ends, LossReason::RenewalFailed));
        match (clock, pickup) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// When a hold is lost by the clock alone, and why (see `Hold::loss_at`).
pub(crate) type LossAt = (Instant, LossReason);

/// What a guard keeps of its registration.
pub(crate) struct Registration {
    pub(crate) level: u64,
    pub(crate) lost: Arc<Loss>,
    /// The hold's holder id, shared by its guards rather than copied into each.
    pub(crate) holder: Arc<str>,
}

// (Clippy takes the `Arc` in `HoldKey` for a key that may change; it hashes and compares
// by `LockKeys::hold`, which never changes.)
type Holds = HashMap<HoldKey, ByToken>;

/// A lock's name in the table ([`LockKeys::hold`]), read from the keys its holds share
/// with their guards rather than copied: the table keeps an entry per held lock.
struct HoldKey(Arc<LockKeys>);

impl Hash for HoldKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the `[u8]` it is borrowed as hashes, so lookups by name find it.
        self.0.hold().hash(state);
    }
}

impl PartialEq for HoldKey {
    fn eq(&self, other: &HoldKey) -> bool {
        self.0.hold() == other.0.hold()
    }
}

impl Eq for HoldKey {}

impl Borrow<[u8]> for HoldKey {
    fn borrow(&self) -> &[u8] {
        self.0.hold()
    }
}

/// Past this many threads holding one lock in this process, its holds are kept in a map.
const FEW_HOLDERS: usize = 8;

/// One lock's holds in this process, by thread token. Nearly always one (the readers of a
/// read-write lock or a semaphore's permits are the exception), so a short list: a map
/// of its own costs several hundred bytes per held lock at its smallest, and a client may
/// hold 100,000 locks. Many holders switch it to a map, so that no operation on a lock
/// read by many threads looks through all of them.
enum ByToken {
    Few(Vec<(u64, Hold)>),
    // Boxed so that the common case stays three words: the table has one per held lock.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<u64, Hold>>),
}

impl Default for ByToken {
    fn default() -> ByToken {
        ByToken::Few(Vec::with_capacity(1))
    }
}

impl ByToken {
    fn get(&self, token: &u64) -> Option<&Hold> {
        match self {
            ByToken::Few(v) => v.iter().find(|(t, _)| t == token).map(|(_, h)| h),
            ByToken::Many(m) => m.get(token),
        }
    }

    fn get_mut(&mut self, token: &u64) -> Option<&mut Hold> {
        match self {
            ByToken::Few(v) => v.iter_mut().find(|(t, _)| t == token).map(|(_, h)| h),
            ByToken::Many(m) => m.get_mut(token),
        }
    }

    /// `token`'s hold, made by `fresh` if there is none.
    fn or_insert_with(&mut self, token: u64, fresh: impl FnOnce() -> Hold) -> &mut Hold {
        if let ByToken::Few(v) = self {
            if v.len() >= FEW_HOLDERS && !v.iter().any(|(t, _)| *t == token) {
                *self = ByToken::Many(Box::new(std::mem::take(v).into_iter().collect()));
            }
        }
        match self {
            ByToken::Few(v) => {
                let at = match v.iter().position(|(t, _)| *t == token) {
                    Some(at) => at,
                    None => {
                        v.push((token, fresh()));
                        v.len() - 1
                    }
                };
                &mut v[at].1
            }
            ByToken::Many(m) => m.entry(token).or_insert_with(fresh),
        }
    }

    fn remove(&mut self, token: &u64) -> Option<Hold> {
        match self {
            ByToken::Few(v) => {
                let at = v.iter().position(|(t, _)| t == token)?;
                Some(v.swap_remove(at).1)
            }
            ByToken::Many(m) => m.remove(token),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            ByToken::Few(v) => v.is_empty(),
            ByToken::Many(m) => m.is_empty(),
        }
    }

    fn values(&self) -> impl Iterator<Item = &Hold> {
        let (few, many) = match self {
            ByToken::Few(v) => (Some(v), None),
            ByToken::Many(m) => (None, Some(m)),
        };
        let few = few.into_iter().flatten().map(|(_, h)| h);
        few.chain(many.into_iter().flat_map(|m| m.values()))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Hold)> {
        let (few, many) = match self {
            ByToken::Few(v) => (Some(v), None),
            ByToken::Many(m) => (None, Some(m)),
        };
        let few = few.into_iter().flatten().map(|(t, h)| (&*t, h));
        few.chain(many.into_iter().flat_map(|m| m.iter_mut()))
    }

    fn retain(&mut self, mut keep: impl FnMut(&u64, &mut Hold) -> bool) {
        match self {
            ByToken::Few(v) => v.retain_mut(|(t, h)| keep(t, h)),
            ByToken::Many(m) => m.retain(|t, h| keep(t, h)),
        }
    }
}

/// The levels `token`'s hold of the lock `key` counts now (see [`Hold::live_levels`]).
#[allow(clippy::mutable_key_type)]
fn live_levels(holds: &Holds, key: &[u8], token: u64) -> usize {
    holds
        .get(key)
        .and_then(|by_token| by_token.get(&token))
        .map_or(0, |hold| hold.live_levels(Instant::now()))
}

/// Takes `token`'s hold of the lock `key` out of the table, and the lock's entry with it
/// once no thread holds it.
#[allow(clippy::mutable_key_type)]
fn remove_hold(holds: &mut Holds, key: &[u8], token: u64) -> Option<Hold> {
    let by_token = holds.get_mut(key)?;
    let hold = by_token.remove(&token);
    if by_token.is_empty() {
        holds.remove(key);
    }
    hold
}

/// An acquire attempt whose outcome is unknown (it timed out, or its connection failed
/// after sending): Redis may have run it, or may still run it, leaving a level nobody
/// holds. The watchdog thread gives such a level back (twice, in case the script ran
/// late), unless this thread's next grant on the lock adopted it meanwhile.
pub(super) struct Doubtful {
    pub(super) id: u64,
    pub(super) keys: Arc<LockKeys>,
    pub(super) token: u64,
    pub(super) holder: String,
    // The levels the attempt was told the thread held: the ghost, if any, is one more.
    pub(super) expected: usize,
    pub(super) runs_left: u8,
    pub(super) in_flight: bool,
    // This thread is attempting on the lock right now: its attempt may adopt the level.
    pub(super) paused: bool,
}

/// A hold as the watchdog thread snapshots it for one renewal round.
pub(super) struct Watched {
    // Its keys; `keys.hold()` is its name in this process.
    pub(super) keys: Arc<LockKeys>,
    token: u64,
    pub(super) holder: Arc<str>,
    pub(super) lost: Arc<Loss>,
    pub(super) lease_ms: u64,
    // The first renewal of a handed-over hold: its lease is only the pickup window.
    pub(super) extension: bool,
    // When that window ends, for an extension: past it, the hold is lost anyway.
    pub(super) pickup_ends: Option<Instant>,
}

/// A thread of this client waiting in a lock's queue: its entry is kept alive each round.
struct Waiting {
    keys: Arc<LockKeys>,
    holder: String,
    deadline: Option<Instant>,
}

/// A lock this client handed on: checked once the pickup window is over, so that a grant
/// nobody took (or a wake-up nobody acted on) does not leave it free with waiters asleep.
pub(super) struct Kick {
    pub(super) keys: Arc<LockKeys>,
    due: Instant,
    pub(super) tries_left: u8,
}

impl Kick {
    /// Checks again after another pickup window, with `tries_left` tries (unless a newer
    /// handoff of the lock scheduled its own check meanwhile).
    pub(super) fn again(mut self, watchdog: &HoldTable, tries_left: u8) {
        self.due = Instant::now() + KICK_AFTER;
        self.tries_left = tries_left;
        let key = self.keys.key().to_vec();
        watchdog.kicks.lock().entry(key).or_insert(self);
    }
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
    // lock key -> the check due after this client handed it on.
    kicks: Mutex<HashMap<Vec<u8>, Kick>>,
    // Wakes the thread that renews what the table holds, checks handed-on locks and
    // cleans up after doubtful attempts, when the table has something due.
    pub(super) alarm: Alarm,
    // The thread that marks holds lost when their time is up and calls the hook.
    pub(crate) notifier: Notifier,
}

/// What an acquisition tells the table besides its lease.
pub(crate) struct Acquisition {
    /// The lock's kind, for the hook.
    pub(crate) kind: &'static str,
    /// The primary it was granted on (`Target::generation`).
    pub(crate) generation: u64,
    /// `max_hold`: how long the watchdog may renew it.
    pub(crate) max_hold: Option<Duration>,
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
            kicks: Mutex::new(HashMap::new()),
            alarm: Alarm::default(),
        }
    }

    /// Keeps thread `token`'s queue entry for the lock alive until
    /// [`done_waiting`](HoldTable::done_waiting); an entry lives a watchdog timeout unless
    /// renewed, and no longer than `deadline` allows.
    pub(crate) fn waiting(
        &self,
        keys: &Arc<LockKeys>,
        token: u64,
        holder: &str,
        deadline: Option<Instant>,
    ) {
        self.waiting
            .lock()
            .entry((keys.key().to_vec(), token))
            .or_insert_with(|| Waiting {
                keys: keys.clone(),
                holder: holder.to_owned(),
                deadline,
            });
    }

    /// Thread `token` no longer waits for the lock.
    pub(crate) fn done_waiting(&self, key: &[u8], token: u64) {
        let mut waiting = self.waiting.lock();
        if !waiting.is_empty() {
            waiting.remove(&(key.to_vec(), token));
        }
    }

    /// Schedules the check of a handed-on lock (the thread is known to run).
    pub(super) fn schedule_kick(&self, keys: &Arc<LockKeys>) {
        let due = Instant::now() + KICK_AFTER;
        let mut kicks = self.kicks.lock();
        let fresh = !kicks.contains_key(keys.key());
        kicks.insert(
            keys.key().to_vec(),
            Kick {
                keys: keys.clone(),
                due,
                tries_left: KICK_TRIES,
            },
        );
        drop(kicks);
        if fresh {
            self.alarm.nudge_for(due);
        }
    }

    /// The earliest extension or check due, if any.
    pub(super) fn next_due(&self) -> Option<Instant> {
        let kick = self.kicks.lock().values().map(|k| k.due).min();
        let holds = self.holds.lock();
        let mut extend: Option<Instant> = None;
        self.extending.lock().retain(|(key, token)| {
            let at = holds
                .get(key.0.hold())
                .and_then(|by_token| by_token.get(token))
                .and_then(|hold| hold.extend_at);
            if let Some(at) = at {
                extend = Some(extend.map_or(at, |e| e.min(at)));
            }
            at.is_some()
        });
        match (kick, extend) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
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
    /// that heard of the grant early in its window (`Wait::pick_up`; `sent` is then an
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
            Hold::new(keys, holder, loss)
        };
        let hold = by_token.or_insert_with(token, fresh);
        if count == 1 && !hold.levels.is_empty() {
            // Redis shows no earlier level of ours: the hold those guards belong to was
            // gone on the server (expired, force-unlocked, lost in a restart or failover),
            // and someone else may have held the lock in between. They must say so.
            log::warn!(
                "redmutex: lease of lock {:?} was lost before this thread took it again",
                String::from_utf8_lossy(keys.key())
            );
            hold.lost.mark(hold.lost.gone_reason(acq.generation));
            *hold = fresh();
        } else if count == 1 {
            *hold = fresh();
        }
        hold.levels.push(Level {
            id: level,
            lease,
            ends: match lease {
                Lease::Watchdog => None,
                Lease::Fixed(ms) => sent.checked_add(Duration::from_millis(ms)),
            },
        });
        // A handed-over hold's lease is the pickup window until the watchdog extends it.
        let set = if handoff {
            PICKUP.min(Duration::from_millis(lease_ms))
        } else {
            Duration::from_millis(lease_ms)
        };
        hold.valid_until = hold.valid_until.max(sent.checked_add(set));
        if lease == Lease::Watchdog {
            if let Some(cap) = acq.max_hold.and_then(|d| sent.checked_add(d)) {
                hold.cap = Some(hold.cap.map_or(cap, |c| c.min(cap)));
            }
        }
        let extend = (handoff && hold.need_ms(u64::MAX, sent) > lease::pickup_ms())
            .then(|| lease::extend_at(sent));
        if extend.is_some() {
            hold.extend_at = extend;
            hold.pickup_ends = Some(sent + PICKUP);
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

    /// Starts an acquire attempt of this thread on the lock: waits for a clean-up of an
    /// earlier doubtful attempt that is in flight, and keeps new ones from starting until
    /// [`end_attempt`](HoldTable::end_attempt), since this attempt may adopt the level.
    /// Returns the levels this thread holds, for the script. A bounded call waits for
    /// the clean-up only until `until`, its I/O bound (the clean-up itself may be stuck
    /// behind a failover): then it fails with `Error::Timeout`, having sent nothing.
    pub(crate) fn begin_attempt(
        &self,
        key: &[u8],
        token: u64,
        until: Option<Instant>,
    ) -> Result<usize, Error> {
        let mut doubts = self.doubts.lock();
        if !doubts.is_empty() {
            while doubts
                .iter()
                .any(|d| d.in_flight && d.token == token && d.keys.hold() == key)
            {
                match until {
                    None => self.cleaned.wait(&mut doubts),
                    Some(until) => {
                        if self.cleaned.wait_until(&mut doubts, until).timed_out() {
                            return Err(Error::timeout(crate::error::timed_out(
                                "the clean-up of an earlier attempt on this lock is still \
                                 waiting for Redis",
                            )));
                        }
                    }
                }
            }
            for d in doubts.iter_mut() {
                if d.token == token && d.keys.hold() == key {
                    d.paused = true;
                }
            }
        }
        drop(doubts);
        Ok(self.levels(key, token))
    }

    /// Ends an attempt begun with [`begin_attempt`](HoldTable::begin_attempt). A grant
    /// adopted any level a doubtful attempt left, and an attempt that queued owns the
    /// thread's queue entry again: nothing is left to clean up.
    pub(crate) fn end_attempt(&self, key: &[u8], token: u64, granted: bool, queued: bool) {
        let mut doubts = self.doubts.lock();
        if doubts.is_empty() {
            return;
        }
        if granted || queued {
            doubts.retain(|d| d.token != token || d.keys.hold() != key);
        } else {
            for d in doubts.iter_mut() {
                if d.token == token && d.keys.hold() == key {
                    d.paused = false;
                }
            }
        }
    }

    /// Records an attempt whose outcome is unknown, for the watchdog thread to give back
    /// the level it may have taken (see `Watchdog::doubt`).
    pub(super) fn record_doubt(
        &self,
        keys: &Arc<LockKeys>,
        token: u64,
        holder: &str,
        expected: usize,
    ) {
        let mut doubts = self.doubts.lock();
        if let Some(d) = doubts
            .iter_mut()
            .find(|d| d.token == token && d.expected == expected && d.keys.hold() == keys.hold())
        {
            d.runs_left = 2;
        } else {
            doubts.push(Doubtful {
                id: self.next_level.fetch_add(1, Ordering::Relaxed),
                keys: keys.clone(),
                token,
                holder: holder.to_owned(),
                expected,
                runs_left: 2,
                in_flight: false,
                paused: false,
            });
        }
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
            hold.lost.mark(hold.lost.gone_reason(generation));
            log::warn!(
                "redmutex: lease of lock {:?} was lost before this thread took it again",
                String::from_utf8_lossy(hold.keys.key())
            );
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

    /// For a fixed level whose own lease is over: whether the hold `lost` belongs to is
    /// over too (no level of it needs the lock now; a level that does covers this one).
    /// Marks it lost if so, so that it says so from now on.
    pub(crate) fn lease_over(&self, key: &[u8], token: u64, lost: &Arc<Loss>) -> bool {
        let now = Instant::now();
        let holds = self.holds.lock();
        let covered = holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .filter(|hold| Arc::ptr_eq(&hold.lost, lost))
            .is_some_and(|hold| hold.live_levels(now) > 0);
        if !covered {
            lost.mark(LossReason::LeaseExpired);
        }
        !covered
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

    /// The release script freed the lock although levels remain registered (they needed no
    /// more time, or the lease was gone): their hold is over.
    pub(crate) fn hold_ended(&self, key: &[u8], lost: &Arc<Loss>) {
        lost.mark(LossReason::LeaseExpired);
        self.forget_lost(key, lost);
    }

    /// Snapshots the holds to renew and marks them as being renewed: in a full round every
    /// hold with a watchdog level or a pending extension, otherwise only the extensions
    /// due by now. Each with the lease its levels need.
    pub(super) fn watched(&self, full: bool, watchdog_ms: u64) -> Vec<Watched> {
        let now = Instant::now();
        let mut holds = self.holds.lock();
        let mut extending = self.extending.lock();
        let mut watched = Vec::new();
        if full {
            for by_token in holds.values_mut() {
                for (&token, hold) in by_token.iter_mut() {
                    hold.watch(token, true, now, watchdog_ms, &mut watched);
                }
            }
            // Every pending extension was taken (or dropped, its hold lost).
            extending.clear();
        } else {
            extending.retain(|(key, token)| {
                let Some(hold) = holds
                    .get_mut(key.0.hold())
                    .and_then(|by_token| by_token.get_mut(token))
                else {
                    return false;
                };
                hold.watch(*token, false, now, watchdog_ms, &mut watched);
                hold.extend_at.is_some()
            });
        }
        watched
    }

    /// The queue entries of this client's waiting threads, each with how long it lives.
    pub(super) fn waiters(&self, policy: &LeasePolicy) -> Vec<(Arc<LockKeys>, u64, String, u64)> {
        self.waiting
            .lock()
            .iter()
            .map(|((_, token), w)| {
                let ttl = policy.entry_ttl_ms(w.deadline);
                (w.keys.clone(), *token, w.holder.clone(), ttl)
            })
            .collect()
    }

    /// Takes the checks of handed-on locks due by now.
    pub(super) fn due_kicks(&self) -> Vec<Kick> {
        let now = Instant::now();
        let mut kicks = self.kicks.lock();
        if kicks.is_empty() {
            return Vec::new();
        }
        let due: Vec<Vec<u8>> = kicks
            .iter()
            .filter(|(_, k)| k.due <= now)
            .map(|(key, _)| key.clone())
            .collect();
        due.iter().filter_map(|key| kicks.remove(key)).collect()
    }

    /// Whether the hold `lost` belongs to was handed over and its pickup window ended
    /// before the watchdog could extend it: its lease is over on the server. Marks it
    /// lost, so that it says so from now on.
    pub(crate) fn pickup_lapsed(&self, key: &[u8], token: u64, lost: &Arc<Loss>) -> bool {
        self.passed(key, token, lost, |hold| {
            hold.pickup_ends
                .map(|ends| (ends, LossReason::RenewalFailed))
        })
    }

    /// When the pickup window of the hold `lost` belongs to ends, if it was handed over and
    /// its lease is still only that window (not extended yet).
    pub(crate) fn pickup_pending(
        &self,
        key: &[u8],
        token: u64,
        lost: &Arc<Loss>,
    ) -> Option<Instant> {
        let holds = self.holds.lock();
        holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .filter(|hold| Arc::ptr_eq(&hold.lost, lost))
            .and_then(|hold| hold.pickup_ends)
    }

    /// Whether the hold `lost` belongs to may have expired on the server: no grant or
    /// renewal confirmed that its key lives until now. Marks it lost, so that it says so
    /// from now on (a renewal that lands late cannot undo what another holder may have
    /// done meanwhile).
    pub(crate) fn lease_expired(&self, key: &[u8], token: u64, lost: &Arc<Loss>) -> bool {
        // (A hold with only fixed levels left is judged by their leases instead.)
        self.passed(key, token, lost, Hold::unconfirmed_after)
    }

    /// Whether the instant `when` picks from the hold `lost` belongs to has passed; if so
    /// the hold is marked lost.
    fn passed(
        &self,
        key: &[u8],
        token: u64,
        lost: &Arc<Loss>,
        when: impl Fn(&Hold) -> Option<(Instant, LossReason)>,
    ) -> bool {
        let holds = self.holds.lock();
        let passed = holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .filter(|hold| Arc::ptr_eq(&hold.lost, lost))
            .and_then(when)
            .filter(|(at, _)| *at <= Instant::now());
        if let Some((_, why)) = passed {
            lost.mark(why);
        }
        passed.is_some()
    }

    /// After a renewal call sent at `sent` that reached the server, the holds of `batch`
    /// not in `lost` (0-based) live at least their lease from then.
    pub(super) fn confirmed(&self, batch: &[Watched], sent: Instant, lost: &[usize]) {
        let mut holds = self.holds.lock();
        for (i, w) in batch.iter().enumerate() {
            if lost.contains(&i) {
                continue;
            }
            let Some(hold) = holds
                .get_mut(w.keys.hold())
                .and_then(|h| h.get_mut(&w.token))
            else {
                continue;
            };
            if Arc::ptr_eq(&hold.lost, &w.lost) {
                let until = sent.checked_add(Duration::from_millis(w.lease_ms));
                hold.valid_until = hold.valid_until.max(until);
            }
        }
    }

    /// After a renewal call: the handed-over holds in `batch` are extended (`ok`), or
    /// their extension is tried again soon while their pickup window lasts.
    pub(super) fn extended(&self, batch: &[Watched], ok: bool) {
        let now = Instant::now();
        let mut holds = self.holds.lock();
        for w in batch.iter().filter(|w| w.extension) {
            let Some(hold) = holds
                .get_mut(w.keys.hold())
                .and_then(|h| h.get_mut(&w.token))
            else {
                continue;
            };
            if !Arc::ptr_eq(&hold.lost, &w.lost) {
                continue;
            }
            if ok {
                hold.pickup_ends = None;
            } else if hold.pickup_ends.is_some_and(|ends| ends > now) {
                hold.extend_at = Some(now + EXTEND_RETRY);
                self.extending
                    .lock()
                    .insert((HoldKey(w.keys.clone()), w.token));
            }
        }
    }

    /// Ends a renewal round for `batch` and wakes the threads waiting for it.
    pub(super) fn renewed(&self, batch: &[Watched]) {
        let mut holds = self.holds.lock();
        for w in batch {
            if let Some(hold) = holds
                .get_mut(w.keys.hold())
                .and_then(|h| h.get_mut(&w.token))
            {
                hold.renewing = false;
            }
        }
        drop(holds);
        self.renewed.notify_all();
    }

    pub(super) fn forget_lost(&self, key: &[u8], lost: &Arc<Loss>) {
        let mut holds = self.holds.lock();
        if let Some(by_token) = holds.get_mut(key) {
            by_token.retain(|_, h| !Arc::ptr_eq(&h.lost, lost));
            if by_token.is_empty() {
                holds.remove(key);
            }
        }
    }

    /// The server no longer has the hold `lost` belongs to: marks it lost for `reason`
    /// and forgets it.
    pub(crate) fn hold_lost(&self, key: &[u8], lost: &Arc<Loss>, reason: LossReason) {
        lost.mark(reason);
        self.forget_lost(key, lost);
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

    /// Marks the hold `loss` belongs to lost if its time is up, or returns when the loss
    /// thread must look again (`None` once it is lost or over, or when a timer is kept
    /// for then already). `popped`: the instant of the timer the loss thread is handling,
    /// which is no longer kept (a stale one, not the hold's own, changes nothing).
    pub(crate) fn check_loss(
        &self,
        keys: &LockKeys,
        token: u64,
        loss: &Arc<Loss>,
        popped: Option<Instant>,
    ) -> Option<Instant> {
        if loss.is_lost() {
            return None;
        }
        let mut holds = self.holds.lock();
        let hold = holds
            .get_mut(keys.hold())
            .and_then(|by_token| by_token.get_mut(&token))
            .filter(|hold| Arc::ptr_eq(&hold.lost, loss))?;
        if let Some(popped) = popped {
            if hold.timer_at != Some(popped) {
                return None;
            }
            hold.timer_at = None;
        }
        hold.arm(Instant::now())
    }

    /// Adds `watcher` to the hold `loss` belongs to, for the guard `level`, and makes sure
    /// the loss thread marks the hold lost when its time is up.
    pub(crate) fn watch_loss<C: LossSource + 'static>(
        &self,
        client: &Arc<C>,
        keys: &Arc<LockKeys>,
        token: u64,
        loss: &Arc<Loss>,
        level: u64,
        watcher: Watcher,
    ) {
        let next = self.check_loss(keys, token, loss, None);
        loss.watch(level, watcher);
        let Some(at) = next else {
            return;
        };
        if let Err(e) = self.notifier.ensure_running(client) {
            // Its guards' polls still see the loss; only the push is missing.
            log::warn!("redmutex: cannot start the loss thread: {e}");
        }
        self.notifier.push(
            at,
            Timed::Hold {
                keys: keys.clone(),
                token,
                loss: Arc::downgrade(loss),
            },
        );
    }

    /// A `force_unlock` freed the holder `token` of `key` (whichever side of a read-write
    /// lock it held): its holds are marked lost (`Deleted`) now, so that their guards and
    /// the hook are told at once. They stay in the table until released: a release still
    /// goes to Redis and says `LeaseLost`, and a hold this thread took again after the
    /// force_unlock, before its message came, is then at worst reported lost too early
    /// rather than left held without renewals.
    pub(crate) fn force_unlocked(&self, key: &[u8], token: u64) {
        let holds = self.holds.lock();
        for mark in LockKeys::HOLD_MARKS {
            let name = [&[mark][..], key].concat();
            let Some(hold) = holds.get(&name[..]).and_then(|h| h.get(&token)) else {
                continue;
            };
            if !hold.lost.is_lost() {
                log::warn!(
                    "redmutex: lock {:?} was force-unlocked while this client held it",
                    String::from_utf8_lossy(key)
                );
                hold.lost.mark(LossReason::Deleted);
            }
        }
    }

    /// The watchdog stops for good (every `Client` is gone): holds that relied on it will
    /// lapse, and their guards must say so rather than look held to the end.
    pub(super) fn abandon(&self) {
        let holds = self.holds.lock();
        let mut abandoned = 0;
        for hold in holds.values().flat_map(|by_token| by_token.values()) {
            if hold.has_watchdog_level() {
                hold.lost.mark(LossReason::ClientDropped);
                abandoned += 1;
            }
        }
        if abandoned > 0 {
            log::warn!(
                "redmutex: every Client was dropped while {abandoned} watchdog lock(s) were \
                 held; their leases are no longer renewed and are reported lost"
            );
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::keys::Object;
    use crate::runtime::scripts;

    fn hold(keys: &Arc<LockKeys>, level: u64) -> Hold {
        let mut hold = Hold::new(keys, "c:1", Loss::new(keys, "Lock", 0, None));
        hold.levels.push(Level {
            id: level,
            lease: Lease::Watchdog,
            ends: None,
        });
        hold
    }

    /// Many threads of one process holding one lock (readers) move the holds from the short
    /// list to a map; every operation finds the same holds either way.
    #[test]
    fn the_holds_of_one_lock_are_found_in_the_list_and_in_the_map() {
        let keys = Arc::new(LockKeys::new(
            b"p:",
            b"n".to_vec(),
            "c",
            Object::Lock,
            &scripts::PLAIN,
        ));
        let mut by_token = ByToken::default();
        let n = 3 * FEW_HOLDERS as u64;
        for token in 0..n {
            assert!(matches!(by_token, ByToken::Few(_)) == (token <= FEW_HOLDERS as u64));
            by_token.or_insert_with(token, || hold(&keys, 100 + token));
            // Asking again for a token held gives that hold, not a new one.
            let again = by_token.or_insert_with(token, || hold(&keys, 0));
            assert_eq!(again.levels[0].id, 100 + token);
        }
        assert!(matches!(by_token, ByToken::Many(_)));
        assert_eq!(by_token.values().count(), n as usize);
        for token in 0..n {
            assert_eq!(
                by_token.get(&token).map(|h| h.levels[0].id),
                Some(100 + token)
            );
        }
        for (token, h) in by_token.iter_mut() {
            assert_eq!(h.levels[0].id, 100 + token);
            h.renewing = true;
        }
        assert!(by_token.values().all(|h| h.renewing));
        by_token.retain(|token, _| token % 2 == 0);
        assert_eq!(by_token.values().count(), (n / 2) as usize);
        assert!(by_token.get(&1).is_none() && by_token.get(&2).is_some());
        for token in (0..n).step_by(2) {
            assert_eq!(
                by_token.remove(&token).map(|h| h.levels[0].id),
                Some(100 + token)
            );
            assert!(by_token.remove(&token).is_none());
        }
        assert!(by_token.is_empty());

        let mut few = ByToken::default();
        few.or_insert_with(7, || hold(&keys, 1));
        few.or_insert_with(8, || hold(&keys, 2));
        assert!(matches!(few, ByToken::Few(_)));
        assert_eq!(few.get_mut(&8).map(|h| h.levels[0].id), Some(2));
        assert_eq!(few.remove(&7).map(|h| h.levels[0].id), Some(1));
        assert_eq!(few.values().count(), 1);
        few.retain(|_, _| false);
        assert!(few.is_empty());
    }

    /// The table is keyed by the hold's keys and looked up by name.
    #[test]
    #[allow(clippy::mutable_key_type)]
    fn a_hold_key_is_found_by_its_name() {
        let keys = Arc::new(LockKeys::new(
            b"p:",
            b"n".to_vec(),
            "c",
            Object::Lock,
            &scripts::PLAIN,
        ));
        let mut holds = Holds::new();
        holds
            .entry(HoldKey(keys.clone()))
            .or_default()
            .or_insert_with(1, || hold(&keys, 1));
        assert!(holds.contains_key(keys.hold()));
        assert!(!holds.contains_key(&b"xp:{other}"[..]));
        assert_eq!(
            remove_hold(&mut holds, keys.hold(), 1).map(|h| h.levels[0].id),
            Some(1)
        );
        assert!(holds.is_empty());
    }

    const ACQ: Acquisition = Acquisition {
        kind: "Lock",
        generation: 0,
        max_hold: None,
    };

    fn keys_of(name: &str) -> Arc<LockKeys> {
        Arc::new(LockKeys::new(
            b"p:",
            name.as_bytes().to_vec(),
            "c",
            Object::Lock,
            &scripts::PLAIN,
        ))
    }

    /// Pending extensions are found through their own index, not by walking every hold:
    /// the earliest due, only the due ones in a partial round, none once their holds are
    /// gone, and every one in a full round.
    #[test]
    fn pending_extensions_are_found_without_walking_every_hold() {
        let watchdog = HoldTable::new(None);
        let now = Instant::now();
        let watchdog_lease = (Lease::Watchdog, 30_000);
        let plain = keys_of("plain");
        let past = keys_of("due");
        let later = keys_of("later");
        for i in 0..1_000 {
            // Holds with nothing pending: what a client holding many locks has most of.
            let keys = keys_of(&format!("idle{i}"));
            watchdog.acquired(&keys, 1, "c:1", 1, watchdog_lease, (now, false), &ACQ);
        }
        watchdog.acquired(&plain, 1, "c:1", 1, watchdog_lease, (now, false), &ACQ);
        assert_eq!(watchdog.next_due(), None);
        assert!(watchdog.extending.lock().is_empty());

        // Handed over: extended a third of the way into the pickup window.
        let sent = now.checked_sub(PICKUP).expect("an instant a second ago");
        watchdog.acquired(&past, 2, "c:2", 1, watchdog_lease, (sent, true), &ACQ);
        let r = watchdog.acquired(&later, 3, "c:3", 1, watchdog_lease, (now, true), &ACQ);
        assert_eq!(watchdog.extending.lock().len(), 2);
        assert_eq!(watchdog.next_due(), Some(sent + PICKUP / 3));

        let round = watchdog.watched(false, 30_000);
        let names: Vec<&[u8]> = round.iter().map(|w| w.keys.key()).collect();
        assert_eq!(names, [past.key()], "only the extension due");
        assert!(round[0].extension);
        watchdog.renewed(&round);
        assert_eq!(watchdog.next_due(), Some(now + PICKUP / 3));

        // Released before its extension: its entry goes with it.
        assert!(watchdog
            .releasing(later.hold(), 3, r.level, 30_000)
            .is_some());
        assert_eq!(watchdog.next_due(), None);
        assert!(watchdog.extending.lock().is_empty());

        let r = watchdog.acquired(&later, 3, "c:3", 1, watchdog_lease, (now, true), &ACQ);
        let round = watchdog.watched(true, 30_000);
        assert_eq!(round.len(), 1_000 + 3, "a full round renews every hold");
        assert!(round
            .iter()
            .any(|w| w.keys.key() == later.key() && w.extension));
        watchdog.renewed(&round);
        assert!(watchdog.extending.lock().is_empty());
        assert_eq!(watchdog.next_due(), None);
        assert!(watchdog
            .releasing(later.hold(), 3, r.level, 30_000)
            .is_some());
    }

    /// A hold re-entered many times keeps one timer for its loss, not one per level.
    #[test]
    fn a_hold_keeps_one_loss_timer_however_often_it_is_re_entered() {
        let hook: Hook = Arc::new(|_: &crate::LostLease| {});
        let watchdog = HoldTable::new(Some(hook));
        let keys = keys_of("reentered");
        let now = Instant::now();
        let lease = (Lease::Watchdog, 30_000);
        let mut levels = Vec::new();
        for count in 1..=100 {
            let r = watchdog.acquired(&keys, 1, "c:1", count, lease, (now, false), &ACQ);
            levels.push(r);
        }
        assert_eq!(watchdog.notifier.timers(), 1);
        // A fixed level ending sooner than the watchdog lease does not make it nearer
        // (the watchdog level keeps the hold), nor does a second hold share its timer.
        let fixed = (Lease::Fixed(1_000), 1_000);
        watchdog.acquired(&keys, 1, "c:1", 101, fixed, (now, false), &ACQ);
        assert_eq!(watchdog.notifier.timers(), 1);
        watchdog.acquired(&keys_of("other"), 2, "c:2", 1, fixed, (now, false), &ACQ);
        assert_eq!(watchdog.notifier.timers(), 2);
    }
}
