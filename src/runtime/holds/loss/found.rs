//! Holds found or judged lost: by the clock (a lease over, a pickup window lapsed, no
//! renewal confirmed), by the server, by a `force_unlock`, and the loss thread's timers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Loss, LossReason, LossSource, Timed, Watcher};
use crate::runtime::holds::hold::Hold;
use crate::runtime::holds::{Forced, HoldTable, FORCED_KEPT};
use crate::runtime::keys::LockKeys;

impl HoldTable {
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

    /// The release script freed the lock although levels remain registered (they needed no
    /// more time, or the lease was gone): their hold is over.
    pub(crate) fn hold_ended(&self, key: &[u8], lost: &Arc<Loss>) {
        lost.mark(LossReason::LeaseExpired);
        self.forget_lost(key, lost);
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

    pub(crate) fn forget_lost(&self, key: &[u8], lost: &Arc<Loss>) {
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
            tracing::warn!(
                target: "redmutex",
                error = %e,
                "redmutex: cannot start the loss thread"
            );
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
    /// goes to Redis and says `LeaseLost`.
    ///
    /// A side with no hold of `token` here may be one whose grant is still on its way to
    /// the acquiring thread (the notice and the reply travel on two connections, in either
    /// order; a handoff's message may wait for its thread): the notice is kept for it, for
    /// `keep`, and the hold's registration marks it lost at once (see
    /// [`forced_before`](HoldTable::forced_before)). Tokens are per hold, so no later hold
    /// can take it for its own.
    pub(crate) fn force_unlocked(&self, key: &[u8], token: u64, keep: Duration) {
        let holds = self.holds.lock();
        let mut unheld = Vec::new();
        for mark in LockKeys::HOLD_MARKS {
            let name = [&[mark][..], key].concat();
            match holds.get(&name[..]).and_then(|h| h.get(&token)) {
                // (Said once, at WARN, by the mark: a hold lost already was said.)
                Some(hold) => hold.lost.mark(LossReason::Deleted),
                None => unheld.push(name),
            }
        }
        // Kept while the table is still locked: a registration checks for it under the
        // same lock, so it comes either before this look (and is marked above) or after
        // the notice is kept.
        let until = Instant::now() + keep;
        let mut forced = self.forced.lock();
        for hold in unheld {
            if forced.len() == FORCED_KEPT {
                forced.pop_front();
            }
            forced.push_back(Forced { hold, token, until });
        }
        drop(forced);
        drop(holds);
    }

    /// Whether a `force_unlock` notice for the hold `token` of `key` came before the hold
    /// was registered (see [`force_unlocked`](HoldTable::force_unlocked)); takes it. Called
    /// with the table locked.
    pub(in crate::runtime::holds) fn forced_before(&self, key: &[u8], token: u64) -> bool {
        let mut forced = self.forced.lock();
        if forced.is_empty() {
            return false;
        }
        let now = Instant::now();
        // (Kept in the order they came, each for the client's one time: the oldest end
        // first.)
        while forced.front().is_some_and(|f| f.until <= now) {
            forced.pop_front();
        }
        let Some(at) = forced
            .iter()
            .position(|f| f.token == token && f.hold[..] == *key && f.until > now)
        else {
            return false;
        };
        forced.remove(at);
        true
    }

    /// The watchdog stops for good (every `Client` is gone): holds that relied on it will
    /// lapse, and their guards must say so rather than look held to the end.
    pub(crate) fn abandon(&self) {
        let holds = self.holds.lock();
        let mut abandoned = 0;
        for hold in holds.values().flat_map(|by_token| by_token.values()) {
            if hold.has_watchdog_level() {
                hold.lost.mark(LossReason::ClientDropped);
                abandoned += 1;
            }
        }
        if abandoned > 0 {
            // Each of them was said at WARN by its mark (`client_dropped`).
            tracing::debug!(
                target: "redmutex",
                holds = abandoned,
                "redmutex: every Client was dropped while watchdog locks were held; their \
                 leases are no longer renewed"
            );
        }
    }
}
