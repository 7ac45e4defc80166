-- acquire_fenced.lua: acquire.lua for fenced locks; every new outermost hold also gets a
-- fencing token, a number that only grows for this lock name.
--
-- KEYS[1]  the lock hash (field = holder id, value = reentry count; plus FENCE_FIELD)
-- KEYS[2]  the lock's token counter (a plain integer key that never expires)
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds (PEXPIRE applied on every grant)
-- ARGV[3]  the levels the caller believes it holds before this call (0 for a new hold)
--
-- Returns {1, count, token}  granted; count is the caller's reentry count after this
--                            call, token the hold's fencing token (the same for every
--                            level of one hold)
--         {0, pttl}          held by someone else; pttl is the remaining lease in ms
--                            (-1 when the key somehow has no TTL)
--
-- The token is drawn (INCR) in the same atomic step that grants the lock, so no two
-- holds of one name ever share a token, and a later hold always has a larger one. A
-- repeated call is harmless, as in acquire.lua.
local FENCE_FIELD = '~fence'
local held = redis.call('hget', KEYS[1], ARGV[1])
if held then
    local expected = tonumber(ARGV[3])
    local count
    if tonumber(held) > expected then
        count = expected + 1
        redis.call('hset', KEYS[1], ARGV[1], count)
    else
        count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    end
    redis.call('pexpire', KEYS[1], ARGV[2])
    local token = redis.call('hget', KEYS[1], FENCE_FIELD)
    if not token then
        -- The outer levels were taken through a plain Lock of the same name: this hold
        -- gets its token now.
        token = redis.call('incr', KEYS[2])
        redis.call('hset', KEYS[1], FENCE_FIELD, token)
    end
    return {1, count, tonumber(token)}
end
if redis.call('exists', KEYS[1]) == 0 then
    local token = redis.call('incr', KEYS[2])
    redis.call('hset', KEYS[1], ARGV[1], 1, FENCE_FIELD, token)
    redis.call('pexpire', KEYS[1], ARGV[2])
    return {1, 1, token}
end
return {0, redis.call('pttl', KEYS[1])}
