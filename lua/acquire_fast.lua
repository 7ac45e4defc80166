-- acquire_fast.lua: a lock's uncontended acquisition, the start of acquire.lua's script.
-- (Keys, arguments and replies: see acquire.lua.) Sent as a script of its own (EVALSHA),
-- it comes before queue.lua (scripts.rs): an uncontended call makes none of the queue's
-- rules, nor reads any argument it does not need. In the library it is the start of the
-- acquire function, with acquire.lua after it.
--
-- A new hold (ARGV[3] is '0' or left out: the caller believes it holds no level) of a
-- name on which nothing exists (neither the lock, nor its queue, nor another kind: the
-- one EXISTS of queue.lua's Q.look, the same keys in the same order) that draws no
-- fencing token (flag 2 of ARGV[4], left out when 0) and carries no metadata (ARGV[8]):
-- HSET and PEXPIRE, and the reply 1, the count (an integer: no table). Anything else goes
-- on to acquire.lua with the EXISTS's count in `found` when it was read (nil when not):
-- no call reads it twice.
-- An attempt that queues (ARGV[5] is 1: its client listens for the lock already, most
-- often because it found it taken) is left to acquire.lua, which reads the lock's lease
-- first (Q.look without `found`): a held lock costs it that one read.
local found
if (not ARGV[3] or ARGV[3] == '0') and ARGV[5] ~= '1' then
    local a, b, c = KEYS[5], KEYS[6], KEYS[7]
    found = redis.call('exists', KEYS[1], KEYS[3], a, a, b, b, c, c)
    if found == 0 and not ARGV[8] and (not ARGV[4] or tonumber(ARGV[4]) % 4 < 2) then
        redis.call('hset', KEYS[1], ARGV[1], 1)
        redis.call('pexpire', KEYS[1], ARGV[2])
        return 1
    end
end
