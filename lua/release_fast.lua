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
--          (ARGV[3] is left out when it is 1, and ARGV[2] too when it is 0: the release of a
--          hold's one level sends the holder id alone, and without ARGV[3] the script frees
--          the lock whatever ARGV[2] says)
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
-- The count rule (levels.lua's `leave`, before this file): the lock's remaining levels'
-- lease is its hash's expiry. The queue mark ('~q', see queue.lua) is read in the same
-- HMGET: a hold without it frees the lock without looking at the queue. The first write
-- is never one that may take memory (a DEL, or the PEXPIRE before an inner level's HSET),
-- which a server at its memory limit refuses as a script's first write: with EVALSHA the
-- script needs no allow_oom.lua (see scripts.rs).
local got = redis.call('hmget', KEYS[1], ARGV[1], '~q')
-- A held lock's release without ARGV[3] (its one level, the common call) leaves none by
-- that rule: no call of it.
local reply = (ARGV[3] or not got[1]) and leave(ARGV[1], got[1])
if reply then
    return reply
end
redis.call('del', KEYS[1])
if not got[2] then
    return 0
end
