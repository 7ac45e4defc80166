//! Redisson's `RFairLock` as a bench peer (issue 41): its scripts' commands and its
//! waiters' wake-ups, written here from Redisson 3.x's documented behaviour (our code).

use super::{request_id, ttl_wait, PeerScript, PubSub, UNLOCK_LATCH_PX_MS};

/// How long a new waiter's queue entry lives past the one before it, ms: Redisson 3.x's
/// default wait (300 s; 5 s in older versions), so no live waiter is purged in a run.
pub const FAIR_WAIT_MS: u64 = 300_000;

/// Every fair call's start: drops the queue's head while its timeout (client clock,
/// `args[4]` / `now`) has passed.
macro_rules! redisson_stale_heads {
    () => {
        r#"
local now = tonumber(args[4])
while true do
    local head = redis.call('LINDEX', keys[2], 0)
    if not head then
        break
    end
    local due = tonumber(redis.call('ZSCORE', keys[3], head))
    if due and due > now then
        break
    end
    redis.call('ZREM', keys[3], head)
    redis.call('LPOP', keys[2])
end
"#
    };
}

/// The fair scripts, as `REDISSON_BODIES` are written (`keys`, `args`).
/// lock KEYS: the lock hash, the queue (LIST of holder ids), the timeouts (ZSET holder
/// id -> deadline, client clock); ARGV: lease ms, holder, wait ms, now ms. nil when taken
/// (free and the queue empty or headed by the caller, or re-entered); else the caller's
/// estimated wait, ms (a new waiter is queued with the last waiter's timeout + wait).
/// unlock KEYS: the lock hash, the queue, the timeouts, the waiters' channel prefix, the
/// request's unlock latch; ARGV: the unlock message, lease ms, holder, now ms, latch PX.
/// As `redisson_unlock` replies, the freeing unlock PUBLISHing to the queue head's own
/// channel (`prefix:<holder id>`).
pub(super) const REDISSON_FAIR_BODIES: [(&str, &str); 2] = [
    (
        "redisson_fair_lock",
        concat!(
            redisson_stale_heads!(),
            r#"
if redis.call('EXISTS', keys[1]) == 0
    and (redis.call('EXISTS', keys[2]) == 0 or redis.call('LINDEX', keys[2], 0) == args[2]) then
    redis.call('LPOP', keys[2])
    redis.call('ZREM', keys[3], args[2])
    redis.call('HSET', keys[1], args[2], 1)
    redis.call('PEXPIRE', keys[1], args[1])
    return nil
end
if redis.call('HEXISTS', keys[1], args[2]) == 1 then
    redis.call('HINCRBY', keys[1], args[2], 1)
    redis.call('PEXPIRE', keys[1], args[1])
    return nil
end
local wait = tonumber(args[3])
local mine = redis.call('ZSCORE', keys[3], args[2])
if mine then
    return tonumber(mine) - wait - now
end
local last = redis.call('LINDEX', keys[2], -1)
local ttl
if last and last ~= args[2] then
    ttl = tonumber(redis.call('ZSCORE', keys[3], last)) - now
else
    ttl = redis.call('PTTL', keys[1])
end
if redis.call('ZADD', keys[3], ttl + wait + now, args[2]) == 1 then
    redis.call('RPUSH', keys[2], args[2])
end
return ttl
"#
        ),
    ),
    (
        "redisson_fair_unlock",
        concat!(
            redisson_stale_heads!(),
            r#"
local seen = redis.call('GET', keys[5])
if seen then
    return tonumber(seen)
end
if redis.call('EXISTS', keys[1]) == 0 then
    local head = redis.call('LINDEX', keys[2], 0)
    if head then
        redis.call('PUBLISH', keys[4] .. ':' .. head, args[1])
    end
    return 1
end
if redis.call('HEXISTS', keys[1], args[3]) == 0 then
    return nil
end
if redis.call('HINCRBY', keys[1], args[3], -1) > 0 then
    redis.call('PEXPIRE', keys[1], args[2])
    redis.call('SET', keys[5], 0, 'PX', args[5])
    return 0
end
redis.call('DEL', keys[1])
local head = redis.call('LINDEX', keys[2], 0)
if head then
    redis.call('PUBLISH', keys[4] .. ':' .. head, args[1])
end
redis.call('SET', keys[5], 1, 'PX', args[5])
return 1
"#
        ),
    ),
];

