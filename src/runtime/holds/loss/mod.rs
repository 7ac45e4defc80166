//! A hold's loss pushed to its holder: the flag the guards of one hold share and the
//! channels and quorum counts waiting on it (here); what the holder is told
//! (`lost_lease.rs`); the table's judgements that a hold is lost (`found.rs`); and the
//! thread that marks a hold lost once its time is up and calls the client's
//! `on_lease_lost` hook (`notifier.rs`).

mod found;
pub(crate) mod lost_lease;
mod notifier;

pub use self::lost_lease::{LossReason, LostLease};
pub(crate) use self::notifier::{LossSource, Notifier, Timed};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::runtime::keys::LockKeys;
use crate::runtime::telemetry;

/// The client-wide hook told of every hold lost.
pub(crate) type Hook = Arc<dyn Fn(&LostLease) + Send + Sync>;

/// What waits for a hold's loss. A loss puts what was lost in a guard's channel (its one
/// slot: the send never blocks), then drops the sender; a release only drops it. So a
/// `recv` tells the two apart (`Ok`: lost; `Err`: released, or lost and told already), and
/// every `recv` and `select!` finds the channel ready at once and for good.
pub(crate) enum Watcher {
    /// A guard's `lost()` channel, of capacity one.
    Guard(Sender<LostLease>),
    /// One member of a `MultiLockGuard`.
    Quorum(Arc<Quorum>),
}

impl Watcher {
    fn lost(self, lost: &LostLease) {
        match self {
            Watcher::Guard(sender) => {
                let _ = sender.try_send(lost.clone());
            }
            Watcher::Quorum(q) => q.member_lost(lost),
        }
    }
}

/// Whether one hold (every level a thread has of one lock, from its outermost acquisition)
/// is lost, shared by its guards and the holds table. A new outermost acquisition gets a
/// new one, so a verdict about an old hold can never mark a newer one lost.
pub(crate) struct Loss {
    lost: AtomicBool,
    // Why, set once by the first `mark` (before `lost`): what a watcher is told.
    reason: OnceLock<LossReason>,
    // By guard level. `None` once lost: the watchers were told.
    watchers: Mutex<Option<Vec<(u64, Watcher)>>>,
    keys: Arc<LockKeys>,
    kind: &'static str,
    // The primary the hold was granted on (`Target::generation`): found gone on a later
    // one, a failover lost it.
    generation: u64,
    // To the hook thread; only when the client has a hook.
    events: Option<Sender<LostLease>>,
}

