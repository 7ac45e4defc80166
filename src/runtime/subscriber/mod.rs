//! The client's pub/sub connections: refcounted channel subscriptions that wake waiters.
//! One classic connection (`SUBSCRIBE`) for the client's own channel and every channel on
//! a single server or a Sentinel service; on a Redis Cluster with sharded pub/sub, a lock
//! queue's channels are listened to on the primaries that own their slots (`shards.rs`).

use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::Mutex;

use crate::runtime::connection::con::NodeAddr;
use crate::runtime::connection::executor::Executor;
use crate::runtime::connection::pool::{self, Manager};
use crate::runtime::scripting::queue::{self, Notice};
use crate::Error;

use self::waiters::Waiters;

mod shards;
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

pub(crate) struct Subscriber {
    shared: Arc<Shared>,
    // The reader thread, started by the first waiter and again if it ever died.
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    manager: Manager,
    // Private to this client: waiters publish here to make the reader, blocked on the
    // socket, come back and subscribe their channels (it alone owns the connection), and
    // `force_unlock` tells this client here which of its holds it freed.
    control: Vec<u8>,
    // The client whose holds a `force_unlock` message marks lost: set once it first
    // acquires something (see `Subscriber::listen`).
    client: OnceLock<Weak<dyn ForceUnlocked>>,
    // A latch: its sender is dropped once the server answered the subscription of
    // `control` (the first session's first SUBSCRIBE), or the reader failed to make or
    // keep its first connection, which a client's first acquisitions await (see `listen`).
    listening: Mutex<(Option<Sender<()>>, Receiver<()>)>,
    // Since when the server has confirmed `control`'s subscription on the current
    // connection (`None`: not confirmed, or no connection): a hold granted after that
    // instant was granted while a `force_unlock` of it is heard (see `held`).
    listening_since: Mutex<Option<Instant>>,
    // The server's ACL refusal of `control`'s SUBSCRIBE, while it stands: the reader asks
    // again, backing off, and meanwhile the client's acquisitions fail (see `refusal`).
    refused: Mutex<Option<redis::RedisError>>,
    // Whether a refusal was told at WARN: once, not at every retry or lock.
    warned: AtomicBool,
    // Whether a lock queue's channels are listened to with sharded pub/sub (a cluster,
    // until a node shows it has none: see `shards.rs`).
    sharding: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    channels: HashMap<Vec<u8>, Entry>,
    // Channels the reader must still SUBSCRIBE in the current session.
    pending: Vec<Vec<u8>>,
    // Channels nobody waits on any more, for the reader to UNSUBSCRIBE.
    idle: Vec<Vec<u8>>,
    connected: bool,
    // When a channel nobody waits on may have lingered long enough, if any may: until
    // then `sweep_idle` has nothing to look for.
    next_idle_check: Option<Instant>,
    // On a cluster: the link to each primary the client listens on (see `shards.rs`).
    links: HashMap<NodeAddr, shards::LinkState>,
    // Which primary serves which slot, once needed.
    slots: Option<shards::SlotMap>,
}

struct Entry {
    refs: usize,
    idle_since: Option<Instant>,
    // SUBSCRIBE requested in the current session (queued or sent): of the classic
    // connection's, or of the link `shard`'s.
    requested: bool,
    waiters: Arc<Waiters>,
    // `Some`: listened to with SSUBSCRIBE on this primary's link (see `shards.rs`).
    shard: Option<NodeAddr>,
    // A sharded subscription of the channel was lost (its slot moved, its link failed):
    // its next confirmation makes every waiter look again.
    lapsed: bool,
}

/// A thread's interest in one lock's channel; dropping it gives the interest up.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: Vec<u8>,
    waiters: Arc<Waiters>,
    token: u64,
    notices: Receiver<Notice>,
}