/// The client's clock, ms since the epoch: Redisson's fair lock passes its own.
fn now_ms() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis()
        .to_string()
}

/// The keys of one fair lock name.
pub struct RedissonFairKeys {
    pub lock: String,
    queue: String,
    timeouts: String,
    channels: String,
}

impl RedissonFairKeys {
    /// Redisson's key names for `name` (under the run's `prefix`).
    pub fn new(prefix: &str, name: &str) -> RedissonFairKeys {
        let lock = format!("{prefix}{name}");
        RedissonFairKeys {
            queue: format!("{prefix}redisson_lock_queue:{{{name}}}"),
            timeouts: format!("{prefix}redisson_lock_timeout:{{{name}}}"),
            channels: format!("{prefix}redisson_lock__channel:{{{name}}}"),
            lock,
        }
    }

    /// The own channel of the waiter `holder`.
    fn channel_of(&self, holder: &str) -> String {
        format!("{}:{holder}", self.channels)
    }
}

/// Redisson 3.x's `RFairLock`, as the `redisson-fair` row runs it: every call first drops
/// the queue's timed-out heads (`LINDEX 0`, `ZSCORE`, `ZREM` + `LPOP`, client clock);
/// the lock is taken in queue order (free, and the queue empty or headed by the caller:
/// `LPOP`, `ZREM`, `HSET`, `PEXPIRE`), re-entered by its holder, or the caller queued
/// (`ZADD` its timeout: the last waiter's + the wait, `RPUSH`) and told its estimated
/// wait; the freeing unlock (`GET` latch, `HEXISTS`, `HINCRBY -1`, `DEL`, `LINDEX 0`)
/// PUBLISHes to the head's own channel, and the head runs the lock script again. Each
/// waiting thread subscribes its own channel (on its process's shared pub/sub connection)
/// for the wait, and unsubscribes after. Left out: Redisson 3.x also lowers the other
/// waiters' timeouts when one takes the lock; how it does so is not in what the bench
/// follows, and leaving it out only makes this row cheaper.
pub struct RedissonFairLock {
    lock: PeerScript,
    unlock: PeerScript,
}

impl RedissonFairLock {
    /// Run as FCALL of the peers' library or as EVALSHA, as [`super::RedissonLock`].
    pub fn new(fcall: bool) -> RedissonFairLock {
        RedissonFairLock {
            lock: PeerScript::new("redisson_fair_lock", fcall),
            unlock: PeerScript::new("redisson_fair_unlock", fcall),
        }
    }

    fn try_lock(
        &self,
        con: &mut redis::Connection,
        k: &RedissonFairKeys,
        holder: &str,
        lease: &str,
    ) -> Option<i64> {
        self.lock.call(
            con,
            &[&k.lock, &k.queue, &k.timeouts],
            &[lease, holder, &FAIR_WAIT_MS.to_string(), &now_ms()],
        )
    }

    /// Takes `k` as `holder`, waiting as Redisson's fair `lock()` does.
    pub fn lock(
        &self,
        con: &mut redis::Connection,
        ps: &PubSub,
        k: &RedissonFairKeys,
        holder: &str,
        lease_ms: u64,
    ) {
        let lease = lease_ms.to_string();
        if self.try_lock(con, k, holder, &lease).is_none() {
            return;
        }
        let channel = k.channel_of(holder);
        ps.join(&channel);
        while let Some(ttl) = self.try_lock(con, k, holder, &lease) {
            ps.wait(&channel, ttl_wait(ttl));
        }
        ps.leave(&channel);
    }

    /// Gives one level of `k` back; fails the bench if `holder` did not hold it.
    pub fn unlock(
        &self,
        con: &mut redis::Connection,
        k: &RedissonFairKeys,
        holder: &str,
        lease_ms: u64,
    ) {
        let latch = format!("{}:redisson_unlock_latch:{}", k.lock, request_id());
        let r = self.unlock.call(
            con,
            &[&k.lock, &k.queue, &k.timeouts, &k.channels, &latch],
            &[
                "0",
                &lease_ms.to_string(),
                holder,
                &now_ms(),
                &UNLOCK_LATCH_PX_MS.to_string(),
            ],
        );
        assert!(r.is_some(), "the redisson fair lock was not ours any more");
    }
}
