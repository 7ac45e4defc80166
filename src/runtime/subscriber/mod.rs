//! The client's pub/sub connections: refcounted channel subscriptions that wake waiters.
//! One classic connection (`SUBSCRIBE`) for the client's own channel and every channel on
//! a single server or a Sentinel service; on a Redis Cluster with sharded pub/sub, a lock
//! queue's channels are listened to on the primaries that own their slots (`shards/`).
//!
//! The map: the subscriber's API, what waiters and the acquisition path call, is here;
//! a waiter's handle on one channel is `subscription.rs`; the reader thread that owns the
//! classic connection is `reader.rs`; the state the API and the readers share, and the
//! dispatch of what the readers hear to the waiting threads, is `dispatch.rs`; the
//! waiting threads of one channel are `waiters.rs`.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use parking_lot::Mutex;

use crate::runtime::connection::con::NodeAddr;
use crate::runtime::connection::executor::Executor;
use crate::runtime::connection::pool::Manager;
use crate::runtime::scripting::queue::Notice;
use crate::Error;

use self::dispatch::{Entry, Shared, State};
use self::shards::Shards;
use self::waiters::Waiters;

pub(crate) use self::subscription::Subscription;

mod dispatch;
mod reader;
mod shards;
mod subscription;
mod waiters;

/// How long the reader gives a reply, and blocks on the socket before checking whether
/// the client is gone. Reading the socket is free: no command is sent.
const READ_TICK: Duration = Duration::from_secs(1);
/// How long the reader blocks on a quiet socket before checking whether the client is
/// gone: a dropped client's threads all end within a second (four wake-ups a second of an
/// idle client cost nothing on the server).
const IDLE_READ_TICK: Duration = Duration::from_millis(250);
/// The read tick while the server refuses the client's own channel: no waiter can nudge
/// the reader there, so it looks for new channels to subscribe this often instead.
const UNNUDGED_READ_TICK: Duration = Duration::from_millis(50);
/// Silence after which the reader PINGs, so a dead connection is noticed and replaced.
const HEALTH_CHECK_AFTER: Duration = Duration::from_secs(10);
/// How long a channel nobody waits on stays subscribed: a busy lock is waited on again
/// and again, and each resubscription would cost two commands.
const LINGER: Duration = Duration::from_secs(5);
/// Lingering channels are looked through at most this often: the reader looks for them
/// once per message, and a client may have waited on thousands of locks.
const IDLE_CHECK_GAP: Duration = Duration::from_millis(500);
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(1);
/// Under Sentinel, how often the reader asks the sentinels which node is the primary: a
/// failover that left our connection up (to a node now demoted, or cut off) would
/// otherwise leave waiters listening where no release is published any more.
const PRIMARY_CHECK: Duration = Duration::from_secs(2);
/// A message for every thread waiting on its channel, whichever it is; they look again.
pub(crate) const BROADCAST: &[u8] = b"*";

/// Who is told of a `force_unlock` of one of the client's holds, heard on the client's own
/// channel: the client, held by a `Weak` so that the reader never keeps it alive.
pub(crate) trait ForceUnlocked: Send + Sync {
    /// The `force_unlock` freed the holder `token` of `key` (see
    /// `HoldTable::force_unlocked`).
    fn force_unlocked(&self, key: &[u8], token: u64);

    /// A `force_unlock` of any of the client's holds may have been told to nobody: they
    /// were taken, or held, while the client did not listen on its own channel (its
    /// pub/sub connection down or not made yet). Every hold is to be checked against
    /// Redis at once (see `Watchdog::check_holds`).
    fn unheard(self: Arc<Self>);
}

