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
-- Then for each queue waited on, two keys (the queue and its waiters hash) and the ARGV m,
-- the number of its entries to keep alive, followed by two ARGV per entry (holder id, how
-- long the entry lives in ms): the waiters j are numbered across the queues in that order.
-- A queue's entries are read and written a chunk at a time (one HMGET and one HSET per
-- chunk), and its expiry looked at once: a client with 10,000 threads queued on one lock
-- refreshes them with a few commands, not four each.
--
-- Returns {lost, gone}: the indices i (1-based) of holds that are gone (that lease was
-- lost: expired, force-unlocked, or Redis lost its data; they are left untouched, so a
-- renewal can never resurrect or extend a hold someone else now has), and the indices j
-- of waiters no longer queued (dropped, as dead or lapsed): they must ask again. An entry
-- that lapsed but is still queued is kept alive instead: nothing has passed over it (a
-- grant or wake-up that reaches a lapsed entry drops it first), so it loses no turn.
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
-- Entries read (and written) per HMGET (HSET): well within what unpack can pass.
local CHUNK = 500
local j = 0
while k + 1 <= #KEYS do
    local queue, waiters = KEYS[k], KEYS[k + 1]
    local m = tonumber(ARGV[a])
    k, a = k + 2, a + 1
    -- The longest-lived entry kept, which the queue must outlive; the new expiry's text
    -- by lifetime, made once for all the entries of one (a lock's unbounded waiters).
    local longest = 0
    local heads = {}
    for from = 0, m - 1, CHUNK do
        local n = math.min(CHUNK, m - from)
        local holders = {}
        for x = 1, n do
            holders[x] = ARGV[a + 2 * (from + x - 1)]
        end
        local got = redis.call('hmget', waiters, unpack(holders))
        local set = {}
        for x = 1, n do
            local v = got[x]
            if v then
                now = now or clock()
                local ttl = ARGV[a + 2 * (from + x - 1) + 1]
                local head = heads[ttl]
                if not head then
                    head = string.format('%d ', now + tonumber(ttl))
                    heads[ttl] = head
                    longest = math.max(longest, tonumber(ttl))
                end
                -- The entry as it was, but for its expiry (its first number).
                set[#set + 1] = holders[x]
                set[#set + 1] = head .. string.sub(v, string.find(v, ' ', 1, true) + 1)
            else
                gone[#gone + 1] = j + from + x
            end
        end
        if #set > 0 then
            redis.call('hset', waiters, unpack(set))
        end
    end
    a, j = a + 2 * m, j + m
    -- As queue.lua's Q.outlive: the entries are fields of the waiters hash, which the
    -- list needs to outlive; both raised to twice the longest entry's life when less is
    -- left. (A list left shorter than that is raised too: a refresh runs once a renewal
    -- period, not once a handoff, and may afford the look.)
    if longest > 0 then
        if redis.call('pttl', waiters) < longest then
            redis.call('pexpire', waiters, 2 * longest)
            redis.call('pexpire', queue, 2 * longest)
        elseif redis.call('pttl', queue) < longest then
            redis.call('pexpire', queue, longest)
        end
    end
end
return {lost, gone}
