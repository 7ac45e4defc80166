-- semaphore.lua: the rules of a semaphore. Not a script of its own: it comes after
-- queue.lua and leases.lua, and is followed by sem_acquire, sem_permits, leased_release
-- or leased_cancel.
--
-- KEYS[1]  the holds: '<holder>' -> the permits that holder holds, '~used' -> their sum,
--          '~m:<holder>' -> a hold's metadata (see queue.lua)
-- KEYS[5]  the leases of those holds (see leases.lua)
-- KEYS[6]  the definition: "<permits> <made with>", the number of permits and the number
--          the first use (or trySetPermits) made the semaphore with, which an operator's
--          change (sem_permits.lua) leaves as it was. (A bare "<permits>" was written by
--          versions before definitions expired, with no expiry: read as both numbers, and
--          given an expiry by S.keep.) It expires a time the caller chose
--          (`expire_after`) past its last use and past the end of every lease it gave:
--          every script that raises a permit's lease (sem_acquire.lua, renew.lua) raises
--          it with S.keep, and none lowers it, so it never expires while a permit is held.
--          A waiter handed permits by a release (Q.take) gets a lease of the pickup window
--          at most, which the definition outlives as it outlives the releaser's lease by
--          `expire_after`, never under the pickup window (semaphore.rs checks that).
--
-- Each acquisition is a holder of its own (its id is "<client id>:<number>"), holding the
-- permits it asked for under its own lease. Waiters are fair (flags 1): a newcomer queues
-- behind anyone waiting, and a release admits the waiters at the head of the queue, in
-- order, while the free permits cover the next one. A waiter asking for more permits than
-- the semaphore has would block the queue forever: none is let in (sem_acquire.lua), and
-- one queued before the number went down is sent away (S.refuse_oversized).

local S = {}

-- The number of permits and the number the semaphore was made with, of the definition's
-- text `v`, and whether the text is a bare number (written before definitions expired).
function S.parse(v)
    local total, made = string.match(v, '^(%d+) (%d+)$')
    if total then
        return tonumber(total), tonumber(made), false
    end
    local n = tonumber(v)
    return n, n, true
end

-- The definition's text of `total` permits for a semaphore made with `made`.
function S.text(total, made)
    return string.format('%d %d', total, made)
end

function S.total()
    local v = redis.call('get', KEYS[6])
    if not v then
        return 0
    end
    return (S.parse(v))
end

-- Makes the definition, which exists, live `ms` more at least: its expiry is raised,
-- never lowered (another handle's longer `expire_after`, a longer lease, stand). One
-- PEXPIRE ... GT on Redis 7.0+ (told by the server's version, as Q.outlive does), a PTTL
-- and a PEXPIRE on 6.2: a fixed number of commands, whatever the expiry was. GT never
-- sets an expiry where there is none, which only a definition written before they
-- expired lacks (`bare`, S.parse's third value): that one takes the PTTL's way.
function S.keep(ms, bare)
    if not bare and (redis.REDIS_VERSION_NUM or 0) >= 0x070000 then
        redis.call('pexpire', KEYS[6], ms, 'gt')
        return
    end
    local left = redis.call('pttl', KEYS[6])
    if left == -1 or left < ms then
        left = ms
    end
    redis.call('pexpire', KEYS[6], left)
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
