-- renew.lua: extend many watchdog leases, and keep many queue entries alive, in one call.
--
-- KEYS[1..n]           lock hashes (n = ARGV[1])
-- KEYS[n+2j-1, n+2j]   the queue and the waiters hash of the lock waited for by waiter j
-- ARGV[1]              n
-- ARGV[2i, 2i+1]       for KEYS[i], i <= n: holder id and the lease in ms it needs
-- ARGV[2n+2j, 2n+2j+1] for waiter j: holder id and how long its entry lives, in ms
--
-- Returns {lost, gone}: the indices i (1-based) of locks whose holder field is gone (that
-- lease was lost: expired, force-unlocked, or Redis lost its data; those keys are left
-- untouched, so a renewal can never resurrect or extend a lock someone else now holds),
-- and the indices j of waiters no longer queued (dropped as dead, or lapsed): they must
-- ask again.
-- A renewal only raises the expiry: a nested level with a longer fixed lease keeps it.
local n = tonumber(ARGV[1])
local lost, gone = {}, {}
for i = 1, n do
    local lease = tonumber(ARGV[2 * i + 1])
    if redis.call('hexists', KEYS[i], ARGV[2 * i]) == 1 then
        if redis.call('pttl', KEYS[i]) < lease then
            redis.call('pexpire', KEYS[i], lease)
        end
    else
        lost[#lost + 1] = i
    end
end
local now
local j = 1
while n + 2 * j <= #KEYS do
    local queue, waiters = KEYS[n + 2 * j - 1], KEYS[n + 2 * j]
    local holder, ttl = ARGV[2 * n + 2 * j], tonumber(ARGV[2 * n + 2 * j + 1])
    local v = redis.call('hget', waiters, holder)
    if v then
        if not now then
            local t = redis.call('time')
            now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        local rest = string.match(v, '^%d+ (.*)$')
        redis.call('hset', waiters, holder, (now + ttl) .. ' ' .. rest)
        for _, key in ipairs({queue, waiters}) do
            if redis.call('pttl', key) < ttl then
                redis.call('pexpire', key, ttl)
            end
        end
    else
        gone[#gone + 1] = j
    end
    j = j + 1
end
return {lost, gone}
