-- semaphore.lua: the rules of a semaphore. Not a script of its own: it comes after
-- queue.lua and leases.lua, and is followed by sem_acquire, sem_permits, leased_release
-- or leased_cancel.
--
-- KEYS[1]  the holds: '<holder>' -> the permits that holder holds, '~used' -> their sum,
--          '~m:<holder>' -> a hold's metadata (see queue.lua)
-- KEYS[5]  the leases of those holds (see leases.lua)
-- KEYS[6]  the number of permits: a string that never expires (like the fencing counter,
--          it is the semaphore's definition; operators change it)
--
-- Each acquisition is a holder of its own (its id is "<client id>:<number>"), holding the
-- permits it asked for under its own lease. Waiters are fair (flags 1): a newcomer queues
-- behind anyone waiting, and a release admits the waiters at the head of the queue, in
-- order, while the free permits cover the next one. A waiter asking for more permits than
-- the semaphore has would block the queue forever: none is let in (sem_acquire.lua), and
-- one queued before the number went down is sent away (S.refuse_oversized).

local S = {}

function S.total()
    return tonumber(redis.call('get', KEYS[6]) or '0')
end

function S.used()
    return tonumber(redis.call('hget', KEYS[1], '~used') or '0')
end

function M.dropped(field, n)
    redis.call('hincrby', KEYS[1], '~used', -n)
end

function Q.fits(f, a, h)
    return S.total() - S.used() >= a
end

function Q.take(h, lease, f, fence, a, now, m)
    redis.call('hset', KEYS[1], unpack(Q.with_meta({h, a}, h, m, now)))
    redis.call('hincrby', KEYS[1], '~used', a)
    M.raise(h, now + lease, now)
end

-- Takes every waiter asking for more than `total` permits out of the queue and tells it to
-- try again ("w <token> <ticket>", see queue.lua), which it does and is refused: no
-- release could ever cover it, and at the head it would keep everyone behind it waiting.
-- (`parse` is queue.lua's reading of an entry.)
function S.refuse_oversized(total)
    local inbox = KEYS[1] .. ':to:'
    local entries = redis.call('hgetall', KEYS[4])
    for i = 1, #entries, 2 do
        local h = entries[i]
        if string.sub(h, 1, 1) ~= '~' then
            local _, _, _, f, t, a = Q.parse(entries[i + 1])
            if a > total then
                Q.remove(h)
                local client, token = string.match(h, '^(.*):(%d+)$')
                if client then
                    Q.tell(f, inbox .. client, 'w ' .. token .. ' ' .. t)
                end
            end
        end
    end
end
