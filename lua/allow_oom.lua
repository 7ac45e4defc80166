-- allow_oom.lua: put before a script that renews, releases, frees or hands on, when it
-- is sent with EVALSHA (Redis 6.2 has no functions, whose 'allow-oom' flag says the
-- same). A server at its memory limit refuses a script's first command that may grow
-- memory, unless the script has already written: a renewal whose first write is a
-- lease's ZADD, or a release whose first is an HSET, would be refused and the holds it
-- keeps would lapse just when the server is busiest. A DEL of a key that never exists
-- is a write that grows nothing and changes nothing (nor is it replicated), so the
-- script counts as having written from its first line on.
--
-- On a cluster, Redis 6.2 checks every key a script touches: on the source of a slot being
-- migrated, a key it does not have (as the marker never is) belongs to the target, and
-- the call is refused as "attempted to access a non local key", which no retry gets past
-- while the migration lasts: every renewal and release of a lock there would fail. A
-- pcall swallows that refusal; the server counts the write before that check, so the
-- script has still written.
--
-- KEYS[1]  any key of the call (the marker key is named after it, so it is in its slot
--          on a cluster); a call without keys does nothing here
-- ARGV     not read
-- Returns  nothing: the script it is put before goes on.
if KEYS[1] then
    redis.pcall('del', KEYS[1] .. ':!oom')
end
