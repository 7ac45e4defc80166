-- acquire.lua: take a reentrant lock, re-enter it, or wait in its queue.
-- (acquire_fast.lua comes first: the uncontended case, which ends there; then queue.lua,
-- when sent as a script of its own: see it for the queue keys and the messages to waiters)
--
-- KEYS[1]  the lock hash (field = holder id, value = reentry count; '~fence' = the token)
-- KEYS[2]  the lock's fencing-token counter (an integer that never expires, in a key
--          namespace no lock name can reach)
-- KEYS[3]  the lock's queue (LIST)      KEYS[4]  the lock's waiters (HASH)
-- KEYS[5..7] the name's read-write lock, semaphore and count-down latch (see Q.look)
-- ARGV[1]  holder id, "<client-uuid>:<thread-token>"
-- ARGV[2]  lease in milliseconds that this level needs
-- ARGV[3]  the levels the caller believes it holds before this call (0 for a new hold)
-- ARGV[4]  flags: 1 fair (never passes the queue), 2 fenced (draw a token)
--          (each of ARGV[3..7] may be left out when it is 0 and no argument after it is
--          sent: a plain lock's new hold sends two arguments; the script reads them as 0)
-- ARGV[5]  1 to wait in the queue when not granted (the caller listens on its inbox), 0 not
-- ARGV[6]  how long the queue entry lives unless refreshed, ms
-- ARGV[7]  the waiting call's ticket, echoed in its messages
--          (ARGV[5..7] are left out by an attempt that does not queue and sends no
--          metadata: the script then does not queue; one that queues sends all three, its
--          ticket never 0)
-- (the pickup window, the starvation bound and the waiters' inbox: see queue.lua)
-- ARGV[8]  (only when the client has metadata) the text a new hold carries, recorded with
--          the server's time as '~m:<holder id>' (see queue.lua); a re-entry keeps the
--          outermost level's record
--
-- Returns count              granted without a fencing token (the common reply: an integer,
--                            no table to make and send); count is the caller's reentry
--                            count after this call
--         {1, count, token}  granted with the fencing token `token` (the hold is fenced),
--                            in decimal text: it may be beyond what a Lua number holds
--                            exactly
--         {0, pttl}          not granted; pttl is the remaining lease of the holder in ms
--                            (-1 when the key somehow has no TTL)
--         {0, pttl, now}     not granted and queued (ARGV[5] is 1); now is the server's
--                            time of the entry, ms (a grant's message carries its own)
--         {-4, kind}         refused: the name is held as another kind (Q.look's number)
--
-- The checks, the grant and the lease are one atomic step: two callers can never both see
-- the key free. A free lock goes to the caller when nobody waits, when the caller is first
-- in line, or (plain locks) when the caller may barge: no fair waiter is queued and the
-- first waiter is younger than the starvation bound. Otherwise the first waiter is made the
-- holder and told so, and the caller waits its turn.
-- Lease rule: the key's expiry is the longest lease any held level still needs, so a
-- re-entry only ever raises it. A fencing token is drawn before the hold is written.
-- ARGV[3] makes a repeated call harmless: when the count is already above it, an earlier
-- call whose reply was lost (or a handoff whose message was lost) took effect, and this one
-- grants that level instead of adding another.
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local expected = tonumber(ARGV[3] or 0)
local flags = tonumber(ARGV[4] or 0)
local fair = flags % 2 == 1
local fenced = math.floor(flags / 2) % 2 == 1
local meta = ARGV[8]

-- A caller that believes it holds levels is most likely right: its hold is looked at first.
-- (No closure for the re-entry: the body of a library function runs once per call, and
-- making one costs every call, re-entry or not.)
local held
if expected > 0 then
    held = redis.call('hget', KEYS[1], holder)
end
-- Neither the lock nor a queue nor another kind (the uncontended case): one call tells, no
-- clock is read.
local queued = false
local pttl = -2
-- Held by another, and its hold may lack the queue mark (queue.lua's '~q'): a caller
-- that queues behind it marks it.
local unmarked = false
if not held then
    -- The lease is read along (Q.look's `timed`) whenever anything exists.
    local taken, listed, other
    -- (The kind check's count as acquire_fast.lua read it, if it did.)
    taken, listed, other, pttl = Q.look(1, 5, true, found)
    if other then
        return Q.refuse_kind(holder, listed, other)
    end
    if taken or listed then
        if pttl == -2 then
            queued = true
        elseif expected == 0 then
            -- Held: maybe by the caller, through a call whose reply was lost. The mark
            -- is read in the same call.
            local got = redis.call('hmget', KEYS[1], holder, '~q')
            held, unmarked = got[1], not got[2]
        else
            unmarked = true
        end
    end
end
if held then
    -- A level more of the caller's hold, which has `held` levels.
    local token = 0
    if fenced then
        token = redis.call('hget', KEYS[1], '~fence')
        if not token then
            -- Outer levels taken through a plain Lock of the name.
            token = Q.draw_fence()
            redis.call('hset', KEYS[1], '~fence', token)
        end
    end
    local count = Q.reenter(holder, tonumber(held), expected)
    if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
    end
    if token == 0 then
        return count
    end
    return {1, count, token}
end
local now
if pttl == -2 then
    local mine = not queued
    if queued then
        local first, since, _, f, fairs
        first, since, _, f, _, _, now, fairs = Q.head(nil)
        if not first then
            -- Only lapsed entries were queued, the caller's own among them if it had one.
            mine = true
        elseif first == holder then
            Q.remove_head(holder, f, fairs)
            mine = true
        else
            -- A plain caller may barge while no fair waiter is queued (fairs: the count
            -- of them, false when none) and the first waiter is younger than the bound.
            mine = not fair and not fairs and now - since < STARVE
            if not mine then
                mine = not Q.hand_on(now, true, holder, true)
            end
            if mine then
                Q.remove(holder)
            else
                -- Handed on: the lease reported is the new holder's.
                pttl = redis.call('pttl', KEYS[1])
            end
        end
    end
    if mine then
        local token = 0
        if fenced or meta or queued then
            local args = {holder, 1}
            if queued then
                -- Others may still wait (queue.lua's '~q'): the mark, in the same HSET.
                args[3], args[4] = '~q', 1
            end
            if fenced then
                token = Q.draw_fence()
                local n = #args
                args[n + 1], args[n + 2] = '~fence', token
            end
            if meta then
                -- The clock is read for the record only.
                now = now or Q.now()
            end
            redis.call('hset', KEYS[1], unpack(Q.with_meta(args, holder, meta, now)))
        else
            -- The common hold: no list to build and unpack.
            redis.call('hset', KEYS[1], holder, 1)
        end
        redis.call('pexpire', KEYS[1], lease)
        if token == 0 then
            return 1
        end
        return {1, 1, token}
    end
end
if ARGV[5] == '1' then
    now = now or Q.now()
    Q.join(holder, now, tonumber(ARGV[6]), lease, flags, ARGV[7], 1, meta)
    if unmarked then
        -- Its release must look at the queue now (queue.lua's '~q').
        redis.call('hset', KEYS[1], '~q', 1)
    end
    return {0, pttl, now}
end
return {0, pttl}
