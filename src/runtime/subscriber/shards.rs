//! Sharded wake-ups on a Redis Cluster (7.0 and later, Valkey): a waiter's channel is
//! listened to with `SSUBSCRIBE` on the primary that owns its slot, where the scripts
//! `SPUBLISH` to it (the waiter's queue entry carries flag 128, see `lua/queue.lua`), so
//! that a wake-up stays on the lock's shard instead of being broadcast over the cluster
//! bus to every node, as a classic `PUBLISH` is.
//!
//! One link per primary the client waits on, opened on demand: a RESP3 connection (under
//! RESP2 redis-rs's reader drops `smessage` and `sunsubscribe` frames; under RESP3 every
//! push reaches the connection's push channel) with a reader thread of its own. Slots are
//! mapped to primaries by `CLUSTER SLOTS` (fetched when first needed and after a link
//! failed) and by the `MOVED` answers of `SSUBSCRIBE`. A slot that moves away is told by
//! the old owner with a `sunsubscribe` push: the link subscribes the channel again, is
//! redirected, and the new owner's link takes it; a link that fails (its primary killed,
//! failing over) hands its channels to the primaries the map names anew. Either way the
//! channel's next confirmation makes its waiters look again: a grant published in the gap
//! is found by their next attempt (or has lapsed after its pickup window and passed on),
//! as after a classic reconnect.
//!
//! The gap of a migration is covered besides: a link also listens for the channel's
//! classic messages (`SUBSCRIBE`, on the same connection), and a script whose `SPUBLISH`
//! no subscriber of its node heard falls back to `PUBLISH` (`Q.tell` in `lua/queue.lua`).
//! That happens when the script ran on the node importing the slot (sent there by `ASK`)
//! while the waiter still listens on the node exporting it; the broadcast reaches it there.
//! A wake-up heard by `SPUBLISH`, the rule, broadcasts nothing.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};

use super::{Shared, State, HEALTH_CHECK_AFTER, MAX_RECONNECT_BACKOFF, READ_TICK};
use crate::runtime::connection::con::NodeAddr;

/// How long a link blocks on its socket before it looks for channels to subscribe and
/// whether it is still needed: a channel routed to it while no nudge could reach it (see
/// `LinkState::nudge`), or moved to it by another link, waits at most this long.
const LINK_READ_TICK: Duration = Duration::from_millis(100);

/// The hash slot of a key or shard channel.
pub(super) fn slot(key: &[u8]) -> u16 {
    crate::runtime::holds::watchdog::slot(key)
}

/// Which primary serves which slots, as `CLUSTER SLOTS` said, patched by `MOVED`s.
#[derive(Default)]
pub(super) struct SlotMap {
    ranges: Vec<(u16, u16, NodeAddr)>,
    moved: HashMap<u16, NodeAddr>,
}

impl SlotMap {
    pub(super) fn new(ranges: Vec<(u16, u16, NodeAddr)>) -> SlotMap {
        SlotMap {
            ranges,
            moved: HashMap::new(),
        }
    }

    /// Records that `slot` moved to `node` (a `MOVED` said so).
    pub(super) fn moved(&mut self, slot: u16, node: NodeAddr) {
        self.moved.insert(slot, node);
    }

    pub(super) fn owner(&self, slot: u16) -> Option<&NodeAddr> {
        self.moved.get(&slot).or_else(|| {
            self.ranges
                .iter()
                .find(|(start, end, _)| (*start..=*end).contains(&slot))
                .map(|(_, _, node)| node)
        })
    }
}

/// One primary's link, as the subscriber's state keeps it.
#[derive(Default)]
pub(super) struct LinkState {
    // Channels to SSUBSCRIBE in the current session.
    pub(super) pending: Vec<Vec<u8>>,
    // Channels nobody waits on any more, to SUNSUBSCRIBE.
    pub(super) idle: Vec<Vec<u8>>,
    pub(super) connected: bool,
    // A channel this link has confirmed: a waiter that routes a new channel here
    // publishes to it to make the reader, blocked on its socket, come back (`SPUBLISH`
    // goes to the channel's slot, this node, and to no other).
    pub(super) nudge: Option<Vec<u8>>,
}

/// What a primary answered to the `SSUBSCRIBE` of one channel.
enum Answer {
    Confirmed,
    /// Another node owns the channel's slot now.
    Moved(NodeAddr),
    /// The server's ACL refused the channel.
    Refused(redis::RedisError),
    /// The server has no sharded pub/sub (Redis before 7.0), or the client's ACL user may
    /// not use it (the command refused, not the channel).
    Unsupported,
}

