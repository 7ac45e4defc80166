//! The client's one pub/sub connection: refcounted channel subscriptions that wake waiters.

use std::collections::HashMap;
use std::sync::{Arc, Once, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::client::Inner;
use crate::pool::Manager;

/// How long the reader blocks on the socket before checking whether the client is gone.
/// Reading the socket is free: no command is sent.
const READ_TICK: Duration = Duration::from_secs(1);
/// Silence after which the reader PINGs, so a dead connection is noticed and replaced.
const HEALTH_CHECK_AFTER: Duration = Duration::from_secs(10);
/// How long a channel nobody waits on stays subscribed: a busy lock is waited on again
/// and again, and each resubscription would cost two commands.
const LINGER: Duration = Duration::from_secs(5);
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) struct Subscriber {
    shared: Arc<Shared>,
    started: Once,
}

struct Shared {
    manager: Manager,
    // Private to this client: waiters publish here to make the reader, blocked on the
    // socket, come back and subscribe their channels (it alone owns the connection).
    control: Vec<u8>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    channels: HashMap<Vec<u8>, Entry>,
    // Channels the reader must still SUBSCRIBE in the current session.
    pending: Vec<Vec<u8>>,
    connected: bool,
}

struct Entry {
    refs: usize,
    idle_since: Option<Instant>,
    // SUBSCRIBE requested in the current session (queued or sent).
    requested: bool,
    waiters: Arc<Waiters>,
}

/// The threads of this process waiting on one channel.
struct Waiters {
    // Capacity one: a release wakes exactly one waiting thread, and a release that comes
    // while no thread is inside `recv` stays here for the next one instead of being lost.
    wake_tx: Sender<()>,
    wake_rx: Receiver<()>,
    // A latch: its sender is dropped once the server confirmed the subscription, which
    // wakes every thread waiting for that at once. Re-armed when the connection drops.
    confirmed: Mutex<(Option<Sender<()>>, Receiver<()>)>,
}

impl Waiters {
    fn new() -> Waiters {
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let (tx, rx) = crossbeam_channel::bounded(0);
        Waiters {
            wake_tx,
            wake_rx,
            confirmed: Mutex::new((Some(tx), rx)),
        }
    }

    fn confirm(&self) {
        self.confirmed.lock().0 = None;
    }

    fn rearm(&self) {
        let mut latch = self.confirmed.lock();
        if latch.0.is_none() {
            let (tx, rx) = crossbeam_channel::bounded(0);
            *latch = (Some(tx), rx);
        }
    }

    fn wake_one(&self) {
        let _ = self.wake_tx.try_send(());
    }
}

/// A thread's interest in one channel; dropping it gives the interest up.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: Vec<u8>,
    waiters: Arc<Waiters>,
}

impl Subscription {
    /// Blocks until the server confirmed the subscription (true) or `until` (false).
    pub(crate) fn wait_confirmed(&self, until: Instant) -> bool {
        let rx = self.waiters.confirmed.lock().1.clone();
        matches!(rx.recv_deadline(until), Err(RecvTimeoutError::Disconnected))
    }

    /// Blocks until a release of this channel wakes this thread (true) or `until` (false).
    pub(crate) fn wait_release(&self, until: Instant) -> bool {
        self.waiters.wake_rx.recv_deadline(until).is_ok()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        if let Some(entry) = state.channels.get_mut(&self.channel) {
            if Arc::ptr_eq(&entry.waiters, &self.waiters) {
                entry.refs -= 1;
                if entry.refs == 0 {
                    entry.idle_since = Some(Instant::now());
                    // A release meant for this thread must not linger and wake the next
                    // waiter spuriously.
                    let _ = entry.waiters.wake_rx.try_recv();
                }
            }
        }
    }
}

impl Subscriber {
    pub(crate) fn new(manager: Manager, prefix: &[u8], client_id: &str) -> Subscriber {
        let mut control = prefix.to_vec();
        control.extend_from_slice(b"__control:");
        control.extend_from_slice(client_id.as_bytes());
        Subscriber {
            shared: Arc::new(Shared {
                manager,
                control,
                state: Mutex::new(State::default()),
            }),
            started: Once::new(),
        }
    }

