-- latch_state.lua: a latch's count and how long it has to live, read together.
-- (latch.lua is prepended: see it for how counts are read exactly)
--
-- KEYS[1]  the latch (a string: the count)
--
-- Returns {count, pttl}: count as a decimal string (exact up to 2^63 - 1), 0 and pttl -2
-- when the latch is not counting (opened, expired, never set); pttl -1 if the key somehow
-- has no expiry.
local current, refused = L.read(KEYS[1])
if refused then
    return refused
end
if current == nil then
    return {0, -2}
end
return {current, redis.call('pttl', KEYS[1])}