impl Subscription {
    /// Queue-entry flags saying how this thread's client listens on the lock's channel:
    /// 128 with sharded pub/sub, so that a release tells it with `SPUBLISH` (see
    /// `lua/queue.lua`), else none.
    ///
    /// A sharded waiter keeps flag 8 ("listens on another node": a release that counts
    /// no subscriber takes it at its word), which every waiter on a cluster carries
    /// (`Executor::listener_flags`), though on a settled cluster `SPUBLISH`'s count, this
    /// node's alone, is the waiter's own: while a slot moves, a release sent by `ASK` to
    /// the importing node counts no subscriber there, neither sharded nor classic (the
    /// waiter listens on the exporting node, where the fallback `PUBLISH` reaches it), and
    /// so does a release on a promoted replica before the waiter's link has followed.
    /// Without flag 8 such a release drops every live waiter as dead, while its broadcast
    /// wakes them all to race for the lock: a fair lock's order is lost (seen in 2 of 3
    /// runs of `tests/cluster.rs`'s `a_fair_queue_is_served_in_order_through_a_half_moved_slot`
    /// with 8 left off sharded entries). With it, a waiter whose process died costs a
    /// pickup window, as on a cluster before.
    pub(crate) fn listen_flags(&self) -> u8 {
        if self.waiters.sharded.load(Ordering::Relaxed) {
            crate::runtime::scripting::flags::SHARDED
        } else {
            0
        }
    }

    /// Whether the server has confirmed this channel's subscription on the current
    /// connection: only then can no message to this client be missed.
    pub(crate) fn is_confirmed(&self) -> bool {
        let rx = self.waiters.confirmed.lock().1.clone();
        matches!(rx.try_recv(), Err(TryRecvError::Disconnected))
            && self.waiters.refused.lock().is_none()
    }

    /// Blocks until the server confirmed the subscription (true), or `until` or `cancel`
    /// (false). `cancel`: a channel that becomes ready when the call is cancelled.
    /// `Err` when the server's ACL refused the channel: final, the caller can never be
    /// told of a release (`Error::NoPermission`, naming the user and the server).
    pub(crate) fn wait_confirmed(
        &self,
        until: Instant,
        cancel: Option<&Receiver<()>>,
    ) -> Result<bool, Error> {
        let rx = self.waiters.confirmed.lock().1.clone();
        let confirmed = match cancel {
            None => matches!(rx.recv_deadline(until), Err(RecvTimeoutError::Disconnected)),
            Some(cancel) => crossbeam_channel::select! {
                recv(rx) -> r => r.is_err(),
                recv(cancel) -> _ => false,
                default(until.saturating_duration_since(Instant::now())) => false,
            },
        };
        match &*self.waiters.refused.lock() {
            Some(e) => Err(self.shared.explain(e)),
            None => Ok(confirmed),
        }
    }

    /// Blocks until a message for this thread arrives, or `until` or `cancel` (`None`).
    pub(crate) fn wait(&self, until: Instant, cancel: Option<&Receiver<()>>) -> Option<Notice> {
        let Some(cancel) = cancel else {
            return self.notices.recv_deadline(until).ok();
        };
        crossbeam_channel::select! {
            recv(self.notices) -> n => n.ok(),
            recv(cancel) -> _ => None,
            default(until.saturating_duration_since(Instant::now())) => None,
        }
    }

    /// The channel this thread's messages arrive on, to wait on several at once.
    pub(crate) fn notices(&self) -> &Receiver<Notice> {
        &self.notices
    }

    /// Records when the lock's current lease ends, as an attempt just saw it.
    pub(crate) fn saw_lease_end(&self, at: Instant) {
        *self.waiters.next_try.lock() = Some(at);
    }

    /// When a thread of this process should next try on its own (`None`: now).
    pub(crate) fn next_try(&self) -> Option<Instant> {
        *self.waiters.next_try.lock()
    }

    /// Claims the next timed try for this thread: `Ok` when it is this thread's to make
    /// (others then wait `window` for its outcome), `Err(when)` when a later lease end was
    /// seen or another thread is trying, and this one should sleep until `when`.
    pub(crate) fn claim_try(&self, now: Instant, window: Duration) -> Result<(), Instant> {
        let mut next = self.waiters.next_try.lock();
        match *next {
            Some(when) if when > now => Err(when),
            _ => {
                *next = Some(now + window);
                Ok(())
            }
        }
    }

    /// Gives a claimed try back (it failed with an error): the next timer may try at once.
    pub(crate) fn unclaim(&self) {
        *self.waiters.next_try.lock() = None;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        let mut idle_since = None;
        if let Some(entry) = state.channels.get_mut(&self.channel) {
            if Arc::ptr_eq(&entry.waiters, &self.waiters) {
                entry.refs -= 1;
                if entry.refs == 0 {
                    idle_since = Some(Instant::now());
                    entry.idle_since = idle_since;
                }
            }
        }
        if let Some(since) = idle_since {
            let due = since + LINGER;
            state.next_idle_check = Some(state.next_idle_check.map_or(due, |at| at.min(due)));
        }
        drop(state);
        self.waiters.slots.lock().remove(&self.token);
    }
}

