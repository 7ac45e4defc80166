//! An acquire attempt's bracket in the table: waiting out the clean-up of an earlier
//! doubtful attempt, and recording one whose outcome is unknown.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::runtime::keys::LockKeys;
use crate::Error;

use super::tasks::Doubtful;
use super::HoldTable;

impl HoldTable {
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
        self.begin_attempt_then(key, token, until, || {})
    }

    /// [`begin_attempt`](HoldTable::begin_attempt), running `before_waiting` before it
    /// waits for a clean-up, if it does: a caller holding room in the client's pool gives
    /// it back there, as the clean-up needs room of its own.
    pub(crate) fn begin_attempt_then(
        &self,
        key: &[u8],
        token: u64,
        until: Option<Instant>,
        before_waiting: impl FnOnce(),
    ) -> Result<usize, Error> {
        let mut before_waiting = Some(before_waiting);
        let mut doubts = self.doubts.lock();
        if !doubts.is_empty() {
            while doubts
                .iter()
                .any(|d| d.in_flight && d.token == token && d.keys.hold() == key)
            {
                if let Some(f) = before_waiting.take() {
                    f();
                }
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

    /// Whether a call of `token`'s on the lock `key` is in doubt: recorded, and its
    /// clean-up not over.
    pub(crate) fn in_doubt_for(&self, key: &[u8], token: u64) -> bool {
        self.doubts
            .lock()
            .iter()
            .any(|d| d.token == token && d.keys.hold() == key)
    }

    /// Records an attempt whose outcome is unknown, for the watchdog thread to give back
    /// the level it may have taken (see `Watchdog::doubt`).
    pub(crate) fn record_doubt(
        &self,
        keys: &Arc<LockKeys>,
        token: u64,
        holder: &str,
        expected: usize,
    ) {
        if expected == 0 && self.held_on_another_side(keys, token) {
            // The call may run whenever: a hold of this side taken under the token before
            // the hold is over would be undone by it.
            let mut in_doubt = self.in_doubt.lock();
            if !in_doubt
                .iter()
                .any(|(k, t)| *t == token && k[..] == *keys.hold())
            {
                in_doubt.push((keys.hold().to_vec(), token));
            }
        }
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
}
