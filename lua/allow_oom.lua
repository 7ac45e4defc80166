-- allow_oom.lua: put before a script that renews, releases, frees or hands on, when it
-- is sent with EVALSHA (Redis 6.2 has no functions, whose 'allow-oom' flag says the
-- same), unless its first write can never be one that may take memory (a lock's release:
-- see release_fast.lua). A server at its memory limit refuses a script's first command that may grow
-- memory, unless the script has already written: a renewal whose first write is a
-- lease's ZADD, or a release whose first is an HSET, would be refused and the holds it
-- keeps would lapse just when the server is busiest. An HDEL of a field no object of the
-- library ever has ('': holder ids, side fields and permit ids are never empty) is a
-- write that grows nothing and changes nothing (nor is it replicated), so the script
-- counts as having written from its first line on.
--
-- It touches KEYS[1], the call's own object, and no other key. (A marker key of its own
-- was tried: named after KEYS[1], '<key>:!oom', it was the key of another lock when the
-- name had a hash tag, and a release of 'job{t}' deleted the lock 'job{t}:!oom'; made a
-- key of the call, in the namespace no name reaches, it never exists, so on a Cluster a
-- slot half-way through a migration refused every call carrying it, TRYAGAIN or ASK, for
-- as long as the migration lasted.) On a key of another type the HDEL fails with
-- WRONGTYPE, which the pcall swallows: the server counted the write before running it.
--
-- KEYS[1]  the call's first key (its own object); a call without keys does nothing here
-- ARGV     not read
-- Returns  nothing: the script it is put before goes on.
if KEYS[1] then
    redis.pcall('hdel', KEYS[1], '')
end