    /// Registers interest in `channel`; a SUBSCRIBE is sent only when this process was not
    /// already subscribed. `client` is used to nudge the reader thread.
    pub(crate) fn subscribe(&self, client: &Inner, channel: &[u8]) -> Subscription {
        let (waiters, nudge) = {
            let mut guard = self.shared.state.lock();
            let state = &mut *guard;
            let entry = match state.channels.get_mut(channel) {
                Some(entry) => entry,
                None => state.channels.entry(channel.to_vec()).or_insert(Entry {
                    refs: 0,
                    idle_since: None,
                    requested: false,
                    waiters: Arc::new(Waiters::new()),
                }),
            };
            entry.refs += 1;
            entry.idle_since = None;
            let mut nudge = false;
            if !entry.requested {
                entry.requested = true;
                state.pending.push(channel.to_vec());
                // While disconnected the reader subscribes everything on its next session.
                nudge = state.connected;
            }
            (entry.waiters.clone(), nudge)
        };
        self.started.call_once(|| {
            let weak = Arc::downgrade(&self.shared);
            thread::Builder::new()
                .name("redmutex-pubsub".to_owned())
                .spawn(move || run(weak))
                .expect("failed to spawn the redmutex pub/sub thread");
        });
        if nudge {
            let control = self.shared.control.as_slice();
            if let Err(e) =
                client.run(|con| redis::cmd("PUBLISH").arg(control).arg("s").query::<()>(con))
            {
                // The waiter still wakes when the holder's lease runs out.
                log::debug!("redmutex: could not nudge the pub/sub thread: {e}");
            }
        }
        Subscription {
            shared: self.shared.clone(),
            channel: channel.to_vec(),
            waiters,
        }
    }
}

fn run(shared: Weak<Shared>) {
    let mut backoff = Duration::from_millis(10);
    let mut reconnect = false;
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let con = strong.manager.connect();
        drop(strong);
        match con {
            Ok(mut con) => {
                backoff = Duration::from_millis(10);
                match session(&shared, &mut con, reconnect) {
                    Ok(()) => return,
                    Err(e) => log::warn!("redmutex: pub/sub connection lost, reconnecting: {e}"),
                }
                reconnect = true;
                if let Some(strong) = shared.upgrade() {
                    strong.disconnected();
                }
            }
            Err(e) => {
                log::warn!("redmutex: pub/sub connection failed, retrying in {backoff:?}: {e}");
                thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
            }
        }
    }
}

/// Serves one connection until it fails (`Err`) or the client is gone (`Ok`).
fn session(
    shared: &Weak<Shared>,
    con: &mut redis::Connection,
    reconnect: bool,
) -> redis::RedisResult<()> {
    con.set_read_timeout(Some(READ_TICK))?;
    let mut pubsub = con.as_pubsub();
    {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        let channels = strong.begin_session();
        let mut all = channels.clone();
        all.push(strong.control.clone());
        pubsub.subscribe(&all)?;
        strong.confirmed(&channels, reconnect);
    }
    let mut last_heard = Instant::now();
    loop {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        let pending = strong.take_pending();
        if !pending.is_empty() {
            pubsub.subscribe(&pending)?;
            strong.confirmed(&pending, false);
        }
        let idle = strong.take_idle();
        if !idle.is_empty() {
            pubsub.unsubscribe(&idle)?;
        }
        // Never block on the socket holding a strong reference: the client must be able
        // to go away meanwhile.
        drop(strong);
        match pubsub.get_message() {
            Ok(msg) => {
                last_heard = Instant::now();
                let channel: Vec<u8> = msg.get_channel()?;
                if let Some(strong) = shared.upgrade() {
                    strong.released(&channel);
                }
            }
            Err(e) if e.is_timeout() => {
                if last_heard.elapsed() >= HEALTH_CHECK_AFTER {
                    pubsub.ping::<redis::Value>()?;
                    last_heard = Instant::now();
                }
            }
            Err(e) => return Err(e),
        }
    }
}

impl Shared {
    /// Everything to subscribe on a new connection; the pending queue is subsumed by it.
    fn begin_session(&self) -> Vec<Vec<u8>> {
        let mut state = self.state.lock();
        state.pending.clear();
        state.connected = true;
        state
            .channels
            .iter_mut()
            .map(|(channel, entry)| {
                entry.requested = true;
                channel.clone()
            })
            .collect()
    }

    fn confirmed(&self, channels: &[Vec<u8>], reconnect: bool) {
        let state = self.state.lock();
        for channel in channels {
            if let Some(entry) = state.channels.get(channel) {
                entry.waiters.confirm();
                if reconnect {
                    // A release published while we were disconnected was never seen: let
                    // one waiter per lock look again.
                    entry.waiters.wake_one();
                }
            }
        }
    }

    fn take_pending(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.state.lock().pending)
    }

    fn take_idle(&self) -> Vec<Vec<u8>> {
        let mut state = self.state.lock();
        let mut idle = Vec::new();
        state
            .channels
            .retain(|channel, entry| match entry.idle_since {
                Some(since) if entry.refs == 0 && since.elapsed() >= LINGER => {
                    if entry.requested {
                        idle.push(channel.clone());
                    }
                    false
                }
                _ => true,
            });
        if !idle.is_empty() {
            state.pending.retain(|c| !idle.contains(c));
        }
        idle
    }

    fn released(&self, channel: &[u8]) {
        if let Some(entry) = self.state.lock().channels.get(channel) {
            if entry.refs > 0 {
                entry.waiters.wake_one();
            }
        }
    }

    fn disconnected(&self) {
        let mut state = self.state.lock();
        state.connected = false;
        state.pending.clear();
        for entry in state.channels.values_mut() {
            entry.requested = false;
            entry.waiters.rearm();
        }
    }
}
