//! Sharded wake-ups on a Redis Cluster (7.0 and later, Valkey): a waiter's channel is
//! listened to with `SSUBSCRIBE` on the primary that owns its slot, where the scripts
//! `SPUBLISH` to it (the waiter's queue entry carries flag `SHARDED`, see `lua/queue.lua`), so
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
//!
//! Here the slot map and the routing of channels to links (`Shards`); each link's thread
//! and connection are `link.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};

use super::{Shared, State};
use crate::runtime::connection::con::NodeAddr;

mod link;
pub(super) mod state;

pub(super) use self::state::SlotMap;

/// How long a link blocks on its socket before it looks for channels to subscribe and
/// whether it is still needed: a channel routed to it while no nudge could reach it (see
/// `LinkState::nudge`), or moved to it by another link, waits at most this long.
const LINK_READ_TICK: Duration = Duration::from_millis(100);

/// The hash slot of a key or shard channel.
pub(super) fn slot(key: &[u8]) -> u16 {
    crate::runtime::holds::watchdog::slot(key)
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

/// The client's sharded pub/sub links, as the shared state keeps them: which primary
/// listens for which channel, the links' sessions and what their readers hear.
pub(super) struct Shards<'a> {
    shared: &'a Arc<Shared>,
}

impl<'a> Shards<'a> {
    /// The sharded links of `shared`.
    pub(super) fn of(shared: &'a Arc<Shared>) -> Shards<'a> {
        Shards { shared }
    }

    /// The primary to listen on for `channel` with `SSUBSCRIBE`, or `None` to listen the
    /// classic way: not a cluster, a server without sharded pub/sub, or no slot map to be
    /// had by `until`. Fetches the map the first time (outside the state's lock), on the
    /// waiting thread: `until` is its deadline (with the I/O grace), which a slow or
    /// frozen seed node must not make it overstay. A waiter that gave up on the map
    /// listens the classic way, which works on any cluster (at the price of a broadcast
    /// per wake-up); the next waiter asks for the map again.
    pub(super) fn shard_for(&self, channel: &[u8], until: Option<Instant>) -> Option<NodeAddr> {
        if !self.shared.sharding.load(Ordering::Relaxed) {
            return None;
        }
        let slot = slot(channel);
        if let Some(map) = &self.shared.state.lock().slots {
            return map.owner(slot).cloned();
        }
        let map = self.fetch_slots(until)?;
        let mut state = self.shared.state.lock();
        let map = state.slots.get_or_insert(map);
        map.owner(slot).cloned()
    }

    /// `CLUSTER SLOTS` from a seed node, given up at `until`.
    fn fetch_slots(&self, until: Option<Instant>) -> Option<SlotMap> {
        let manager = &self.shared.manager;
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
        &self,
        state: &mut State,
        channel: &[u8],
        node: &NodeAddr,
    ) -> Option<Vec<u8>> {
        let link = match state.links.get_mut(node) {
            Some(link) => link,
            None => {
                link::start(Arc::downgrade(self.shared), node.clone());
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
        let mut guard = self.shared.state.lock();
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
        let mut state = self.shared.state.lock();
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
        let mut state = self.shared.state.lock();
        state
            .links
            .get_mut(node)
            .map(|link| std::mem::take(&mut link.pending))
            .unwrap_or_default()
    }

    fn take_link_idle(&self, node: &NodeAddr) -> Vec<Vec<u8>> {
        self.shared.sweep_idle();
        let mut state = self.shared.state.lock();
        state
            .links
            .get_mut(node)
            .map(|link| std::mem::take(&mut link.idle))
            .unwrap_or_default()
    }

    /// `node`'s answer to the `SSUBSCRIBE` of `channel`.
    fn shard_answered(&self, node: &NodeAddr, channel: &[u8], answer: Answer) {
        match answer {
            Answer::Confirmed => {
                let mut state = self.shared.state.lock();
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
                let mut state = self.shared.state.lock();
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
            Answer::Refused(e) => self.shared.answered(channel, Err(e), false),
            Answer::Unsupported => {
                // No sharded pub/sub to be had: this client listens the classic way
                // from now on. The channel's waiters have not queued yet (they queue
                // once their subscription is confirmed, with the flags of the way it
                // was): the classic reader takes it within its read tick.
                if self.shared.sharding.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        target: "redmutex",
                        "redmutex: SSUBSCRIBE refused (a server before 7.0, or the ACL); \
                         listening for releases with SUBSCRIBE"
                    );
                }
                let mut state = self.shared.state.lock();
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
        let mut state = self.shared.state.lock();
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
    fn link_lost(&self, node: &NodeAddr) {
        {
            let mut guard = self.shared.state.lock();
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
        let mut state = self.shared.state.lock();
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
                    self.shared.deliver(&channel, &payload);
                }
            }
            PushKind::SUnsubscribe => self.slot_lost(node, &channel),
            _ => {}
        }
    }
}
