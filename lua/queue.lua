-- queue.lua: the waiter queue of a lock. Not a script of its own: it is prepended to every
-- script that can hand a lock on (acquire, release, cancel, kick, force_unlock), so the
-- queue's rules are written once.
--
-- KEYS[1]  the lock hash (field = holder id, value = reentry count; '~fence' = the hold's
--          fencing token)
-- KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the queue: a LIST of waiting holder ids, in the order they reached Redis
-- KEYS[4]  the waiters: a HASH holder id -> "<expiry> <since> <lease> <flags> <ticket>
--          <amount>" (expiry and since in server ms; lease in ms; flags: 1 fair, 2 fenced,
--          4 a reader of a read-write lock, 8 its client listens on another cluster node, so
--          PUBLISH's count, which is this node's alone, cannot tell it is alive; ticket: the waiting call's number, echoed in its
--          messages; amount: the permits a semaphore waiter asks for, else 1), and '~fair'
--          -> the number of fair waiters queued
--
-- What a hold is differs by primitive, so the queue reaches the hold only through three
-- hooks, defined here for a lock (the hash is the hold, its expiry the lease) and redefined
-- by leases.lua, rw.lua and semaphore.lua, which come after this file: Q.fits (may the
-- waiter hold now), Q.take (make it the holder), Q.clear (free everything).
--
-- A waiter is told its turn on the channel <inbox><client id> (its holder id is
-- "<client id>:<thread token>"): "g <token> <ticket> <fence>" when the lock was handed to
-- it (it is the holder now), "w <token> <ticket>" when it should try again.

local Q = {}

function Q.now()
    local t = redis.call('time')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function parse(v)
    local e, s, l, f, t, a = string.match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+) ?(%d*)$')
    return tonumber(e), tonumber(s), tonumber(l), tonumber(f), t, tonumber(a) or 1
end

-- Whether the waiter `h` (flags f, asking for a permits) may hold the lock now.
function Q.fits(f, a, h)
    return redis.call('exists', KEYS[1]) == 0
end

-- Draws the next fencing token, as the counter's own decimal text: INCR's reply reaches
-- Lua as a double (exact only up to 2^53), and `..` would write 10^14 as "1e+14".
function Q.draw_fence()
    redis.call('incr', KEYS[2])
    return redis.call('get', KEYS[2])
end

-- Makes `h` the holder, with a lease of `lease` ms and the fencing token `fence` (a string
-- from Q.draw_fence; 0: none).
function Q.take(h, lease, f, fence, a, now)
    redis.call('hset', KEYS[1], h, 1)
    if fence ~= 0 then
        redis.call('hset', KEYS[1], '~fence', fence)
    end
    redis.call('pexpire', KEYS[1], lease)
end

-- Frees the lock whoever holds it.
function Q.clear()
    redis.call('del', KEYS[1])
end

-- Takes one more level of `field`'s hold, which has `held` levels while the caller believes
-- it has `expected`: the new count. A call repeated after a lost reply (held already
-- above expected) is granted the level the first one took, not another.
function Q.reenter(field, held, expected)
    if held > expected then
        redis.call('hset', KEYS[1], field, expected + 1)
        return expected + 1
    end
    return redis.call('hincrby', KEYS[1], field, 1)
end

-- Leaves one level of `field`'s hold; ARGV[2] is the lease in ms the caller's remaining
-- levels need and ARGV[3] the levels it believes it holds (see release.lua). Returns the
-- script's reply when the caller holds nothing ({-1, 0}), when this release already took
-- effect ({count, 0}: a lost reply), or when levels remain ({left, 0}; `keep(ms)` gives
-- them their lease); nil when the hold is over and the caller must free it.
function Q.release(field, keep)
    local held = redis.call('hget', KEYS[1], field)
    if not held then
        return {-1, 0}
    end
    local count = tonumber(held)
    local expected = tonumber(ARGV[3])
    if count < expected then
        return {count, 0}
    end
    local left = expected - 1
    local need = tonumber(ARGV[2])
    if left > 0 and need > 0 then
        redis.call('hset', KEYS[1], field, left)
        keep(need)
        return {left, 0}
    end
    return nil
end

-- Drops holds whose own lease ended (none for a lock: its expiry is Redis's).
function Q.purge(now)
end

local function is_fair(flags)
    return flags % 2 == 1
end

local function is_fenced(flags)
    return math.floor(flags / 2) % 2 == 1
end

-- Drops holder's waiter data (its LIST entry is the caller's to remove).
local function listens_elsewhere(flags)
    return math.floor(flags / 8) % 2 == 1
