-- leases.lua: holds with a lease each, for primitives held by many at once (read-write
-- locks, semaphores). Not a script of its own: it comes after queue.lua and before the
-- primitive's rules, and redefines the queue's hooks that depend on leases.
--
-- KEYS[1]  the holds: a HASH hold field -> what it holds (a reentry count, or permits)
-- KEYS[5]  the leases: a ZSET hold field -> the server time its lease ends, in ms
--
-- A hold whose lease ended is dropped by the next script that looks (Q.purge), so a
-- crashed holder frees its share when its own lease ends while the others keep theirs.
-- Both keys expire with the longest lease, so nothing outlives every holder.

local M = {}

-- The hold field of `holder` asking with `flags` (a primitive's rules redefine it).
function M.field(holder, flags)
    return holder
end

-- What dropping `field`, which held `n`, changes besides the two keys (a primitive's rules
-- redefine it: the permits in use).
function M.dropped(field, n)
end

-- A field of the holds that goes with `field`'s hold, nil when none (a primitive's rules
-- redefine it: the writer mark).
function M.companion(field)
    return nil
end

-- Drops `field`'s hold, which holds `n` (nil: not known, read here), and its metadata
-- (in the same HDEL: a field that may not exist costs nothing more); the keys' expiry is
-- the caller's to fit.
function M.drop(field, n)
    n = n or redis.call('hget', KEYS[1], field)
    if n then
        local other = M.companion(field)
        if other then
            redis.call('hdel', KEYS[1], field, other, Q.meta_field(field))
        else
            redis.call('hdel', KEYS[1], field, Q.meta_field(field))
        end
    end
    redis.call('zrem', KEYS[5], field)
    if n then
        M.dropped(field, tonumber(n))
    end
end

function Q.purge(now)
    local ended = redis.call('zrangebyscore', KEYS[5], '-inf', now)
    for _, field in ipairs(ended) do
        M.drop(field)
    end
end

-- Keeps both keys alive exactly as long as the longest lease, and deletes them when no
-- hold is left.
function M.fit(now)
    local last = redis.call('zrange', KEYS[5], -1, -1, 'withscores')
    if #last == 0 then
        redis.call('del', KEYS[1], KEYS[5])
        return
    end
    local ms = math.max(tonumber(last[2]) - now, 1)
    redis.call('pexpire', KEYS[1], ms)
    redis.call('pexpire', KEYS[5], ms)
end

-- Sets `field`'s lease to end at `ends` (a release shortens it to what remains).
function M.set(field, ends, now)
    redis.call('zadd', KEYS[5], ends, field)
    M.fit(now)
end

-- Makes `field`'s lease end no earlier than `ends`.
function M.raise(field, ends, now)
    -- GT (Redis 6.2): a lease is only ever raised here; CH: 1 when it was added or raised.
    if redis.call('zadd', KEYS[5], 'GT', 'CH', ends, field) == 1 then
        if redis.call('pttl', KEYS[1]) < ends - now then
            redis.call('pexpire', KEYS[1], ends - now)
            redis.call('pexpire', KEYS[5], ends - now)
        end
    end
end

-- Ms until the first lease ends (a crashed holder's share frees then): how long a waiter
-- may sleep without a message; -1 when nothing is held.
function M.soonest(now)
    local first = redis.call('zrange', KEYS[5], 0, 0, 'withscores')
    if #first == 0 then
        return -1
    end
    return math.max(tonumber(first[2]) - now, 0)
end

-- Shares: after a grant, the next waiter may fit too.
function Q.sole(f)
    return false
end

function Q.clear()
    redis.call('del', KEYS[1], KEYS[5])
end
