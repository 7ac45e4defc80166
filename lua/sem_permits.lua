-- sem_permits.lua: read or change a semaphore's number of permits (an operator's tool);
-- more permits go to the waiters at once.
-- (queue.lua, leases.lua and semaphore.lua are prepended: see them for the keys)
--
-- KEYS[1..6] as in leased_release.lua
-- ARGV[1]  'get', 'add', 'reduce', 'set' or 'tryset'
-- ARGV[2]  the number to add, take away, set or try to set (0 for 'get')
-- ARGV[3]  the number of permits the semaphore is made with when it does not exist yet
-- ARGV[4]  the most permits a semaphore may have
-- ARGV[5]  how long the definition (KEYS[6]) outlives this use at least, ms
--
-- Returns {total, used}      the number of permits and those held, after the change
--         {-1, total}        refused, nothing changed: 'add' past ARGV[4], or 'reduce' by
--                            more than there are
--         {1|0, total}       'tryset': 1 if the number was set to ARGV[2], 0 if the
--                            semaphore had a number already (unchanged)
-- Reducing below the permits held takes none back: their holders keep them, and nobody
-- else gets one until enough are released. Waiters asking for more than the new number
-- leave the queue and are told to try again, which refuses them (see sem_acquire.lua).
-- A change keeps the number the semaphore was made with beside the new one (see
-- semaphore.lua): handles made with either are let in. (It writes the text a bare number
-- left by an earlier version becomes.) Every operation is a use: the
-- definition lives ARGV[5] more at least, made with that expiry when it is made here,
-- and a change keeps its expiry (SET ... KEEPTTL), which is the longest lease's and more.
local keep = tonumber(ARGV[5])
-- Redisson's trySetPermits: the number is set only where nothing defined it yet (a first
-- use makes the semaphore with ARGV[3]).
if ARGV[1] == 'tryset' then
    local n = tonumber(ARGV[2])
    local fresh = redis.call('set', KEYS[6], S.text(n, n), 'NX', 'PX', keep)
    if fresh then
        return {1, n}
    end
    local total, _, bare = S.parse(redis.call('get', KEYS[6]))
    S.keep(keep, bare)
    return {0, total}
end
local stored = redis.call('get', KEYS[6])
local total, made, bare
if stored then
    total, made, bare = S.parse(stored)
    S.keep(keep, bare)
else
    total, made = tonumber(ARGV[3]), tonumber(ARGV[3])
    redis.call('set', KEYS[6], S.text(total, made), 'PX', keep)
end
local now = Q.now()
Q.purge(now)
M.fit(now)
local n = tonumber(ARGV[2])
local op = ARGV[1]
if op == 'add' then
    if total + n > tonumber(ARGV[4]) then
        return {-1, total}
    end
    total = total + n
elseif op == 'reduce' then
    if n > total then
        return {-1, total}
    end
    total = total - n
elseif op == 'set' then
    total = n
end
if op ~= 'get' then
    redis.call('set', KEYS[6], S.text(total, made), 'KEEPTTL')
    if op ~= 'add' then
        S.refuse_oversized(total)
    end
    Q.hand_on(now, false, nil)
end
return {total, S.used()}