/// Whether `e` refuses `SSUBSCRIBE` itself: a server that does not know it ("unknown
/// command"), or an ACL user not allowed to run it (`NOPERM` naming the command; a refused
/// channel is told otherwise, and the classic way would be refused it too).
pub(super) fn refuses_command(e: &redis::RedisError) -> bool {
    let detail = e.detail().unwrap_or("").to_ascii_lowercase();
    match e.code() {
        Some("ERR") => detail.starts_with("unknown command"),
        Some("NOPERM") => detail.contains("'ssubscribe'"),
        _ => false,
    }
}

/// `host:port` as `MOVED` names a node (the host may be an IPv6 address).
pub(super) fn parse_addr(addr: &str) -> Option<NodeAddr> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
}

impl Shared {
    /// The primary to listen on for `channel` with `SSUBSCRIBE`, or `None` to listen the
    /// classic way: not a cluster, a server without sharded pub/sub, or no slot map to be
    /// had by `until`. Fetches the map the first time (outside the state's lock), on the
    /// waiting thread: `until` is its deadline (with the I/O grace), which a slow or
    /// frozen seed node must not make it overstay. A waiter that gave up on the map
    /// listens the classic way, which works on any cluster (at the price of a broadcast
    /// per wake-up); the next waiter asks for the map again.
    pub(super) fn shard_for(&self, channel: &[u8], until: Option<Instant>) -> Option<NodeAddr> {
        if !self.sharding.load(Ordering::Relaxed) {
            return None;
        }
        let slot = slot(channel);
        if let Some(map) = &self.state.lock().slots {
            return map.owner(slot).cloned();
        }
        let map = self.fetch_slots(until)?;
        let mut state = self.state.lock();
        let map = state.slots.get_or_insert(map);
        map.owner(slot).cloned()
    }

