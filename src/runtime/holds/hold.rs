//! One thread's hold on one lock as the table keeps it (its levels, leases, loss and
//! renewal state), and how the table files holds: by lock, then by thread.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::holds::lease::{self, millis, Lease, PICKUP};
use crate::runtime::holds::loss::Loss;
use crate::runtime::holds::loss::LossReason;
use crate::runtime::keys::LockKeys;

pub(super) struct Level {
    pub(super) id: u64,
    pub(super) lease: Lease,
    // Fixed leases: when this level stops needing the lock, counted from when its acquire
    // was sent, so never later than the expiry Redis applied.
    pub(super) ends: Option<Instant>,
}

impl Level {
    /// Whether this level still needs the key at `now`.
    pub(super) fn needs_at(&self, now: Instant) -> bool {
        self.ends.is_none_or(|ends| ends > now)
    }
}

/// What this process knows of one thread's hold on one lock.
pub(super) struct Hold {
    // One per live guard, so that a nested release can work out what the remaining guards
    // still need, and the watchdog renews while any of them is a watchdog guard.
    pub(super) levels: Vec<Level>,
    pub(super) holder: Arc<str>,
    // The thread whose hold this is (its `keys::thread_token`), which its next acquisitions
    // of the lock's object re-enter under the same holder token; `None` for a hold that is
    // nobody's thread's (a permit, an owned hold), which nothing re-enters.
    pub(super) thread: Option<u64>,
    pub(super) keys: Arc<LockKeys>,
    // Shared with the guards of this hold; a new outermost acquisition gets a new one, so
    // a verdict about an old hold can never mark a newer one lost.
    pub(super) lost: Arc<Loss>,
    // `max_hold`: past this instant the watchdog no longer renews the hold (the earliest
    // of its levels' caps).
    pub(super) cap: Option<Instant>,
    // When the loss thread's timer for this hold is due, if one is kept: one per hold,
    // however often it is re-entered (others found in the heap are stale and dropped).
    pub(super) timer_at: Option<Instant>,
    // Part of a renewal script now in flight. This thread's acquisitions and releases of
    // the lock wait for it, so that a renewal taken from an older snapshot can never land
    // on a later hold (a fixed lease re-taken in between would be silently extended).
    pub(super) renewing: bool,
    // The hold was handed over by a release, with a lease of at most the pickup window:
    // when the watchdog must extend it to what the levels need.
    pub(super) extend_at: Option<Instant>,
    // A handed-over hold not extended yet: when its lease on the server ends.
    pub(super) pickup_ends: Option<Instant>,
    // The latest the key's expiry is known to reach: the send time of the last grant or
    // renewal that set it, plus the lease it set. Redis applied it later, so the key lives
    // at least this long; past it, with no renewal confirmed, the hold may be gone (Redis
    // frozen or unreachable, a partition) and another holder may have the lock.
    pub(super) valid_until: Option<Instant>,
}

impl Hold {
    /// Starts this entry anew for an acquisition Redis counted as the first level of a
    /// hold (`fresh` makes the new one). Levels still here belong to a hold that was gone
    /// on the server (expired, force-unlocked, lost in a restart or failover), and
    /// someone else may have held the lock in between: their guards must say so (and the
    /// mark says it once, at WARN).
    pub(super) fn restart(&mut self, generation: u64, fresh: impl FnOnce() -> Hold) {
        if !self.levels.is_empty() {
            self.lost.mark(self.lost.gone_reason(generation));
        }
        *self = fresh();
    }

