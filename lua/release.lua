-- release.lua: leave one level of a reentrant lock; wake waiters when it becomes free.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's release channel
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds that the caller's remaining levels still need (the
--          longest of them); 0 when none needs any more time
-- ARGV[3]  message published on KEYS[2] when the lock becomes free
-- ARGV[4]  the levels the caller believes it holds before this call (at least 1)
--
-- Returns -1     the caller holds no level (never acquired, lease expired, force-unlocked,
--                or a repeated call whose first run freed the lock)
--         0      the lock is now free: the key is deleted and the message published
--         n > 0  the caller still holds n levels; the key's expiry is set to ARGV[2]
--
-- The expiry is set, not just raised: a released inner level with a longer lease must not
-- leave its lease to the outer ones. Remaining levels that need no more time (fixed leases
-- already over) free the lock at once, as their lease would have.
-- The count is set from ARGV[4], not decremented, so a repeated call (after a lost reply)
-- takes no second level, and levels left by lost acquire replies are dropped too.
local held = redis.call('hget', KEYS[1], ARGV[1])
if not held then
    return -1
end
local count = tonumber(held)
local expected = tonumber(ARGV[4])
if count < expected then
    -- This release already took effect; its reply was lost.
    return count
end
local left = expected - 1
local need = tonumber(ARGV[2])
if left > 0 and need > 0 then
    redis.call('hset', KEYS[1], ARGV[1], left)
    redis.call('pexpire', KEYS[1], need)
    return left
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[3])
return 0