end

local function forget(holder, flags)
    redis.call('hdel', KEYS[4], holder)
    if is_fair(flags) and redis.call('hincrby', KEYS[4], '~fair', -1) <= 0 then
        redis.call('hdel', KEYS[4], '~fair')
    end
end

-- The first live waiter (holder, since, lease, flags, ticket, amount), dropping the lapsed
-- ones in front of it (a process that stopped refreshing, a deadline passed); nil when
-- none waits.
function Q.head(now)
    while true do
        local h = redis.call('lindex', KEYS[3], 0)
        if not h then
            return nil
        end
        local v = redis.call('hget', KEYS[4], h)
        if v then
            local e, s, l, f, t, a = parse(v)
            if e > now then
                return h, s, l, f, t, a
            end
            forget(h, f)
        end
        redis.call('lpop', KEYS[3])
    end
end

-- Whether a fair waiter is queued: then nobody may take the lock past the queue.
function Q.has_fair()
    return redis.call('hexists', KEYS[4], '~fair') == 1
end

-- Takes holder out of the queue wherever it is; true if it was queued.
function Q.remove(holder)
    local v = redis.call('hget', KEYS[4], holder)
    if not v then
        return false
    end
    local _, _, _, f = parse(v)
    forget(holder, f)
    redis.call('lrem', KEYS[3], 1, holder)
    return true
end

-- Queues holder at the back, or refreshes its entry where it stands (its place and age
-- are kept: a waiter trying again does not lose its turn). Everything else is the calling
-- wait's own: an entry left by an earlier wait of the thread (a plain one whose cancel
-- was lost) must not make a fair wait plain or a fenced one tokenless.
function Q.join(holder, now, ttl, lease, flags, ticket, amount)
    local v = redis.call('hget', KEYS[4], holder)
    local since = now
    local was_fair = false
    if v then
        local _, s, _, f = parse(v)
        since, was_fair = s, is_fair(f)
    else
        redis.call('rpush', KEYS[3], holder)
    end
    if is_fair(flags) and not was_fair then
        redis.call('hincrby', KEYS[4], '~fair', 1)
    elseif was_fair and not is_fair(flags) and
        redis.call('hincrby', KEYS[4], '~fair', -1) <= 0 then
        redis.call('hdel', KEYS[4], '~fair')
    end
    -- Numbers as exact integers (`..` would write 10^14 and more in exponent form).
    redis.call('hset', KEYS[4], holder,
        string.format('%d %d %d %d %s %d', now + ttl, since, lease, flags, ticket, amount or 1))
    -- The queue lives as long as its longest-lived entry, never forever.
    for i = 3, 4 do
        if redis.call('pttl', KEYS[i]) < ttl then
            redis.call('pexpire', KEYS[i], ttl)
        end
    end
end

-- The free lock's next turns go to the first live waiters other than `me`, in order, for
-- as long as the next one fits (Q.fits: one for a lock, a run of readers, the permits a
-- release freed): each is made the holder (lease: its own, at most `pickup` ms until it
-- confirms) when `give`, or when it is fair or has waited `starve` ms; otherwise it is
-- told to try again. A waiter whose client no longer listens (PUBLISH reaches nobody: its
-- process died) is dropped and the next one served; one listening on another cluster node
-- is taken at its word (a dead one there costs the pickup window). Returns the last holder id served, or
-- nil when nobody (but `me`) waits or fits.
function Q.hand_on(now, inbox, pickup, starve, give, me)
    local served
    while true do
        local h, s, l, f, t, a = Q.head(now)
        if not h or h == me or not Q.fits(f, a, h) then
            return served
        end
        local client, token = string.match(h, '^(.*):(%d+)$')
        local grant = give or is_fair(f) or now - s >= starve
        local fence = 0
        local msg
        if grant then
            if is_fenced(f) then
                fence = Q.draw_fence()
            end
            msg = 'g ' .. token .. ' ' .. t .. ' ' .. fence
        else
            msg = 'w ' .. token .. ' ' .. t
        end
        local heard = client and
            (redis.call('publish', inbox .. client, msg) > 0 or listens_elsewhere(f))
        if heard and not grant then
            return h
        end
        forget(h, f)
        redis.call('lpop', KEYS[3])
        if heard then
            Q.take(h, math.min(l, pickup), f, fence, a, now)
            served = h
        end
    end
end
