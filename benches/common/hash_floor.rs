//! The hash floor (a reentrant lock in a hash by Lua, nothing more) and the scripts' shared parts.

/// The floor of the design itself: the least a reentrant lock kept in a hash by Lua
/// scripts can run (take: EXISTS, HINCRBY, PEXPIRE; give back: HEXISTS, HINCRBY, DEL,
/// PUBLISH to wake waiters), no queue, no fencing, no fairness, as EVALSHA calls.
pub struct HashLock {
    take: redis::Script,
    give: redis::Script,
}

impl HashLock {
    pub fn new() -> HashLock {
        HashLock {
            take: redis::Script::new(
                r#"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"#,
            ),
            give: redis::Script::new(
                r#"
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 'free')
return 1
"#,
            ),
        }
    }

    /// One uncontended take + give back of `key` (waking nobody on `channel`).
    pub fn pair(&self, con: &mut redis::Connection, key: &str, channel: &str) {
        let taken: Option<i64> = self
            .take
            .key(key)
            .arg(30_000u64)
            .arg("holder:1")
            .invoke(con)
            .expect("hash lock take");
        assert!(taken.is_none(), "the uncontended hash lock was taken");
        let given: Option<i64> = self
            .give
            .key(key)
            .key(channel)
            .arg("holder:1")
            .arg(30_000u64)
            .invoke(con)
            .expect("hash lock give");
        assert_eq!(given, Some(1), "the hash lock was not ours any more");
    }
}

/// The hash floors' take, written once: the first hold (`EXISTS`, `HSET`, `PEXPIRE`) or
/// the holder's re-entry (`HEXISTS`, `HINCRBY`, `PEXPIRE`), each returning 1; what
/// follows it runs when another holds the lock.
macro_rules! hash_take {
    () => {
        r#"
if redis.call('EXISTS', keys[1]) == 0 then
    redis.call('HSET', keys[1], args[1], 1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 1
end
if redis.call('HEXISTS', keys[1], args[1]) == 1 then
    redis.call('HINCRBY', keys[1], args[1], 1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 1
end
"#
    };
}

/// The hash floors' give, written once: -1 when the caller does not hold the lock, 0 when
/// it keeps levels (`HINCRBY -1`, `PEXPIRE`); after its last level the lock is deleted and
/// what follows runs.
macro_rules! hash_leave {
    () => {
        r#"
local n = redis.call('HGET', keys[1], args[1])
if not n then
    return -1
end
if tonumber(n) > 1 then
    redis.call('HINCRBY', keys[1], args[1], -1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 0
end
redis.call('DEL', keys[1])
"#
    };
}

/// The string-lock floors' handover, written once: `next` (popped) made the holder and
/// told, else the lock deleted.
macro_rules! set_hand {
    () => {
        r#"
if next then
    redis.call('SET', keys[1], next, 'PX', args[2])
    redis.call('PUBLISH', args[3] .. next, 'g')
    return 1
end
redis.call('DEL', keys[1])
return 0
"#
    };
}
