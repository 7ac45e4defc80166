-- latch_set.lua: set a count-down latch's count, unless it is counting already.
--
-- KEYS[1]  the latch (a string: the count; its TTL the expiry the user chose)
-- ARGV[1]  the count, at least 1
-- ARGV[2]  the expiry in milliseconds
--
-- Returns 1 when the count was set, 0 when the latch was counting already (left as it was).
-- A latch that reached zero, expired or never existed is not counting.
local current = redis.call('get', KEYS[1])
if current and not tonumber(current) then
    return redis.error_reply('WRONGTYPE the key holds a value that is not a latch count; nothing was changed')
end
if current and tonumber(current) > 0 then
    return 0
end
redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
return 1
