-- levels.lua: the rule by which a release leaves one level of a hold, shared by a lock's
-- release (release_fast.lua) and a read-write lock's or a semaphore's (leased_release.lua).
-- Not a script of its own: it comes first in both scripts (scripts.rs; a lock's release
-- runs it before queue.lua, which an uncontended release never makes), and once at the
-- top of the library.
--
-- ARGV[2]  lease in ms that the caller's remaining levels still need (0 when none)
-- ARGV[3]  the levels the caller believes it holds before this call (at least 1; left out
--          by a lock's release of its one level: then it leaves none)
--
-- Leaves one level of the hold `field` of KEYS[1], whose count is `held` (as read: nil
-- when the caller holds none). Returns the script's reply when the release ends here:
-- {-1, 0} when the caller holds nothing, {count, 0} when it holds fewer levels than it
-- believes (an earlier call whose reply was lost took effect: this one changes nothing),
-- the levels left when some remain (an integer); nil when the hold is over and the caller
-- frees it. The count is set from ARGV[3], not decremented, so a repeated call takes no
-- second level, and levels left by lost acquire replies are dropped too. The remaining
-- levels' lease is set, not raised (a released inner level with a longer lease must not
-- leave its lease to the outer ones), by `set_lease(field, now + ms, now)` (a leased
-- kind's M.set) or, without it, as KEYS[1]'s expiry; remaining levels that need no more
-- time (fixed leases already over) free the hold at once, as their lease would have. The
-- lease is written before the count: a PEXPIRE takes no memory, so a server at its memory
-- limit does not refuse it as the script's first write (a lock's release needs no
-- allow_oom.lua, see scripts.rs).
local function leave(field, held, set_lease, now)
    if not held then
        return {-1, 0}
    end
    if not ARGV[3] then
        return nil
    end
    local count, expected = tonumber(held), tonumber(ARGV[3])
    if count < expected then
        return {count, 0}
    end
    local left = expected - 1
    if left > 0 then
        local need = tonumber(ARGV[2])
        if need > 0 then
            if set_lease then
                set_lease(field, now + need, now)
            else
                redis.call('pexpire', KEYS[1], need)
            end
            redis.call('hset', KEYS[1], field, left)
            return left
        end
    end
    return nil
end
