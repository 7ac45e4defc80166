-- release.lua: hand a lock on that release_fast.lua (before it: keys, arguments, replies)
-- just freed from a hold carrying the queue mark ('~q': someone may wait, see queue.lua).
-- (queue.lua is prepended to it, after release_fast.lua, when sent as a script of its own)
--
-- The freed lock goes to the first live waiter: made the holder if it is fair or has
-- waited past the starvation bound, else told to try (a plain lock's releaser may barge
-- back in). No clock read unless someone waits. A waiter of the caller's own client is
-- told in the reply, not published to.
return Q.freed(Q.hand_on(nil, false, nil, true, ARGV[1]))
