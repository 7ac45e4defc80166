//! The library's scripts as the tests run, name and count them by hand.

use std::collections::HashMap;

use redis::IntoConnectionInfo;

use super::{manifest, redis_version, server_kind, RedisServer};

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

/// The constants line the library puts before every script (`src/runtime/scripting/scripts.rs`'s
/// `constants`): the pickup window and the starvation bound, in ms, here the ones the
/// tests of the scripts by hand were written for.
pub const SCRIPT_CONSTANTS: &str = "local PICKUP, STARVE = 1000, 10\n";

/// A bundled script's text as the library runs it when it can hand a lock on (acquire,
/// release, cancel, kick, force_unlock): the constants, then the queue's rules,
/// `lua/queue.lua`, first. (A lock's acquire and release: `script` is their fast path's
/// file and the rest together, see [`lock_acquire`].)
pub fn queued_script(script: &str) -> String {
    [SCRIPT_CONSTANTS, manifest::QUEUE.text, script].concat()
}

/// A lock's acquire script body for [`queued_script`]: its fast path, then the rest (the
/// library puts the queue's rules between them when it sends it as a script of its own).
pub fn lock_acquire() -> &'static str {
    static TEXT: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| [manifest::ACQUIRE_FAST.text, manifest::ACQUIRE.text].concat());
    &TEXT
}

/// A lock's release script body for [`queued_script`], as [`lock_acquire`].
pub fn lock_release() -> &'static str {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        [
            manifest::LEVELS.text,
            manifest::RELEASE_FAST.text,
            manifest::RELEASE.text,
        ]
        .concat()
    });
    &TEXT
}

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
        for (_, function) in manifest::functions() {
            let name = function.name;
            redis::Script::new(&script_text(name))
                .prepare_invoke()
                .load(&mut con)
                .unwrap_or_else(|e| self.fail(&format!("SCRIPT LOAD {name}: {e}")));
        }
    }
}

/// The name of the function that runs the bundled script `script` ("acquire",
/// "rw_release", "renew"...: the names `src/runtime/scripting/manifest.rs` gives them), as the
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

/// The constants line `src/runtime/scripting/scripts.rs` puts before every script it sends, with the
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
/// limit, its rule files, then its body, as `src/runtime/scripting/manifest.rs` lists them.
fn script_text(script: &str) -> String {
    let text =
        manifest::script_text(script).unwrap_or_else(|| panic!("no bundled script {script:?}"));
    [LIBRARY_CONSTANTS, &text].concat()
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
