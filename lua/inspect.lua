-- inspect.lua: what Redis records of every object of one name, read in one step (so the
-- holders, lease and queue shown belong together). Writes nothing.
--
-- KEYS[1]  the lock hash          KEYS[2]  its queue      KEYS[3]  its fencing-token counter
-- KEYS[4]  the read-write lock    KEYS[5]  its queue
-- KEYS[6]  the semaphore          KEYS[7]  its queue      KEYS[8]  its number of permits
-- KEYS[9]  the count-down latch
-- KEYS[10] the read-write lock's leases    KEYS[11] the semaphore's leases
--
-- Returns {lock, rwlock, semaphore, latch}, each false when that object does not exist:
--   lock, rwlock, semaphore  {type, pttl, fields, queue, extra, ended}: the key's type
--                            ('hash' for ours; another type means someone else's data),
--                            its PTTL in ms, its hash as a flat field/value list, the
--                            waiters' holder ids in queue order, for the lock its fencing
--                            counter, for the semaphore its number of permits (false when
--                            undefined; its definition's first number, see semaphore.lua),
--                            and the hold fields whose own lease has ended (the
--                            read-write lock's and the semaphore's; the next script that
--                            writes drops them): no longer holders, not to be shown.
--                            A semaphore exists while its number of permits is defined,
--                            held or not
--   latch                    {type, pttl, count}
local function text(key)
    if redis.call('type', key)['ok'] == 'string' then
        return redis.call('get', key)
    end
    return false
end

local function object(hash, queue, extra, leases, defined)
    local kind = redis.call('type', hash)['ok']
    local waiting = {}
    if redis.call('type', queue)['ok'] == 'list' then
        waiting = redis.call('lrange', queue, 0, -1)
    end
    if kind == 'none' and #waiting == 0 and not defined then
        return false
    end
    local fields = {}
    local ended = {}
    if kind == 'hash' then
        fields = redis.call('hgetall', hash)
        if leases and redis.call('type', leases)['ok'] == 'zset' then
            local t = redis.call('time')
            local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            ended = redis.call('zrangebyscore', leases, '-inf', now)
        end
    end
    return {kind, redis.call('pttl', hash), fields, waiting, extra, ended}
end

-- The number of permits of a semaphore's definition (semaphore.lua's S.parse, which this
-- script does not include).
local function permits(key)
    local v = text(key)
    return v and string.match(v, '^%d+') or v
end

local latch = false
local latch_kind = redis.call('type', KEYS[9])['ok']
if latch_kind ~= 'none' then
    latch = {latch_kind, redis.call('pttl', KEYS[9]), text(KEYS[9])}
end
return {
    object(KEYS[1], KEYS[2], text(KEYS[3]), nil),
    object(KEYS[4], KEYS[5], false, KEYS[10]),
    object(KEYS[6], KEYS[7], permits(KEYS[8]), KEYS[11], permits(KEYS[8]) ~= false),
    latch,
}
