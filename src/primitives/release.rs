//! Releasing one level of a held lock: the release script, sent again until it is
//! answered (refused before it ran, or its reply lost), with a handed-over hold's short
//! lease kept alive meanwhile. The guard decides what to release and what the reply means.

use std::time::Instant;

use crate::runtime::connection::con::Con;
use crate::runtime::connection::pool;
use crate::runtime::holds::lease;
use crate::runtime::holds::loss::Loss;
use crate::runtime::holds::loss::LossReason;
use crate::runtime::holds::LossAt;
use crate::runtime::inner::Inner;
use crate::runtime::keys::LockKeys;
use crate::runtime::scripting::calls;
use crate::runtime::scripting::scripts::{self, ScriptCall};
use crate::Error;

/// The release script's reply and the replicas' shortfall, if any.
pub(crate) type Reply = Result<(Freed, Option<Error>), Error>;

/// What the release scripts reply: the levels left (-1: the caller held none), whether a
/// waiter was served (1) or not (0), and the messages for waiters of the releaser's own
/// client, which the script returns instead of publishing them (see `lua/queue.lua`'s
/// `Q.hand_on`) for the releaser to deliver itself (`Subscriber::deliver_own`).
#[derive(Debug)]
pub(crate) struct Freed {
    pub(crate) left: i64,
    pub(crate) served: i64,
    pub(crate) told: Vec<Vec<u8>>,
}

