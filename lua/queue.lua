-- queue.lua: the waiter queue of a lock. Not a script of its own: it is prepended to every
-- script that can hand a lock on (acquire, release, cancel, kick, force_unlock; a lock's
-- acquire and release have their fast path before it, acquire_fast.lua and
-- release_fast.lua), so the queue's rules are written once.
--
-- PICKUP and STARVE, the pickup window and the starvation bound in ms, are the client's
-- constants (lease.rs's PICKUP and STARVATION_BOUND), set in a line put before
-- every script (scripts.rs's `constants`): sent once with the script, not with every call.
-- The inbox of a waiter's client, its channel less its client id, is the object's key
-- (KEYS[1]) followed by ':to:', as keys.rs makes it.
--
-- KEYS[1]  the lock hash (field = holder id, value = reentry count; '~fence' = the hold's
--          fencing token; '~m:<holder id>' = the hold's metadata, see below; '~q' = 1:
--          someone may wait, see below)
-- KEYS[2]  the lock's fencing-token counter
-- KEYS[3]  the queue: a LIST of waiting holder ids, in the order they reached Redis (but
--          a read-write lock's pending upgrade, which goes first: see rw_acquire.lua)
-- KEYS[4]  the waiters: a HASH holder id -> "<expiry> <since> <lease> <flags> <ticket>
--          <amount>[ <text>]" (expiry and since in server ms; lease in ms; flags: 1 fair, 2 fenced,
--          4 a reader of a read-write lock, 16 its upgradeable reader, 32 a writer that
--          upgrades (see rw.lua), 8 its client listens on another cluster node, so
--          PUBLISH's count, which is this node's alone, cannot tell it is alive, 64 the
--          entry ends with " <text>", the metadata its hold is to carry, 128 its client
--          listens with sharded pub/sub (SSUBSCRIBE on the node of the lock's slot, a
--          cluster on Redis 7.0+): it is told with SPUBLISH, which stays on the slot's
--          shard, where a PUBLISH is broadcast to every node of a cluster); ticket: the
--          waiting call's number, echoed in its messages; amount: the permits a semaphore
--          waiter asks for, else 1), and '~fair' -> the number of fair waiters queued
--
-- A hold whose client set metadata (ClientBuilder::metadata) carries it in the holds hash
-- itself, as the field '~m:<hold field>' -> "<server ms when the hold was taken> <text>",
-- written by the very HSET that makes the hold and deleted by the HDEL or DEL that ends
-- it: it costs no command of its own, lives exactly as long as the hold (the hash's
-- expiry is the lease, or the hold's field goes with it), and a handoff writes the
-- waiter's from its queue entry.
--
-- A lock's hold is marked '~q' when its queue may hold an entry: a release of a hold
-- without the mark frees it without looking at the queue (the uncontended release's one
-- command less). So every hold the queue may have entries behind carries it: a hold made
-- while the queue exists (acquire.lua, written by the HSET that makes it), a hold handed
-- on from the queue (Q.take), and a hold someone queues behind (acquire.lua, when it
-- joins: the one write a queue's first waiter adds). The mark goes only with the hold
-- (DEL, expiry); one left after the queue emptied costs that hold's release a look, as
-- every release paid before. (Read-write locks and semaphores have no mark: their
-- releases always look.)
--
-- What a hold is differs by primitive, so the queue reaches the hold only through three
-- hooks, defined here for a lock (the hash is the hold, its expiry the lease) and redefined
-- by leases.lua, rw.lua and semaphore.lua, which come after this file: Q.fits (may the
-- waiter hold now), Q.take (make it the holder), Q.sole (does that holder exclude all
-- others), Q.clear (free everything).
--
-- A waiter is told its turn on the channel <KEYS[1]>:to:<client id>, in its lock's slot (its holder id is
-- "<client id>:<thread token>"): "g <token> <ticket> <fence> <now>" when the lock was handed
-- to it (it is the holder now; now: the server's time of the handoff, ms, which the waiter
-- sets against the time its queued attempt's reply carried), "w <token> <ticket>" when it
-- should try again.

local Q = {}

-- A name is one kind of object at a time: a lock (plain, fair and fenced locks are one),
-- a read-write lock, a semaphore, a counting count-down latch, numbered 1 to 4 in this
-- order. An acquire script is passed the main keys of the three kinds other than its
-- own (`own`), in that order, as KEYS[first], KEYS[first + 1] and KEYS[first + 2]: each
-- exists exactly while its kind holds the name. One EXISTS tells whether the object's own
-- key (KEYS[1]) and its queue (KEYS[3]) exist and whether another kind holds the name,
-- the keys named 1, 2 and 4 times over (EXISTS counts a key as often as it is named): the
-- uncontended case costs the one call it always did. Returns held, queued (KEYS[1],
-- KEYS[3] exist), and the number of the other kind that holds the name, nil when none
-- (looked up key by key: only a refusal pays for that).
--
-- `timed`: the caller reads its own key's PTTL whenever anything exists, returned fourth
-- (-2 when the key does not exist): that read tells whether the key exists, so the one
-- EXISTS need only tell the queue (named once) from the other kinds (named twice each)
-- by what is left, 8 keys named where 15 were (a lock's acquire). `found`: that EXISTS's
-- count when the caller read it already (acquire_fast.lua), nil when not.
-- Without `found` (an attempt that queues, or a re-entry whose hold was not found: both
-- most often find the key held) the PTTL comes first, and a held key ends the look: a
-- name held as one kind is refused to every other kind's acquire, so no other kind needs
-- a look, and the queue is not read by a caller whose lock is held (acquire.lua): one
-- command, not two. (A lock is never handed on from its queue by a script that found it
-- free without a look at the name: see Q.hand_on.) A free key then costs the EXISTS
-- after it.
function Q.look(own, first, timed, found)
    local a, b, c = KEYS[first], KEYS[first + 1], KEYS[first + 2]
    if timed and not found then
        local pttl = redis.call('pttl', KEYS[1])
        if pttl ~= -2 then
            return true, false, nil, pttl
        end
        found = redis.call('exists', KEYS[3], a, a, b, b, c, c)
        return false, found % 2 == 1, found >= 2 and Q.other(own, first) or nil, -2
    end
    if timed then
        if found == 0 then
            return false, false, nil, -2
        end
        local pttl = redis.call('pttl', KEYS[1])
        local held = pttl ~= -2
        if held then
            found = found - 1
        end
        return held, found % 2 == 1, found >= 2 and Q.other(own, first) or nil, pttl
    end
    local found = redis.call('exists', KEYS[1], KEYS[3], KEYS[3], a, a, a, a, b, b, b, b,
        c, c, c, c)
    if found >= 4 then
        return found % 2 == 1, math.floor(found / 2) % 2 == 1, Q.other(own, first)
    end
    return found % 2 == 1, math.floor(found / 2) % 2 == 1, nil
end

-- Everything else is made on first use: the first read of a name Q lacks (its
-- metatable's __index) runs `more`, which adds them all. A script sent with EVALSHA runs
-- the top level of these files on every call, and an uncontended acquire or release
-- needs only Q.look; a library makes them once. The hooks that a
-- primitive's rules (after this file) redefine are made only where they did not.
-- (scripts.rs tests that no later file redefines anything else `more` makes.)
local function more()
    function Q.now()
        local t = redis.call('time')
        return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end

    -- A queue entry's numbers, and the metadata text it carries (flag 64; nil when none).
    local function parse(v)
        local e, s, l, f, t, a, m = string.match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+) ?(%d*) ?(.*)$')
        f = tonumber(f)
        if math.floor(f / 64) % 2 == 0 then
            m = nil
        end
        return tonumber(e), tonumber(s), tonumber(l), f, t, tonumber(a) or 1, m
    end
    -- (semaphore.lua reads entries too; this file's locals are `more`'s now.)
    Q.parse = parse

    -- The metadata field of the hold field `field`, and its value for a hold taken at `now`
    -- (server ms) by a client whose metadata is `m`.
    function Q.meta_field(field)
        return '~m:' .. field
    end

    function Q.meta_value(now, m)
        return string.format('%d', now) .. ' ' .. m
    end

    -- `args` (a flat field/value list for HSET) with `field`'s metadata added when `m` is set.
    function Q.with_meta(args, field, m, now)
        if m then
            args[#args + 1] = Q.meta_field(field)
            args[#args + 1] = Q.meta_value(now, m)
        end
        return args
    end

    -- The number of the other kind that holds the name (see Q.look), nil when none: looked
    -- up key by key, only a refusal pays for that.
    function Q.other(own, first)
        local i = first
        for kind = 1, 4 do
            if kind ~= own then
                if redis.call('exists', KEYS[i]) == 1 then
                    return kind
                end
                i = i + 1
            end
        end
        return nil
    end

    -- The reply that refuses the name to `holder` because the kind `other` holds it (see
    -- Q.look), nothing written; a caller that was queued (`queued`: the queue exists) leaves
    -- the queue, where it would only wait to be refused again.
    function Q.refuse_kind(holder, queued, other)
        if queued then
            Q.remove(holder)
        end
        return {-4, other}
    end

    -- Whether the waiter `h` (flags f, asking for a permits) may hold the lock now.
    if not Q.fits then
        function Q.fits(f, a, h)
            return redis.call('exists', KEYS[1]) == 0
        end
    end

    -- Draws the next fencing token, as the counter's own decimal text: INCR's reply reaches
    -- Lua as a double, exact only below 2^53 (and `..` would write 10^14 as "1e+14"), so
    -- beyond that the text is read back.
    -- The counter expires a day (86,400,000 ms) after its last draw, so that a lock name
    -- left alone leaves nothing behind. Its tokens still only grow: a counter made anew (the
    -- INCR found none, whether it expired or never was) starts from the server's clock in
    -- microseconds, which is past every token an earlier counter of the name drew (those
    -- grew by one per hold, from an earlier such start, far fewer than a microsecond apart).
    function Q.draw_fence()
        local n = redis.call('incr', KEYS[2])
        if n == 1 then
            local t = redis.call('time')
            local fresh = string.format('%d%06d', t[1], t[2])
            redis.call('set', KEYS[2], fresh, 'px', 86400000)
            return fresh
        end
        redis.call('pexpire', KEYS[2], 86400000)
        if n < 9007199254740992 then
            return string.format('%d', n)
        end
        return redis.call('get', KEYS[2])
    end

    -- Makes `h` the holder, with a lease of `lease` ms and the fencing token `fence` (a string
    -- from Q.draw_fence; 0: none), carrying the metadata `m` (nil: none) taken at `now`.
    if not Q.take then
        function Q.take(h, lease, f, fence, a, now, m)
            -- Marked: others may wait behind it (see '~q' above).
            local args = {h, 1, '~q', 1}
            if fence ~= 0 then
                args[5], args[6] = '~fence', fence
            end
            redis.call('hset', KEYS[1], unpack(Q.with_meta(args, h, m, now)))
            redis.call('pexpire', KEYS[1], lease)
        end
    end

    -- Whether the holder `h` made with flags f excludes everyone else (a lock does): then a
    -- handoff ends with its grant, without looking at the next waiter.
    if not Q.sole then
        function Q.sole(f)
            return true
        end
    end

    -- Frees the lock whoever holds it.
    if not Q.clear then
        function Q.clear()
            redis.call('del', KEYS[1])
        end
    end

    -- Takes one more level of `field`'s hold, which has `held` levels while the caller believes
    -- it has `expected`: the new count. A call repeated after a lost reply (held already
    -- above expected) is granted the level the first one took, not another.
    function Q.reenter(field, held, expected)
        if held > expected then
            redis.call('hset', KEYS[1], field, expected + 1)
            return expected + 1
        end
        return redis.call('hincrby', KEYS[1], field, 1)
    end

    -- Drops holds whose own lease ended (none for a lock: its expiry is Redis's).
    if not Q.purge then
        function Q.purge(now)
        end
    end

    local function is_fair(flags)
        return flags % 2 == 1
    end

    local function is_fenced(flags)
        return math.floor(flags / 2) % 2 == 1
    end

    local function listens_elsewhere(flags)
        return math.floor(flags / 8) % 2 == 1
    end

    -- Tells the waiter whose entry has the flags `flags` the message `msg` on its channel
    -- `channel`, the way its client listens; returns how many subscribers on this node heard
    -- it. Flag 128 (sharded): SPUBLISH, which stays on the slot's shard. When no subscriber of
    -- this node heard that, the slot may be moving: this node imports it (the call came by ASK)
    -- while the waiter's client still listens on the node it is leaving, where it listens for
    -- the channel's classic messages too; a PUBLISH reaches it there. So too when the caller's
    -- ACL refuses SPUBLISH (the waiter's client chose it, not the caller): a release must not
    -- fail for it.
    function Q.tell(flags, channel, msg)
        if math.floor(flags / 128) % 2 == 1 then
            local heard = redis.pcall('spublish', channel, msg)
            if type(heard) == 'number' and heard > 0 then
                return heard
            end
        end
        return redis.call('publish', channel, msg)
    end

    -- Drops holder's waiter data (its LIST entry is the caller's to remove). `fairs` is the
    -- '~fair' count when the caller read it along with the entry (false: none), nil when not.
    local function forget(holder, flags, fairs)
        if not is_fair(flags) then
            redis.call('hdel', KEYS[4], holder)
            return
        end
        -- The last fair waiter takes the count with it in one call.
        if fairs ~= nil and (tonumber(fairs) or 0) <= 1 then
            redis.call('hdel', KEYS[4], holder, '~fair')
        elseif redis.call('hincrby', KEYS[4], '~fair', -1) <= 0 then
            redis.call('hdel', KEYS[4], holder, '~fair')
        else
            redis.call('hdel', KEYS[4], holder)
        end
    end

    -- The first live waiter, dropping the lapsed ones in front of it (a process that stopped
    -- refreshing, a deadline passed): holder, since, lease, flags, ticket, amount, then `now`,
    -- the '~fair' count (false when no fair waiter is queued) and the metadata text its hold
    -- is to carry (nil: none); nil when none waits. The
    -- clock is read only when someone is queued: `now` may be nil, and the time read is
    -- returned for the caller to go on with.
    function Q.head(now)
        while true do
            local h = redis.call('lindex', KEYS[3], 0)
            if not h then
                return nil
            end
            local got = redis.call('hmget', KEYS[4], h, '~fair')
            local v = got[1]
            if v then
                local e, s, l, f, t, a, m = parse(v)
                now = now or Q.now()
                if e > now then
                    return h, s, l, f, t, a, now, got[2], m
                end
                forget(h, f, got[2])
            end
            redis.call('lpop', KEYS[3])
        end
    end

    -- Takes the first waiter, `holder` with `flags` and the '~fair' count `fairs` as Q.head
    -- just returned them, out of the queue.
    function Q.remove_head(holder, flags, fairs)
        forget(holder, flags, fairs)
        redis.call('lpop', KEYS[3])
    end

    -- Takes holder out of the queue wherever it is; true if it was queued.
    function Q.remove(holder)
        local got = redis.call('hmget', KEYS[4], holder, '~fair')
        if not got[1] then
            return false
        end
        local _, _, _, f = parse(got[1])
        forget(holder, f, got[2])
        redis.call('lrem', KEYS[3], 1, holder)
        return true
    end

    -- Queues holder at the back, or refreshes its entry where it stands (its place and age
    -- are kept: a waiter trying again does not lose its turn). Everything else is the calling
    -- wait's own: an entry left by an earlier wait of the thread (a plain one whose cancel
    -- was lost) must not make a fair wait plain or a fenced one tokenless. `m`: the metadata
    -- text the hold is to carry if it is handed to the waiter (nil: none).
    function Q.join(holder, now, ttl, lease, flags, ticket, amount, m)
        local got = redis.call('hmget', KEYS[4], holder, '~fair')
        local v = got[1]
        local fairs = tonumber(got[2]) or 0
        local since = now
        local was_fair = false
        -- A queue this call creates has no expiry yet: no need to ask for it.
        local fresh = false
        if v then
            local _, s, _, f = parse(v)
            since, was_fair = s, is_fair(f)
        else
            fresh = redis.call('rpush', KEYS[3], holder) == 1
        end
        -- Numbers as exact integers (`..` would write 10^14 and more in exponent form).
        local entry = string.format('%d %d %d %d %s %d', now + ttl, since, lease,
            m and flags + 64 or flags, ticket, amount or 1)
        if m then
            entry = entry .. ' ' .. m
        end
        if is_fair(flags) and not was_fair then
            redis.call('hset', KEYS[4], holder, entry, '~fair', fairs + 1)
        elseif was_fair and not is_fair(flags) and fairs > 1 then
            redis.call('hset', KEYS[4], holder, entry, '~fair', fairs - 1)
        else
            if was_fair and not is_fair(flags) then
                redis.call('hdel', KEYS[4], '~fair')
            end
            redis.call('hset', KEYS[4], holder, entry)
        end
        Q.outlive(KEYS[3], KEYS[4], ttl, fresh)
    end

    -- Makes a queue (LIST `queue`, HASH `waiters`) live `ttl` ms at least, and never forever:
    -- at most twice as long as its longest-lived entry. Entries are fields of the waiters
    -- hash, so none outlives it, and the list matters only while it does: the list is set
    -- to the hash's expiry whenever that is set (or, `fresh`, when the list was just
    -- created and has no expiry yet), so it never lives less (nor did the rules before
    -- these leave it less, so the hash is the key to read). The hash's expiry is raised
    -- only when less than `ttl` is left, and then to twice `ttl`: a queue whose waiters
    -- keep joining and refreshing costs one PTTL a call, where setting both expiries to
    -- `ttl` cost a PEXPIRE each every call (raising them with PEXPIRE ... GT, Redis 7.0+,
    -- costs the same two). A queue whose waiters all stopped refreshing outlives them by
    -- at most `ttl`; the readers drop lapsed entries anyway (Q.head). (renew.lua keeps a
    -- copy of these rules.) A queue this call made anew (its first waiter: a fresh list,
    -- and most often a hash just created, without expiry) is set with PEXPIRE's NX on
    -- servers from 7.0 on (told by the server's version, not by FCALL or EVALSHA: a 7.0
    -- server whose ACL refuses FCALL runs the scripts as EVALSHAs): one call where the
    -- PTTL and a PEXPIRE were; a hash that already had an expiry (it outlived the list)
    -- goes by the rule above.
    function Q.outlive(queue, waiters, ttl, fresh)
        if fresh and (redis.REDIS_VERSION_NUM or 0) >= 0x070000
            and redis.call('pexpire', waiters, 2 * ttl, 'nx') == 1 then
            redis.call('pexpire', queue, 2 * ttl)
            return
        end
        local left = redis.call('pttl', waiters)
        if left < ttl then
            redis.call('pexpire', waiters, 2 * ttl)
            redis.call('pexpire', queue, 2 * ttl)
        elseif fresh then
            redis.call('pexpire', queue, left)
        end
    end

    -- The client id of the holder id `holder` ("<client id>:<thread token>"): Q.hand_on's
    -- test of a waiter of the releasing client (`mine`).
    function Q.client_of(holder)
        return string.match(holder, '^(.*):%d+$')
    end

    -- The reply {0, w} of a release that freed its hold (w: 1 when a waiter was served), with
    -- the messages Q.hand_on returned for the caller's own client after them, to deliver.
    function Q.freed(served, told)
        local reply = {0, served and 1 or 0}
        if told then
            for i = 1, #told do
                reply[i + 2] = told[i]
            end
        end
        return reply
    end

    -- The free lock's next turns go to the first live waiters other than `me`, in order, for
    -- as long as the next one fits (Q.fits: one for a lock, a run of readers, the permits a
    -- release freed): each is made the holder (lease: its own, at most PICKUP ms until it
    -- confirms) when `give`, or when it is fair or has waited STARVE ms; otherwise it is
    -- told to try again. A waiter whose client no longer listens (PUBLISH reaches nobody: its
    -- process died) is dropped and the next one served; one listening on another cluster node
    -- is taken at its word (a dead one there costs the pickup window). Returns the last holder id served, or
    -- nil when nobody (but `me`) waits or fits. `now` may be nil: the clock is then read only
    -- if someone waits. `free`: the caller knows a lock (not a shared hold) to be free, so
    -- that the first waiter fits without asking (and the handoff ends with its grant).
    -- `mine`: the caller's holder id, when the caller delivers its own client's messages
    -- (a release: see Q.freed); a waiter of that client is not told with a PUBLISH (its
    -- client is alive: it makes this call), its message is returned instead, second: a list
    -- of the messages for the caller to deliver in order (nil when none), the way its
    -- subscriber delivers a published one.
    -- Only a script that knows the name to be this object's may make a waiter the holder:
    -- a release (`mine`: the object was held until this call), an acquire (`me`: it looked
    -- at the name, Q.look), or one that finds the object's key (KEYS[1]) held. A script
    -- that finds the object free and did not free it (a cancel, a kick, a forced unlock of
    -- a lapsed hold, more permits for a semaphore nobody holds) tells the next waiter to
    -- try again instead, whatever its flags: another kind may hold the name since the hold
    -- lapsed (the other kinds' acquires look at this object's key, not at its queue), and
    -- the waiter's own attempt looks at the name (a refusal, WrongKind) before it takes it.
    function Q.hand_on(now, give, me, free, mine)
        local served
        -- The inbox prefix (keys.rs's `inbox`), made once a waiter is told.
        local inbox
        -- The messages for the caller's own client's waiters, if any.
        local told
        -- The caller's client id (Q.client_of(mine)), read from `mine` once a waiter is
        -- found: a release that finds nobody pays no pattern match.
        local own
        -- Whether the name is known to be this object's (see above), once asked.
        local sure = me or mine
        while true do
            local h, s, l, f, t, a, fairs, m
            h, s, l, f, t, a, now, fairs, m = Q.head(now)
            if not h or h == me or not (free or Q.fits(f, a, h)) then
                return served, told
            end
            local client, token = string.match(h, '^(.*):(%d+)$')
            local grant = give or is_fair(f) or now - s >= STARVE
            if grant and not sure then
                sure = redis.call('exists', KEYS[1]) == 1
                grant = sure
            end
            local fence = 0
            local msg
            if grant then
                if is_fenced(f) then
                    fence = Q.draw_fence()
                end
                msg = string.format('g %s %s %s %d', token, t, fence, now)
            else
                msg = 'w ' .. token .. ' ' .. t
            end
            local heard
            if mine and own == nil then
                own = Q.client_of(mine) or false
            end
            if client and client == own then
                told = told or {}
                told[#told + 1] = msg
                heard = true
            else
                inbox = inbox or KEYS[1] .. ':to:'
                heard = client and
                    (Q.tell(f, inbox .. client, msg) > 0 or listens_elsewhere(f))
            end
            if heard and not grant then
                return h, told
            end
            Q.remove_head(h, f, fairs)
            if heard then
                Q.take(h, math.min(l, PICKUP), f, fence, a, now, m)
                served = h
                if Q.sole(f) then
                    return served, told
                end
            end
        end
    end
end

-- A library (FCALL) makes them at once, when it is loaded: its text (scripts.rs's
-- LIBRARY_BODY) declares a local `setmetatable` left nil, as a library may not call it
-- while it loads, and pays nothing for them per call.
if setmetatable then
    setmetatable(Q, {__index = function(q, name)
        setmetatable(q, nil)
        more()
        return rawget(q, name)
    end})
else
    more()
end
