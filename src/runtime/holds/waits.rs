//! This client's queue entries, kept alive while their threads wait, and the checks of
//! the locks it handed on.

use std::sync::Arc;
use std::time::Instant;

use crate::runtime::holds::lease::{LeasePolicy, KICK_AFTER};
use crate::runtime::keys::LockKeys;

use super::tasks::{Kick, Waiting, KICK_TRIES};
use super::HoldTable;

impl HoldTable {
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

    /// The queue entries of this client's waiting threads, each with how long it lives.
    pub(crate) fn waiters(&self, policy: &LeasePolicy) -> Vec<(Arc<LockKeys>, u64, String, u64)> {
        self.waiting
            .lock()
            .iter()
            .map(|((_, token), w)| {
                let ttl = policy.entry_ttl_ms(w.deadline);
                (w.keys.clone(), *token, w.holder.clone(), ttl)
            })
            .collect()
    }

    /// Schedules the check of a handed-on lock (the thread is known to run).
    pub(crate) fn schedule_kick(&self, keys: &Arc<LockKeys>) {
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

    /// Takes the checks of handed-on locks due by now.
    pub(crate) fn due_kicks(&self) -> Vec<Kick> {
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

    /// Checks the handed-on lock of `kick` again after another pickup window, with
    /// `tries_left` tries (unless a newer handoff of the lock scheduled its own check
    /// meanwhile).
    pub(crate) fn kick_again(&self, mut kick: Kick, tries_left: u8) {
        kick.due = Instant::now() + KICK_AFTER;
        kick.tries_left = tries_left;
        let key = kick.keys.key().to_vec();
        self.kicks.lock().entry(key).or_insert(kick);
    }
}
