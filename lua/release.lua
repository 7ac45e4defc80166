-- release.lua: leave one level of a reentrant lock; wake waiters when it becomes free.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's release channel
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds to restore while the caller still holds outer levels
-- ARGV[3]  message published on KEYS[2] when the lock becomes free
--
-- Returns -1     the caller holds no level (never acquired, lease expired, force-unlocked)
--         0      the lock is now free: the key is deleted and the message published
--         n > 0  the caller still holds n levels; the lease was reset to ARGV[2]
--
-- Reading the count first keeps the common case, the outermost release, at one write.
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not count then
    return -1
end
if count > 1 then
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('pexpire', KEYS[1], ARGV[2])
    return count - 1
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[3])
return 0