/// A client's subscriber: the state its waiters and readers share, and its reader thread.
pub(crate) struct Subscriber {
    shared: Arc<Shared>,
    // The reader thread, started by the first waiter and again if it ever died.
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What a client's own channel's name starts with, its client id following: the channel
/// its reader always listens on (see `lua/force_unlock.lua`).
pub(crate) fn own_channel_prefix(key_prefix: &[u8]) -> Vec<u8> {
    [key_prefix, b"__control:"].concat()
}

impl Subscriber {
    pub(crate) fn new(manager: Manager, prefix: &[u8], client_id: &str) -> Subscriber {
        let mut control = own_channel_prefix(prefix);
        control.extend_from_slice(client_id.as_bytes());
        let sharding = manager.target.is_cluster();
        Subscriber {
            shared: Arc::new(Shared {
                manager,
                control,
                client: OnceLock::new(),
                listening: Mutex::new({
                    let (tx, rx) = crossbeam_channel::bounded(0);
                    (Some(tx), rx)
                }),
                listening_since: Mutex::new(None),
                refused: Mutex::new(None),
                warned: AtomicBool::new(false),
                sharding: AtomicBool::new(sharding),
                state: Mutex::new(State::default()),
            }),
            thread: Mutex::new(None),
        }
    }

    /// `client` is about to hold something: makes sure the reader runs, so that it listens
    /// on the client's own channel, where a `force_unlock` of any of its holds is told.
    /// Sends nothing on the caller's connection: the reader subscribes once per
    /// connection.
    ///
    /// Until the server has first answered that subscription (or the reader failed to
    /// make its first connection), waits for it, at most until `until`: called before an
    /// acquisition sends anything, so that a hold it takes is granted while a
    /// `force_unlock` of it is heard (and a refusal fails it before anything is written,
    /// see [`Subscriber::refusal`]); called again once it holds (the wait is then the
    /// rest of the call's bound), so that a refusal that comes meanwhile has its hold
    /// given back. A call whose wait ends unanswered goes on: its holds are checked
    /// against Redis once the subscription is confirmed (see [`Subscriber::held`]). The
    /// set-up happens once, with the first acquisitions, not at some later moment of the
    /// client's traffic.
    pub(crate) fn listen<C: ForceUnlocked + 'static>(&self, client: &Arc<C>, until: Instant) {
        if !self.start(client) {
            return;
        }
        let rx = self.shared.listening.lock().1.clone();
        if let Err(RecvTimeoutError::Timeout) = rx.recv_deadline(until) {
            // Redis is slow: the reader keeps trying on its own, and the client's holds
            // are checked once it listens.
            tracing::debug!(
                target: "redmutex",
                "redmutex: the client's own channel is not subscribed yet"
            );
        }
    }

