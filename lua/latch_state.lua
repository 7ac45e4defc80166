-- latch_state.lua: a latch's count and how long it has to live, read together.
--
-- KEYS[1]  the latch (a string: the count)
--
-- Returns {count, pttl}: count 0 and pttl -2 when the latch is not counting (opened,
-- expired, never set); pttl -1 if the key somehow has no expiry.
local current = redis.call('get', KEYS[1])
if current and not tonumber(current) then
    return redis.error_reply('WRONGTYPE the key holds a value that is not a latch count; nothing was changed')
end
if not current then
    return {0, -2}
end
return {tonumber(current), redis.call('pttl', KEYS[1])}
