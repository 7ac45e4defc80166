-- rw.lua: the rules of a read-write lock. Not a script of its own: it comes after
-- queue.lua and leases.lua, and is followed by rw_acquire, rw_release or rw_cancel.
--
-- KEYS[1]  the holds: 'w:<holder>' -> the writer's reentry count, 'r:<holder>' -> each
--          reader's, '~writer' -> the writer's holder id
-- KEYS[5]  the leases of those holds (see leases.lua)
--
-- Many readers or one writer; the writer's own thread may also read (a downgrade). Every
-- waiter is fair (flags 1; 4 marks a reader): once anyone waits, a newcomer queues behind,
-- so a waiting writer is never passed by a stream of readers. A release admits the waiters
-- at the head of the queue that fit: one writer, or every reader up to the next writer.

local RW = {}

function RW.is_read(flags)
    return math.floor(flags / 4) % 2 == 1
end

function M.field(holder, flags)
    return (RW.is_read(flags) and 'r:' or 'w:') .. holder
end

-- Whether `holder` may take the lock in the mode of `flags` as it is held now. `writer`:
-- the '~writer' field when the caller read it already (false: none), nil when not.
function RW.compatible(holder, flags, writer)
    if RW.is_read(flags) then
        if writer == nil then
            writer = redis.call('hget', KEYS[1], '~writer')
        end
        return not writer or writer == holder
    end
    return redis.call('zcard', KEYS[5]) == 0
end

function M.companion(field)
    if string.sub(field, 1, 2) == 'w:' then
        return '~writer'
    end
    return nil
end

function Q.fits(f, a, h)
    return RW.compatible(h, f)
end

-- A writer excludes everyone; readers after a reader may fit.
function Q.sole(f)
    return not RW.is_read(f)
end

function Q.take(h, lease, f, fence, a, now)
    local field = M.field(h, f)
    if RW.is_read(f) then
        redis.call('hset', KEYS[1], field, 1)
    else
        redis.call('hset', KEYS[1], field, 1, '~writer', h)
    end
    M.raise(field, now + lease, now)
end
