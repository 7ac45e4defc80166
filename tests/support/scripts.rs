//! The library's scripts as the tests run, name and count them by hand.

use std::collections::HashMap;

use redis::IntoConnectionInfo;

use super::{redis_version, server_kind, RedisServer};

/// Parses `cmdstat_<name>:calls=N,usec=...` lines of `INFO commandstats`.
/// Calls per command (lowercase name) since the server started, from `INFO commandstats`
/// on `con`: for servers the harness did not start (`REDIS_URL`).
pub fn commandstats(con: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    parse_commandstats(&info)
}

/// The constants line the library puts before every script (`src/runtime/scripts.rs`'s
/// `constants`): the pickup window and the starvation bound, in ms, here the ones the
/// tests of the scripts by hand were written for.
pub const SCRIPT_CONSTANTS: &str = "local PICKUP, STARVE = 1000, 10\n";

/// A bundled script's text as the library runs it when it can hand a lock on (acquire,
/// release, cancel, kick, force_unlock): the constants, then the queue's rules,
/// `lua/queue.lua`, first. (A lock's acquire and release: `script` is their fast path's
/// file and the rest together, see [`LOCK_ACQUIRE`].)
pub fn queued_script(script: &str) -> String {
    [
        SCRIPT_CONSTANTS,
        include_str!("../../lua/queue.lua"),
        script,
    ]
    .concat()
}

/// A lock's acquire script body for [`queued_script`]: its fast path, then the rest (the
/// library puts the queue's rules between them when it sends it as a script of its own).
pub const LOCK_ACQUIRE: &str = concat!(
    include_str!("../../lua/acquire_fast.lua"),
    include_str!("../../lua/acquire.lua")
);

/// A lock's release script body for [`queued_script`], as [`LOCK_ACQUIRE`].
pub const LOCK_RELEASE: &str = concat!(
    include_str!("../../lua/levels.lua"),
    include_str!("../../lua/release_fast.lua"),
    include_str!("../../lua/release.lua")
);

/// Script executions in `stats` (`INFO commandstats`): FCALLs of the library's functions,
/// or EVALSHAs where a client runs the scripts as scripts of their own (and EVALs).
/// Before Redis 7.0 a refused call counts too, and `SCRIPT` is one entry (no
/// `script|load`): each EVALSHA refused with NOSCRIPT was followed by one SCRIPT LOAD,
/// which is taken off.
pub fn script_calls(stats: &HashMap<String, u64>) -> u64 {
    let sent: u64 = ["fcall", "evalsha", "eval"]
        .iter()
        .map(|c| stats.get(*c).copied().unwrap_or(0))
        .sum();
    sent - stats.get("script").copied().unwrap_or(0)
}

impl RedisServer {
    /// Script executions so far (see [`script_calls`]).
    pub fn script_calls(&self) -> u64 {
        script_calls(&self.command_calls())
    }

    /// On a server without functions (before Redis 7.0), `SCRIPT LOAD`s every bundled
    /// script, as a client's first call loads them all (the library) on one with them:
    /// the first call of each script is then no NOSCRIPT refusal and load there either,
    /// for tests that count calls. Nothing on other servers.
    pub fn load_scripts(&self) {
        if server_kind().has_functions() {
            return;
        }
        let mut con = self.connection();
        for name in BUNDLED {
            redis::Script::new(&script_text(name))
                .prepare_invoke()
                .load(&mut con)
                .unwrap_or_else(|e| self.fail(&format!("SCRIPT LOAD {name}: {e}")));
        }
    }
}

/// The bundled scripts' names (their functions' names after the library's).
const BUNDLED: [&str; 21] = [
    "acquire",
    "release",
    "cancel",
    "kick",
    "force_unlock",
    "rw_acquire",
    "rw_release",
    "rw_cancel",
    "rw_kick",
    "rw_force_unlock",
    "sem_acquire",
    "sem_release",
    "sem_cancel",
    "sem_kick",
    "sem_force_unlock",
    "sem_permits",
    "renew",
    "inspect",
    "latch_set",
    "latch_count_down",
    "latch_state",
];

/// The name of the function that runs the bundled script `script` ("acquire",
/// "rw_release", "renew"...: the names `src/runtime/scripts.rs` gives them), as the
/// clients of this build call it with `FCALL` on the server at `url`: it appears in their
/// requests (which the proxy and MONITOR see) instead of an `EVALSHA`'s SHA-1. Loads the
/// library there, as a client's first call would, so that calls counted afterwards
/// include no load.
///
/// On a server without functions (Redis 6.2) the clients send `EVALSHA <sha1>` instead:
/// the SHA-1 of the script's text, which is returned then (the script loaded there), so
/// that the same tests look for what the requests there carry.
pub fn function_name(url: &str, script: &str) -> String {
    let client = redmutex::Client::open(url).expect("build client");
    client
        .inspect("support:load")
        .expect("inspect, which loads the library");
    let info = url.into_connection_info().expect("valid redis url");
    let mut con = redis::Client::open(info)
        .and_then(|c| c.get_connection())
        .expect("connect");
    loaded_function_name(&mut con, script)
}

