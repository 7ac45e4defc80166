//! Loss pushed to the holder: the flag the guards of one hold share, the channels and
//! quorum counts waiting on it, the thread that marks a hold lost once its time is up
//! (nobody may be polling), and the thread that calls the client's `on_lease_lost` hook.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel::{never, select, Receiver, Sender};
use parking_lot::Mutex;

use crate::runtime::holds::lost_lease::{LossReason, LostLease};
use crate::runtime::keys::LockKeys;
use crate::runtime::telemetry;
use crate::Error;

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

/// A deadline the loss thread keeps: when a hold may be lost by the clock alone, or when a
/// `MultiLockGuard`'s validity ends.
pub(crate) enum Timed {
    Hold {
        keys: Arc<LockKeys>,
        token: u64,
        loss: Weak<Loss>,
    },
    Quorum(Weak<Quorum>),
}

struct Timer {
    at: Instant,
    seq: u64,
    what: Timed,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Timer) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Timer {}

impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Timer) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timer {
    // Reversed: the heap's top is the earliest.
    fn cmp(&self, other: &Timer) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Timers {
    heap: BinaryHeap<Timer>,
    // When the thread wakes by itself next: `None` while it sleeps with no deadline. A
    // deadline pushed earlier than this wakes it.
    planned: Option<Instant>,
    // Past this many timers, those of holds already gone are dropped: a released hold's
    // timer otherwise stays until its deadline, which a long fixed lease puts far off.
    prune_at: usize,
}

/// The fewest timers kept before pruning.
const PRUNE_FROM: usize = 1024;

impl Timer {
    fn is_live(&self) -> bool {
        match &self.what {
            Timed::Hold { loss, .. } => loss.strong_count() > 0,
            Timed::Quorum(q) => q.strong_count() > 0,
        }
    }
}

/// What the loss thread works for: its client, as far as the thread needs it (the client's
/// holds table). The thread holds it by a `Weak`, and ends once the client is gone.
pub(crate) trait LossSource: Send + Sync {
    /// The client's loss thread's handle, with its timers and its hook.
    fn notifier(&self) -> &Notifier;
    /// Marks the hold `loss` belongs to lost if its time is up, or returns when to look
    /// again (see `HoldTable::check_loss`).
    fn check_loss(
        &self,
        keys: &LockKeys,
        token: u64,
        loss: &Arc<Loss>,
        popped: Option<Instant>,
    ) -> Option<Instant>;
}

/// The loss thread of a client: a thread of its own rather than the renewal thread, so that
/// a renewal call stuck on a frozen server does not hold back other holds' deadlines. With
/// an `on_lease_lost` hook, also the client's hook thread: the hook runs there, not on the
/// loss thread, so that a slow hook delays only the hook's later calls, never a hold being
/// marked lost (nor a renewal).
pub(crate) struct Notifier {
    hook: Option<Hook>,
    // Losses queued for the hook thread, in the order the holds were marked lost. The
    // thread ends once every sender is gone: this one and those of the holds' `Loss`es,
    // all gone with the client (guards keep it).
    events: Option<(Sender<LostLease>, Receiver<LostLease>)>,
    timers: Mutex<Timers>,
    seq: AtomicU64,
    // The running thread and the sender that wakes it; dropped with the client, which
    // ends the thread.
    thread: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
    // The hook thread, once started.
    hook_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Notifier {
    pub(crate) fn new(hook: Option<Hook>) -> Notifier {
        Notifier {
            events: hook.as_ref().map(|_| crossbeam_channel::unbounded()),
            hook,
            timers: Mutex::new(Timers {
                heap: BinaryHeap::new(),
                planned: None,
                prune_at: PRUNE_FROM,
            }),
            seq: AtomicU64::new(0),
            thread: Mutex::new(None),
            hook_thread: Mutex::new(None),
        }
    }

    /// Whether every hold needs its deadline kept (a hook must hear of every loss).
    pub(crate) fn has_hook(&self) -> bool {
        self.hook.is_some()
    }

    /// Where a hold's loss is sent for the hook, if there is one.
    pub(crate) fn events(&self) -> Option<Sender<LostLease>> {
        self.events.as_ref().map(|(tx, _)| tx.clone())
    }

    /// Makes sure the loss thread runs (again, if it died), and the hook thread if there
    /// is a hook.
    pub(crate) fn ensure_running<C: LossSource + 'static>(
        &self,
        client: &Arc<C>,
    ) -> Result<(), Error> {
        self.ensure_hook_running()?;
        let mut thread = self.thread.lock();
        if let Some((_, handle)) = &*thread {
            if !handle.is_finished() {
                return Ok(());
            }
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let weak: Weak<dyn LossSource> = Arc::downgrade(client) as Weak<C>;
        let handle = thread::Builder::new()
            .name("redmutex-loss".to_owned())
            .spawn(move || run(weak, rx))
            .map_err(Error::Thread)?;
        *thread = Some((tx, handle));
        // Deadlines pushed while no thread ran are looked at now.
        self.timers.lock().planned = None;
        drop(thread);
        self.wake();
        Ok(())
    }

    /// Makes sure the hook thread runs, if there is a hook. It holds the hook and the
    /// receiving end of the losses, nothing of the client, so it ends by itself once the
    /// client is gone and the losses queued before are told.
    fn ensure_hook_running(&self) -> Result<(), Error> {
        let (Some(hook), Some((_, events))) = (&self.hook, &self.events) else {
            return Ok(());
        };
        let mut thread = self.hook_thread.lock();
        if thread.as_ref().is_some_and(|handle| !handle.is_finished()) {
            return Ok(());
        }
        let (hook, events) = (hook.clone(), events.clone());
        let handle = thread::Builder::new()
            .name("redmutex-hook".to_owned())
            .spawn(move || call_hook(&hook, &events))
            .map_err(Error::Thread)?;
        *thread = Some(handle);
        Ok(())
    }

    /// Keeps `what` until `at`, when the thread looks at it.
    pub(crate) fn push(&self, at: Instant, what: Timed) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut timers = self.timers.lock();
        if timers.heap.len() >= timers.prune_at {
            timers.heap.retain(Timer::is_live);
            timers.prune_at = PRUNE_FROM.max(2 * timers.heap.len());
        }
        timers.heap.push(Timer { at, seq, what });
        let wake = timers.planned.is_none_or(|planned| at < planned);
        if wake {
            timers.planned = Some(at);
        }
        drop(timers);
        if wake {
            self.wake();
        }
    }

    #[cfg(test)]
    pub(crate) fn timers(&self) -> usize {
        self.timers.lock().heap.len()
    }

    fn wake(&self) {
        if let Some((wake, _)) = &*self.thread.lock() {
            let _ = wake.try_send(());
        }
    }

    /// The timers due by now, each with its instant.
    fn due(&self) -> Vec<(Instant, Timed)> {
        let now = Instant::now();
        let mut timers = self.timers.lock();
        let mut due = Vec::new();
        while timers.heap.peek().is_some_and(|t| t.at <= now) {
            if let Some(t) = timers.heap.pop() {
                due.push((t.at, t.what));
            }
        }
        // Awake: deadlines pushed from now on are found by `next` before it sleeps.
        timers.planned = Some(now);
        due
    }

    /// When the thread must wake next, published so that an earlier deadline wakes it.
    fn next(&self) -> Option<Instant> {
        let mut timers = self.timers.lock();
        let next = timers.heap.peek().map(|t| t.at);
        timers.planned = next;
        next
    }
}

/// The hook thread: calls the hook for each loss, in order, until every sender is gone.
fn call_hook(hook: &Hook, events: &Receiver<LostLease>) {
    for lost in events {
        // A panicking hook must not end the notifications of later losses.
        if catch_unwind(AssertUnwindSafe(|| hook(&lost))).is_err() {
            tracing::error!(
                target: "redmutex",
                "redmutex: the on_lease_lost hook panicked"
            );
        }
    }
}

fn run(client: Weak<dyn LossSource>, wake: Receiver<()>) {
    loop {
        let next = match client.upgrade() {
            Some(inner) => inner.notifier().next(),
            None => return,
        };
        let timeout = next.map_or_else(never, crossbeam_channel::at);
        select! {
            recv(wake) -> woken => {
                if woken.is_err() {
                    return;
                }
            }
            recv(timeout) -> _ => {}
        }
        let Some(inner) = client.upgrade() else {
            return;
        };
        let notifier = inner.notifier();
        for (popped, what) in notifier.due() {
            match what {
                Timed::Hold { keys, token, loss } => {
                    let Some(loss) = loss.upgrade() else {
                        continue;
                    };
                    let next = inner.check_loss(&keys, token, &loss, Some(popped));
                    if let Some(at) = next {
                        notifier.push(
                            at,
                            Timed::Hold {
                                keys,
                                token,
                                loss: Arc::downgrade(&loss),
                            },
                        );
                    }
                }
                Timed::Quorum(q) => {
                    if let Some(q) = q.upgrade() {
                        q.fire();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::keys::Object;
    use crate::runtime::scripting::scripts;
    use crossbeam_channel::TryRecvError;

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
