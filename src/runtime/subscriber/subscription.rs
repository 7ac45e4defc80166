//! `Subscription`: a waiting thread's interest in one lock's channel, through which it
//! waits for its wake-ups, learns whether the channel is listened to yet, and claims its
//! turn to try on its own; dropping it gives the interest up.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

use super::dispatch::Shared;
use super::waiters::Waiters;
use super::LINGER;
use crate::runtime::scripting::queue::Notice;
use crate::Error;

/// A thread's interest in one lock's channel; dropping it gives the interest up.
pub(crate) struct Subscription {
    pub(super) shared: Arc<Shared>,
    pub(super) channel: Vec<u8>,
    pub(super) waiters: Arc<Waiters>,
    pub(super) token: u64,
    pub(super) notices: Receiver<Notice>,
}

impl Subscription {
    /// Queue-entry flags saying how this thread's client listens on the lock's channel:
    /// `SHARDED` with sharded pub/sub, so that a release tells it with `SPUBLISH` (see
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
