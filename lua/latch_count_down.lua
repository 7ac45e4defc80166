-- latch_count_down.lua: count a latch down by one; open it at zero.
-- (latch.lua is prepended: see it for how counts are read exactly)
--
-- KEYS[1]  the latch (a string: the count)
-- ARGV[1]  the channel its waiters listen on
-- ARGV[2]  the message that tells every waiter to look again
--
-- Returns the count left, as a decimal string (exact up to 2^63 - 1): 0 when this call
-- opened the latch (the key is deleted and the waiters told), or when it was not counting
-- (nothing changed).
local current, refused = L.read(KEYS[1])
if refused then
    return refused
end
if not L.counting(current) then
    return '0'
end
-- DECR's reply reaches Lua as a double, inexact above 2^53, but a nonzero integer is never
-- a zero double: the comparison is exact. The count itself is read back as a string.
if redis.call('decr', KEYS[1]) <= 0 then
    redis.call('del', KEYS[1])
    redis.call('publish', ARGV[1], ARGV[2])
    return '0'
end
return redis.call('get', KEYS[1])
