//! The per-client table of held locks, and the one thread that renews their leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::client::Inner;
use crate::scripts;

/// Keys renewed by one script call. Bounded so that one call never blocks Redis for long;
/// 1,000 locks still take only two round trips.
const RENEW_BATCH: usize = 500;

/// How a level of a lock keeps its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog while held.
    Watchdog,
    /// A fixed lease in milliseconds, never renewed.
    Fixed(u64),
}

struct Level {
    id: u64,
    lease: Lease,
}

/// What this process knows of one thread's hold on one lock.
struct Hold {
    // One per live guard, so that a nested release restores the lease the remaining
    // guards asked for, and the watchdog renews while any of them is a watchdog guard.
    levels: Vec<Level>,
    holder: Arc<str>,
    // Shared with the guards of this hold; a new outermost acquisition gets a new flag, so
    // a verdict about an old hold can never mark a newer one lost.
    lost: Arc<AtomicBool>,
}

/// What a guard keeps of its registration.
pub(crate) struct Registration {
    pub(crate) level: u64,
    pub(crate) lost: Arc<AtomicBool>,
}

pub(crate) struct Watchdog {
    // lock key -> thread token -> hold.
    holds: Mutex<HashMap<Vec<u8>, HashMap<u64, Hold>>>,
    next_level: AtomicU64,
    // Dropped with the client: the thread's receiver then disconnects and it exits at once.
    stop: OnceLock<Sender<()>>,
}

impl Watchdog {
    pub(crate) fn new() -> Watchdog {
        Watchdog {
            holds: Mutex::new(HashMap::new()),
            next_level: AtomicU64::new(1),
            stop: OnceLock::new(),
        }
    }

    /// Records a granted acquisition whose reentry count is now `count`. Runs on the
    /// acquiring thread before the guard exists, so a lock is never held unregistered.
    pub(crate) fn acquired(
        &self,
        client: &Arc<Inner>,
        key: &[u8],
        token: u64,
        holder: &str,
        count: i64,
        lease: Lease,
    ) -> Registration {
        let level = self.next_level.fetch_add(1, Ordering::Relaxed);
        let lost = {
            let mut holds = self.holds.lock();
            let by_token = match holds.get_mut(key) {
                Some(by_token) => by_token,
                None => holds.entry(key.to_vec()).or_default(),
            };
            let fresh = || Hold {
                levels: Vec::with_capacity(2),
                holder: Arc::from(holder),
                lost: Arc::new(AtomicBool::new(false)),
            };
            let hold = by_token.entry(token).or_insert_with(fresh);
            if count == 1 {
                // Redis says this is an outermost acquisition: whatever was recorded
                // belongs to an earlier hold whose lease is gone.
                *hold = fresh();
            }
            hold.levels.push(Level { id: level, lease });
            hold.lost.clone()
        };
        if lease == Lease::Watchdog {
            self.start(client);
        }
        Registration { level, lost }
    }

    /// The levels this thread holds of the lock, as far as this process knows: what the
    /// acquire script is told, so that a repeated call cannot count a level twice.
    pub(crate) fn levels(&self, key: &[u8], token: u64) -> usize {
        let holds = self.holds.lock();
        holds
            .get(key)
            .and_then(|by_token| by_token.get(&token))
            .filter(|hold| !hold.lost.load(Ordering::SeqCst))
            .map_or(0, |hold| hold.levels.len())
    }

    /// Forgets the guard `level`; after this returns the watchdog never renews on its
    /// behalf. Returns the lease to restore for the levels this thread still holds and
    /// how many levels it held before this release, or `None` when the guard's hold is
    /// already over (lost or superseded).
    pub(crate) fn releasing(
        &self,
        key: &[u8],
        token: u64,
        level: u64,
        watchdog_ms: u64,
    ) -> Option<(u64, usize)> {
        let mut holds = self.holds.lock();
        let by_token = holds.get_mut(key)?;
        let hold = by_token.get_mut(&token)?;
        let at = hold.levels.iter().position(|l| l.id == level)?;
        let held = hold.levels.len();
        hold.levels.remove(at);
        let restore = if hold.levels.iter().any(|l| l.lease == Lease::Watchdog) {
            watchdog_ms
        } else {
            match hold.levels.last() {
                Some(Level {
                    lease: Lease::Fixed(ms),
                    ..
                }) => *ms,
                _ => watchdog_ms,
            }
        };
        if hold.levels.is_empty() {
            by_token.remove(&token);
            if by_token.is_empty() {
                holds.remove(key);
            }
        }
        Some((restore, held))
    }

    fn watched(&self) -> Vec<(Vec<u8>, Arc<str>, Arc<AtomicBool>)> {
        let holds = self.holds.lock();
        holds
            .iter()
            .flat_map(|(key, by_token)| {
                by_token
                    .values()
                    .filter(|h| h.levels.iter().any(|l| l.lease == Lease::Watchdog))
                    .map(move |h| (key.clone(), h.holder.clone(), h.lost.clone()))
            })
            .collect()
    }

    fn forget_lost(&self, key: &[u8], lost: &Arc<AtomicBool>) {
        let mut holds = self.holds.lock();
        if let Some(by_token) = holds.get_mut(key) {
            by_token.retain(|_, h| !Arc::ptr_eq(&h.lost, lost));
            if by_token.is_empty() {
                holds.remove(key);
            }
        }
    }

    fn start(&self, client: &Arc<Inner>) {
        self.stop.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::bounded(0);
            let weak = Arc::downgrade(client);
            thread::Builder::new()
                .name("redmutex-watchdog".to_owned())
                .spawn(move || run(weak, rx))
                .expect("failed to spawn the redmutex watchdog thread");
            tx
        });
    }
}

fn run(client: Weak<Inner>, stop: Receiver<()>) {
    loop {
        let period = match client.upgrade() {
            Some(inner) => inner.config.watchdog_timeout / 3,
            None => return,
        };
        match stop.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(inner) = client.upgrade() else {
            return;
        };
        if !inner.has_handles() {
            // Every Client and Lock is gone; only guards (perhaps forgotten ones) remain.
            // Their leases run out within a watchdog timeout.
            return;
        }
        renew_all(&inner);
    }
}

/// One renewal round: every watchdog hold, in batches of one script call each. A batch
/// that fails (Redis unreachable) is simply tried again next round; its leases still have
/// two thirds of their time left.
pub(crate) fn renew_all(inner: &Inner) {
    let watched = inner.watchdog.watched();
    let lease_ms = crate::lock::millis(inner.config.watchdog_timeout);
    for batch in watched.chunks(RENEW_BATCH) {
        let mut call = scripts::RENEW.prepare_invoke();
        for (key, _, _) in batch {
            call.key(key.as_slice());
        }
        call.arg(lease_ms);
        for (_, holder, _) in batch {
            call.arg(holder.as_ref());
        }
        match inner.run(|con| call.invoke::<Vec<usize>>(con)) {
            Ok(lost) => {
                for i in lost {
                    let Some((key, _, flag)) = i.checked_sub(1).and_then(|i| batch.get(i)) else {
                        continue;
                    };
                    log::warn!(
                        "redmutex: lease of lock {:?} lost (expired, force-unlocked or Redis lost it)",
                        String::from_utf8_lossy(key)
                    );
                    flag.store(true, Ordering::SeqCst);
                    inner.watchdog.forget_lost(key, flag);
                }
            }
            Err(e) => log::warn!("redmutex: lease renewal failed, retrying next round: {e}"),
        }
    }
}
