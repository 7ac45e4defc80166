-- latch_set.lua: set a count-down latch's count, unless it is counting already.
-- (latch.lua is prepended: see it for how counts are read exactly)
--
-- KEYS[1]  the latch (a string: the count; its TTL the expiry the user chose)
-- KEYS[2]  the id of the call that set it last (a string, kept ARGV[4] ms)
-- KEYS[3..5] the name's lock, read-write lock and semaphore: a name is one kind at a time
--          (see Q.look in queue.lua), and a latch is not set while one of them is held
-- ARGV[1]  the count, at least 1 and at most 2^63 - 1, in decimal
-- ARGV[2]  the expiry in milliseconds
-- ARGV[3]  this call's id: the same for each run of one call (the client repeats a call
--          whose reply was lost), different for every call
-- ARGV[4]  how long to remember the id, ms
--
-- Returns 1 when the count was set (by this run, or by an earlier run of the same call:
-- then nothing changes, even if the latch opened since), 0 when the latch was counting
-- already (left as it was). A latch that reached zero, expired or never existed is not
-- counting. -1, -2 or -3 when the name is held as a lock, a read-write lock or a
-- semaphore (nothing changed).
if redis.call('get', KEYS[2]) == ARGV[3] then
    return 1
end
-- One call tells which, the keys named 1, 2 and 4 times over (EXISTS counts each time).
local held = redis.call('exists', KEYS[3], KEYS[4], KEYS[4], KEYS[5], KEYS[5], KEYS[5],
    KEYS[5])
if held > 0 then
    if held % 2 == 1 then
        return -1
    elseif held % 4 >= 2 then
        return -2
    end
    return -3
end
local current, refused = L.read(KEYS[1])
if refused then
    return refused
end
if L.counting(current) then
    return 0
end
redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
redis.call('set', KEYS[2], ARGV[3], 'px', ARGV[4])
return 1
