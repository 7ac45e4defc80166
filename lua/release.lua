-- release.lua: leave one level of a reentrant lock; hand it on when it becomes free.
-- (queue.lua is prepended: see it for the queue keys and the messages to waiters)
--
-- KEYS[1]  the lock hash          KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the lock's queue       KEYS[4]  the lock's waiters
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds that the caller's remaining levels still need (the
--          longest of them); 0 when none needs any more time
-- ARGV[3]  the levels the caller believes it holds before this call (at least 1)
--
-- Returns {-1, 0}  the caller holds no level (never acquired, lease expired, force-unlocked,
--                  or a repeated call whose first run freed the lock)
--         0        the lock is now free and nobody was told (the common reply: an
--                  integer, no table to make and send)
--         {0, w, m...}  the lock is now free (or handed on) after a look at its queue; w
--                  is 1 when a waiter was told; m...: the messages for waiters of the
--                  caller's own client, which it delivers itself (see Q.hand_on), none
--                  when none
--         n        the caller still holds n levels; the key's expiry is set to ARGV[2]
--         {n, 0}   the caller holds n levels, fewer than it believes: an earlier call
--                  whose reply was lost took effect
--
-- The expiry is set, not just raised: a released inner level with a longer lease must not
-- leave its lease to the outer ones. Remaining levels that need no more time (fixed leases
-- already over) free the lock at once, as their lease would have.
-- The count is set from ARGV[3], not decremented, so a repeated call (after a lost reply)
-- takes no second level, and levels left by lost acquire replies are dropped too.
-- A freed lock goes to the first live waiter (looked for only when the hold carries the
-- queue mark, see queue.lua): made the holder if it is fair or has waited
-- past the starvation bound, else told to try (a plain lock's releaser may barge back in).
-- Levels left keep their lease (Q.release sets it: a lock's).
local reply, _, _, queued = Q.release(ARGV[1], true)
if reply then
    return reply
end
redis.call('del', KEYS[1])
if not queued then
    -- Nobody queued behind this hold (its mark, queue.lua's '~q'): no queue to look at.
    return 0
end
-- No clock read unless someone waits; the lock is free. A waiter of the caller's own
-- client is told in the reply, not published to.
return Q.freed(Q.hand_on(nil, false, nil, true, ARGV[1]))
