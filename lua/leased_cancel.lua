-- leased_cancel.lua: leave the queue of a read-write lock or a semaphore, or give back a
-- level nobody knows of; hand on whatever that frees (a writer leaving the head of the
-- queue lets the readers behind it in).
-- (queue.lua, leases.lua and the primitive's rules are prepended: see them for the keys)
--
-- KEYS[1..6] as in leased_release.lua
-- ARGV[1]  holder id
-- ARGV[2]  the levels the caller's thread holds (0 for a waiter)
-- ARGV[3]  lease in ms those levels still need (0 when none)
-- ARGV[4]  1: a level beyond ARGV[2] is kept and reported (a waiter whose deadline passed
--          just as it was handed a share takes it); 0: it is given back
-- ARGV[5]  flags of the hold (4: a read hold, 16: an upgradeable read hold)
--
-- Returns {1, count, 0}  ARGV[4] was 1 and the caller holds a level more than ARGV[2]
--         {0, w}         the caller is out of the queue; w is 1 when a waiter was handed a
--                        share
-- Levels a read-write lock's caller holds are never taken: one attempt (or handoff) adds
-- one level at most, so a count above ARGV[2] + 1 means the caller miscounted what it
-- holds, and the count is left alone (a ghost level then ends with its lease). A
-- semaphore's hold counts permits, not levels, and belongs to one call: it goes whole.
local now = Q.now()
Q.purge(now)
local holder = ARGV[1]
local field = M.field(holder, tonumber(ARGV[5]))
local expected = tonumber(ARGV[2])
local held = tonumber(redis.call('hget', KEYS[1], field) or '0')
local levels = KEYS[6] == nil
Q.remove(holder)
if held > expected then
    if ARGV[4] == '1' then
        return {1, held, 0}
    end
    if levels and held > expected + 1 then
        return {0, 0}
    end
    local need = tonumber(ARGV[3])
    if expected > 0 and need > 0 then
        redis.call('hset', KEYS[1], field, expected)
        M.set(field, now + need, now)
    else
        M.drop(field, held)
        M.fit(now)
    end
end
local served = Q.hand_on(now, false, nil)
return {0, served and 1 or 0}
