//! The bundled Lua scripts and the set each kind of primitive runs. Each script runs as a
//! function of one library (`FUNCTION LOAD`, called with `FCALL`) on servers that have
//! functions (Redis 7 and later, Valkey), and as a script of its own (`EVALSHA`) on the
//! others: a library defines the rules every script shares once, when it is loaded, where
//! a script defines them again on every call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use redis::{Cmd, ConnectionLike, FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs};

use crate::runtime::connection::con::Con;
use crate::runtime::holds::lease::{pickup_ms, starve_ms};
use crate::runtime::scripting::{flags, manifest};

/// A bundled script: the library function that runs it (`$function`, named after the
/// library) and the same files as a script of its own, both as the manifest lists them.
macro_rules! script {
    ($function:literal) => {
        Bundled {
            function: LazyLock::new(|| format!("{}_{}", library().name, $function)),
            script: LazyLock::new(|| {
                let text = manifest::script_text($function).expect("a function of the manifest");
                Script::new(&with_constants(&text))
            }),
        }
    };
}

/// The library's text after its name: the shared files, then each group of functions
/// that share rule files as a `do ... end` block of its own, with those files and then its
/// functions (see [`manifest::Group`]). The library's functions cannot see the `KEYS` and
/// `ARGV` of a call as a script does: each call sets them, shared by the group's rules and
/// its bodies (a server runs one call at a time).
fn library_body() -> String {
    let mut body = String::from(concat!(
        "local KEYS, ARGV\n",
        // Nil: queue.lua makes its rules at once here, not on first use (a library may not
        // call `setmetatable` while it loads, and makes them once anyway).
        "local setmetatable\n",
        "local function register(name, flags, body)\n",
        "    redis.register_function{function_name = LIB .. '_' .. name, flags = flags,\n",
        "        callback = function(keys, args) KEYS, ARGV = keys, args return body() end}\n",
        "end\n",
    ));
    for part in manifest::SHARED {
        body.push_str(part.text);
    }
    for group in manifest::LIBRARY {
        body.push_str("do\n");
        for rule in group.rules {
            body.push_str(rule.text);
        }
        for f in group.functions {
            push_function(&mut body, f);
        }
        body.push_str("end\n");
    }
    body
}

/// Adds the function `f` to the library's text: its fast path and body as the function
/// that runs them with the call's keys and arguments as `KEYS` and `ARGV`.
fn push_function(body: &mut String, f: &manifest::Function) {
    let flags = if f.allow_oom { "{'allow-oom'}" } else { "{}" };
    // On a line of its own, whatever the file before ends with.
    body.push_str(&format!("\nregister('{}', {flags}, function()\n", f.name));
    if let Some(fast) = f.fast {
        body.push_str(fast.text);
    }
    body.push_str(f.body.text);
    body.push_str("\nend)\n");
}

/// The client's constants the scripts share (`PICKUP`, `STARVE`: see `lua/queue.lua`), as
/// the Lua line put before every script and before the library's body: sent once with the
/// text, where they were arguments of every call.
fn constants() -> String {
    format!("local PICKUP, STARVE = {}, {}\n", pickup_ms(), starve_ms())
}

/// `body` after [`constants`]: a script's text as it is sent.
fn with_constants(body: &str) -> String {
    [constants().as_str(), body].concat()
}

/// The function library: its name and its text for `FUNCTION LOAD`.
pub(crate) struct Library {
    pub(crate) name: String,
    pub(crate) text: String,
}

/// The library, named after a hash of its text (`redmutex_<12 hex digits>`, as are its
/// functions, `redmutex_<hash>_acquire`...): two versions of redmutex using one server
/// each load and call their own, side by side.
pub(crate) fn library() -> &'static Library {
    static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
        // The SHA-1 that `EVALSHA` would name the text by.
        let body = with_constants(&library_body());
        let hash = Script::new(&body).get_hash()[..12].to_owned();
        let name = format!("redmutex_{hash}");
        let text = format!("#!lua name={name}\nlocal LIB = '{name}'\n{body}");
        Library { name, text }
    });
    &LIBRARY
}

/// A bundled script: the library function that runs it, and the same code as a script of
/// its own for servers without functions.
pub(crate) struct Bundled {
    function: LazyLock<String>,
    script: LazyLock<Script>,
}

