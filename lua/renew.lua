-- renew.lua: extend many watchdog leases, and keep many queue entries alive, in one call;
-- also how a waiter confirms a hold handed to it (one hold, no waiter).
--
-- ARGV[1]  n, the number of holds
-- Then for each hold i, three ARGV (mode, field, lease in ms) and its keys, in order (a
-- lease of 0 checks the hold only: it is reported if gone, and nothing is written):
--   mode 'k'  a lock: one key, the lock hash; the field is the holder id, and the lease is
--             the key's expiry
--   mode 'm'  a hold with a lease of its own (read-write locks): two keys, the holds hash
--             and the leases ZSET (see leases.lua); the field is the hold's field
--   mode 's'  a semaphore's permits: as 'm', a third key, the semaphore's definition (see
--             semaphore.lua), and a fourth ARGV, how long the definition outlives the
--             holds' new expiry, in ms: it is raised to that at least (S.keep's rule)
-- Then for each waiter j, two ARGV (holder id, how long its entry lives in ms) and two keys
-- (the queue and the waiters hash of what it waits for).
--
-- Returns {lost, gone}: the indices i (1-based) of holds that are gone (that lease was
-- lost: expired, force-unlocked, or Redis lost its data; they are left untouched, so a
-- renewal can never resurrect or extend a hold someone else now has), and the indices j
-- of waiters no longer queued (dropped as dead, or lapsed): they must ask again.
-- A renewal only raises a hold's expiry: a nested level with a longer fixed lease keeps it.
-- A queue's keys live at least as long as its longest-lived entry, at most twice as long
-- (queue.lua's Q.outlive).
local function clock()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Always a write, also when the expiry stays: a WAIT after this call (a handed-over hold
-- confirmed with sync_replicas) must cover the grant that some other connection wrote.
local function raise(key, lease)
    redis.call('pexpire', key, math.max(redis.call('pttl', key), lease))
end

-- semaphore.lua's S.keep (this script does not include the semaphore's rules): `key`, which
-- exists, lives `ms` more at least, never less than it did. (A definition written before
-- they expired, without one, is left so: its semaphore's next acquisition gives it one.)
local function keep(key, ms)
    if (redis.REDIS_VERSION_NUM or 0) >= 0x070000 then
        redis.call('pexpire', key, ms, 'gt')
        return
    end
    redis.call('pexpire', key, math.max(redis.call('pttl', key), ms))
end

local n = tonumber(ARGV[1])
local lost, gone = {}, {}
local now
local k, a = 1, 2
for i = 1, n do
    local mode, field, lease = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
    a = a + 3
    -- A semaphore's definition and how long it outlives the holds ('s').
    local definition, idle
    if mode == 's' then
        definition, idle = KEYS[k + 2], tonumber(ARGV[a])
        a = a + 1
    end
    if mode == 'k' then
        if redis.call('hexists', KEYS[k], field) == 0 then
            lost[#lost + 1] = i
        elseif lease > 0 then
            raise(KEYS[k], lease)
        end
        k = k + 1
    else
        local holds, leases = KEYS[k], KEYS[k + 1]
        k = k + (definition and 3 or 2)
        now = now or clock()
        local ends = tonumber(redis.call('zscore', leases, field) or '0')
        if ends <= now or redis.call('hexists', holds, field) == 0 then
            lost[#lost + 1] = i
        elseif lease > 0 then
            if ends < now + lease then
                redis.call('zadd', leases, now + lease, field)
            end
            -- The two keys expire together (leases.lua sets them alike, by the holds'
            -- expiry), and the holds go with the earlier of them: one expiry read serves
            -- both. (Always written, as raise does.)
            local ms = math.max(redis.call('pttl', holds), lease)
            redis.call('pexpire', holds, ms)
            redis.call('pexpire', leases, ms)
            if definition then
                keep(definition, ms + idle)
            end
        end
    end
end
local j = 1
while k + 1 <= #KEYS do
    local queue, waiters = KEYS[k], KEYS[k + 1]
    local holder, ttl = ARGV[a], tonumber(ARGV[a + 1])
    k, a = k + 2, a + 2
    local v = redis.call('hget', waiters, holder)
    if v then
        now = now or clock()
        local rest = string.match(v, '^%d+ (.*)$')
        redis.call('hset', waiters, holder, string.format('%d', now + ttl) .. ' ' .. rest)
        -- As queue.lua's Q.outlive: the entry is a field of the waiters hash, which the
        -- list needs to outlive; both raised to twice `ttl` when less is left. (A list
        -- left shorter than the entry is raised too: a refresh runs once a renewal
        -- period, not once a handoff, and may afford the look.)
        if redis.call('pttl', waiters) < ttl then
            redis.call('pexpire', waiters, 2 * ttl)
            redis.call('pexpire', queue, 2 * ttl)
        elseif redis.call('pttl', queue) < ttl then
            redis.call('pexpire', queue, ttl)
        end
    else
        gone[#gone + 1] = j
    end
    j = j + 1
end
return {lost, gone}
