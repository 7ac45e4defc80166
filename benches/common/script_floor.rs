//! The script floors: one script call to take, one to give back, per hold shape.

use super::QUEUE_FLOOR_BODIES;
use std::fmt::Write as _;

/// Which shape a [`ScriptFloor`] keeps its hold in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FloorShape {
    /// A HASH holder -> reentry count with PEXPIRE, as `Lock` keeps it: the least the
    /// design's shape allows.
    Hash,
    /// The naive lock's string (`SET NX PX`, compare-and-delete), but both calls scripted:
    /// what running every operation as a script costs, without the hash.
    Set,
    /// [`FloorShape::Hash`] with the one-name-one-kind check `Lock`'s acquire makes today
    /// on the uncontended path (lua/acquire_fast.lua): one EXISTS over the lock, its queue
    /// and the name's three other kinds' keys, with as many KEYS declared (7) as it
    /// declares. What that check costs, beside hashfloor.
    Kind,
}

impl FloorShape {
    fn prefix(self) -> &'static str {
        match self {
            FloorShape::Hash => "hashfloor",
            FloorShape::Set => "setfloor",
            FloorShape::Kind => "kindfloor",
        }
    }
}

/// The scripts' bodies, written against `keys` and `args` (a function's parameters); the
/// EVALSHA text reads `KEYS` and `ARGV` instead.
/// Hash take: the first hold is EXISTS, HSET, PEXPIRE (3 commands); reentry by the holder
/// HINCRBY + PEXPIRE; held by another: 0 (the caller polls). Hash give: HGET, then DEL
/// on the last level (2 commands), else HINCRBY -1 + PEXPIRE. No queue, so no look for
/// waiters on release, no wake-up, no fencing, no metadata: a floor, not a lock to use.
const FLOOR_BODIES: [(&str, &str); 6] = [
    ("hashfloor_take", concat!(hash_take!(), "return 0\n")),
    ("hashfloor_give", concat!(hash_leave!(), "return 1\n")),
    (
        "kindfloor_take",
        r#"
local a, b, c = keys[5], keys[6], keys[7]
if redis.call('EXISTS', keys[1], keys[3], a, a, b, b, c, c) == 0 then
    redis.call('HSET', keys[1], args[1], 1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 1
end
if redis.call('HEXISTS', keys[1], args[1]) == 1 then
    redis.call('HINCRBY', keys[1], args[1], 1)
    redis.call('PEXPIRE', keys[1], args[2])
    return 1
end
return 0
"#,
    ),
    ("kindfloor_give", concat!(hash_leave!(), "return 1\n")),
    (
        "setfloor_take",
        r#"
if redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2]) then
    return 1
end
return 0
"#,
    ),
    (
        "setfloor_give",
        r#"
if redis.call('GET', keys[1]) == args[1] then
    redis.call('DEL', keys[1])
    return 1
end
return -1
"#,
    ),
];

/// The function library holding [`FLOOR_BODIES`] (Redis 7.0+, Valkey).
const FLOOR_LIBRARY: &str = "redmutex_bench_floors";

/// The script floor of a lock kept by Lua scripts (issue 29 item 1): one script call to
/// take (`KEYS[1]`, `ARGV`: holder, lease ms), one to give back, each doing only the
/// commands its shape needs, with the fewest strings per call (FCALL name 1 key holder
/// lease). Run as functions of their own library ([`ScriptFloor::load_library`]) or as
/// EVALSHA scripts, the way the client under comparison runs its own.
pub struct ScriptFloor {
    shape: FloorShape,
    fcall: bool,
    take: redis::Script,
    give: redis::Script,
}

impl ScriptFloor {
    pub fn new(shape: FloorShape, fcall: bool) -> ScriptFloor {
        let evalsha = |name: &str| {
            let (_, body) = FLOOR_BODIES
                .iter()
                .find(|(n, _)| *n == name)
                .expect("a floor body");
            redis::Script::new(&body.replace("keys[", "KEYS[").replace("args[", "ARGV["))
        };
        let p = shape.prefix();
        ScriptFloor {
            shape,
            fcall,
            take: evalsha(&format!("{p}_take")),
            give: evalsha(&format!("{p}_give")),
        }
    }

    /// Loads (or replaces) the floors' function library: once, before the workers start.
    pub fn load_library(con: &mut redis::Connection) {
        let mut code = format!(
            "#!lua name={FLOOR_LIBRARY}
"
        );
        for (name, body) in FLOOR_BODIES.iter().chain(&QUEUE_FLOOR_BODIES) {
            let _ = writeln!(
                code,
                "redis.register_function('{name}', function(keys, args){body}end)"
            );
        }
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(code)
            .query(con)
            .expect("FUNCTION LOAD the floors' library");
    }

    fn call(
        &self,
        con: &mut redis::Connection,
        op: &str,
        key: &str,
        holder: &str,
        lease_ms: u64,
    ) -> i64 {
        // The kind floor's take declares Lock's acquire's 7 keys (the lock, its fencing
        // counter, queue and waiters, the name's 3 other kinds); its give, the lock only.
        let mut keys = vec![key.to_owned()];
        if self.shape == FloorShape::Kind && op == "take" {
            keys.extend(["f", "q", "w", "rw", "sem", "latch"].map(|k| format!("{key}:{k}")));
        }
        if self.fcall {
            redis::cmd("FCALL")
                .arg(format!("{}_{op}", self.shape.prefix()))
                .arg(keys.len())
                .arg(&keys)
                .arg(holder)
                .arg(lease_ms)
                .query(con)
        } else {
            let script = if op == "take" { &self.take } else { &self.give };
            let mut call = script.prepare_invoke();
            for k in &keys {
                call.key(k);
            }
            call.arg(holder).arg(lease_ms).invoke(con)
        }
        .unwrap_or_else(|e| panic!("{} {op}: {e}", self.shape.prefix()))
    }

    /// One try: true when `key` was free (or already `holder`'s) and is now held.
    pub fn try_lock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        holder: &str,
        lease_ms: u64,
    ) -> bool {
        self.call(con, "take", key, holder, lease_ms) == 1
    }

    /// Gives one level of `key` back; fails the bench if `holder` did not hold it.
    pub fn unlock(&self, con: &mut redis::Connection, key: &str, holder: &str, lease_ms: u64) {
        let r = self.call(con, "give", key, holder, lease_ms);
        assert!(r >= 0, "the {} was not ours any more", self.shape.prefix());
    }
}
