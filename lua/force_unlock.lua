-- force_unlock.lua: delete a lock whoever holds it (an administrative operation), and hand
-- it to the first waiter.
-- (queue.lua is prepended: see it for the queue keys and the messages to waiters)
--
-- KEYS[1]  the lock hash          KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the lock's queue       KEYS[4]  the lock's waiters
-- KEYS[5]  the holds' leases (read-write locks: every reader and the writer are freed;
--          semaphores: every permit held is given back)
-- KEYS[6]  the semaphore's definition, its number of permits (semaphores: kept as it is,
--          with its expiry, see semaphore.lua)
-- KEYS[#KEYS] (last, after the leases and permits where there are some)  the id of the
--          call that force-unlocked the lock last (a string, kept ARGV[2] ms)
-- ARGV[1]  this call's id: the same for each run of one call (the client repeats a call
--          whose reply was lost), different for every call
-- ARGV[2]  how long to remember the id, ms
-- ARGV[3]  the prefix of each client's own channel (`<key prefix>__control:`): every
--          holder's client is told there which of its holds went, "f <token> <key>" (its
--          holder id is "<client id>:<token>"), so it marks them lost at once rather than
--          at its next renewal
--
-- Returns 1 when a lock was deleted (by this run, or by an earlier run of the same call:
-- then nothing changes), 0 when it was not locked; a WRONGTYPE error, with nothing
-- changed, when the key holds something that is not a lock (someone's data).
local forced = KEYS[#KEYS]
if redis.call('get', forced) == ARGV[1] then
    return 1
end
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
local ok = kind == 'hash'
local fields = {}
if ok then
    fields = redis.call('hkeys', KEYS[1])
    for i, field in ipairs(fields) do
        if string.sub(field, 1, 1) ~= '~' and not string.match(field, '^.+:%d+$') then
            ok = false
            break
        end
    end
end
if not ok then
    return redis.error_reply('WRONGTYPE the key holds a ' .. kind .. ' that is not a redmutex lock; nothing was changed')
end
-- Each holder once (a read-write lock's thread may hold 'r:' and 'w:'); the fields of a
-- read-write lock carry their side's mark, a client id (a UUID) never starts so.
local told = {}
for _, field in ipairs(fields) do
    if string.sub(field, 1, 1) ~= '~' then
        local holder = string.match(field, '^[wru]:(.+)$') or field
        local client, token = string.match(holder, '^(.*):(%d+)$')
        if client and not told[holder] then
            told[holder] = true
            redis.call('publish', ARGV[3] .. client, 'f ' .. token .. ' ' .. KEYS[1])
        end
    end
end
Q.clear()
Q.hand_on(Q.now(), false, nil)
redis.call('set', forced, ARGV[1], 'px', ARGV[2])
return 1
