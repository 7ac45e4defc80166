-- latch_count_down.lua: count a latch down by one; open it at zero.
--
-- KEYS[1]  the latch (a string: the count)
-- ARGV[1]  the channel its waiters listen on
-- ARGV[2]  the message that tells every waiter to look again
--
-- Returns the count left: 0 when this call opened the latch (the key is deleted and the
-- waiters told), or when it was not counting (nothing changed).
local current = redis.call('get', KEYS[1])
if current and not tonumber(current) then
    return redis.error_reply('WRONGTYPE the key holds a value that is not a latch count; nothing was changed')
end
if not current or tonumber(current) <= 0 then
    return 0
end
local left = redis.call('decr', KEYS[1])
if left <= 0 then
    redis.call('del', KEYS[1])
    redis.call('publish', ARGV[1], ARGV[2])
    return 0
end
return left