impl Loss {
    pub(crate) fn new(
        keys: &Arc<LockKeys>,
        kind: &'static str,
        generation: u64,
        events: Option<Sender<LostLease>>,
    ) -> Loss {
        Loss {
            lost: AtomicBool::new(false),
            reason: OnceLock::new(),
            watchers: Mutex::new(Some(Vec::new())),
            keys: keys.clone(),
            kind,
            generation,
            events,
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Marks the hold lost for `reason`, once: the first call tells every watcher, then
    /// queues the loss for the hook. Never blocks, and never waits for the hook (it may
    /// run under the holds table's lock, or on the loss thread, whose other timers must
    /// not wait for a slow hook).
    pub(crate) fn mark(&self, reason: LossReason) {
        // The reason first: whoever sees `lost` set can tell a watcher why.
        if self.reason.set(reason).is_err() {
            return;
        }
        self.lost.store(true, Ordering::SeqCst);
        telemetry::lease_lost(&self.keys, reason);
        let lost = self.lease(reason);
        let watchers = self.watchers.lock().take();
        for (_, w) in watchers.into_iter().flatten() {
            w.lost(&lost);
        }
        if let Some(events) = &self.events {
            let _ = events.send(lost);
        }
    }

    /// What a watcher of this hold is told of its loss for `reason`.
    pub(crate) fn lease(&self, reason: LossReason) -> LostLease {
        LostLease::new(self.keys.clone(), self.kind, reason)
    }

    /// The reason a hold found gone on the server at `generation` was lost.
    pub(crate) fn gone_reason(&self, generation: u64) -> LossReason {
        if generation != self.generation {
            LossReason::ServerLost
        } else {
            LossReason::Deleted
        }
    }

    /// Whether anything waits for this hold's loss.
    pub(crate) fn is_watched(&self) -> bool {
        self.watchers.lock().as_ref().is_some_and(|w| !w.is_empty())
    }

    /// Adds `watcher` for the guard `level`; told at once if the hold is lost already.
    pub(crate) fn watch(&self, level: u64, watcher: Watcher) {
        let mut watchers = self.watchers.lock();
        match &mut *watchers {
            Some(list) if !self.is_lost() => list.push((level, watcher)),
            _ => {
                drop(watchers);
                // Lost: the reason was set before `lost`, and before the watchers went.
                let reason = self.reason.get().copied().unwrap_or(LossReason::Deleted);
                watcher.lost(&self.lease(reason));
            }
        }
    }

    /// The guard `level` is released: its channels disconnect (the hold may live on in
    /// other levels, which are not told anything).
    pub(crate) fn released(&self, level: u64) {
        let mut gone = Vec::new();
        if let Some(list) = &mut *self.watchers.lock() {
            let mut i = 0;
            while i < list.len() {
                if list[i].0 == level {
                    gone.push(list.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        drop(gone);
    }
}

/// What a `MultiLockGuard`'s `lost()` waits on: how many of its members' holds stand, and
/// the sender of the guard's channel (capacity one), told as a [`Watcher::Guard`] is.
pub(crate) struct Quorum {
    standing: AtomicUsize,
    quorum: usize,
    sender: Mutex<Option<Sender<LostLease>>>,
    // What the end of a fixed lease's validity is told as (`None`: no member is held).
    expired: Option<LostLease>,
}

impl Quorum {
    pub(crate) fn new(
        standing: usize,
        quorum: usize,
        sender: Sender<LostLease>,
        expired: Option<LostLease>,
    ) -> Quorum {
        let q = Quorum {
            standing: AtomicUsize::new(standing),
            quorum,
            sender: Mutex::new(Some(sender)),
            expired,
        };
        if standing < quorum {
            // No hold left to lose (released already).
            q.released();
        }
        q
    }

    fn member_lost(&self, lost: &LostLease) {
        let before = self
            .standing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .unwrap_or(0);
        if before.saturating_sub(1) < self.quorum {
            self.tell(Some(lost));
        }
    }

    /// The validity of the guard's fixed lease is over: its receivers are told so.
    pub(crate) fn fire(&self) {
        self.tell(self.expired.as_ref());
    }

    /// The guard is released: its receivers disconnect, told nothing.
    pub(crate) fn released(&self) {
        self.tell(None);
    }

    fn tell(&self, lost: Option<&LostLease>) {
        if let Some(sender) = self.sender.lock().take() {
            if let Some(lost) = lost {
                let _ = sender.try_send(lost.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::keys::Object;
    use crate::runtime::scripting::scripts;
    use crossbeam_channel::{Receiver, TryRecvError};

    fn loss(events: Option<Sender<LostLease>>) -> Loss {
        let keys = Arc::new(LockKeys::new(
            b"p:",
            b"n".to_vec(),
            "c",
            Object::Lock,
            &scripts::PLAIN,
        ));
        Loss::new(&keys, "Lock", 1, events)
    }

    fn channel(loss: &Loss, level: u64) -> Receiver<LostLease> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        loss.watch(level, Watcher::Guard(tx));
        rx
    }

    /// What `rx` is told: the reason of the one loss it was sent, then that it is closed.
    fn told(rx: &Receiver<LostLease>) -> (Option<LossReason>, TryRecvError) {
        let reason = rx.try_recv().ok().map(|l| l.reason());
        (reason, rx.try_recv().expect_err("one message at most"))
    }

    /// A loss tells every level's channel and the hook once, with the reason; a release
    /// only closes its own level's channel and never calls the hook; a channel asked for
    /// after the loss is told at once.
    #[test]
    fn a_loss_is_told_once_to_every_watcher_and_a_release_only_to_its_own() {
        let (tx, events) = crossbeam_channel::unbounded();
        let loss = loss(Some(tx));
        let (outer, inner) = (channel(&loss, 1), channel(&loss, 2));
        assert!(loss.is_watched());
        loss.released(2);
        assert_eq!(told(&inner), (None, TryRecvError::Disconnected));
        assert_eq!(outer.try_recv().map(drop), Err(TryRecvError::Empty));
        assert!(events.try_recv().is_err(), "a release is no loss");

        loss.mark(LossReason::Deleted);
        loss.mark(LossReason::LeaseExpired);
        let lost = Some(LossReason::Deleted);
        assert_eq!(told(&outer), (lost, TryRecvError::Disconnected));
        let heard: Vec<LossReason> = events.try_iter().map(|l| l.reason()).collect();
        assert_eq!(heard, [LossReason::Deleted], "once, with the first reason");
        let late = channel(&loss, 3);
        assert_eq!(told(&late), (lost, TryRecvError::Disconnected));
        assert_eq!(loss.gone_reason(1), LossReason::Deleted);
        assert_eq!(loss.gone_reason(2), LossReason::ServerLost);
    }

    /// A quorum's channel is told once fewer than the quorum of its members stand (of the
    /// member that tipped it), or its validity ends; released, it is only closed.
    #[test]
    fn a_quorum_is_lost_when_fewer_than_its_quorum_stand() {
        let expired = || Some(loss(None).lease(LossReason::LeaseExpired));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let quorum = Arc::new(Quorum::new(3, 2, tx, expired()));
        let members: Vec<Loss> = (0..3).map(|_| loss(None)).collect();
        for (level, m) in members.iter().enumerate() {
            m.watch(level as u64, Watcher::Quorum(quorum.clone()));
        }
        members[0].mark(LossReason::Deleted);
        assert_eq!(
            rx.try_recv().map(drop),
            Err(TryRecvError::Empty),
            "two of three stand"
        );
        members[1].mark(LossReason::ServerLost);
        let lost = Some(LossReason::ServerLost);
        assert_eq!(told(&rx), (lost, TryRecvError::Disconnected));

        let (tx, rx) = crossbeam_channel::bounded(1);
        let quorum = Quorum::new(2, 2, tx, expired());
        quorum.fire();
        let lost = Some(LossReason::LeaseExpired);
        assert_eq!(told(&rx), (lost, TryRecvError::Disconnected), "validity");

        let (tx, rx) = crossbeam_channel::bounded(1);
        let quorum = Quorum::new(2, 2, tx, expired());
        quorum.released();
        quorum.fire();
        assert_eq!(told(&rx), (None, TryRecvError::Disconnected), "released");

        let (tx, rx) = crossbeam_channel::bounded(1);
        let _short = Quorum::new(1, 2, tx, expired());
        let closed = (None, TryRecvError::Disconnected);
        assert_eq!(told(&rx), closed, "short from the start");
    }
}
