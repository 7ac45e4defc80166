//! One attempt at a `Lock<K>` and what comes of it: the acquire script's call and its
//! reply (`Grant`, `Refused`), the confirmation of a hold a release handed over, and the
//! guard a grant becomes. The pieces every acquisition is made of: a `Lock`'s wait
//! (`wait.rs`) and a `MultiLock`'s rounds (`multi_wait.rs`) both use them.

use std::time::{Duration, Instant};

use crate::primitives::kind::{self, Kind};
use crate::primitives::lock::Lock;
use crate::primitives::release::Freed;
use crate::runtime::connection::con::Con;
use crate::runtime::connection::pool::Room;
use crate::runtime::holds::lease::{millis, Lease, IO_GRACE};
use crate::runtime::holds::Acquisition;
use crate::runtime::keys;
use crate::runtime::scripting::calls;
use crate::runtime::scripting::scripts::ScriptCall;
use crate::{Error, LockGuard};

impl<K: Kind> Lock<K> {
    /// Runs the acquire script: `Ok(grant)` when granted, `Err(refused)` when held elsewhere.
    /// With `join`, a thread not granted is queued (or its entry refreshed), with the
    /// flags `listen` of its subscription (`Subscription::listen_flags`). `room`: room in
    /// the pool the caller took already (see `Executor::enter`).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::primitives) fn attempt(
        &self,
        (token, holder): (u64, &str),
        lease_ms: u64,
        amount: u32,
        join: Option<(u64, u64)>,
        listen: u8,
        until: Option<Instant>,
        mut room: Option<Room>,
    ) -> Result<Result<Grant, Refused>, Error> {
        let inner = &self.client.inner;
        let keys = &self.keys;
        // (The room is given back while a clean-up of this thread's is waited for.)
        let held = inner
            .holds
            .begin_attempt_then(keys.hold(), token, until, || drop(room.take()))?;
        let call = self.acquire_cmd(holder, lease_ms, held, amount, join, listen);
        let outcome = inner.exec.run_in(room, until, |con| {
            let reply: AcquireReply = inner.exec.eval(con, &call)?;
            let grant = match Self::grant_of(&reply.0)? {
                Ok(Ok(grant)) => grant,
                other => return Ok(other),
            };
            let need = || {
                let watchdog_ms = inner.exec.config.lease.watchdog_ms();
                inner.holds.need_ms(keys.hold(), token, watchdog_ms)
            };
            Ok(
                match self.replicated(con, holder, need, grant.count as usize)? {
                    None => Ok(Ok(grant)),
                    Some(shortfall) => Err(shortfall),
                },
            )
        });
        let outcome = outcome.and_then(|refused| refused);
        self.settle_attempt((token, holder), held, join.is_some(), outcome)
    }

    /// Ends an attempt begun with `watchdog.begin_attempt` (which said `held`) and passes
    /// its outcome on: a level or a queue entry it may have left unknown to this process
    /// is given back by the watchdog.
    pub(crate) fn settle_attempt(
        &self,
        (token, holder): (u64, &str),
        held: usize,
        joined: bool,
        outcome: Result<Result<Grant, Refused>, Error>,
    ) -> Result<Result<Grant, Refused>, Error> {
        let inner = &self.client.inner;
        let keys = &self.keys;
        let granted = matches!(outcome, Ok(Ok(_)));
        let queued = joined && matches!(outcome, Ok(Err(_)));
        inner.holds.end_attempt(keys.hold(), token, granted, queued);
        if let Err(e) = &outcome {
            if e.outcome_unknown() {
                // Redis may have run the script, or may still: a level nobody holds, or a
                // queue entry nobody waits behind.
                inner.watchdog.doubt(inner, keys, token, holder, held);
            }
        }
        outcome
    }

    /// The lease a level taken with `lease` asks for, in ms.
    pub(crate) fn lease_ms(&self, lease: Lease) -> u64 {
        match lease {
            // A cap shorter than the watchdog lease shortens the first lease too: the hold
            // ends at its cap whatever it is.
            Lease::Watchdog => {
                let ms = self.client.inner.exec.config.lease.watchdog_ms();
                self.max_hold.map_or(ms, |cap| ms.min(millis(cap)))
            }
            Lease::Fixed(ms) => ms,
        }
    }

    /// The acquire script's call (see `lua/acquire.lua`): `held` levels believed held,
    /// `join` the ticket and entry lifetime to queue with, `listen` how the thread's client
    /// listens for its turn (`Subscription::listen_flags`).
    pub(crate) fn acquire_cmd(
        &self,
        holder: &str,
        lease_ms: u64,
        held: usize,
        amount: u32,
        join: Option<(u64, u64)>,
        listen: u8,
    ) -> ScriptCall {
        let exec = &self.client.inner.exec;
        let ops = self.keys.ops;
        calls::acquire(
            &self.keys,
            &calls::Acquire {
                holder,
                lease_ms,
                held,
                flags: ops.flags | exec.listener_flags() | listen,
                join,
                amount: ops.per_call.then_some((amount, self.initial)),
                metadata: exec.config.metadata.as_deref(),
            },
        )
    }

    /// What the acquire script's reply says: granted, held elsewhere (the holder's
    /// remaining lease in ms), or refused.
    pub(crate) fn grant_of(
        reply: &[i64],
    ) -> redis::RedisResult<Result<Result<Grant, Refused>, Error>> {
        Ok(match *reply {
            [1, count, fence] => Ok(Ok(Grant {
                count,
                fence: kind::is_fenced::<K>().then_some(fence as u64),
            })),
            [0, pttl] => Ok(Err(Refused {
                pttl,
                queued_at: None,
            })),
            [0, pttl, at] => Ok(Err(Refused {
                pttl,
                queued_at: u64::try_from(at).ok(),
            })),
            // Asked to write while holding a read hold: refused, nothing written.
            [-1] => Err(Error::WOULD_DEADLOCK),
            // An upgrade whose upgradeable hold is gone: the write would not be one.
            [-3] => Err(Error::LEASE_LOST),
            // The name is another kind's: refused, nothing written (the caller's queue
            // entry, if any, removed).
            [-4, kind] => Err(Error::wrong_kind(keys::kind_name(kind))),
            // A semaphore asked for more permits than it has: refused, nothing written.
            [-2, total] => Err(Error::invalid(format!(
                "more permits asked for than the semaphore has ({total})"
            ))),
            // A semaphore handle made with a number the semaphore neither has nor was
            // defined with: refused, nothing written.
            [-5, total, made, asked] => Err(Error::invalid(if total == made {
                format!(
                    "the semaphore has {total} permits, but this handle was made with \
                     {asked}: make it with {total}, or change the number with set_permits"
                )
            } else {
                format!(
                    "the semaphore has {total} permits (defined with {made}), but this \
                     handle was made with {asked}: make it with either, or change the \
                     number with set_permits"
                )
            })),
            _ => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "unexpected reply from the acquire script",
                )))
            }
        })
    }

    /// Confirms the hold a release handed to `holder` (see `Wait::confirm`; a `MultiLock`
    /// confirms a member handed over as its call left the queue the same way): true when it
    /// was still held, now with a lease of `lease_ms` from this call on; false when it had
    /// lapsed (nothing changed). With `sync_replicas`, a hold the replicas did not confirm
    /// is given back (and handed on), and the call fails as an acquisition would.
    pub(crate) fn pick_up(
        &self,
        holder: &str,
        lease_ms: u64,
        until: Option<Instant>,
    ) -> Result<bool, Error> {
        let exec = &self.client.inner.exec;
        let keys = &self.keys;
        let call = calls::confirm(keys, holder, lease_ms);
        let outcome = exec.run_until(until, |con| {
            let (lost, _): (Vec<i64>, Vec<i64>) = exec.eval(con, &call)?;
            if !lost.is_empty() {
                return Ok(Ok(false));
            }
            // The renewal always writes, so its WAIT covers the grant written before it.
            Ok(match self.replicated(con, holder, || 0, 1)? {
                None => Ok(true),
                Some(shortfall) => Err(shortfall),
            })
        });
        outcome.and_then(|confirmed| confirmed)
    }

    /// With `sync_replicas`, after a script on `con` gave `holder` a level (it now holds
    /// `held`): `None` once the replicas confirmed it (or none are asked for). A grant the
    /// replicas did not confirm, or a WAIT that failed (an ACL without +wait, a proxy
    /// without WAIT), is given back on the same connection (the levels left need `need()`
    /// ms), since a lock the caller is told it did not get must not stay taken for a whole
    /// lease: `Some(why)`. The give-back's own failure is the one reported: the level may
    /// then remain until its lease ends (or the thread's next acquisition adopts it).
    fn replicated(
        &self,
        con: &mut Con,
        holder: &str,
        need: impl FnOnce() -> u64,
        held: usize,
    ) -> redis::RedisResult<Option<Error>> {
        let keys = &self.keys;
        let failure = match self.client.inner.exec.await_replicas(con, keys.key()) {
            Ok(None) => return Ok(None),
            Ok(Some(shortfall)) => Ok(shortfall),
            Err(e) => Err(e),
        };
        let inner = &self.client.inner;
        let rollback: redis::RedisResult<Freed> = inner
            .exec
            .eval(con, &calls::release(keys, holder, need(), held));
        if let Ok(freed) = &rollback {
            // The level given back may have gone to a waiting thread of this client,
            // whose message is in the reply (see `Freed`).
            inner.subscriber.deliver_own(keys.channel(), &freed.told);
        }
        match (failure, rollback) {
            (Ok(shortfall), Ok(_)) => Ok(Some(shortfall)),
            (Ok(_), Err(e)) | (Err(e), _) => Err(e),
        }
    }

    pub(crate) fn wait_bound(&self, pttl: i64) -> Duration {
        match pttl {
            // No expiry at all (someone wrote the key by hand): look again after a lease
            // rather than never.
            -1 => self.client.inner.exec.config.lease.watchdog(),
            // PTTL rounds down: the lease may last up to a millisecond more, and waking
            // before it ends would only cost a wasted try.
            ms if ms >= 0 => Duration::from_millis(ms as u64 + 1),
            // Gone between the check and the PTTL: try again at once.
            _ => Duration::ZERO,
        }
    }

    pub(crate) fn granted(
        &self,
        token: u64,
        holder: String,
        grant: Grant,
        lease: Lease,
        sent: Instant,
        handoff: bool,
    ) -> LockGuard<K> {
        let inner = &self.client.inner;
        let registration = self.client.inner.holds.acquired(
            &self.keys,
            token,
            &holder,
            grant.count,
            (lease, self.lease_ms(lease)),
            (sent, handoff),
            &Acquisition {
                kind: K::NAME,
                generation: self.client.inner.exec.generation(),
                max_hold: self.max_hold,
                thread: self.thread_owned().then(keys::thread_token),
            },
        );
        // A force_unlock of this hold is told on the client's own channel, or found by a
        // check of the holds if it may have been told to nobody (see `Subscriber::held`).
        inner.subscriber.held(inner, sent);
        LockGuard::new(self, token, holder, lease, sent, registration, grant.fence)
    }

    /// Whether this handle's holds are the acquiring thread's (re-entered by its later
    /// acquisitions), not holders of their own (a permit, an owned hold).
    pub(crate) fn thread_owned(&self) -> bool {
        !self.keys.ops.per_call && !<K as crate::primitives::kind::sealed::Sealed>::OWN_HOLDER
    }

    /// How long an acquisition begun now with `deadline` and `lease` waits for the client's
    /// own channel's subscription to be answered (see `Subscriber::listen`): before it
    /// sends anything, until its deadline (a call that may not wait at all sends at once);
    /// once it holds, until its I/O bound ends, and never past half its lease (counted
    /// from no earlier than now), so a guard is never handed out with its lease over;
    /// either at most the command timeout from now.
    pub(crate) fn listen_bounds(
        &self,
        lease: Lease,
        deadline: Option<Instant>,
    ) -> (Instant, Instant) {
        let now = Instant::now();
        let command = now + self.client.inner.exec.config.command_timeout;
        let before = deadline.map_or(command, |d| d.min(command));
        let half_lease = now + Duration::from_millis(self.lease_ms(lease) / 2);
        let after = self
            .io_until(deadline)
            .map_or(command, |io| io.min(command));
        (before, after.min(half_lease))
    }

    /// The instant I/O of an attempt must give up at: none for unbounded calls, the
    /// deadline (or now, past it) plus a grace for the round trip under way for bounded
    /// ones, plus the replicas' WAIT when `sync_replicas` is on.
    pub(in crate::primitives) fn io_until(&self, deadline: Option<Instant>) -> Option<Instant> {
        let deadline = deadline?;
        let mut grace = IO_GRACE;
        if let Some((_, wait_ms)) = self.client.inner.exec.config.sync_replicas {
            grace += Duration::from_millis(wait_ms);
        }
        Some(deadline.max(Instant::now()) + grace)
    }
}

/// An acquire script's reply as the numbers of its table (see [`Lock::grant_of`]). A lock's
/// grant without a fencing token, its common reply, comes as the bare reentry count, an
/// integer (`lua/acquire.lua`): read as the table `{1, count, 0}` it stands for.
pub(crate) struct AcquireReply(pub(crate) Vec<i64>);

impl redis::FromRedisValue for AcquireReply {
    fn from_redis_value(v: redis::Value) -> Result<AcquireReply, redis::ParsingError> {
        Ok(AcquireReply(match v {
            redis::Value::Int(count) => vec![1, count, 0],
            table => Vec::<i64>::from_redis_value(table)?,
        }))
    }
}

/// What a granted acquire script reported.
pub(crate) struct Grant {
    pub(crate) count: i64,
    pub(crate) fence: Option<u64>,
}

/// What an acquire script that did not grant reported.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refused {
    /// The holder's remaining lease in ms (-1: none known).
    pub(crate) pttl: i64,
    /// The server's time (ms) when the attempt queued the caller; `None` when it did not.
    pub(crate) queued_at: Option<u64>,
}
