-- release_fast.lua: leave one level of a reentrant lock; free it when it was the last.
-- The start of a lock's release script, everything but a handoff (release.lua, after it):
-- sent as a script of its own (EVALSHA), it comes before queue.lua (scripts.rs), so a
-- release that hands nothing on makes none of the queue's rules. In the library it is the
-- start of the release function.
--
-- KEYS[1]  the lock hash          KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the lock's queue       KEYS[4]  the lock's waiters
-- (KEYS[2..4]: for release.lua's handoff, which draws a waiter's token and reads the queue)
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds that the caller's remaining levels still need (the
--          longest of them); 0 when none needs any more time
-- ARGV[3]  the levels the caller believes it holds before this call (at least 1)
--          (ARGV[2..3] are left out when they are 0 and 1, the release of a hold's one
--          level: its common call sends the holder id alone)
--
-- Returns 0        the lock is now free and nobody was told: its hold did not carry the
--                  queue mark (the common reply: an integer, no table)
--         n        the caller still holds n levels; the key's expiry is set to ARGV[2]
--         {-1, 0}  the caller holds no level (never acquired, lease expired, force-unlocked,
--                  or a repeated call whose first run freed the lock)
--         {n, 0}   the caller holds n levels, fewer than it believes: an earlier call whose
--                  reply was lost took effect, and this one changes nothing
--         {0, w, m...}  (release.lua) the lock is now free (or handed on) after a look at
--                  its queue; w is 1 when a waiter was told; m...: the messages for
--                  waiters of the caller's own client, which it delivers itself (see
--                  Q.hand_on), none when none
--
-- The expiry is set, not just raised: a released inner level with a longer lease must not
-- leave its lease to the outer ones. Remaining levels that need no more time (fixed leases
-- already over) free the lock at once, as their lease would have.
-- The count is set from ARGV[3], not decremented, so a repeated call (after a lost reply)
-- takes no second level, and levels left by lost acquire replies are dropped too.
-- The queue mark ('~q', see queue.lua) is read in the same HMGET: a hold without it frees
-- the lock without looking at the queue.
-- The first write is never one that may take memory (a DEL, or the PEXPIRE before an
-- inner level's HSET), which a server at its memory limit refuses as a script's first
-- write: with EVALSHA the script needs no allow_oom.lua (see scripts.rs).
local got = redis.call('hmget', KEYS[1], ARGV[1], '~q')
local held = got[1]
if not held then
    return {-1, 0}
end
-- Without ARGV[3] the caller believes it holds one level: it holds at least that many (a
-- count is never below 1), and leaves none.
if ARGV[3] then
    local count, expected = tonumber(held), tonumber(ARGV[3])
    if count < expected then
        return {count, 0}
    end
    local left = expected - 1
    if left > 0 then
        local need = tonumber(ARGV[2])
        if need > 0 then
            redis.call('pexpire', KEYS[1], need)
            redis.call('hset', KEYS[1], ARGV[1], left)
            return left
        end
    end
end
redis.call('del', KEYS[1])
if not got[2] then
    return 0
end