// The scripts of every function of the library (see `manifest::LIBRARY` for their files).
static ACQUIRE: Bundled = script!("acquire");
static RELEASE: Bundled = script!("release");
static CANCEL: Bundled = script!("cancel");
static KICK: Bundled = script!("kick");
static FORCE_UNLOCK: Bundled = script!("force_unlock");
static RW_ACQUIRE: Bundled = script!("rw_acquire");
static RW_RELEASE: Bundled = script!("rw_release");
static RW_CANCEL: Bundled = script!("rw_cancel");
static RW_KICK: Bundled = script!("rw_kick");
static RW_FORCE_UNLOCK: Bundled = script!("rw_force_unlock");
static SEM_ACQUIRE: Bundled = script!("sem_acquire");
static SEM_RELEASE: Bundled = script!("sem_release");
static SEM_CANCEL: Bundled = script!("sem_cancel");
static SEM_KICK: Bundled = script!("sem_kick");
static SEM_FORCE_UNLOCK: Bundled = script!("sem_force_unlock");
pub(crate) static SEM_PERMITS: Bundled = script!("sem_permits");
pub(crate) static RENEW: Bundled = script!("renew");
pub(crate) static INSPECT: Bundled = script!("inspect");
pub(crate) static LATCH_SET: Bundled = script!("latch_set");
pub(crate) static LATCH_COUNT_DOWN: Bundled = script!("latch_count_down");
pub(crate) static LATCH_STATE: Bundled = script!("latch_state");

/// What one kind of primitive runs and how its holds are kept: everything the shared
/// acquisition, release, renewal and clean-up code needs to know about a kind. (`pub` only
/// because the sealed `Kind` trait names it; nothing outside the crate can reach it.)
pub struct Ops {
    pub(crate) acquire: &'static Bundled,
    pub(crate) release: &'static Bundled,
    pub(crate) cancel: &'static Bundled,
    pub(crate) kick: &'static Bundled,
    pub(crate) force_unlock: &'static Bundled,
    /// Flags of every hold and queue entry ([`flags`]: fair, fenced, a read hold, an
    /// upgradeable read hold, a write hold asked as an upgrade).
    pub(crate) flags: u8,
    /// `None`: the hold is the lock hash's field `<holder>` and its lease the key's expiry.
    /// `Some(p)`: the hold is the field `<p><holder>`, with a lease of its own (leases.lua).
    pub(crate) field_prefix: Option<&'static str>,
    /// Every acquisition is a holder of its own (a semaphore's permits), not the thread.
    pub(crate) per_call: bool,
}

impl Ops {
    /// The hash field of `holder`'s hold.
    pub(crate) fn field(&self, holder: &str) -> String {
        match self.field_prefix {
            Some(prefix) => format!("{prefix}{holder}"),
            None => holder.to_owned(),
        }
    }
}

const fn lock(flags: u8) -> Ops {
    Ops {
        acquire: &ACQUIRE,
        release: &RELEASE,
        cancel: &CANCEL,
        kick: &KICK,
        force_unlock: &FORCE_UNLOCK,
        flags,
        field_prefix: None,
        per_call: false,
    }
}

const fn read_write(flags: u8, prefix: &'static str) -> Ops {
    Ops {
        acquire: &RW_ACQUIRE,
        release: &RW_RELEASE,
        cancel: &RW_CANCEL,
        kick: &RW_KICK,
        force_unlock: &RW_FORCE_UNLOCK,
        flags,
        field_prefix: Some(prefix),
        per_call: false,
    }
}

pub(crate) static PLAIN: Ops = lock(0);
pub(crate) static FAIR: Ops = lock(flags::FAIR);
pub(crate) static FENCED: Ops = lock(flags::FENCED);
pub(crate) static READ: Ops = read_write(flags::FAIR | flags::READ, "r:");
pub(crate) static WRITE: Ops = read_write(flags::FAIR, "w:");
pub(crate) static UPGRADEABLE: Ops = read_write(flags::FAIR | flags::UPGRADEABLE, "u:");
/// The write side as an upgrade asks for it: the same holds as [`WRITE`]'s.
pub(crate) static UPGRADE: Ops = read_write(flags::FAIR | flags::UPGRADE, "w:");
pub(crate) static PERMITS: Ops = Ops {
    acquire: &SEM_ACQUIRE,
    release: &SEM_RELEASE,
    cancel: &SEM_CANCEL,
    kick: &SEM_KICK,
    // Every permit held is given back; the number of permits stays.
    force_unlock: &SEM_FORCE_UNLOCK,
    flags: flags::FAIR,
    field_prefix: Some(""),
    per_call: true,
};