    /// `client` was granted a hold (now in its table) by a call sent at `sent`: if the
    /// server had not confirmed the client's own channel by then, a `force_unlock` of the
    /// hold may have been published to nobody, and its holds are checked against Redis
    /// as soon as the subscription is confirmed (now, if it is). Sends nothing itself.
    pub(crate) fn held<C: ForceUnlocked + 'static>(&self, client: &Arc<C>, sent: Instant) {
        if !self.start(client) {
            return;
        }
        let since = *self.shared.listening_since.lock();
        match since {
            // Confirmed before the grant was sent, on the connection still up: the server
            // ran the SUBSCRIBE before the grant, so a force_unlock after it is heard.
            Some(at) if at < sent => {}
            // Confirmed since: perhaps after a force_unlock right after the grant.
            Some(_) => client.clone().unheard(),
            // The confirmation to come checks every hold, this one with them: it was put
            // in the table before this look.
            None => {}
        }
    }

    /// Makes sure the reader runs for `client` (told of `force_unlock`s from now on),
    /// waiting for nothing; false when it cannot be started.
    pub(crate) fn start<C: ForceUnlocked + 'static>(&self, client: &Arc<C>) -> bool {
        if self.shared.client.get().is_none() {
            let weak: Weak<dyn ForceUnlocked> = Arc::downgrade(client) as Weak<C>;
            let _ = self.shared.client.set(weak);
        }
        if let Err(e) = self.ensure_running() {
            // Its renewals still find a force_unlock, a third of the lease later.
            tracing::warn!(
                target: "redmutex",
                error = %e,
                "redmutex: cannot start the pub/sub thread"
            );
            return false;
        }
        true
    }

    /// The server's ACL refusal of the client's own channel, while it stands, as the
    /// error a refused command gets: a client that cannot be told of a `force_unlock` of
    /// its holds must not hold anything (its acquisitions fail with it; the reader asks
    /// again meanwhile, so a corrected ACL is taken up within a second).
    pub(crate) fn refusal(&self) -> Option<Error> {
        let refused = self.shared.refused.lock();
        refused.as_ref().map(|e| self.shared.explain(e))
    }

    /// Starts the reader thread, or starts it again if it died (a reader that died leaves
    /// waiters to their lease timers only, so it must not stay dead).
    fn ensure_running(&self) -> Result<(), Error> {
        let mut thread = self.thread.lock();
        if let Some(handle) = &*thread {
            if !handle.is_finished() {
                return Ok(());
            }
            tracing::warn!(
                target: "redmutex",
                "redmutex: the pub/sub thread had stopped; starting it again"
            );
            self.shared.disconnected();
        }
        let weak = Arc::downgrade(&self.shared);
        let handle = thread::Builder::new()
            .name("redmutex-pubsub".to_owned())
            .spawn(move || reader::run(weak))
            .map_err(Error::Thread)?;
        *thread = Some(handle);
        Ok(())
    }

    /// Registers thread `token`'s interest in `channel` if this process is subscribed to it
    /// already (or still lingering on it): no command is sent. `None` otherwise.
    pub(crate) fn rejoin(&self, channel: &[u8], token: u64) -> Option<Subscription> {
        let mut state = self.shared.state.lock();
        let entry = state.channels.get_mut(channel)?;
        if !entry.requested {
            return None;
        }
        drop(state);
        self.ensure_running().ok()?;
        let mut state = self.shared.state.lock();
        let entry = state.channels.get_mut(channel)?;
        entry.refs += 1;
        entry.idle_since = None;
        let waiters = entry.waiters.clone();
        drop(state);
        Some(self.slot(channel, waiters, token))
    }

    fn slot(&self, channel: &[u8], waiters: Arc<Waiters>, token: u64) -> Subscription {
        let (tx, notices) = crossbeam_channel::unbounded();
        waiters.slots.lock().insert(token, tx);
        Subscription {
            shared: self.shared.clone(),
            channel: channel.to_vec(),
            waiters,
            token,
            notices,
        }
    }

    /// Delivers the messages `told` of a script this client ran, for its own threads
    /// waiting on `channel` (a release hands the lock to them without publishing: see
    /// `lua/queue.lua`'s `Q.hand_on`), exactly as if they had been published: a thread no
    /// longer waiting is handled as it is for a published message.
    pub(crate) fn deliver_own(&self, channel: &[u8], told: &[Vec<u8>]) {
        for payload in told {
            self.shared.deliver(channel, payload);
        }
    }

    /// Tells every thread of this client waiting on `channel` to try again.
    pub(crate) fn recheck_all(&self, channel: &[u8]) {
        if let Some(waiters) = self.shared.waiters_of(channel) {
            waiters.recheck_all();
        }
    }

    /// Tells thread `token`, if it waits on `channel`, to try again.
    pub(crate) fn recheck(&self, channel: &[u8], token: u64) {
        if let Some(waiters) = self.shared.waiters_of(channel) {
            waiters.notify(token, Notice::Recheck);
        }
    }

    /// Registers thread `token`'s interest in `channel`; a SUBSCRIBE is sent only when this
    /// process was not already subscribed. `client` (the client's executor) is used to
    /// nudge the reader thread, giving up at `until`. `queue`: the channel is one a lock's
    /// queue tells its waiters on, which on a cluster with sharded pub/sub is listened to
    /// on its slot's primary (see `shards/`; a latch's is not: its opening is published
    /// the classic way).
    pub(crate) fn subscribe(
        &self,
        client: &Executor,
        channel: &[u8],
        token: u64,
        until: Option<Instant>,
        queue: bool,
    ) -> Result<Subscription, Error> {
        // FCALL refused is the sign of a server before 7.0, without sharded pub/sub either.
        let shard = if queue && client.scripting.uses_functions() {
            Shards::of(&self.shared).shard_for(channel, until)
        } else {
            None
        };
        let (waiters, nudge) = self.count_interest(channel, shard);
        // From here on the interest is counted: dropping this gives it back, also when
        // the thread cannot be started.
        let subscription = self.slot(channel, waiters, token);
        self.ensure_running()?;
        if let Some((command, to)) = nudge {
            nudge_reader(client, channel, command, &to, until);
        }
        Ok(subscription)
    }

    /// Counts one more interest in `channel` (listened to on `shard`'s link, or the
    /// classic way) and decides whether the channel is to be subscribed now: then it is
    /// queued for its reader, and the nudge that makes the reader come back for it is
    /// returned (the command and the channel to publish it to), unless the reader looks
    /// by itself (disconnected, or its own channel refused).
    fn count_interest(
        &self,
        channel: &[u8],
        shard: Option<NodeAddr>,
    ) -> (Arc<Waiters>, Option<(&'static str, Vec<u8>)>) {
        let mut guard = self.shared.state.lock();
        let state = &mut *guard;
        let entry = match state.channels.get_mut(channel) {
            Some(entry) => entry,
            None => state.channels.entry(channel.to_vec()).or_insert(Entry {
                refs: 0,
                idle_since: None,
                requested: false,
                waiters: Arc::new(Waiters::new(shard.is_some())),
                shard,
                lapsed: false,
            }),
        };
        entry.refs += 1;
        entry.idle_since = None;
        let waiters = entry.waiters.clone();
        let mut nudge = None;
        if !entry.requested {
            match entry.shard.clone() {
                None => {
                    entry.requested = true;
                    state.pending.push(channel.to_vec());
                    // While disconnected the reader subscribes everything on its next
                    // session; while its own channel is refused it looks without a
                    // nudge.
                    if state.connected && self.shared.refused.lock().is_none() {
                        nudge = Some(("PUBLISH", self.shared.control.clone()));
                    }
                }
                Some(node) => {
                    nudge = Shards::of(&self.shared)
                        .route(state, channel, &node)
                        .map(|to| ("SPUBLISH", to));
                }
            }
        }
        (waiters, nudge)
    }
}

