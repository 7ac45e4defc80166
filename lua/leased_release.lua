-- leased_release.lua: leave one level of a hold of a read-write lock or a semaphore; hand
-- the freed share on.
-- (levels.lua, queue.lua, leases.lua and the primitive's rules are prepended: see them for
-- the keys)
--
-- KEYS[1]  the holds         KEYS[2]  the fencing-token counter (unused)
-- KEYS[3]  the queue         KEYS[4]  the waiters      KEYS[5]  the holds' leases
-- KEYS[6]  the semaphore's definition, its number of permits (semaphores; read, never
--          written: a release ends a lease, which the definition outlives, see semaphore.lua)
-- ARGV[1]  holder id
-- ARGV[2]  lease in ms the caller's remaining levels still need (0 when none)
-- ARGV[3]  the levels the caller believes it holds before this call (at least 1; a permit
--          is one level whatever it counts)
-- ARGV[4]  flags of the hold (4: a read hold, 16: an upgradeable read hold)
--
-- Returns {-1, 0}  the caller holds nothing (never acquired, lease ended, force-unlocked,
--                  or a repeated call whose first run released it)
--         {0, w, m...}  the caller's hold is over; w is 1 when a waiter was handed a
--                  share; m...: the messages for waiters of the caller's own client, which
--                  it delivers itself (see Q.hand_on)
--         {n, 0}   the caller holds n levels, fewer than it believes: an earlier call whose
--                  reply was lost took effect, and this one changes nothing
--         n        the caller still holds n levels, with a lease of ARGV[2] ms
-- The count rule is levels.lua's `leave`, a lock's too (release_fast.lua): the remaining
-- levels' lease is their field's in the leases (M.set).
local now = Q.now()
Q.purge(now)
local field = M.field(ARGV[1], tonumber(ARGV[4]))
local held = redis.call('hget', KEYS[1], field)
local reply = leave(field, held, M.set, now)
if reply then
    return reply
end
M.drop(field, held)
M.fit(now)
return Q.freed(Q.hand_on(now, false, nil, nil, ARGV[1]))
