//! One attempt at a `Lock<K>`: the acquire script's call and what its reply says
//! (`Grant`, `Refused`). The piece every acquisition is made of: a `Lock`'s wait
//! (`wait/`) and a `MultiLock`'s rounds (`multi_wait/round.rs`) both send it.

use std::time::Instant;

use crate::primitives::kind::{self, Kind};
use crate::primitives::lock::Lock;
use crate::runtime::connection::pool::Room;
use crate::runtime::keys;
use crate::runtime::scripting::calls;
use crate::runtime::scripting::scripts::ScriptCall;
use crate::Error;

impl<K: Kind> Lock<K> {
    /// Runs the acquire script: `Ok(grant)` when granted, `Err(refused)` when held elsewhere.
    /// With `join`, a thread not granted is queued (or its entry refreshed), with the
    /// flags `listen` of its subscription (`Subscription::listen_flags`). `room`: room in
    /// the pool the caller took already (see `Executor::enter`).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::primitives) fn send_attempt(
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
