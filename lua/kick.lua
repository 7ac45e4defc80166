-- kick.lua: make sure a free lock with waiters is handed on. Run some time after a handoff:
-- a waiter that was handed the lock and never confirmed it (its process froze, or died
-- right after) lets its short lease lapse, and nobody else would notice.
-- (queue.lua, and for read-write locks and semaphores their own rules, are prepended: see
-- them for the keys and the messages to waiters)
--
-- KEYS[1]  the lock hash          KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the lock's queue       KEYS[4]  the lock's waiters
-- KEYS[5]  the holds' leases (read-write locks and semaphores)
-- KEYS[6]  the semaphore's definition, its number of permits (semaphores; read only)
-- ARGV     none
--
-- Returns {pttl, w}  pttl: the key's remaining lease in ms (-2 free, -1 without expiry);
--                    w is 1 when a waiter was just told its turn
local now = Q.now()
Q.purge(now)
local served = Q.hand_on(now, false, nil)
return {redis.call('pttl', KEYS[1]), served and 1 or 0}