    /// `CLUSTER SLOTS` from a seed node, given up at `until`.
    fn fetch_slots(&self, until: Option<Instant>) -> Option<SlotMap> {
        let manager = &self.manager;
        match manager
            .target
            .cluster_slots(manager.connect_timeout, manager.command_timeout, until)
        {
            Ok(ranges) => Some(SlotMap::new(ranges)),
            Err(e) => {
                tracing::debug!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: could not read the cluster's slot map"
                );
                None
            }
        }
    }

    /// Puts `entry` (of `channel`) on `node`'s link, starting the link if it has none:
    /// queued for its current session if it has one (else its next session subscribes
    /// every channel of the node). Returns the link's nudge channel when the caller should
    /// nudge it.
    pub(super) fn route(
        self: &Arc<Self>,
        state: &mut State,
        channel: &[u8],
        node: &NodeAddr,
    ) -> Option<Vec<u8>> {
        let link = match state.links.get_mut(node) {
            Some(link) => link,
            None => {
                start(Arc::downgrade(self), node.clone());
                state.links.entry(node.clone()).or_default()
            }
        };
        let entry = state.channels.get_mut(channel)?;
        entry.shard = Some(node.clone());
        entry.requested = link.connected;
        if !link.connected {
            return None;
        }
        link.pending.push(channel.to_vec());
        link.nudge.clone()
    }

    /// A new session of `node`'s link: every channel routed to it, to subscribe.
    fn begin_link_session(&self, node: &NodeAddr) -> Vec<Vec<u8>> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let link = state.links.entry(node.clone()).or_default();
        link.pending.clear();
        link.connected = true;
        state
            .channels
            .iter_mut()
            .filter(|(_, entry)| entry.shard.as_ref() == Some(node))
            .map(|(channel, entry)| {
                entry.requested = true;
                channel.clone()
            })
            .collect()
    }

    /// Whether `node`'s link still has channels; a link without any is forgotten (its
    /// thread ends), under the same lock a new channel's routing starts one.
    fn link_wanted(&self, node: &NodeAddr) -> bool {
        let mut state = self.state.lock();
        let wanted = state
            .channels
            .values()
            .any(|entry| entry.shard.as_ref() == Some(node));
        if !wanted {
            state.links.remove(node);
        }
        wanted
    }

    fn take_link_pending(&self, node: &NodeAddr) -> Vec<Vec<u8>> {
        let mut state = self.state.lock();
        state
            .links
            .get_mut(node)
            .map(|link| std::mem::take(&mut link.pending))
            .unwrap_or_default()
    }

    fn take_link_idle(&self, node: &NodeAddr) -> Vec<Vec<u8>> {
        self.sweep_idle();
        let mut state = self.state.lock();
        state
            .links
            .get_mut(node)
            .map(|link| std::mem::take(&mut link.idle))
            .unwrap_or_default()
    }

    /// `node`'s answer to the `SSUBSCRIBE` of `channel`.
    fn shard_answered(self: &Arc<Self>, node: &NodeAddr, channel: &[u8], answer: Answer) {
        match answer {
            Answer::Confirmed => {
                let mut state = self.state.lock();
                let State {
                    channels, links, ..
                } = &mut *state;
                if let Some(entry) = channels.get_mut(channel) {
                    if entry.shard.as_ref() == Some(node) {
                        entry.waiters.confirm();
                        if std::mem::take(&mut entry.lapsed) {
                            // Its subscription was lost meanwhile (a move, a failover): a
                            // message published in the gap was never seen.
                            entry.waiters.recheck_all();
                        }
                        if let Some(link) = links.get_mut(node) {
                            link.nudge.get_or_insert_with(|| channel.to_vec());
                        }
                    }
                }
            }
            Answer::Moved(owner) => {
                let mut state = self.state.lock();
                if let Some(map) = &mut state.slots {
                    map.moved(slot(channel), owner.clone());
                }
                let routed = state
                    .channels
                    .get(channel)
                    .is_some_and(|entry| entry.shard.as_ref() == Some(node));
                if routed {
                    // No nudge: the new link reads with a short tick.
                    self.route(&mut state, channel, &owner);
                }
            }
            Answer::Refused(e) => self.answered(channel, Err(e), false),
            Answer::Unsupported => {
                // No sharded pub/sub to be had: this client listens the classic way
                // from now on. The channel's waiters have not queued yet (they queue
                // once their subscription is confirmed, with the flags of the way it
                // was): the classic reader takes it within its read tick.
                if self.sharding.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        target: "redmutex",
                        "redmutex: SSUBSCRIBE refused (a server before 7.0, or the ACL); \
                         listening for releases with SUBSCRIBE"
                    );
                }
                let mut state = self.state.lock();
                let State {
                    channels, pending, ..
                } = &mut *state;
                if let Some(entry) = channels.get_mut(channel) {
                    entry.shard = None;
                    entry.waiters.sharded.store(false, Ordering::Relaxed);
                    entry.requested = true;
                    pending.push(channel.to_vec());
                }
            }
        }
    }

    /// `node` pushed `sunsubscribe` for `channel` unasked: it no longer serves the
    /// channel's slot (moved away, or the node was demoted). Subscribed again on the same
    /// link, the channel is redirected to its new owner.
    fn slot_lost(&self, node: &NodeAddr, channel: &[u8]) {
        let mut state = self.state.lock();
        let State {
            channels, links, ..
        } = &mut *state;
        let Some(entry) = channels.get_mut(channel) else {
            return; // unsubscribed by us (the reply to our own SUNSUBSCRIBE)
        };
        if entry.shard.as_ref() != Some(node) || !entry.requested {
            return;
        }
        entry.waiters.rearm();
        entry.lapsed = true;
        if let Some(link) = links.get_mut(node) {
            if link.nudge.as_deref() == Some(channel) {
                link.nudge = None;
            }
            link.pending.push(channel.to_vec());
        }
    }

    /// `node`'s link failed (or could not connect): its channels are unconfirmed, and
    /// those whose slot the cluster now says another primary serves go to that one's link.
    fn link_lost(self: &Arc<Self>, node: &NodeAddr) {
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            if let Some(link) = state.links.get_mut(node) {
                link.connected = false;
                link.pending.clear();
                link.nudge = None;
            }
            for entry in state.channels.values_mut() {
                if entry.shard.as_ref() == Some(node) {
                    entry.requested = false;
                    entry.lapsed = true;
                    entry.waiters.rearm();
                }
            }
        }
        let map = self.fetch_slots(None);
        let mut state = self.state.lock();
        if map.is_some() {
            state.slots = map;
        }
        let Some(slots) = &state.slots else {
            return;
        };
        let moves: Vec<(Vec<u8>, NodeAddr)> = state
            .channels
            .iter()
            .filter(|(_, entry)| entry.shard.as_ref() == Some(node))
            .filter_map(|(channel, _)| {
                let owner = slots.owner(slot(channel))?;
                (owner != node).then(|| (channel.clone(), owner.clone()))
            })
            .collect();
        for (channel, owner) in moves {
            self.route(&mut state, &channel, &owner);
        }
    }

    /// A push read on `node`'s link.
    fn pushed(&self, node: &NodeAddr, push: PushInfo) {
        let mut data = push.data.into_iter();
        let channel = match data.next() {
            Some(Value::BulkString(channel)) => channel,
            _ => return,
        };
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                if let Some(Value::BulkString(payload)) = data.next() {
                    self.deliver(&channel, &payload);
                }
            }
            PushKind::SUnsubscribe => self.slot_lost(node, &channel),
            _ => {}
        }
    }
}

