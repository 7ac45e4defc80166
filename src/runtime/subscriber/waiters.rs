//! The threads of this process waiting on one lock's channel, as the subscriber keeps
//! them: a slot each for the messages addressed to it, the latch of the channel's
//! subscription, and when one of them should next try on its own.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::runtime::scripting::queue::Notice;

/// The threads of this process waiting on one lock (its channel for this client).
pub(super) struct Waiters {
    // Each waiting thread's own slot, by thread token: the scripts address one thread.
    pub(super) slots: Mutex<HashMap<u64, Sender<Notice>>>,
    // A latch: its sender is dropped once the server confirmed the subscription, which
    // wakes every thread waiting for that at once. Re-armed when the connection drops.
    pub(super) confirmed: Mutex<(Option<Sender<()>>, Receiver<()>)>,
    // When a waiting thread of this process should next try without a message: the end
    // of the holder's lease as last seen here, or the end of a try in flight. A crashed
    // holder hands nothing on, and without this every waiting thread's timer would fire
    // at the same instant; this way one thread per process tries.
    pub(super) next_try: Mutex<Option<Instant>>,
    // The server's ACL refusal of the channel's SUBSCRIBE: final for these threads (the
    // channel's entry is dropped, so a later wait asks again).
    pub(super) refused: Mutex<Option<redis::RedisError>>,
    // Listened to with sharded pub/sub (see `shards/`): the threads queue with flag `SHARDED`,
    // so that releases `SPUBLISH` to them. Cleared if the cluster turns out to have none
    // (before any of them queued: they queue once the subscription is confirmed).
    pub(super) sharded: AtomicBool,
}

impl Waiters {
    pub(super) fn new(sharded: bool) -> Waiters {
        let (tx, rx) = crossbeam_channel::bounded(0);
        Waiters {
            slots: Mutex::new(HashMap::new()),
            confirmed: Mutex::new((Some(tx), rx)),
            next_try: Mutex::new(None),
            refused: Mutex::new(None),
            sharded: AtomicBool::new(sharded),
        }
    }

    pub(super) fn confirm(&self) {
        self.confirmed.lock().0 = None;
    }

    /// The server refused the channel (`e`): every thread waiting for its confirmation,
    /// or for a message, wakes and finds the refusal.
    pub(super) fn refuse(&self, e: redis::RedisError) {
        *self.refused.lock() = Some(e);
        self.confirm();
        self.recheck_all();
    }

    pub(super) fn rearm(&self) {
        let mut latch = self.confirmed.lock();
        if latch.0.is_none() {
            let (tx, rx) = crossbeam_channel::bounded(0);
            *latch = (Some(tx), rx);
        }
    }

    /// Delivers `notice` to the thread `token`; false when no such thread waits here.
    pub(super) fn notify(&self, token: u64, notice: Notice) -> bool {
        match self.slots.lock().get(&token) {
            Some(slot) => slot.send(notice).is_ok(),
            None => false,
        }
    }

    pub(super) fn recheck_all(&self) {
        for slot in self.slots.lock().values() {
            let _ = slot.send(Notice::Recheck);
        }
    }
}
