-- renew.lua: extend many watchdog leases in one round trip.
--
-- KEYS[1..n]   lock hashes
-- ARGV[1]      lease in milliseconds
-- ARGV[2..n+1] holder id for KEYS[i] is ARGV[i+1]
--
-- Returns an array of the indices i (1-based) whose holder field is gone: that lease was
-- lost (expired, force-unlocked, or Redis lost its data). Those keys are left untouched,
-- so a renewal can never resurrect or extend a lock that someone else now holds.
-- A renewal only raises the expiry: a nested level with a longer fixed lease keeps it.
local lease = tonumber(ARGV[1])
local lost = {}
for i = 1, #KEYS do
    if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
        if redis.call('pttl', KEYS[i]) < lease then
            redis.call('pexpire', KEYS[i], lease)
        end
    else
        lost[#lost + 1] = i
    end
end
return lost
