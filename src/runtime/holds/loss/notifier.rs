//! The loss thread and the hook thread of a client: the deadlines at which a hold may be
//! lost by the clock alone (nobody may be polling), and the calls of the client's
//! `on_lease_lost` hook.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crossbeam_channel::{never, select, Receiver, Sender};
use parking_lot::Mutex;

use super::{Hook, Loss, LostLease, Quorum};
use crate::runtime::keys::LockKeys;
use crate::Error;

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
