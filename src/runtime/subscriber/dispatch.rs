//! The state a client's subscriber shares between its API, its reader threads and its
//! waiters (`Shared`): which channels are wanted, requested and confirmed, and the
//! dispatch of what a reader hears (a wake-up, a `force_unlock` of one of the client's
//! holds, a lost connection) to the waiting threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use super::shards::state::{LinkState, SlotMap};
use super::waiters::Waiters;
use super::{ForceUnlocked, BROADCAST, IDLE_CHECK_GAP, LINGER, MAX_RECONNECT_BACKOFF};
use crate::runtime::connection::con::NodeAddr;
use crate::runtime::connection::pool::Manager;
use crate::runtime::scripting::queue;
use crate::Error;

/// What the subscriber's API, its readers and its waiters share.
pub(super) struct Shared {
    pub(super) manager: Manager,
    // Private to this client: waiters publish here to make the reader, blocked on the
    // socket, come back and subscribe their channels (it alone owns the connection), and
    // `force_unlock` tells this client here which of its holds it freed.
    pub(super) control: Vec<u8>,
    // The client whose holds a `force_unlock` message marks lost: set once it first
    // acquires something (see `Subscriber::listen`).
    pub(super) client: OnceLock<Weak<dyn ForceUnlocked>>,
    // A latch: its sender is dropped once the server answered the subscription of
    // `control` (the first session's first SUBSCRIBE), or the reader failed to make or
    // keep its first connection, which a client's first acquisitions await (see `listen`).
    pub(super) listening: Mutex<(Option<Sender<()>>, Receiver<()>)>,
    // Since when the server has confirmed `control`'s subscription on the current
    // connection (`None`: not confirmed, or no connection): a hold granted after that
    // instant was granted while a `force_unlock` of it is heard (see `held`).
    pub(super) listening_since: Mutex<Option<Instant>>,
    // The server's ACL refusal of `control`'s SUBSCRIBE, while it stands: the reader asks
    // again, backing off, and meanwhile the client's acquisitions fail (see `refusal`).
    pub(super) refused: Mutex<Option<redis::RedisError>>,
    // Whether a refusal was told at WARN: once, not at every retry or lock.
    pub(super) warned: AtomicBool,
    // Whether a lock queue's channels are listened to with sharded pub/sub (a cluster,
    // until a node shows it has none: see `shards/`).
    pub(super) sharding: AtomicBool,
    pub(super) state: Mutex<State>,
}

/// The channels and links, under one lock.
#[derive(Default)]
pub(super) struct State {
    pub(super) channels: HashMap<Vec<u8>, Entry>,
    // Channels the reader must still SUBSCRIBE in the current session.
    pub(super) pending: Vec<Vec<u8>>,
    // Channels nobody waits on any more, for the reader to UNSUBSCRIBE.
    pub(super) idle: Vec<Vec<u8>>,
    pub(super) connected: bool,
    // When a channel nobody waits on may have lingered long enough, if any may: until
    // then `sweep_idle` has nothing to look for.
    pub(super) next_idle_check: Option<Instant>,
    // On a cluster: the link to each primary the client listens on (see `shards/`).
    pub(super) links: HashMap<NodeAddr, LinkState>,
    // Which primary serves which slot, once needed.
    pub(super) slots: Option<SlotMap>,
}

/// One channel as the subscriber keeps it.
pub(super) struct Entry {
    pub(super) refs: usize,
    pub(super) idle_since: Option<Instant>,
    // SUBSCRIBE requested in the current session (queued or sent): of the classic
    // connection's, or of the link `shard`'s.
    pub(super) requested: bool,
    pub(super) waiters: Arc<Waiters>,
    // `Some`: listened to with SSUBSCRIBE on this primary's link (see `shards/`).
    pub(super) shard: Option<NodeAddr>,
    // A sharded subscription of the channel was lost (its slot moved, its link failed):
    // its next confirmation makes every waiter look again.
    pub(super) lapsed: bool,
}

/// A `force_unlock` message on a client's own channel: "f <token> <key>", the token of
/// the holder it freed (its holder id is "<client id>:<token>") and the key it freed.
pub(super) fn parse_forced(payload: &[u8]) -> Option<(u64, &[u8])> {
    let rest = payload.strip_prefix(b"f ")?;
    let space = rest.iter().position(|&b| b == b' ')?;
    let token = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
    Some((token, &rest[space + 1..]))
}

impl Shared {
    /// Everything to subscribe on a new connection; the pending queue is subsumed by it.
    pub(super) fn begin_session(&self) -> Vec<Vec<u8>> {
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
    pub(super) fn answered(
        &self,
        channel: &[u8],
        answer: Result<(), redis::RedisError>,
        reconnect: bool,
    ) {
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
    pub(super) fn control_answered(
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
    pub(super) fn not_listening(&self) {
        *self.listening_since.lock() = None;
        self.listening.lock().0 = None;
    }

    /// Says at WARN, once, that the server refused a channel; later refusals at DEBUG.
    pub(super) fn warn_refused(&self, channel: &[u8], e: &redis::RedisError) {
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
    pub(super) fn explain(&self, e: &redis::RedisError) -> Error {
        let target = &self.manager.target;
        Error::redis(e.clone()).at_server(
            || target.server(),
            || target.user(),
            target.has_password(),
        )
    }

    pub(super) fn confirmed(&self, channel: &[u8], reconnect: bool) {
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

    pub(super) fn take_pending(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.state.lock().pending)
    }

    /// Channels of the classic connection nobody waits on any more (see `sweep_idle`).
    pub(super) fn take_idle(&self) -> Vec<Vec<u8>> {
        self.sweep_idle();
        std::mem::take(&mut self.state.lock().idle)
    }

    /// Forgets the channels nobody waited on for `LINGER`, handing those subscribed to
    /// the reader that must unsubscribe them: the classic one's, or their link's.
    pub(super) fn sweep_idle(&self) {
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
    pub(super) fn waiters_of(&self, channel: &[u8]) -> Option<Arc<Waiters>> {
        let state = self.state.lock();
        state
            .channels
            .get(channel)
            .map(|entry| entry.waiters.clone())
    }

    pub(super) fn deliver(&self, channel: &[u8], payload: &[u8]) {
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

    pub(super) fn disconnected(&self) {
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
