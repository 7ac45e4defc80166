-- latch_set.lua: set a count-down latch's count, unless it is counting already.
-- (latch.lua is prepended: see it for how counts are read exactly)
--
-- KEYS[1]  the latch (a string: the count; its TTL the expiry the user chose)
-- ARGV[1]  the count, at least 1 and at most 2^63 - 1, in decimal
-- ARGV[2]  the expiry in milliseconds
--
-- Returns 1 when the count was set, 0 when the latch was counting already (left as it was).
-- A latch that reached zero, expired or never existed is not counting.
local current, refused = L.read(KEYS[1])
if refused then
    return refused
end
if L.counting(current) then
    return 0
end
redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
return 1
