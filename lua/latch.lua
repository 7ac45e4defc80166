-- latch.lua: the rules of a count-down latch's count, prepended to every latch_*.lua.
--
-- A count goes up to 2^63 - 1, but Lua numbers are doubles, exact only up to 2^53: a
-- count is only ever handled as the decimal string Redis stores, its arithmetic is left to
-- DECR, and a script returns it as that string, never through tonumber().
local L = {}

local I64_MAX = '9223372036854775807'

-- The latch's count as Redis stores it, or nil when there is no latch; and an error reply
-- to return, with nothing changed, when the key holds something that is not a count.
function L.read(key)
    local value = redis.call('get', key)
    if not value then
        return nil, nil
    end
    local digits = string.match(value, '^%-?([1-9]%d*)$')
    if value == '0' or (digits and (#digits < #I64_MAX or (#digits == #I64_MAX and digits <= I64_MAX))) then
        return value, nil
    end
    return nil, redis.error_reply('WRONGTYPE the key holds a value that is not a latch count; nothing was changed')
end

-- Whether a count read by L.read is still counting (above zero); no latch is not.
function L.counting(value)
    return value ~= nil and value ~= '0' and string.sub(value, 1, 1) ~= '-'
end
