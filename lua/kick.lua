-- kick.lua: make sure a free lock with waiters is handed on. Run some time after a handoff:
-- a waiter that was handed the lock and never confirmed it (its process froze, or died
-- right after) lets its short lease lapse, and nobody else would notice.
-- (queue.lua is prepended: see it for the queue keys and the messages to waiters)
--
-- KEYS[1]  the lock hash          KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the lock's queue       KEYS[4]  the lock's waiters
-- ARGV[1]  inbox prefix      ARGV[2]  pickup window, ms      ARGV[3]  starvation bound, ms
--
-- Returns {pttl, 0}  the lock is held (pttl: its remaining lease in ms, -1 without expiry)
--         {-2, w}    the lock is free; w is 1 when a waiter was just told its turn
local pttl = redis.call('pttl', KEYS[1])
if pttl ~= -2 then
    return {pttl, 0}
end
local served = Q.hand_on(Q.now(), ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), false, nil)
return {-2, served and 1 or 0}
