//! The bundled Lua scripts, run with EVALSHA and loaded on NOSCRIPT by `redis::Script`, and
//! the set each kind of primitive runs.

use std::sync::LazyLock;

use redis::{Cmd, ConnectionLike, FromRedisValue, RedisResult, Script};

/// A script made of rule files and a body, in order: the queue's rules (`lua/queue.lua`)
/// come first, then the rules of the primitive that redefine its hooks.
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!($(include_str!(concat!("../../lua/", $file))),+)))
    };
}

static ACQUIRE: LazyLock<Script> = script!("queue.lua", "acquire.lua");
static RELEASE: LazyLock<Script> = script!("queue.lua", "release.lua");
static CANCEL: LazyLock<Script> = script!("queue.lua", "cancel.lua");
static KICK: LazyLock<Script> = script!("queue.lua", "kick.lua");
static FORCE_UNLOCK: LazyLock<Script> = script!("queue.lua", "force_unlock.lua");

static RW_ACQUIRE: LazyLock<Script> =
    script!("queue.lua", "leases.lua", "rw.lua", "rw_acquire.lua");
static RW_RELEASE: LazyLock<Script> =
    script!("queue.lua", "leases.lua", "rw.lua", "leased_release.lua");
static RW_CANCEL: LazyLock<Script> =
    script!("queue.lua", "leases.lua", "rw.lua", "leased_cancel.lua");
static RW_KICK: LazyLock<Script> = script!("queue.lua", "leases.lua", "rw.lua", "kick.lua");
static RW_FORCE_UNLOCK: LazyLock<Script> =
    script!("queue.lua", "leases.lua", "rw.lua", "force_unlock.lua");

static SEM_ACQUIRE: LazyLock<Script> = script!(
    "queue.lua",
    "leases.lua",
    "semaphore.lua",
    "sem_acquire.lua"
);
static SEM_RELEASE: LazyLock<Script> = script!(
    "queue.lua",
    "leases.lua",
    "semaphore.lua",
    "leased_release.lua"
);
static SEM_CANCEL: LazyLock<Script> = script!(
    "queue.lua",
    "leases.lua",
    "semaphore.lua",
    "leased_cancel.lua"
);
static SEM_KICK: LazyLock<Script> = script!("queue.lua", "leases.lua", "semaphore.lua", "kick.lua");
static SEM_FORCE_UNLOCK: LazyLock<Script> = script!(
    "queue.lua",
    "leases.lua",
    "semaphore.lua",
    "force_unlock.lua"
);
pub(crate) static SEM_PERMITS: LazyLock<Script> = script!(
    "queue.lua",
    "leases.lua",
    "semaphore.lua",
    "sem_permits.lua"
);

pub(crate) static RENEW: LazyLock<Script> = script!("renew.lua");
pub(crate) static INSPECT: LazyLock<Script> = script!("inspect.lua");
pub(crate) static LATCH_SET: LazyLock<Script> = script!("latch.lua", "latch_set.lua");
pub(crate) static LATCH_COUNT_DOWN: LazyLock<Script> = script!("latch.lua", "latch_count_down.lua");
pub(crate) static LATCH_STATE: LazyLock<Script> = script!("latch.lua", "latch_state.lua");

/// What one kind of primitive runs and how its holds are kept: everything the shared
/// acquisition, release, renewal and clean-up code needs to know about a kind. (`pub` only
/// because the sealed `Kind` trait names it; nothing outside the crate can reach it.)
pub struct Ops {
    pub(crate) acquire: &'static LazyLock<Script>,
    pub(crate) release: &'static LazyLock<Script>,
    pub(crate) cancel: &'static LazyLock<Script>,
    pub(crate) kick: &'static LazyLock<Script>,
    pub(crate) force_unlock: &'static LazyLock<Script>,
    /// Flags of every hold and queue entry: 1 fair, 2 fenced, 4 a read hold.
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
pub(crate) static FAIR: Ops = lock(1);
pub(crate) static FENCED: Ops = lock(2);
pub(crate) static READ: Ops = read_write(1 | 4, "r:");
pub(crate) static WRITE: Ops = read_write(1, "w:");
pub(crate) static PERMITS: Ops = Ops {
    acquire: &SEM_ACQUIRE,
    release: &SEM_RELEASE,
    cancel: &SEM_CANCEL,
    kick: &SEM_KICK,
    // Every permit held is given back; the number of permits stays.
    force_unlock: &SEM_FORCE_UNLOCK,
    flags: 1,
    field_prefix: Some(""),
    per_call: true,
};

/// Runs `cmd`, an `EVALSHA` of `script`, loading the script first if the server lacks it
/// (a restart, `SCRIPT FLUSH`): `redis::Script::invoke` for a command built by hand, so
/// that the same command can also be sent without waiting for its reply (`fanout`).
pub(crate) fn eval<T: FromRedisValue>(
    con: &mut dyn ConnectionLike,
    script: &Script,
    cmd: &Cmd,
) -> RedisResult<T> {
    match cmd.query(con) {
        Err(e) if is_noscript(&e) => {
            script.load(con)?;
            cmd.query(con)
        }
        result => result,
    }
}

/// Whether the server refused an `EVALSHA` for not knowing the script.
pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}