/// What a client's own channel's name starts with, its client id following: the channel
/// its reader always listens on (see `lua/force_unlock.lua`).
pub(crate) fn own_channel_prefix(key_prefix: &[u8]) -> Vec<u8> {
    [key_prefix, b"__control:"].concat()
}

/// A `force_unlock` message on a client's own channel: "f <token> <key>", the token of
/// the holder it freed (its holder id is "<client id>:<token>") and the key it freed.
fn parse_forced(payload: &[u8]) -> Option<(u64, &[u8])> {
    let rest = payload.strip_prefix(b"f ")?;
    let space = rest.iter().position(|&b| b == b' ')?;
    let token = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
    Some((token, &rest[space + 1..]))
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
            .spawn(move || run(weak))
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
    /// on its slot's primary (see `shards.rs`; a latch's is not: its opening is published
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
            self.shared.shard_for(channel, until)
        } else {
            None
        };
        let (waiters, nudge) = {
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
                        nudge = self
                            .shared
                            .route(state, channel, &node)
                            .map(|to| ("SPUBLISH", to));
                    }
                }
            }
            (waiters, nudge)
        };
        // From here on the interest is counted: dropping this gives it back, also when
        // the thread cannot be started.
        let subscription = self.slot(channel, waiters, token);
        self.ensure_running()?;
        if let Some((command, to)) = nudge {
            // On a cluster, a classic PUBLISH goes to the node of the waiter's lock (where
            // its attempt just ran), not to one picked at random, which may be frozen (see
            // `Con::query_at`): it reaches the reader on whichever node it listens. An
            // SPUBLISH goes where its channel's slot is: the link's node.
            let at = if command == "SPUBLISH" {
                to.as_slice()
            } else {
                channel
            };
            // Ahead of calls waiting for room in the pool: in a burst of waiting threads,
            // those that find the channel subscribed when their turn comes queue with
            // their first call (see `Wait::run`).
            if let Err(e) = client.run_urgent(until, |con| {
                con.query_at::<()>(redis::cmd(command).arg(to.as_slice()).arg("s"), at)
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
        Ok(subscription)
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
            Ok((mut con, generation)) => {
                let began = Instant::now();
                match session(&shared, &mut con, generation, reconnect) {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(
                            target: "redmutex",
                            error = %e,
                            "redmutex: pub/sub connection lost, reconnecting"
                        )
                    }
                }
                reconnect = true;
                if let Some(strong) = shared.upgrade() {
                    // Before the next session delivers a message: a grant it brings may
                    // come from another server than the one its waiter queued on.
                    strong.manager.topology.changed();
                    strong.disconnected();
                    strong.not_listening();
                }
                if began.elapsed() < MAX_RECONNECT_BACKOFF {
                    // A session that failed as soon as it began (the server refusing it
                    // something) would fail again: back off as for a failed connect,
                    // never reconnect in a tight loop.
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
                } else {
                    backoff = Duration::from_millis(10);
                }
            }
            Err(e) => {
                tracing::warn!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: pub/sub connection failed, retrying in {backoff:?}"
                );
                if let Some(strong) = shared.upgrade() {
                    strong.not_listening();
                }
                thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
            }
        }
    }
}

/// The reader's connection, spoken to by hand: redis-rs's `PubSub::subscribe` drops the
/// server's reply, so a SUBSCRIBE the ACL refused would pass for a confirmed one, and its
/// waiters would wait for messages that can never come.
struct Link<'a> {
    con: &'a mut redis::Connection,
    // Messages that arrived while a reply was awaited, delivered first.
    early: VecDeque<redis::Msg>,
    // The socket's read timeout now: a reply is given `READ_TICK`, a wait for a message
    // the tick of the moment.
    timeout: Duration,
}

