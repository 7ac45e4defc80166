-- force_unlock.lua: delete a lock whoever holds it (an administrative operation).
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's release channel
-- ARGV[1]  message published on KEYS[2] when a lock was deleted
--
-- Returns 1 when a lock was deleted (and waiters were told), 0 when it was not locked.
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', KEYS[2], ARGV[1])
    return 1
end
return 0
