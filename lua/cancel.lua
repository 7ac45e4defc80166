-- cancel.lua: leave the queue, or give back a level nobody knows of; hand the lock on if
-- that leaves it free.
-- (queue.lua is prepended: see it for the queue keys and the messages to waiters)
--
-- KEYS[1]  the lock hash          KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the lock's queue       KEYS[4]  the lock's waiters
-- ARGV[1]  holder id
-- ARGV[2]  the levels the caller's thread holds (0 for a waiter)
-- ARGV[3]  lease in ms those levels still need (0 when none)
-- ARGV[4]  1: a level beyond ARGV[2] is kept and reported (a waiter whose deadline passed
--          just as the lock was handed to it takes it); 0: it is given back (clean-up of
--          a call that failed or whose outcome is unknown)
--
-- Returns {1, count, token}  ARGV[4] was 1 and the caller holds a level more than ARGV[2]
--                            (token: the hold's fencing token as text, 0 when none)
--         {0, w}             the caller is out of the queue; w is 1 when the lock was
--                            handed on to a waiter
-- Repeating a call changes nothing more: the count is set from ARGV[2], never decremented.
-- Levels the caller holds are never taken: one attempt (or handoff) adds one level at
-- most, so a count above ARGV[2] + 1 means the caller miscounted what it holds, and the
-- count is left alone (a ghost level then ends with its lease).
local holder = ARGV[1]
local expected = tonumber(ARGV[2])
local held = tonumber(redis.call('hget', KEYS[1], holder) or '0')
Q.remove(holder)
if held > expected then
    if ARGV[4] == '1' then
        local token = redis.call('hget', KEYS[1], '~fence') or 0
        return {1, held, token}
    end
    if held > expected + 1 then
        return {0, 0}
    end
    local need = tonumber(ARGV[3])
    if expected > 0 and need > 0 then
        redis.call('hset', KEYS[1], holder, expected)
        redis.call('pexpire', KEYS[1], need)
        return {0, 0}
    end
    redis.call('del', KEYS[1])
end
if redis.call('exists', KEYS[1]) == 1 then
    return {0, 0}
end
local served = Q.hand_on(nil, false, nil, true)
return {0, served and 1 or 0}