/// Starts `node`'s link thread.
fn start(shared: Weak<Shared>, node: NodeAddr) {
    let name = format!("redmutex-pubsub-{}:{}", node.0, node.1);
    if let Err(e) = thread::Builder::new()
        .name(name)
        .spawn(move || run(shared, node))
    {
        // Its waiters go by their lease timers; the next channel routed here tries again.
        tracing::warn!(
            target: "redmutex",
            error = %e,
            "redmutex: cannot start a pub/sub thread"
        );
    }
}

fn run(shared: Weak<Shared>, node: NodeAddr) {
    let mut backoff = Duration::from_millis(10);
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if !strong.link_wanted(&node) {
            return;
        }
        let manager = &strong.manager;
        let con =
            manager
                .target
                .connect_node(&node, manager.connect_timeout, manager.command_timeout);
        drop(strong);
        let began = Instant::now();
        let failure = match con {
            Ok(mut con) => match session(&shared, &mut con, &node) {
                Ok(()) => return,
                Err(e) => e,
            },
            Err(e) => e,
        };
        tracing::debug!(
            target: "redmutex",
            error = %failure,
            node = %format!("{}:{}", node.0, node.1),
            "redmutex: sharded pub/sub link lost"
        );
        let Some(strong) = shared.upgrade() else {
            return;
        };
        strong.manager.topology.changed();
        strong.link_lost(&node);
        drop(strong);
        if began.elapsed() < MAX_RECONNECT_BACKOFF {
            thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
        } else {
            backoff = Duration::from_millis(10);
        }
    }
}

/// A link's connection, spoken to by hand as the classic `Link` is (see there).
struct ShardLink<'a> {
    con: &'a mut redis::Connection,
    // Every push the connection reads, whichever call read it.
    pushes: mpsc::Receiver<PushInfo>,
    timeout: Duration,
}