impl Link<'_> {
    /// Sends `cmd` and returns its reply (a server error as a value), keeping the messages
    /// that arrive before it. `Err`: the connection failed.
    fn request(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        self.read_timeout(READ_TICK)?;
        self.con.send_packed_command(&cmd.get_packed_command())?;
        loop {
            let reply = self.con.recv_response()?;
            match redis::Msg::from_value(&reply) {
                Some(msg) => self.early.push_back(msg),
                None => return Ok(reply),
            }
        }
    }

    /// Subscribes `channel`: `Ok(Err(e))` when the server's ACL refused it (`NOPERM`),
    /// `Err` when the connection failed or the server answered another error.
    fn subscribe(&mut self, channel: &[u8]) -> redis::RedisResult<Result<(), redis::RedisError>> {
        match self
            .request(redis::cmd("SUBSCRIBE").arg(channel))?
            .extract_error()
        {
            Ok(_) => Ok(Ok(())),
            Err(e) if crate::error::is_no_permission(&e) => Ok(Err(e)),
            Err(e) => Err(e),
        }
    }

    fn unsubscribe(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        if let Err(e) = self
            .request(redis::cmd("UNSUBSCRIBE").arg(channel))?
            .extract_error()
        {
            // Still subscribed: its messages find no waiter and are dropped.
            tracing::debug!(target: "redmutex", "redmutex: the server refused an UNSUBSCRIBE: {e}");
        }
        Ok(())
    }

    /// A PING: any reply, a refusal too, shows the connection alive.
    fn ping(&mut self) -> redis::RedisResult<()> {
        self.request(&redis::cmd("PING")).map(drop)
    }

    fn read_timeout(&mut self, timeout: Duration) -> redis::RedisResult<()> {
        if self.timeout != timeout {
            self.con.set_read_timeout(Some(timeout))?;
            self.timeout = timeout;
        }
        Ok(())
    }

    /// The next message, waiting at most `tick`.
    fn next_message(&mut self, tick: Duration) -> redis::RedisResult<redis::Msg> {
        if let Some(msg) = self.early.pop_front() {
            return Ok(msg);
        }
        self.read_timeout(tick)?;
        // A `PubSub` only to read a message without taking it for a reply (a timed-out
        // reply read would make redis-rs skip the next value). Never dropped: its drop
        // would UNSUBSCRIBE every channel; it owns nothing else.
        ManuallyDrop::new(self.con.as_pubsub()).get_message()
    }
}

