//! The pickup of a hold a release handed to a waiting `Wait`: whether the grant's message
//! came early enough to take it at once, or the server must confirm it first.

use std::time::{Duration, Instant};

use super::Wait;
use crate::primitives::acquire::attempt::Grant;
use crate::primitives::kind::{self, Kind};
use crate::runtime::holds::lease;
use crate::runtime::scripting::queue;
use crate::runtime::telemetry;
use crate::{Error, LockGuard};

impl<K: Kind> Wait<'_, K> {
    /// The lock was handed to this thread by a release, in a message with `ticket`,
    /// `fence` (the token the release drew) and `at` (the server's time of the release):
    /// the guard, or `None` when the grant's pickup window was over first.
    ///
    /// The window (a lease of at most [`lease::PICKUP`], or the call's own lease if shorter)
    /// starts at the release, on the server. A grant that carries the ticket of this call's
    /// latest attempt that could queue was made from the queue entry that attempt wrote, so
    /// after the attempt ran, so after it was sent; and as much later than the attempt ran
    /// as the server's clock says (`at` against the time the attempt's reply carried). So
    /// its lease ends no earlier than the send time, plus that span, plus the window, by
    /// this machine's clock: the message's own delay does not count, nor how long the
    /// thread waited. While at least half the window is left the guard is returned at once,
    /// its lease counted from that moment, and the watchdog extends the hold when the lease
    /// needs more than the window. Otherwise ([`Wait::confirm_grant`]) the grant may have lapsed
    /// and passed on, and the server is asked; so too when the client saw the deployment
    /// change during the wait (see [`Wait::window_start`]): then the two server times may
    /// come from two clocks, and the confirmation places the hold from its own send time.
    pub(super) fn take_handoff(
        &mut self,
        ticket: u64,
        fence: u64,
        at: Option<u64>,
    ) -> Result<Option<LockGuard<K>>, Error> {
        let Some(since) = self.window_start(ticket, at) else {
            return self.confirm_grant(fence);
        };
        telemetry::handoff();
        if let Some(s) = &self.sub {
            // The others of this process now wait for our release (or lease).
            s.saw_lease_end(Instant::now() + Duration::from_millis(self.lease_ms));
        }
        let grant = Grant {
            count: 1,
            fence: kind::is_fenced::<K>().then_some(fence),
        };
        self.left_queue();
        let lock = self.lock;
        Ok(Some(lock.guard_for_grant(
            self.token,
            self.holder.clone(),
            grant,
            self.lease,
            since,
            true,
        )))
    }

    /// When the pickup window of a grant with `ticket` made at the server time `at` began
    /// at the earliest, by this machine's clock, if that shows the grant still has half its
    /// window or more left; `None` when it may not (the server must be asked), when the
    /// ticket is an earlier attempt's (that grant lapsed before the later attempt ran, or
    /// the attempt would have been granted), with `sync_replicas` (the replicas must
    /// confirm it), and when the client saw the deployment change since the attempt was
    /// sent (or cannot see it: a cluster).
    ///
    /// The last because the two server times must come from one clock: after a failover,
    /// a reconnect or a slot's move, the entry may have been timed by one server and the
    /// grant by another. A grant clock ahead by δ whose message took δ or more to arrive
    /// is not "placed after its own arrival", yet placed δ late: the watchdog's extension,
    /// a third into the window, could then land after the window closed on the server.
    fn window_start(&self, ticket: u64, at: Option<u64>) -> Option<Instant> {
        let exec = &self.lock.client.inner.exec;
        if ticket != self.ticket
            || exec.config.sync_replicas.is_some()
            || !exec.same_topology_since(self.joined_topology)
        {
            return None;
        }
        let start = queue::grant_seen_from(self.joined?, self.queued_at, at);
        let now = Instant::now();
        if start > now {
            // A grant placed after its own arrival: the two times came from clocks that
            // disagree (another server's, after a failover or a slot's move).
            return None;
        }
        let window = Duration::from_millis(self.lease_ms).min(lease::PICKUP);
        let left = start.checked_add(window)?.checked_duration_since(now)?;
        (left >= window / 2 + lease::pickup_margin(window)).then_some(start)
    }

    /// Confirms a hold handed to this thread (`fence`: the token the release drew) with the
    /// server before it is returned: `None` when its pickup window was over first.
    ///
    /// Nothing here can tell how long the grant's message took, or how long ago the grant
    /// was written when the call's leave-the-queue script reports it: a grant that arrived
    /// late may have lapsed and passed on. One renewal-script call settles it: it extends
    /// the hold to this call's lease if it is still ours (the extension the watchdog would
    /// otherwise make a third into the window), and with `sync_replicas` its `WAIT`
    /// confirms the hold on the replicas before the guard exists.
    pub(super) fn confirm_grant(&mut self, fence: u64) -> Result<Option<LockGuard<K>>, Error> {
        let lock = self.lock;
        let sent = Instant::now();
        let held =
            lock.confirm_handoff(&self.holder, self.lease_ms, lock.io_until(self.deadline))?;
        if !held {
            return Ok(None);
        }
        telemetry::handoff();
        if let Some(s) = &self.sub {
            // The others of this process now wait for our release (or lease).
            s.saw_lease_end(sent + Duration::from_millis(self.lease_ms));
        }
        let grant = Grant {
            count: 1,
            fence: kind::is_fenced::<K>().then_some(fence),
        };
        Ok(Some(self.keep_grant(grant, sent)))
    }
}
