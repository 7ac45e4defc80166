-- rw.lua: the rules of a read-write lock. Not a script of its own: it comes after
-- queue.lua and leases.lua, and is followed by rw_acquire, rw_release or rw_cancel.
--
-- KEYS[1]  the holds: 'w:<holder>' -> the writer's reentry count, 'r:<holder>' -> each
--          reader's, 'u:<holder>' -> the upgradeable reader's, '~writer' -> the writer's
--          holder id, '~upgrader' -> the upgradeable reader's holder id, '~m:<hold
--          field>' -> a hold's metadata (see queue.lua)
-- KEYS[5]  the leases of those holds (see leases.lua)
--
-- Many readers or one writer; the writer's own thread may also read (a downgrade). Besides
-- the readers, one upgradeable reader (flags 16): it shares the lock with the readers and
-- excludes writers and other upgradeable readers, and may take the write hold (an
-- upgrade: a write asked by the thread that holds 'u:') once the other holds are gone,
-- without waiting for anyone else: being the one upgradeable reader, it waits for nobody
-- that waits for it. Every waiter is fair (flags 1; 4 marks a reader, 16 an upgradeable
-- one): once anyone waits, a newcomer queues behind, so a waiting writer is never passed
-- by a stream of readers; a pending upgrade queues at the head, ahead of them all. A
-- release admits the waiters at the head of the queue that fit: one writer (or the
-- upgrade), or every reader up to the next writer, with at most one upgradeable reader.

local RW = {}

function RW.is_read(flags)
    return math.floor(flags / 4) % 2 == 1
end

function RW.is_upgradeable(flags)
    return math.floor(flags / 16) % 2 == 1
end

-- A write asked as an upgrade: refused when the caller's upgradeable hold is gone.
function RW.is_upgrade(flags)
    return math.floor(flags / 32) % 2 == 1
end

function M.field(holder, flags)
    if RW.is_upgradeable(flags) then
        return 'u:' .. holder
    end
    return (RW.is_read(flags) and 'r:' or 'w:') .. holder
end

-- Whether `holder` may take the lock in the mode of `flags` as it is held now. `writer`
-- and `upgrader`: the '~writer' and '~upgrader' fields when the caller read them already
-- (false: none), nil when not.
function RW.compatible(holder, flags, writer, upgrader)
    if RW.is_read(flags) or RW.is_upgradeable(flags) then
        if writer == nil then
            local got = redis.call('hmget', KEYS[1], '~writer', '~upgrader')
            writer, upgrader = got[1], got[2]
        end
        if writer and writer ~= holder then
            return false
        end
        if RW.is_upgradeable(flags) then
            if upgrader == nil then
                upgrader = redis.call('hget', KEYS[1], '~upgrader')
            end
            return not upgrader or upgrader == holder
        end
        return true
    end
    -- A writer needs every hold gone, but the upgradeable reader's own (and its own read
    -- hold beside it): an upgrade.
    local holds = redis.call('zcard', KEYS[5])
    if holds == 0 then
        return true
    end
    if not redis.call('zscore', KEYS[5], 'u:' .. holder) then
        return false
    end
    return holds == (redis.call('zscore', KEYS[5], 'r:' .. holder) and 2 or 1)
end

function M.companion(field)
    local kind = string.sub(field, 1, 2)
    if kind == 'w:' then
        return '~writer'
    elseif kind == 'u:' then
        return '~upgrader'
    end
    return nil
end

function Q.fits(f, a, h)
    return RW.compatible(h, f)
end

-- A writer excludes everyone; readers (and one upgradeable reader) after a reader may fit.
function Q.sole(f)
    return not RW.is_read(f) and not RW.is_upgradeable(f)
end

function Q.take(h, lease, f, fence, a, now, m)
    local field = M.field(h, f)
    local args = {field, 1}
    if RW.is_upgradeable(f) then
        args[3], args[4] = '~upgrader', h
    elseif not RW.is_read(f) then
        args[3], args[4] = '~writer', h
    end
    redis.call('hset', KEYS[1], unpack(Q.with_meta(args, field, m, now)))
    M.raise(field, now + lease, now)
end
