//! A renewal round as the table sees it: the holds to renew (all, or the extensions
//! due), what the round confirmed, and the threads waiting for it to end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::hold::{HoldKey, RoundKind, Watched};
use super::HoldTable;

/// How soon a failed extension of a handed-over hold is tried again: several times
/// within its pickup window.
const EXTEND_RETRY: Duration = Duration::from_millis(100);

impl HoldTable {
    /// The earliest extension or check due, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
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

    /// Whether this process holds anything.
    pub(crate) fn holds_any(&self) -> bool {
        !self.holds.lock().is_empty()
    }

    /// Snapshots the holds a round of `kind` takes and marks them as being renewed (see
    /// [`RoundKind`]), each with the lease its levels need (0: checked only).
    pub(crate) fn watched(&self, kind: RoundKind, watchdog_ms: u64) -> Vec<Watched> {
        let now = Instant::now();
        let mut holds = self.holds.lock();
        let mut extending = self.extending.lock();
        let mut watched = Vec::new();
        if kind != RoundKind::Due {
            for by_token in holds.values_mut() {
                for (&token, hold) in by_token.iter_mut() {
                    hold.watch(token, kind, now, watchdog_ms, &mut watched);
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
                hold.watch(*token, RoundKind::Due, now, watchdog_ms, &mut watched);
                hold.extend_at.is_some()
            });
        }
        watched
    }

    /// After a renewal call sent at `sent` that reached the server, the holds of `batch`
    /// not in `lost` (0-based) live at least their lease from then.
    pub(crate) fn confirmed(&self, batch: &[Watched], sent: Instant, lost: &[usize]) {
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
    pub(crate) fn extended(&self, batch: &[Watched], ok: bool) {
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
    pub(crate) fn renewed(&self, batch: &[Watched]) {
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
}
