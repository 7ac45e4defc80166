-- acquire.lua: take a reentrant lock, or re-enter it when the caller already holds it.
--
-- KEYS[1]  the lock hash (field = holder id, value = reentry count)
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds (PEXPIRE applied on every grant)
--
-- Returns {1, count}  granted; count is the caller's reentry count after this call
--         {0, pttl}   held by someone else; pttl is the remaining lease in ms
--                     (-1 when the key somehow has no TTL)
--
-- The existence check, the grant and the lease are one atomic step: two callers can
-- never both see the key free.
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    local count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    redis.call('pexpire', KEYS[1], ARGV[2])
    return {1, count}
end
return {0, redis.call('pttl', KEYS[1])}