    /// Adds level `id`, taken with `lease` (of `lease_ms`) by a call sent at `sent`:
    /// the hold's validity and `max_hold` cap follow. Returns when the watchdog is to
    /// extend it, for a handed-over hold (`handoff`) whose pickup window is shorter than
    /// its levels need (its lease is the window until then).
    pub(super) fn add_level(
        &mut self,
        id: u64,
        (lease, lease_ms): (Lease, u64),
        (sent, handoff): (Instant, bool),
        max_hold: Option<Duration>,
    ) -> Option<Instant> {
        self.levels.push(Level {
            id,
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
        self.valid_until = self.valid_until.max(sent.checked_add(set));
        if lease == Lease::Watchdog {
            if let Some(cap) = max_hold.and_then(|d| sent.checked_add(d)) {
                self.cap = Some(self.cap.map_or(cap, |c| c.min(cap)));
            }
        }
        let extend = (handoff && self.need_ms(u64::MAX, sent) > lease::pickup_ms())
            .then(|| lease::extend_at(sent));
        if extend.is_some() {
            self.extend_at = extend;
            self.pickup_ends = Some(sent + PICKUP);
        }
        extend
    }

    /// A hold of `holder` (thread `thread`'s, if any) on `keys` with no level yet, not
    /// lost, not being renewed.
    pub(super) fn new(keys: &Arc<LockKeys>, holder: &str, thread: Option<u64>, loss: Loss) -> Hold {
        Hold {
            levels: Vec::with_capacity(1),
            holder: Arc::from(holder),
            thread,
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
    pub(super) fn live_levels(&self, now: Instant) -> usize {
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
    /// being renewed, if the round is for it: in a full round when it has a watchdog
    /// level or a pending extension, otherwise when its extension is due by `now`. A
    /// check round takes what a full one does, and every other hold whose lease is not
    /// over too, to be checked only (a lease of 0: nothing extends it).
    pub(super) fn watch(
        &mut self,
        token: u64,
        kind: RoundKind,
        now: Instant,
        watchdog_ms: u64,
        watched: &mut Vec<Watched>,
    ) {
        if self.lost.is_lost() {
            // Its guards say it is lost: a renewal must not keep it going.
            self.extend_at = None;
            return;
        }
        let full = kind != RoundKind::Due;
        let due = self.extend_at.is_some_and(|at| full || at <= now);
        let renew = due || (full && self.has_watchdog_level());
        if !renew && kind != RoundKind::Check {
            return;
        }
        if renew {
            self.extend_at = None;
        }
        let extension = renew && self.pickup_ends.is_some();
        let need_ms = self.need_ms(watchdog_ms, now);
        if need_ms == 0 {
            return;
        }
        self.renewing = true;
        watched.push(Watched {
            keys: self.keys.clone(),
            token,
            holder: self.holder.clone(),
            lost: self.lost.clone(),
            lease_ms: if renew { need_ms } else { 0 },
            extension,
            pickup_ends: self.pickup_ends,
        });
    }

    pub(super) fn has_watchdog_level(&self) -> bool {
        self.levels.iter().any(|l| l.lease == Lease::Watchdog)
    }

    /// The lease the key needs for these levels at `now`, in ms: the longest of them (the
    /// watchdog lease for a watchdog level, no longer than what is left until the hold's
    /// `max_hold` cap), 0 when none needs any more time.
    pub(super) fn need_ms(&self, watchdog_ms: u64, now: Instant) -> u64 {
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
    pub(super) fn arm(&mut self, now: Instant) -> Option<Instant> {
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
    pub(super) fn unconfirmed_after(&self) -> Option<(Instant, LossReason)> {
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
    pub(super) fn loss_at(&self) -> Option<(Instant, LossReason)> {
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

// (Clippy takes the `Arc` in `HoldKey` for a key that may change; it hashes and compares
// by `LockKeys::hold`, which never changes.)
pub(super) type Holds = HashMap<HoldKey, ByToken>;

/// A lock's name in the table ([`LockKeys::hold`]), read from the keys its holds share
/// with their guards rather than copied: the table keeps an entry per held lock.
pub(super) struct HoldKey(pub(super) Arc<LockKeys>);

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
pub(super) const FEW_HOLDERS: usize = 8;

/// One lock's holds in this process, by thread token. Nearly always one (the readers of a
/// read-write lock or a semaphore's permits are the exception), so a short list: a map
/// of its own costs several hundred bytes per held lock at its smallest, and a client may
/// hold 100,000 locks. Many holders switch it to a map, so that no operation on a lock
/// read by many threads looks through all of them.
pub(super) enum ByToken {
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
    pub(super) fn get(&self, token: &u64) -> Option<&Hold> {
        match self {
            ByToken::Few(v) => v.iter().find(|(t, _)| t == token).map(|(_, h)| h),
            ByToken::Many(m) => m.get(token),
        }
    }

    pub(super) fn get_mut(&mut self, token: &u64) -> Option<&mut Hold> {
        match self {
            ByToken::Few(v) => v.iter_mut().find(|(t, _)| t == token).map(|(_, h)| h),
            ByToken::Many(m) => m.get_mut(token),
        }
    }

    /// `token`'s hold, made by `fresh` if there is none.
    pub(super) fn or_insert_with(&mut self, token: u64, fresh: impl FnOnce() -> Hold) -> &mut Hold {
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

    pub(super) fn remove(&mut self, token: &u64) -> Option<Hold> {
        match self {
            ByToken::Few(v) => {
                let at = v.iter().position(|(t, _)| t == token)?;
                Some(v.swap_remove(at).1)
            }
            ByToken::Many(m) => m.remove(token),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            ByToken::Few(v) => v.is_empty(),
            ByToken::Many(m) => m.is_empty(),
        }
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Hold> {
        let (few, many) = match self {
            ByToken::Few(v) => (Some(v), None),
            ByToken::Many(m) => (None, Some(m)),
        };
        let few = few.into_iter().flatten().map(|(_, h)| h);
        few.chain(many.into_iter().flat_map(|m| m.values()))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Hold)> {
        let (few, many) = match self {
            ByToken::Few(v) => (Some(v), None),
            ByToken::Many(m) => (None, Some(m)),
        };
        let few = few.into_iter().flatten().map(|(t, h)| (*t, h));
        few.chain(
            many.into_iter()
                .flat_map(|m| m.iter().map(|(t, h)| (*t, h))),
        )
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Hold)> {
        let (few, many) = match self {
            ByToken::Few(v) => (Some(v), None),
            ByToken::Many(m) => (None, Some(m)),
        };
        let few = few.into_iter().flatten().map(|(t, h)| (&*t, h));
        few.chain(many.into_iter().flat_map(|m| m.iter_mut()))
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&u64, &mut Hold) -> bool) {
        match self {
            ByToken::Few(v) => v.retain_mut(|(t, h)| keep(t, h)),
            ByToken::Many(m) => m.retain(|t, h| keep(t, h)),
        }
    }
}

/// The levels `token`'s hold of the lock `key` counts now (see [`Hold::live_levels`]).
#[allow(clippy::mutable_key_type)]
pub(super) fn live_levels(holds: &Holds, key: &[u8], token: u64) -> usize {
    holds
        .get(key)
        .and_then(|by_token| by_token.get(&token))
        .map_or(0, |hold| hold.live_levels(Instant::now()))
}

/// Takes `token`'s hold of the lock `key` out of the table, and the lock's entry with it
/// once no thread holds it.
#[allow(clippy::mutable_key_type)]
pub(super) fn remove_hold(holds: &mut Holds, key: &[u8], token: u64) -> Option<Hold> {
    let by_token = holds.get_mut(key)?;
    let hold = by_token.remove(&token);
    if by_token.is_empty() {
        holds.remove(key);
    }
    hold
}

/// Which holds a renewal round takes (see `HoldTable::watched`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoundKind {
    /// The extensions of handed-over holds due by now.
    Due,
    /// Every hold with a watchdog level or a pending extension: the round of every third
    /// of the watchdog lease.
    Full,
    /// What a full round takes, and every hold with fixed leases only, checked without
    /// being extended: after the client's pub/sub connection was down, when a
    /// `force_unlock` of any hold may have been published to nobody.
    Check,
}

/// A hold as the watchdog thread snapshots it for one renewal round.
pub(crate) struct Watched {
    // Its keys; `keys.hold()` is its name in this process.
    pub(crate) keys: Arc<LockKeys>,
    pub(super) token: u64,
    pub(crate) holder: Arc<str>,
    pub(crate) lost: Arc<Loss>,
    // The lease to renew it to; 0 in a check round for a hold the watchdog does not renew
    // (fixed leases): it is only checked (`renew.lua`).
    pub(crate) lease_ms: u64,
    // The first renewal of a handed-over hold: its lease is only the pickup window.
    pub(crate) extension: bool,
    // When that window ends, for an extension: past it, the hold is lost anyway.
    pub(crate) pickup_ends: Option<Instant>,
}