/// Publishes `command` ("PUBLISH" or "SPUBLISH") to `to` so that the reader, blocked on
/// its socket, comes back and subscribes `channel`; a failure only costs the waiter up to
/// a read tick.
fn nudge_reader(
    client: &Executor,
    channel: &[u8],
    command: &str,
    to: &[u8],
    until: Option<Instant>,
) {
    // On a cluster, a classic PUBLISH goes to the node of the waiter's lock (where
    // its attempt just ran), not to one picked at random, which may be frozen (see
    // `Con::query_at`): it reaches the reader on whichever node it listens. An
    // SPUBLISH goes where its channel's slot is: the link's node.
    let at = if command == "SPUBLISH" { to } else { channel };
    // Ahead of calls waiting for room in the pool: in a burst of waiting threads,
    // those that find the channel subscribed when their turn comes queue with
    // their first call (see `Wait::run`).
    if let Err(e) = client.run_urgent(until, |con| {
        con.query_at::<()>(redis::cmd(command).arg(to).arg("s"), at)
    }) {
        // The reader still subscribes within a read tick (a second), and until it
        // confirms the waiter goes by the holder's lease.
        tracing::debug!(
            target: "redmutex",
            error = %e,
            "redmutex: could not nudge the pub/sub thread"
        );
    }
}

#[cfg(test)]
mod tests;
