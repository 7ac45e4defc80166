-- acquire.lua: take a reentrant lock, or re-enter it when the caller already holds it.
--
-- KEYS[1]  the lock hash (field = holder id, value = reentry count; fenced locks also
--          keep the hold's token in the field '~fence')
-- KEYS[2]  fenced locks only: the lock's token counter (an integer that never expires,
--          in a key namespace no lock name can reach)
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds that this level needs
-- ARGV[3]  the levels the caller believes it holds before this call (0 for a new hold)
--
-- Returns {1, count}         granted; count is the caller's reentry count after this call
--         {1, count, token}  the same for a fenced lock, with the hold's fencing token
--         {0, pttl}          held by someone else; pttl is the remaining lease in ms
--                            (-1 when the key somehow has no TTL)
--
-- The existence check, the grant and the lease are one atomic step: two callers can
-- never both see the key free. Lease rule: the key's expiry is the longest lease any held
-- level still needs, so a re-entry only ever raises it, never cuts the outer levels' lease.
-- A fencing token is drawn (INCR) in the same step, before anything is written: a
-- failing INCR (WRONGTYPE, an ACL without +incr) leaves no half-taken lock behind.
-- ARGV[3] makes a repeated call harmless: when the count is already above it, an earlier
-- call whose reply was lost took effect, and this one grants that level instead of
-- adding another.
local FENCE_FIELD = '~fence'
local fenced = #KEYS == 2
local lease = tonumber(ARGV[2])
local held = redis.call('hget', KEYS[1], ARGV[1])
if not held and redis.call('exists', KEYS[1]) == 1 then
    return {0, redis.call('pttl', KEYS[1])}
end
local token = false
if fenced then
    if held then
        token = redis.call('hget', KEYS[1], FENCE_FIELD)
    end
    if not token then
        -- A new hold, or one whose outer levels came through a plain Lock of the name.
        token = redis.call('incr', KEYS[2])
        redis.call('hset', KEYS[1], FENCE_FIELD, token)
    end
end
local count
if held then
    local expected = tonumber(ARGV[3])
    if tonumber(held) > expected then
        count = expected + 1
        redis.call('hset', KEYS[1], ARGV[1], count)
    else
        count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    end
    if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
    end
else
    count = 1
    redis.call('hset', KEYS[1], ARGV[1], count)
    redis.call('pexpire', KEYS[1], lease)
end
if not fenced then
    return {1, count}
end
return {1, count, tonumber(token)}