/// Serves one connection until it fails (`Err`) or the client is gone (`Ok`).
fn session(
    shared: &Weak<Shared>,
    con: &mut redis::Connection,
    generation: u64,
    reconnect: bool,
) -> redis::RedisResult<()> {
    con.set_read_timeout(Some(READ_TICK))?;
    let mut link = Link {
        con,
        early: VecDeque::new(),
        timeout: READ_TICK,
    };
    // One channel per SUBSCRIBE and UNSUBSCRIBE: each reply says whether its one channel
    // was refused. One each costs a round trip per channel, on this thread.
    // While the server refuses the client's own channel: when to ask again, and the
    // pause after that (doubling as for a failed connect).
    let mut control_retry = {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        let answer = link.subscribe(strong.control.as_slice())?;
        let control_retry = strong.control_answered(answer, None);
        let channels = strong.begin_session();
        drop(strong);
        for channel in channels {
            let answer = link.subscribe(channel.as_slice())?;
            let Some(strong) = shared.upgrade() else {
                return Ok(());
            };
            strong.answered(&channel, answer, reconnect);
        }
        control_retry
    };
    let mut last_heard = Instant::now();
    let mut primary_checked = Instant::now();
    loop {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        let target = &strong.manager.target;
        if target.is_sentinel() && primary_checked.elapsed() >= PRIMARY_CHECK {
            target.refresh(strong.manager.connect_timeout);
            primary_checked = Instant::now();
        }
        if target.generation() != generation {
            // Releases are published on the new primary now; the reconnect re-subscribes
            // there and has every waiter look again.
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the sentinels name a new primary",
            )));
        }
        if control_retry.is_some_and(|(at, _)| Instant::now() >= at) {
            let answer = link.subscribe(strong.control.as_slice())?;
            control_retry = strong.control_answered(answer, control_retry);
        }
        for channel in strong.take_pending() {
            let answer = link.subscribe(channel.as_slice())?;
            strong.answered(&channel, answer, false);
        }
        for channel in strong.take_idle() {
            link.unsubscribe(channel.as_slice())?;
        }
        let tick = if control_retry.is_some() {
            UNNUDGED_READ_TICK
        } else {
            IDLE_READ_TICK
        };
        // Never block on the socket holding a strong reference: the client must be able
        // to go away meanwhile.
        drop(strong);
        match link.next_message(tick) {
            Ok(msg) => {
                last_heard = Instant::now();
                let channel: Vec<u8> = msg.get_channel()?;
                if let Some(strong) = shared.upgrade() {
                    strong.deliver(&channel, msg.get_payload_bytes());
                }
            }
            // A read interrupted by a signal (EINTR: on Linux a process stopped and
            // continued gets it even without handlers) broke nothing: the connection and
            // the parser's partial reply are intact, as after a read tick. Reconnecting
            // would resubscribe, and a release meanwhile would drop the waiters as dead.
            Err(e) if e.is_timeout() || pool::is_interrupted(&e) => {
                if last_heard.elapsed() >= HEALTH_CHECK_AFTER {
                    link.ping()?;
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
            .filter(|(_, entry)| entry.shard.is_none())
            .map(|(channel, entry)| {
                entry.requested = true;
                channel.clone()
            })
            .collect()
    }

    /// The server's answer to the SUBSCRIBE of `channel`: confirmed, or refused by its
    /// ACL, which is final for the threads waiting on it: they fail with the refusal,
    /// and the channel is forgotten (a later wait on the lock asks again).
    fn answered(&self, channel: &[u8], answer: Result<(), redis::RedisError>, reconnect: bool) {
        let Err(e) = answer else {
            return self.confirmed(channel, reconnect);
        };
        self.warn_refused(channel, &e);
        let mut state = self.state.lock();
        if let Some(entry) = state.channels.remove(channel) {
            entry.waiters.refuse(e);
        }
        state.pending.retain(|c| c != channel);
        for link in state.links.values_mut() {
            link.pending.retain(|c| c != channel);
        }
    }

    /// The server's answer to the SUBSCRIBE of the client's own channel; returns when to
    /// ask again (`None`: subscribed), given the current schedule `retry`.
    fn control_answered(
        &self,
        answer: Result<(), redis::RedisError>,
        retry: Option<(Instant, Duration)>,
    ) -> Option<(Instant, Duration)> {
        let next = match answer {
            Ok(()) => {
                if self.refused.lock().take().is_some() {
                    tracing::info!(target: "redmutex", "redmutex: the server now allows this client's pub/sub channel");
                    self.warned.store(false, Ordering::Relaxed);
                }
                *self.listening_since.lock() = Some(Instant::now());
                // A force_unlock published while the client did not listen (its connection
                // down, or not made yet when a hold was granted) reached nobody: the holds
                // are checked against Redis, as a waiter looks again after a reconnect.
                // (This channel is the classic connection's on a cluster too: a sharded
                // link carries waiters' channels only, and its reconnect needs no check.)
                if let Some(client) = self.client.get().and_then(Weak::upgrade) {
                    client.unheard();
                }
                None
            }
            Err(e) => {
                self.warn_refused(&self.control, &e);
                *self.refused.lock() = Some(e);
                let pause = retry.map_or(Duration::from_millis(10), |(_, pause)| {
                    (pause * 2).min(MAX_RECONNECT_BACKOFF)
                });
                Some((Instant::now() + pause, pause))
            }
        };
        // Either way the client's first acquisitions need wait no longer (see `listen`).
        self.listening.lock().0 = None;
        next
    }

    /// The reader could not make, or keep, its connection: the client's first
    /// acquisitions wait no longer for it to listen (see `Subscriber::listen`), and until
    /// it does, a hold it is granted is checked once it does (see `Subscriber::held`).
    fn not_listening(&self) {
        *self.listening_since.lock() = None;
        self.listening.lock().0 = None;
    }

    /// Says at WARN, once, that the server refused a channel; later refusals at DEBUG.
    fn warn_refused(&self, channel: &[u8], e: &redis::RedisError) {
        let channel = String::from_utf8_lossy(channel);
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                target: "redmutex",
                %channel,
                error = %e,
                "redmutex: pub/sub channel refused"
            );
        } else {
            // Message and fields are what the CLI keeps back by (it prints the
            // NoPermission error the waiting call gets instead).
            tracing::warn!(
                target: "redmutex",
                %channel,
                error = %e,
                "redmutex: pub/sub channel refused: this client cannot hear releases or \
                 force_unlocks there, so its waits (and, while its own channel is refused, \
                 its acquisitions) fail with NoPermission until its ACL user may use \
                 redmutex's channels (see docs/redis-layout.md)"
            );
        }
    }

    /// `e`, a refusal of this client's, as the error a refused command gets (see
    /// `Executor::explain`): naming the client's user and server.
    fn explain(&self, e: &redis::RedisError) -> Error {
        let target = &self.manager.target;
        Error::redis(e.clone()).at_server(
            || target.server(),
            || target.user(),
            target.has_password(),
        )
    }

    fn confirmed(&self, channel: &[u8], reconnect: bool) {
        let state = self.state.lock();
        if let Some(entry) = state.channels.get(channel) {
            entry.waiters.confirm();
            if reconnect {
                // A message published while we were disconnected was never seen, and the
                // scripts dropped this client's waiters as dead: every waiter looks again.
                entry.waiters.recheck_all();
            }
        }
    }

    fn take_pending(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.state.lock().pending)
    }

    /// Channels of the classic connection nobody waits on any more (see `sweep_idle`).
    fn take_idle(&self) -> Vec<Vec<u8>> {
        self.sweep_idle();
        std::mem::take(&mut self.state.lock().idle)
    }

    /// Forgets the channels nobody waited on for `LINGER`, handing those subscribed to
    /// the reader that must unsubscribe them: the classic one's, or their link's.
    fn sweep_idle(&self) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let now = Instant::now();
        if state.next_idle_check.is_none_or(|at| at > now) {
            return;
        }
        let mut idle = Vec::new();
        let mut next: Option<Instant> = None;
        state.channels.retain(|channel, entry| {
            let Some(since) = entry.idle_since.filter(|_| entry.refs == 0) else {
                return true;
            };
            if now.saturating_duration_since(since) < LINGER {
                let due = since + LINGER;
                next = Some(next.map_or(due, |at| at.min(due)));
                return true;
            }
            idle.push((channel.clone(), entry.requested, entry.shard.take()));
            false
        });
        state.next_idle_check = next.map(|at| at.max(now + IDLE_CHECK_GAP));
        for (channel, requested, shard) in idle {
            match shard {
                Some(node) => {
                    // A link already gone took its subscriptions with its connection.
                    if let Some(link) = state.links.get_mut(&node) {
                        link.pending.retain(|c| *c != channel);
                        if link.nudge.as_ref() == Some(&channel) {
                            link.nudge = None;
                        }
                        if requested {
                            link.idle.push(channel);
                        }
                    }
                }
                None => {
                    state.pending.retain(|c| *c != channel);
                    if requested {
                        state.idle.push(channel);
                    }
                }
            }
        }
    }

    /// The threads of this process waiting on `channel`, if any.
    fn waiters_of(&self, channel: &[u8]) -> Option<Arc<Waiters>> {
        let state = self.state.lock();
        state
            .channels
            .get(channel)
            .map(|entry| entry.waiters.clone())
    }

    fn deliver(&self, channel: &[u8], payload: &[u8]) {
        if channel == self.control.as_slice() {
            if let Some((token, key)) = parse_forced(payload) {
                let client = self.client.get().and_then(Weak::upgrade);
                if let Some(inner) = client {
                    inner.force_unlocked(key, token);
                }
            }
            return; // otherwise a nudge
        }
        if payload == BROADCAST {
            // A state every waiter of the channel waits for (a latch opened).
            if let Some(w) = self.waiters_of(channel) {
                w.recheck_all();
            }
            return;
        }
        let Some((token, notice)) = queue::parse(payload) else {
            return;
        };
        let waiters = self.waiters_of(channel);
        if !waiters.is_some_and(|w| w.notify(token, notice)) {
            // The thread left (its deadline passed, or it failed) before the message came.
            // A grant it never took lapses after the pickup window and passes on.
            tracing::debug!(
                target: "redmutex",
                "redmutex: a message for a thread no longer waiting: {notice:?}"
            );
        }
    }

    fn disconnected(&self) {
        *self.listening_since.lock() = None;
        let mut state = self.state.lock();
        state.connected = false;
        state.pending.clear();
        state.idle.clear();
        for entry in state.channels.values_mut() {
            if entry.shard.is_none() {
                entry.requested = false;
                entry.waiters.rearm();
            }
        }
    }
}

#[cfg(test)]
mod tests;
