//! The fair floors: a queue of waiters by Lua (issue 29's, and one that survives a dead waiter).

use std::time::Duration;

/// Which fair floor a [`QueueFloorLock`] is: issue 29's, or one that also survives a
/// waiter that dies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QueueShape {
    /// Issue 29's fair floor: the lock a string (`SET NX PX`), the queue a list of holder
    /// ids, nothing else.
    Bare,
    /// The fair floor with what keeps a queue working when waiters die: every entry has an
    /// expiry (a HASH holder -> expiry beside the list, one `TIME` per call that needs
    /// it), the release skips entries past it, and the queue's keys expire after their
    /// longest entry (one `PTTL` per join, raising both keys' expiry when short). Without
    /// it a waiter that dies is handed the lock and holds the queue for a whole lease,
    /// and an abandoned queue stays in memory for ever. A contended acquisition: take
    /// `SET NX`, `TIME`, `HSET`, `RPUSH`, `PTTL`; give `GET`, `LPOP`, `HGET`, `HDEL`,
    /// `TIME`, `SET PX`, `PUBLISH`: 14 executed commands with the two calls.
    Safe,
    /// [`QueueShape::Safe`] with the lock kept as `Lock` keeps it, the design's shape: a
    /// HASH holder -> reentry count with PEXPIRE, so a take looks whether the caller holds
    /// it already (`EXISTS`, `HEXISTS`) and a handover is `DEL`, `HSET`, `PEXPIRE` where
    /// the string needs one `SET PX`: 17 executed commands per contended acquisition.
    SafeHash,
}

impl QueueShape {
    fn prefix(self) -> &'static str {
        match self {
            QueueShape::Bare => "floor",
            QueueShape::Safe => "safefloor",
            QueueShape::SafeHash => "safehash",
        }
    }
}

/// The safe floors' join (after a take found the lock held), written once: the entry's
/// expiry in the entries hash (pushed on the list when new), and the queue keys' expiry
/// raised to twice an entry's life when less than one is left (one `PTTL` when not).
macro_rules! safe_join {
    () => {
        r#"
local t = redis.call('TIME')
local life = tonumber(args[3])
if redis.call('HSET', keys[3], args[1], t[1] * 1000 + math.floor(t[2] / 1000) + life) == 1 then
    redis.call('RPUSH', keys[2], args[1])
end
if redis.call('PTTL', keys[3]) < life then
    redis.call('PEXPIRE', keys[2], 2 * life)
    redis.call('PEXPIRE', keys[3], 2 * life)
end
return 0
"#
    };
}

/// The safe floors' next waiter, written once: pops entries until one that has not
/// expired (`TIME` read once) into `next`, which is false when the queue ran out.
macro_rules! safe_next {
    () => {
        r#"
local now, next
while true do
    next = redis.call('LPOP', keys[2])
    if not next then
        break
    end
    local due = redis.call('HGET', keys[3], next)
    redis.call('HDEL', keys[3], next)
    if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
    end
    if due and tonumber(due) > now then
        break
    end
end
"#
    };
}

/// The queue floors' scripts, as [`FLOOR_BODIES`] are written (`keys`, `args`).
/// KEYS: the lock, its queue (a list), its entries (a hash, the safe shapes only).
/// take ARGV: holder, lease ms, entry lifetime ms; 1 when taken, 0 when queued.
/// give ARGV: holder, lease ms, grant channel prefix; 1 when handed over, 0 when freed,
/// an error when the caller did not hold it.
pub(super) const QUEUE_FLOOR_BODIES: [(&str, &str); 6] = [
    (
        "floor_take",
        r#"
if redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2]) then
    return 1
end
redis.call('RPUSH', keys[2], args[1])
return 0
"#,
    ),
    (
        "floor_give",
        concat!(
            r#"
if redis.call('GET', keys[1]) ~= args[1] then
    return redis.error_reply('queue floor: not the holder')
end
local next = redis.call('LPOP', keys[2])
"#,
            set_hand!()
        ),
    ),
    (
        "safefloor_take",
        concat!(
            r#"
if redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2]) then
    return 1
end
"#,
            safe_join!()
        ),
    ),
    (
        "safefloor_give",
        concat!(
            r#"
if redis.call('GET', keys[1]) ~= args[1] then
    return redis.error_reply('safe floor: not the holder')
end
"#,
            safe_next!(),
            set_hand!()
        ),
    ),
    ("safehash_take", concat!(hash_take!(), safe_join!())),
    (
        "safehash_give",
        concat!(
            hash_leave!(),
            safe_next!(),
            r#"
if next then
    redis.call('HSET', keys[1], next, 1)
    redis.call('PEXPIRE', keys[1], args[2])
    redis.call('PUBLISH', args[3] .. next, 'g')
    return 1
end
return 0
"#
        ),
    ),
];

/// A queue floor's entries hash: beside its queue list.
fn entries_key(queue: &str) -> String {
    format!("{queue}:e")
}