/// [`function_name`] on the server `con` is connected to, where a client of this build
/// already ran a script (so loaded the library): a cluster node, which a lone client's
/// first call, as `function_name` makes it, may not reach (`MOVED`).
pub fn loaded_function_name(con: &mut redis::Connection, script: &str) -> String {
    let version = redis_version(con);
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_some_and(|m| m < 7) {
        // Loaded too, as the library would be: calls counted afterwards include no load.
        return load_script(con, script);
    }
    let libraries: Vec<HashMap<String, redis::Value>> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("redmutex_*")
        .query(con)
        .expect("FUNCTION LIST");
    let names: Vec<String> = libraries
        .iter()
        .filter_map(|l| match l.get("library_name") {
            Some(redis::Value::BulkString(name)) => Some(String::from_utf8_lossy(name).into()),
            _ => None,
        })
        .collect();
    assert_eq!(names.len(), 1, "one redmutex library expected: {names:?}");
    format!("{}_{script}", names[0])
}

/// The constants line `src/runtime/scripts.rs` puts before every script it sends, with the
/// library's own values (`lease::PICKUP`, 1 s; `lease::STARVATION_BOUND`, 2 ms): a script's
/// SHA-1 covers it, so the tests that look for a script's `EVALSHA` find it only while
/// these are the library's (a change there fails them, which is the point).
const LIBRARY_CONSTANTS: &str = "local PICKUP, STARVE = 1000, 2\n";

/// The SHA-1 a client that runs `script` with `EVALSHA` names it by (the text it sends,
/// constants first): what its requests carry, on any server.
pub fn script_sha(script: &str) -> String {
    redis::Script::new(&script_text(script))
        .get_hash()
        .to_owned()
}

/// Loads the bundled script `script` (`SCRIPT LOAD`) on the server `con` is connected to,
/// as an `EVALSHA` client does on its first call of it, and returns its SHA-1
/// ([`script_sha`]). A test that delays a script's first `EVALSHA` there loads it first:
/// otherwise the late call finds no script (`NOSCRIPT`) and runs nothing.
pub fn load_script(con: &mut redis::Connection, script: &str) -> String {
    redis::Script::new(&script_text(script))
        .prepare_invoke()
        .load(con)
        .expect("SCRIPT LOAD")
}

/// The text of the bundled script `script` as a script of its own (what `EVALSHA` names
/// by its SHA-1): the constants line, allow_oom.lua for those that must run at the memory
/// limit, its rule files, then its body, as `src/runtime/scripts.rs` puts them together.
fn script_text(script: &str) -> String {
    let queue = include_str!("../../lua/queue.lua");
    let leases = include_str!("../../lua/leases.lua");
    let rw = include_str!("../../lua/rw.lua");
    let sem = include_str!("../../lua/semaphore.lua");
    let latch = include_str!("../../lua/latch.lua");
    let kick = include_str!("../../lua/kick.lua");
    let force = include_str!("../../lua/force_unlock.lua");
    let released = include_str!("../../lua/leased_release.lua");
    let cancelled = include_str!("../../lua/leased_cancel.lua");
    let oom = include_str!("../../lua/allow_oom.lua");
    // A read-write lock's or semaphore's script: the queue's and the leases' rules, the
    // kind's own, then the body.
    let leased_kind = |rules, body| vec![queue, leases, rules, body];
    // The release's count rule, before a release's other files (see levels.lua).
    let levels = include_str!("../../lua/levels.lua");
    // The bodies read-write locks and semaphores share, each on its own rules file.
    let leased_op = |op: &str| match op {
        "cancel" => cancelled,
        "kick" => kick,
        _ => force,
    };
    let parts: Vec<&str> = match script {
        // A lock's fast path first, before the queue's rules.
        "acquire" => vec![
            include_str!("../../lua/acquire_fast.lua"),
            queue,
            include_str!("../../lua/acquire.lua"),
        ],
        // A lock's release needs no allow_oom.lua (see release_fast.lua).
        "release" => vec![
            levels,
            include_str!("../../lua/release_fast.lua"),
            queue,
            include_str!("../../lua/release.lua"),
        ],
        "cancel" => vec![oom, queue, include_str!("../../lua/cancel.lua")],
        "kick" => vec![oom, queue, kick],
        "force_unlock" => vec![oom, queue, force],
        "rw_acquire" => leased_kind(rw, include_str!("../../lua/rw_acquire.lua")),
        "rw_release" => vec![oom, levels, queue, leases, rw, released],
        "rw_cancel" | "rw_kick" | "rw_force_unlock" => {
            vec![oom, queue, leases, rw, leased_op(&script["rw_".len()..])]
        }
        "sem_acquire" => leased_kind(sem, include_str!("../../lua/sem_acquire.lua")),
        "sem_release" => vec![oom, levels, queue, leases, sem, released],
        "sem_cancel" | "sem_kick" | "sem_force_unlock" => {
            vec![oom, queue, leases, sem, leased_op(&script["sem_".len()..])]
        }
        "sem_permits" => leased_kind(sem, include_str!("../../lua/sem_permits.lua")),
        "renew" => vec![oom, include_str!("../../lua/renew.lua")],
        "inspect" => vec![include_str!("../../lua/inspect.lua")],
        "latch_set" => vec![latch, include_str!("../../lua/latch_set.lua")],
        "latch_count_down" => vec![oom, latch, include_str!("../../lua/latch_count_down.lua")],
        "latch_state" => vec![latch, include_str!("../../lua/latch_state.lua")],
        other => panic!("no bundled script {other:?}"),
    };
    [LIBRARY_CONSTANTS, &parts.concat()].concat()
}

pub(super) fn parse_commandstats(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_ascii_lowercase(), calls))
        })
        .collect()
}
