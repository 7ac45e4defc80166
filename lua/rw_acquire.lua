-- rw_acquire.lua: take a read, upgradeable or write hold of a read-write lock, re-enter it,
-- upgrade the upgradeable hold to the write hold, or wait in its queue.
-- (queue.lua, leases.lua and rw.lua are prepended: see them for the keys and the policy)
--
-- KEYS[1]  the holds         KEYS[2]  the fencing-token counter (unused)
-- KEYS[3]  the queue         KEYS[4]  the waiters      KEYS[5]  the holds' leases
-- KEYS[6..8] the name's lock, semaphore and count-down latch (see Q.look)
-- ARGV[1..8] as in acquire.lua, but ARGV[3..4] are always sent (ARGV[4] flags: 1 fair,
--          4 a read hold, 16 an upgradeable read hold, 32 a write asked as an upgrade;
--          read-write waiters are always fair;
--          ARGV[8], the metadata, is recorded per hold field: '~m:r:<holder>'...)
--
-- Returns {1, count, 0}  granted; count is the caller's reentry count in this mode
--         {0, ms}        not granted; ms until the first hold's lease ends (-1 when
--                        nothing is held)
--         {0, ms, now}   not granted and queued (ARGV[5] is 1); now: the server's time, ms
--         {-1}           refused: the caller holds a read hold (and not the upgradeable
--                        one) and asks to write or for the upgradeable hold, which could
--                        wait for itself forever
--         {-3}           refused: an upgrade (flags 32) by a caller whose upgradeable
--                        hold is gone (lease ended, force-unlocked): its write would not
--                        follow its read without a writer in between
--         {-4, kind}     refused: the name is held as another kind (Q.look's number)
-- A re-entry is always granted, even past waiters (they wait for this very hold), and so
-- is a read or upgradeable hold taken by the writer's own thread (a downgrade), and a
-- read hold taken by the upgradeable reader's. A write asked by the upgradeable reader
-- (an upgrade) is granted as soon as no other hold is left, past every waiter (they wait
-- for its hold anyway), and otherwise queues at the head: the readers that come
-- meanwhile queue behind it, and the release of the last reader hands it the write hold.
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local flags = tonumber(ARGV[4])
local read = RW.is_read(flags)
local upgradeable = RW.is_upgradeable(flags)
local field = M.field(holder, flags)
local meta = ARGV[8]
local now = Q.now()
-- Whether anything is held, anyone waits, or another kind holds the name, in one call:
-- with nothing held there is nothing to purge nor read (the holds and their leases go
-- together, leases.lua), and with nobody queued no queue to read.
local any, listed, other = Q.look(2, 6)
if other then
    return Q.refuse_kind(holder, listed, other)
end
-- The caller's hold in this mode, its read and upgradeable holds, the writer and the
-- upgradeable reader, in one read.
local got = {}
if any then
    Q.purge(now)
    got = redis.call('hmget', KEYS[1], field, 'r:' .. holder, '~writer', 'u:' .. holder,
        '~upgrader')
end
local held, writer, upgrader = got[1], got[3], got[5]
if held then
    local count = Q.reenter(field, tonumber(held), tonumber(ARGV[3]))
    M.raise(field, now + lease, now)
    return {1, count, 0}
end
if RW.is_upgrade(flags) and not got[4] then
    return {-3}
end
if not read and got[2] and not got[4] then
    return {-1}
end
if not read and not upgradeable and got[4] then
    -- An upgrade.
    if RW.compatible(holder, flags) then
        Q.remove(holder)
        Q.take(holder, lease, flags, 0, 1, now, meta)
        return {1, 1, 0}
    end
    if ARGV[5] == '1' then
        Q.join(holder, now, tonumber(ARGV[6]), lease, flags, ARGV[7], 1, meta)
        if redis.call('lindex', KEYS[3], 0) ~= holder then
            -- Ahead of everyone: a writer queued behind the upgradeable hold would
            -- otherwise wait for it while it waits for the writer. The list is written
            -- anew, with the commands the queue uses anyway (the README's ACL rule has no
            -- LPUSH), and keeps its expiry. Once per upgrade that waits, at most.
            local ttl = redis.call('pttl', KEYS[3])
            local rest = redis.call('lrange', KEYS[3], 0, -1)
            redis.call('del', KEYS[3])
            local batch = {holder}
            for _, h in ipairs(rest) do
                if h ~= holder then
                    batch[#batch + 1] = h
                    -- In parts: Lua's stack limits unpack's arguments.
                    if #batch == 1000 then
                        redis.call('rpush', KEYS[3], unpack(batch))
                        batch = {}
                    end
                end
            end
            if #batch > 0 then
                redis.call('rpush', KEYS[3], unpack(batch))
            end
            if ttl > 0 then
                redis.call('pexpire', KEYS[3], ttl)
            end
        end
        return {0, M.soonest(now), now}
    end
    return {0, M.soonest(now)}
end
if RW.compatible(holder, flags, writer or false, upgrader or false) then
    -- The writer's own thread, or the upgradeable reader's asking to read: granted past
    -- the waiters, who wait for its hold anyway (queued, it would wait for itself).
    local downgrade = (read or upgradeable) and writer == holder or
        (read and upgrader == holder)
    local first, _, f, fairs
    if listed then
        first, _, _, f, _, _, _, fairs = Q.head(now)
    end
    local handed = false
    if first and first ~= holder and not downgrade then
        -- Those ahead that fit now go first (a free lock left with waiters: a lapsed grant).
        Q.hand_on(now, true, holder)
        first, _, _, f, _, _, _, fairs = Q.head(now)
        handed = true
    end
    if downgrade or ((not first or first == holder) and
        (not handed or RW.compatible(holder, flags))) then
        if first == holder then
            Q.remove_head(holder, f, fairs)
        elseif first then
            Q.remove(holder)
        end
        Q.take(holder, lease, flags, 0, 1, now, meta)
        return {1, 1, 0}
    end
end
if ARGV[5] == '1' then
    Q.join(holder, now, tonumber(ARGV[6]), lease, flags, ARGV[7], 1, meta)
    return {0, M.soonest(now), now}
end
return {0, M.soonest(now)}