impl redis::FromRedisValue for Freed {
    fn from_redis_value(v: redis::Value) -> Result<Freed, redis::ParsingError> {
        // A lock's common replies are an integer (`lua/release.lua`): the levels left,
        // 0 when the lock is free and nobody was told.
        if let redis::Value::Int(left) = v {
            return Ok(Freed {
                left,
                served: 0,
                told: Vec::new(),
            });
        }
        let mut items = Vec::<redis::Value>::from_redis_value(v)?.into_iter();
        let (Some(left), Some(served)) = (items.next(), items.next()) else {
            return Err("a release reply of fewer than two items".into());
        };
        Ok(Freed {
            left: i64::from_redis_value(left)?,
            served: i64::from_redis_value(served)?,
            told: items
                .map(Vec::<u8>::from_redis_value)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A release under way: the script's call, and the levels it was told the thread holds.
pub(crate) struct Release {
    pub(crate) cmd: ScriptCall,
    pub(crate) levels: usize,
    // For a hold handed over and not extended yet: how to keep its lease from running
    // out while the release is refused and sent again, and when its window ends.
    keep_alive: Option<KeepAlive>,
    window_ends: Option<Instant>,
    // For the release of a hold's last level: when it is lost by the clock alone (its
    // lease confirmed until then, and nothing renews it now), and why.
    lease_ends: Option<LossAt>,
}

impl Release {
    /// The release of `holder`'s hold on `keys`, of which the thread held `levels` levels:
    /// `need`, the lease the levels left need (see `HoldTable::releasing`); `window_ends`,
    /// the end of the pickup window of a hold handed over and not extended yet;
    /// `lease_ends`, when the hold's last level is lost by the clock alone.
    pub(crate) fn new(
        keys: &LockKeys,
        holder: &str,
        need: u64,
        levels: usize,
        window_ends: Option<Instant>,
        lease_ends: Option<LossAt>,
    ) -> Release {
        Release {
            cmd: calls::release(keys, holder, need, levels),
            levels,
            keep_alive: window_ends.map(|ends| KeepAlive {
                call: calls::confirm(keys, holder, lease::pickup_ms()),
                ends,
            }),
            window_ends,
            lease_ends,
        }
    }

    /// Sends the release script through `inner` until it is answered, marking the hold
    /// `lost` if its lease (a handed-over hold's window) passes meanwhile. The reply (the
    /// script's and the replicas' shortfall), and whether the script was sent again after
    /// a send that may have run it (a repeat).
    pub(crate) fn send(self, inner: &Inner, keys: &LockKeys, lost: &Loss) -> (Reply, bool) {
        let mut keep_alive = self.keep_alive;
        // Whether a send before this one may have run the script (its reply lost on the
        // way), and so whether this one is a repeat: a refusal before it ran (a split
        // slot's TRYAGAIN, a failover's refusals) is not.
        let mut may_have_run = false;
        let mut repeated = false;
        let mut sent = 0;
        let reply = inner.exec.run(|con| {
            sent += 1;
            repeated = may_have_run;
            if sent > 1 {
                // Sent again: the first was refused (a slot split by a migration, a
                // failover under way) or its connection dropped. A hold handed over has
                // only its pickup window, which such a wait may outlast: the lock's hash
                // alone, which a split slot still serves, is kept alive meanwhile.
                keep_alive_for_release(inner, con, &mut keep_alive, lost)?;
                // Any other hold released to its last level: nothing renews or watches it
                // any more, so its loss, if its lease passes while the release waits, is
                // told here, when it happens.
                if let (None, Some((ends, why))) = (&keep_alive, self.lease_ends) {
                    if ends <= Instant::now() {
                        lost.mark(why);
                    }
                }
            }
            let freed: Freed = inner
                .exec
                .eval(con, &self.cmd)
                .inspect_err(|e| may_have_run |= !refused_before_running(e))?;
            // It ran: a failed WAIT below sends it again, a repeat.
            may_have_run = true;
            let shortfall = if freed.left >= 0 {
                inner.exec.await_replicas(con, keys.key())?
            } else {
                None
            };
            Ok((freed, shortfall))
        });
        let ends = match (&keep_alive, self.window_ends) {
            (Some(k), _) => Some((k.ends, LossReason::RenewalFailed)),
            (None, Some(window)) => Some((window, LossReason::RenewalFailed)),
            (None, None) => self.lease_ends,
        };
        if let (Ok((freed, _)), Some((ends, why))) = (&reply, ends) {
            if freed.left < 0 && ends <= Instant::now() {
                // Its lease (a handed-over hold's window) passed while the release waited:
                // the hold lapsed then, which is what its guard says.
                lost.mark(why);
            }
        }
        (reply, repeated)
    }
}

/// Whether `e` refused a call before its script ran (so a call sent again after it is
/// no repeat): a settling deployment's refusals and redirections, a demoted primary's
/// `READONLY`, a script or library not loaded.
fn refused_before_running(e: &redis::RedisError) -> bool {
    pool::is_settling(e) || pool::is_readonly(e) || scripts::is_setup_refusal(e)
}

/// Keeps a handed-over hold's short lease going while its release waits (see
/// [`keep_alive_for_release`]).
struct KeepAlive {
    // The renewal script for the hold, to a pickup window from when it runs.
    call: ScriptCall,
    // The lease's end as far as known: the window's, then a window from each renewal.
    ends: Instant,
}

/// Before a release is sent again: renews the handed-over hold of `keep_alive` for another
/// pickup window once less than two thirds of its lease is left, so that its lease never
/// runs out while the release waits (and outlasts a release that fails in the end by a
/// window at most). Once the hold is found gone, or its lease over, nothing more is sent;
/// a lease that ran out unrenewed (the renewal refused too: its keys split) marks the hold
/// `lost` then, so that the hook hears of it when it happens, not when the release ends.
fn keep_alive_for_release(
    inner: &Inner,
    con: &mut Con,
    keep_alive: &mut Option<KeepAlive>,
    lost: &Loss,
) -> redis::RedisResult<()> {
    let Some(k) = keep_alive.as_mut() else {
        return Ok(());
    };
    let now = Instant::now();
    if k.ends <= now {
        lost.mark(LossReason::RenewalFailed);
        *keep_alive = None;
        return Ok(());
    }
    if !lease::extension_due(k.ends, now) {
        return Ok(());
    }
    let (lost, _): (Vec<i64>, Vec<i64>) = inner.exec.eval(con, &k.call)?;
    if lost.is_empty() {
        k.ends = now + lease::PICKUP;
    } else {
        *keep_alive = None;
    }
    Ok(())
}