/// The floor of a fair lock that hands over without polling, queueing its waiters in
/// Redis and waking the next one with a PUBLISH as `Lock` and `FairLock` do: the least
/// such a lock can do, measured under the same contention as they are. (Another wake-up,
/// such as a blocking pop per waiter, would be another design with another floor.) A
/// waiter that finds the lock taken joins a FIFO list and blocks on its own channel
/// (subscribed once, before the run); the holder's release pops the next waiter, makes it
/// the holder and PUBLISHes one grant to it. So a handed-over acquisition costs exactly
/// two script requests (the take that queues, the give that hands over) and one PUBLISH
/// delivered to a subscriber. Its [`QueueShape`] says what else it keeps.
///
/// Left out, which is why it is a lower bound and not a lock to use: no ticket or
/// sequence number (a late grant cannot be told from a current one), no expiry of queue
/// entries in the bare shape (a waiter that dies stays queued and is handed a lock it
/// never uses, until the lease runs out), no crash safety beyond the lease, no lease
/// renewal (the lease only has to outlast the bench's 1 ms holds) nor refresh of a
/// waiter's entry, no reentrancy but in the hash shape, no confirmation that the grant
/// was received, no timeout or cancellation of a wait, no fencing token, no check that a
/// name is one kind, and one subscriber connection per waiter instead of one shared per
/// client. A grant reaches only a waiter already subscribed, so each subscribes before
/// its first take.
pub struct QueueFloorLock {
    shape: QueueShape,
    fcall: bool,
    take: redis::Script,
    give: redis::Script,
}

impl QueueFloorLock {
    /// Issue 29's fair floor, run as EVALSHA.
    pub fn new() -> QueueFloorLock {
        QueueFloorLock::with(QueueShape::Bare, false)
    }

    /// A floor of `shape`, run as FCALL of the floors' library
    /// ([`ScriptFloor::load_library`], loaded first) or as EVALSHA.
    pub fn with(shape: QueueShape, fcall: bool) -> QueueFloorLock {
        let evalsha = |op: &str| {
            let name = format!("{}_{op}", shape.prefix());
            let (_, body) = QUEUE_FLOOR_BODIES
                .iter()
                .find(|(n, _)| *n == name)
                .expect("a queue floor body");
            redis::Script::new(&body.replace("keys[", "KEYS[").replace("args[", "ARGV["))
        };
        QueueFloorLock {
            shape,
            fcall,
            take: evalsha("take"),
            give: evalsha("give"),
        }
    }

    fn call(
        &self,
        con: &mut redis::Connection,
        op: &str,
        key: &str,
        queue: &str,
        args: (&str, u64, Option<&str>),
    ) -> i64 {
        let entries = entries_key(queue);
        // The bare shape has no entries hash: two keys, as its scripts read.
        let keys: &[&str] = if self.shape == QueueShape::Bare {
            &[key, queue]
        } else {
            &[key, queue, &entries]
        };
        let reply = if self.fcall {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(format!("{}_{op}", self.shape.prefix()))
                .arg(keys.len())
                .arg(keys)
                .arg(args.0)
                .arg(args.1)
                .arg(args.2);
            cmd.query(con)
        } else {
            let script = if op == "take" { &self.take } else { &self.give };
            let mut call = script.prepare_invoke();
            for k in keys {
                call.key(*k);
            }
            call.arg(args.0).arg(args.1);
            // (None: the bare take reads no third argument, and is sent none.)
            if let Some(a) = args.2 {
                call.arg(a);
            }
            call.invoke(con)
        };
        reply.unwrap_or_else(|e| panic!("{} {op} (not the holder?): {e}", self.shape.prefix()))
    }

    /// Subscribes `sub` (a connection of its own, used for nothing else) to the grant
    /// channel of `me`; a wait longer than `timeout` fails the bench instead of hanging it.
    pub fn subscribe(sub: &mut redis::Connection, prefix: &str, me: &str, timeout: Duration) {
        let channel = format!("{prefix}{me}");
        sub.send_packed_command(&redis::cmd("SUBSCRIBE").arg(&channel).get_packed_command())
            .expect("SUBSCRIBE");
        let reply = sub.recv_response().expect("SUBSCRIBE reply");
        let kind: Vec<redis::Value> = redis::from_redis_value(reply).expect("SUBSCRIBE reply");
        let kind: String = redis::from_redis_value(kind[0].clone()).expect("SUBSCRIBE reply");
        assert_eq!(kind, "subscribe", "unexpected reply to SUBSCRIBE");
        sub.set_read_timeout(Some(timeout))
            .expect("set the grant read timeout");
    }

    /// Takes `key` as `me`: at once when it is free, else queued on `queue` until the
    /// holder's give PUBLISHes the grant on `sub` (subscribed with [`Self::subscribe`]).
    /// A queue entry lives for `lease_ms` too.
    pub fn lock(
        &self,
        con: &mut redis::Connection,
        sub: &mut redis::Connection,
        key: &str,
        queue: &str,
        me: &str,
        lease_ms: u64,
    ) {
        let life = lease_ms.to_string();
        let life = (self.shape != QueueShape::Bare).then_some(life.as_str());
        if self.call(con, "take", key, queue, (me, lease_ms, life)) == 1 {
            return;
        }
        let value = sub.recv_response().unwrap_or_else(|e| {
            panic!("queue floor: no grant for {me} within the read timeout ({e}): a lost handoff")
        });
        let msg = redis::Msg::from_owned_value(value).expect("a grant message");
        let payload: String = msg.get_payload().expect("grant payload");
        assert_eq!(payload, "g", "unexpected grant payload");
    }

    /// Gives `key` back as `me`: to the next queued waiter (its grant PUBLISHed on
    /// `{prefix}{next}`), or freed when none waits. Fails the bench if `me` did not hold it.
    pub fn unlock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        queue: &str,
        me: &str,
        lease_ms: u64,
        prefix: &str,
    ) {
        let given = self.call(con, "give", key, queue, (me, lease_ms, Some(prefix)));
        assert!(given >= 0, "{} give: not the holder", self.shape.prefix());
    }
}