impl ShardLink<'_> {
    /// Sends `cmd` and returns its reply: the first value that is not a push, or the push
    /// `confirms` (its kind and channel) names. Every push also reaches `pushes`.
    fn request(
        &mut self,
        cmd: &redis::Cmd,
        confirms: Option<(PushKind, &[u8])>,
    ) -> redis::RedisResult<Value> {
        self.read_timeout(READ_TICK)?;
        self.con.send_packed_command(&cmd.get_packed_command())?;
        loop {
            let reply = self.con.recv_response()?;
            let Value::Push { kind, data } = &reply else {
                return Ok(reply);
            };
            if let Some((want, channel)) = &confirms {
                if kind == want
                    && matches!(data.first(), Some(Value::BulkString(c)) if c == channel)
                {
                    return Ok(reply);
                }
            }
        }
    }

    fn ssubscribe(&mut self, channel: &[u8]) -> redis::RedisResult<Answer> {
        let reply = self.request(
            redis::cmd("SSUBSCRIBE").arg(channel),
            Some((PushKind::SSubscribe, channel)),
        )?;
        match reply.extract_error() {
            Ok(_) => Ok(Answer::Confirmed),
            Err(e) => {
                if let Some(owner) = e.redirect_node().and_then(|(addr, _)| parse_addr(addr)) {
                    Ok(Answer::Moved(owner))
                } else if refuses_command(&e) {
                    Ok(Answer::Unsupported)
                } else if crate::error::is_no_permission(&e) {
                    Ok(Answer::Refused(e))
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Listens on `channel`: its sharded messages, and once they are confirmed its
    /// classic ones too (see the module's comment).
    fn listen(&mut self, channel: &[u8]) -> redis::RedisResult<Answer> {
        let answer = self.ssubscribe(channel)?;
        if let Answer::Confirmed = answer {
            self.classic(channel, true)?;
        }
        Ok(answer)
    }

    /// Stops listening on `channel`, both ways.
    fn unlisten(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        let reply = self.request(
            redis::cmd("SUNSUBSCRIBE").arg(channel),
            Some((PushKind::SUnsubscribe, channel)),
        )?;
        if let Err(e) = reply.extract_error() {
            tracing::debug!(target: "redmutex", "redmutex: the server refused an SUNSUBSCRIBE: {e}");
        }
        self.classic(channel, false)
    }

    /// `SUBSCRIBE` (`on`) or `UNSUBSCRIBE` `channel`'s classic messages: a refusal only
    /// leaves the migration gap to the waiters' looking again, and is told at DEBUG.
    fn classic(&mut self, channel: &[u8], on: bool) -> redis::RedisResult<()> {
        let (command, kind) = if on {
            ("SUBSCRIBE", PushKind::Subscribe)
        } else {
            ("UNSUBSCRIBE", PushKind::Unsubscribe)
        };
        let reply = self.request(redis::cmd(command).arg(channel), Some((kind, channel)))?;
        if let Err(e) = reply.extract_error() {
            tracing::debug!(target: "redmutex", "redmutex: the server refused a {command}: {e}");
        }
        Ok(())
    }

    fn ping(&mut self) -> redis::RedisResult<()> {
        self.request(&redis::cmd("PING"), None).map(drop)
    }

    fn read_timeout(&mut self, timeout: Duration) -> redis::RedisResult<()> {
        if self.timeout != timeout {
            self.con.set_read_timeout(Some(timeout))?;
            self.timeout = timeout;
        }
        Ok(())
    }

    /// Waits at most `tick` for something to arrive (it reaches `pushes`). A read that
    /// times out here leaves redis-rs's reply accounting alone (unlike `recv_response`).
    fn wait(&mut self, tick: Duration) -> redis::RedisResult<()> {
        self.read_timeout(tick)?;
        match std::mem::ManuallyDrop::new(self.con.as_pubsub()).get_message() {
            Ok(_) => Ok(()),
            Err(e) if e.is_timeout() || crate::runtime::connection::pool::is_interrupted(&e) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Serves `node`'s link on `con` until it fails (`Err`), or the client or the link's last
/// channel is gone (`Ok`).
fn session(
    shared: &Weak<Shared>,
    con: &mut redis::Connection,
    node: &NodeAddr,
) -> redis::RedisResult<()> {
    let (tx, pushes) = mpsc::channel();
    con.set_push_sender(tx);
    let mut link = ShardLink {
        con,
        pushes,
        timeout: Duration::ZERO,
    };
    let channels = {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        strong.begin_link_session(node)
    };
    let mut queue = channels;
    let mut last_heard = Instant::now();
    // When the link last looked whether it still has channels: a look through all the
    // client's channels (a link of one lock among 10,000 lingering channels: ~34 µs in a
    // release build, under the state's lock), made once per read tick rather than once per
    // message (one per handoff of a busy lock: ~205 µs each). A link whose last channel
    // went keeps its connection a tick longer at most.
    let mut looked = Instant::now();
    loop {
        for channel in queue.drain(..) {
            let answer = link.listen(&channel)?;
            if let Answer::Moved(_) = answer {
                // It may have been listened to here before its slot moved.
                link.classic(&channel, false)?;
            }
            let Some(strong) = shared.upgrade() else {
                return Ok(());
            };
            strong.shard_answered(node, &channel, answer);
        }
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        for push in link.pushes.try_iter() {
            last_heard = Instant::now();
            strong.pushed(node, push);
        }
        if looked.elapsed() >= LINK_READ_TICK {
            if !strong.link_wanted(node) {
                return Ok(());
            }
            looked = Instant::now();
        }
        for channel in strong.take_link_idle(node) {
            link.unlisten(&channel)?;
        }
        queue = strong.take_link_pending(node);
        if !queue.is_empty() {
            continue;
        }
        // Never block on the socket holding a strong reference.
        drop(strong);
        link.wait(LINK_READ_TICK)?;
        if last_heard.elapsed() >= HEALTH_CHECK_AFTER {
            link.ping()?;
            last_heard = Instant::now();
        }
    }
}
