-- rw_acquire.lua: take a read or write hold of a read-write lock, re-enter it, or wait in
-- its queue.
-- (queue.lua, leases.lua and rw.lua are prepended: see them for the keys and the policy)
--
-- KEYS[1]  the holds         KEYS[2]  the fencing-token counter (unused)
-- KEYS[3]  the queue         KEYS[4]  the waiters      KEYS[5]  the holds' leases
-- ARGV[1..10] as in acquire.lua (ARGV[4] flags: 1 fair, 4 a read hold; read-write waiters
--          are always fair)
--
-- Returns {1, count, 0}  granted; count is the caller's reentry count in this mode
--         {0, ms}        not granted; ms until the first hold's lease ends (-1 when
--                        nothing is held)
--         {0, ms, now}   not granted and queued (ARGV[5] is 1); now: the server's time, ms
--         {-1}           refused: the caller holds a read hold and asks to write, which
--                        would wait for itself forever
-- A re-entry is always granted, even past waiters (they wait for this very hold), and so
-- is a read hold taken by the writer's own thread (a downgrade).
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local flags = tonumber(ARGV[4])
local read = RW.is_read(flags)
local field = M.field(holder, flags)
local now = Q.now()
Q.purge(now)
-- The caller's hold in this mode, its read hold, and the writer, in one read.
local got = redis.call('hmget', KEYS[1], field, 'r:' .. holder, '~writer')
local held, writer = got[1], got[3]
if held then
    local count = Q.reenter(field, tonumber(held), tonumber(ARGV[3]))
    M.raise(field, now + lease, now)
    return {1, count, 0}
end
if not read and got[2] then
    return {-1}
end
if RW.compatible(holder, flags, writer) then
    local downgrade = read and writer == holder
    local first, _, f, fairs
    first, _, _, f, _, _, _, fairs = Q.head(now)
    local handed = false
    if first and first ~= holder and not downgrade then
        -- Those ahead that fit now go first (a free lock left with waiters: a lapsed grant).
        Q.hand_on(now, ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), true, holder)
        first, _, _, f, _, _, _, fairs = Q.head(now)
        handed = true
    end
    if downgrade or ((not first or first == holder) and
        (not handed or RW.compatible(holder, flags))) then
        if first == holder then
            Q.remove_head(holder, f, fairs)
        elseif first then
            Q.remove(holder)
        end
        Q.take(holder, lease, flags, 0, 1, now)
        return {1, 1, 0}
    end
end
if ARGV[5] == '1' then
    Q.join(holder, now, tonumber(ARGV[6]), lease, flags, ARGV[7], 1)
    return {0, M.soonest(now), now}
end
return {0, M.soonest(now)}