/// One call of a bundled script: its keys and arguments, sent as an `FCALL` or an
/// `EVALSHA` as the client's [`Scripting`] says when it is sent ([`Scripting::command`],
/// the one place either command is built).
#[derive(Clone)]
pub(crate) struct ScriptCall {
    script: &'static Bundled,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    pub(crate) fn new(script: &'static Bundled) -> ScriptCall {
        ScriptCall {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Adds a key (`KEYS[n]`).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut ScriptCall {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut ScriptCall {
        arg.write_redis_args(&mut self.args);
        self
    }
}

/// How a client runs the bundled scripts: as the library's functions until a server shows
/// it has none, then as scripts of their own.
pub(crate) struct Scripting {
    functions: AtomicBool,
    // An FCALL has run on a server of this client: it has functions. Until then a call
    // whose keys or arguments are not UTF-8 goes as EVALSHA (see `command`).
    confirmed: AtomicBool,
}

/// The refusals a call gets over before it is sent again, each once.
#[derive(Default)]
pub(crate) struct Recovered {
    fallen_back: bool,
    loaded_library: bool,
    loaded_scripts: bool,
}

impl Scripting {
    /// `functions`: try the library first (the server may still turn out to lack it).
    pub(crate) fn new(functions: bool) -> Scripting {
        Scripting {
            functions: AtomicBool::new(functions),
            confirmed: AtomicBool::new(false),
        }
    }

    /// Whether calls are sent as `FCALL`s now.
    pub(crate) fn uses_functions(&self) -> bool {
        self.functions.load(Ordering::Relaxed)
    }

    /// Whether `call` goes as an `FCALL`. A server without functions refuses one with
    /// "unknown command", echoing its first arguments: when they are not UTF-8 (a lock
    /// named by bytes), redis-rs cannot read that reply, so the refusal would not be
    /// seen as one and the call would fail instead of falling back. Until an FCALL has
    /// run, such a call goes as EVALSHA, which every server runs the same.
    fn sends_fcall(&self, call: &ScriptCall) -> bool {
        self.uses_functions()
            && (self.confirmed.load(Ordering::Relaxed)
                || call
                    .keys
                    .iter()
                    .chain(&call.args)
                    .all(|a| std::str::from_utf8(a).is_ok()))
    }

    /// The command that runs `call`: `FCALL <function> <numkeys> <keys> <args>`, or the same
    /// with `EVALSHA <sha1>`.
    pub(crate) fn command(&self, call: &ScriptCall) -> Cmd {
        let mut cmd = if self.sends_fcall(call) {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(call.script.function.as_str());
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(call.script.script.get_hash());
            cmd
        };
        cmd.arg(call.keys.len());
        for key in &call.keys {
            cmd.arg(key.as_slice());
        }
        for arg in &call.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }

    /// Runs `call` on `con`. A server that lacks the script or the library (a restart
    /// without persistence, `SCRIPT FLUSH`, `FUNCTION FLUSH`, a new cluster node) is given
    /// it, and a server without functions (an older one, or a proxy or ACL that refuses
    /// them) makes this client send `EVALSHA`s from then on; either way the call, which did
    /// not run, is sent again.
    pub(crate) fn run<T: FromRedisValue>(
        &self,
        con: &mut Con,
        call: &ScriptCall,
    ) -> RedisResult<T> {
        let mut recovered = Recovered::default();
        loop {
            let fcall = self.sends_fcall(call);
            match self.command(call).query(&mut *con) {
                Err(e) if self.recover(con, &e, &[call], &mut recovered)? => {}
                result => {
                    // Ran (or failed inside): the server has functions. An error that
                    // is not the server's reply (a lost connection) proves nothing.
                    let ran = match &result {
                        Ok(_) => true,
                        Err(e) => e.code().is_some() && !is_functions_refused(e),
                    };
                    if fcall && ran {
                        self.confirmed.store(true, Ordering::Relaxed);
                    }
                    return result;
                }
            }
        }
    }

    /// Whether the refusal `e` of a command carrying `calls` is one to get over, and then
    /// gets over it: true when the calls should be sent again (each refusal once, in
    /// `recovered`).
    pub(crate) fn recover(
        &self,
        con: &mut Con,
        e: &RedisError,
        calls: &[&ScriptCall],
        recovered: &mut Recovered,
    ) -> RedisResult<bool> {
        if is_functions_refused(e) && !recovered.fallen_back {
            self.fall_back(e);
            recovered.fallen_back = true;
            return Ok(true);
        }
        // What is missing says how the call went: the library for an FCALL, the script
        // for an EVALSHA (one transaction may hold both, see `sends_fcall`).
        if is_function_missing(e) && !recovered.loaded_library {
            recovered.loaded_library = true;
            match load_library(con) {
                Err(e) if is_functions_refused(&e) && !recovered.fallen_back => {
                    self.fall_back(&e);
                    recovered.fallen_back = true;
                    // The scripts are loaded by the next refusal.
                }
                loaded => loaded?,
            }
        } else if is_noscript(e) && !recovered.loaded_scripts {
            recovered.loaded_scripts = true;
            let mut loaded: Vec<&str> = Vec::new();
            for call in calls {
                let script = &*call.script.script;
                if !loaded.contains(&script.get_hash()) {
                    script.load(con)?;
                    loaded.push(script.get_hash());
                }
            }
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    fn fall_back(&self, e: &RedisError) {
        if self.functions.swap(false, Ordering::Relaxed) {
            tracing::info!(
                target: "redmutex",
                error = %e,
                "redmutex: the server refused FCALL; running the scripts with EVALSHA"
            );
        }
    }
}

/// Loads the library on the server `con` reaches, where it may well be already: another
/// client loaded it meanwhile. On a cluster it goes to every primary (replacing the same
/// text where it is): a call may reach a node other than its slot's owner in the client's
/// map (an ASK redirection during a migration, a node just added), and that node must
/// have it too.
fn load_library(con: &mut Con) -> RedisResult<()> {
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD");
    if matches!(con, Con::Cluster(_)) {
        // Every primary must answer OK: one that has the library would refuse a plain
        // LOAD. The library's name carries the hash of its text, so REPLACE swaps in the
        // very same functions.
        load.arg("REPLACE");
    }
    load.arg(library().text.as_str());
    match load.query::<()>(con as &mut dyn ConnectionLike) {
        Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => Ok(()),
        loaded => loaded,
    }
}

/// Whether the server refused an `EVALSHA` for not knowing the script.
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Whether the server refused an `FCALL` for not knowing the function (it lacks the
/// library).
pub(crate) fn is_function_missing(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.eq_ignore_ascii_case("function not found"))
}

/// Whether the server refused `FCALL` (or `FUNCTION LOAD`) itself: a server without
/// functions ("unknown command"; a function's own call of an unknown command is told
/// otherwise), or a user not allowed them.
pub(crate) fn is_functions_refused(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or("").to_ascii_lowercase();
    match e.code() {
        Some("ERR") => {
            detail.starts_with("unknown command")
                && (detail.contains("fcall") || detail.contains("function"))
        }
        Some("NOPERM") => detail.contains("'fcall'") || detail.contains("'function"),
        _ => false,
    }
}

/// Whether a refusal of a script's command means it did not run and should be sent again
/// by the client's ordinary path, which gets over it ([`Scripting::recover`]).
pub(crate) fn is_setup_refusal(e: &RedisError) -> bool {
    is_noscript(e) || is_function_missing(e) || is_functions_refused(e)
}

#[cfg(test)]
mod tests {
    use crate::runtime::scripting::manifest;

    /// The names `text` defines as `function Q.<name>` at the start of a line indented by
    /// `indent` spaces.
    fn defined(text: &str, indent: usize) -> Vec<&str> {
        let head = format!("{}function Q.", " ".repeat(indent));
        text.lines()
            .filter_map(|l| l.strip_prefix(head.as_str()))
            .map(|rest| rest.split('(').next().unwrap_or(rest))
            .collect()
    }

    /// Each script is a function of the manifest, and every function of the manifest is
    /// one of the client's scripts.
    #[test]
    fn the_scripts_are_the_manifests_functions() {
        use super::*;
        let all: [&Bundled; 21] = [
            &ACQUIRE,
            &RELEASE,
            &CANCEL,
            &KICK,
            &FORCE_UNLOCK,
            &RW_ACQUIRE,
            &RW_RELEASE,
            &RW_CANCEL,
            &RW_KICK,
            &RW_FORCE_UNLOCK,
            &SEM_ACQUIRE,
            &SEM_RELEASE,
            &SEM_CANCEL,
            &SEM_KICK,
            &SEM_FORCE_UNLOCK,
            &SEM_PERMITS,
            &RENEW,
            &INSPECT,
            &LATCH_SET,
            &LATCH_COUNT_DOWN,
            &LATCH_STATE,
        ];
        let mut names: Vec<&str> = all
            .iter()
            .map(|b| {
                // Made from the manifest, or a panic.
                let _ = b.script.get_hash();
                &b.function[library().name.len() + 1..]
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut listed: Vec<&str> = manifest::functions().map(|(_, f)| f.name).collect();
        listed.sort_unstable();
        assert_eq!(names, listed);
    }

    /// queue.lua makes most of its functions on first use (`more`), after the rule files
    /// that follow it have run: those may redefine only what it makes at once or makes
    /// only where missing (the hooks), or `more` would put the lock's own back.
    #[test]
    fn later_rule_files_redefine_only_the_queues_hooks() {
        let queue = manifest::QUEUE.text;
        let eager = defined(queue, 0);
        let hooks = defined(queue, 8);
        assert!(
            eager.contains(&"look") && hooks.contains(&"take"),
            "{eager:?} {hooks:?}"
        );
        for part in [
            manifest::LEASES,
            manifest::RW,
            manifest::SEMAPHORE,
            manifest::LATCH,
        ] {
            let file = part.file;
            for name in defined(part.text, 0) {
                assert!(
                    eager.contains(&name) || hooks.contains(&name),
                    "{file} redefines Q.{name}, which queue.lua's `more` would make over it"
                );
            }
        }
    }
}
