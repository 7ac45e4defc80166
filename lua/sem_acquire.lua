-- sem_acquire.lua: take permits of a semaphore, or wait in its queue.
-- (queue.lua, leases.lua and semaphore.lua are prepended: see them for the keys)
--
-- KEYS[1..6] as in leased_release.lua
-- KEYS[7..9] the name's lock, read-write lock and count-down latch (see Q.look)
-- ARGV[1..7] as in acquire.lua, but ARGV[3..4] are always sent (ARGV[3], the levels held,
--          is 0 or 1: 1 when an earlier attempt of the same call may have been granted;
--          ARGV[4] flags: 1, fair)
-- ARGV[8]  the permits asked for (at least 1)
-- ARGV[9]  the number of permits the caller's handle was made with: the semaphore is made
--          with it when it is not defined (KEYS[6], see semaphore.lua), and a semaphore
--          defined otherwise refuses it
-- ARGV[10] how long the definition outlives this call's lease, ms (`expire_after`)
-- ARGV[11] (only when the client has metadata) the text the hold carries (see acquire.lua)
--
-- A call that gives a lease (to the caller, or to a waiter ahead) makes the definition
-- live its lease and ARGV[10] more at least (S.keep; made with that expiry when this call
-- defines the semaphore).
--
-- Returns {1, 1, 0}  granted (or granted already, to an earlier attempt of this call whose
--                    reply was lost: the holder id is the call's own)
--         {0, ms}    not granted; ms until the first hold's lease ends (-1 when nothing is
--                    held)
--         {0, ms, now} not granted and queued (ARGV[5] is 1); now: the server's time, ms
--         {-4, kind}  refused: the name is held as another kind (Q.look's number); nothing
--                    is written (the semaphore's number of permits is not set either)
--         {-5, total, made, asked} refused: the handle was made with `asked` permits, and
--                    the semaphore has `total` and was made with `made` (differing when an
--                    operator changed its number): a handle made with either is let in,
--                    another would silently get a number it was not made with.
--         {-2, total} refused: more permits asked for than the semaphore has (total), which
--                    no release can ever cover.
--         Nothing is written by a refusal, but for a caller that was queued (the number
--         was changed under it): it leaves the queue, and the waiters behind it are
--         served. A caller that holds already (an earlier attempt of this call was
--         granted) is granted again, whatever the number now.
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local flags = tonumber(ARGV[4])
local amount = tonumber(ARGV[8])
local asked = tonumber(ARGV[9])
local keep = lease + tonumber(ARGV[10])
local meta = ARGV[11]
-- Whether permits are held, anyone waits, or another kind holds the name, in one call:
-- with no permit held there is nothing to purge nor read (the holds and their leases go
-- together, leases.lua), and with nobody queued no queue to read.
local any, listed, other = Q.look(3, 7)
if other then
    return Q.refuse_kind(holder, listed, other)
end
local stored = redis.call('get', KEYS[6])
local total, made, bare = asked, asked, false
if stored then
    total, made, bare = S.parse(stored)
end
local refusal
if asked ~= total and asked ~= made then
    refusal = {-5, total, made, asked}
elseif amount > total then
    refusal = {-2, total}
end
if refusal and redis.call('hexists', KEYS[1], holder) == 0 then
    if redis.call('hexists', KEYS[4], holder) == 1 then
        local now = Q.now()
        Q.purge(now)
        Q.remove(holder)
        -- The waiters behind may be handed permits, under leases the definition outlives.
        if Q.hand_on(now, false, holder) and stored then
            S.keep(keep, bare)
        end
        M.fit(now)
    end
    return refusal
end
-- A definition made here is made with its expiry; one stored is kept (S.keep) once a
-- lease is given below, to the caller or to a waiter ahead of it (Q.hand_on): a call
-- that only queues gives none, and the leases it waits behind are kept already.
local kept = not stored
if kept then
    redis.call('set', KEYS[6], S.text(asked, asked), 'PX', keep)
end
local function give()
    if not kept then
        kept = true
        S.keep(keep, bare)
    end
end
local now = Q.now()
-- The caller's hold (granted already to an earlier attempt) and the permits in use.
local got = {}
if any then
    Q.purge(now)
    got = redis.call('hmget', KEYS[1], holder, '~used')
end
if got[1] then
    give()
    Q.remove(holder)
    M.raise(holder, now + lease, now)
    return {1, 1, 0}
end
local used = tonumber(got[2] or '0')
local first, _, f, wants, fairs
if listed then
    first, _, _, f, _, wants, _, fairs = Q.head(now)
end
-- Those ahead that fit now go first (Q.fits of the first waiter, with the permits known
-- here: when it does not fit, Q.hand_on would hand nothing on).
if first and first ~= holder and total - used >= wants then
    give()
    Q.hand_on(now, true, holder)
    first, _, _, f, _, _, _, fairs = Q.head(now)
    used = S.used()
end
-- Q.fits, with the number of permits and those in use known here.
if (not first or first == holder) and total - used >= amount then
    give()
    if first then
        Q.remove_head(holder, f, fairs)
    end
    -- Q.take, with the permits in use known: the hold and their sum in one write.
    redis.call('hset', KEYS[1],
        unpack(Q.with_meta({holder, amount, '~used', used + amount}, holder, meta, now)))
    M.raise(holder, now + lease, now)
    return {1, 1, 0}
end
if ARGV[5] == '1' then
    Q.join(holder, now, tonumber(ARGV[6]), lease, flags, ARGV[7], amount, meta)
    return {0, M.soonest(now), now}
end
return {0, M.soonest(now)}
