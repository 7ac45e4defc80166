//! Which files of `lua/` make up each bundled script and each function of the library,
//! written once: the client's library and scripts (`scripts.rs`), the test harness and the
//! benches all put theirs together from this list.
//!
//! Standalone (nothing of the crate), so that tests/ and benches/ include it with
//! `#[path]`; its `include_str!` paths are relative to this file.

/// A file of `lua/`: its name and its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// The file's name in `lua/`, for messages.
    pub file: &'static str,
    /// The file's text.
    pub text: &'static str,
}

macro_rules! parts {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)+) => {
        $(
            $(#[$doc])*
            pub const $name: Part = Part {
                file: $file,
                text: include_str!(concat!("../../../lua/", $file)),
            };
        )+
    };
}

parts! {
    /// Makes a script of its own run at the server's memory limit: what a library
    /// function's `allow-oom` flag does (see [`Function::oom_marker`]).
    ALLOW_OOM = "allow_oom.lua";
    /// The release's count rule, a lock's and a leased kind's (`leave`).
    LEVELS = "levels.lua";
    /// The waiter queue's rules, whose hooks the kinds' rules below redefine.
    QUEUE = "queue.lua";
    /// A lease per hold: the read-write lock's and the semaphore's rules.
    LEASES = "leases.lua";
    /// The read-write lock's rules.
    RW = "rw.lua";
    /// The semaphore's rules.
    SEMAPHORE = "semaphore.lua";
    /// The count-down latch's rules.
    LATCH = "latch.lua";
    /// A lock's uncontended acquire, which ends there.
    ACQUIRE_FAST = "acquire_fast.lua";
    /// A lock's acquire past its fast path.
    ACQUIRE = "acquire.lua";
    /// A lock's uncontended release, which ends there.
    RELEASE_FAST = "release_fast.lua";
    /// A lock's release past its fast path.
    RELEASE = "release.lua";
    /// Leaves a lock's queue.
    CANCEL = "cancel.lua";
    /// Hands a lapsed object on to its next waiter.
    KICK = "kick.lua";
    /// Frees an object whoever holds it.
    FORCE_UNLOCK = "force_unlock.lua";
    /// The read-write lock's acquire.
    RW_ACQUIRE = "rw_acquire.lua";
    /// The semaphore's acquire.
    SEM_ACQUIRE = "sem_acquire.lua";
    /// A leased kind's release (read-write lock, semaphore).
    LEASED_RELEASE = "leased_release.lua";
    /// A leased kind's leaving of the queue.
    LEASED_CANCEL = "leased_cancel.lua";
    /// The semaphore's permit count: read, add, reduce.
    SEM_PERMITS = "sem_permits.lua";
    /// Renews holds and keeps queue entries alive.
    RENEW = "renew.lua";
    /// Reads what Redis records of each object of a name.
    INSPECT = "inspect.lua";
    /// Sets a count-down latch.
    LATCH_SET = "latch_set.lua";
    /// Counts a latch down.
    LATCH_COUNT_DOWN = "latch_count_down.lua";
    /// Reads a latch's count.
    LATCH_STATE = "latch_state.lua";
}

/// One function of the library, which is also a script of its own.
#[derive(Clone, Copy, Debug)]
pub struct Function {
    /// Its name after the library's (`redmutex_<hash>_<name>`).
    pub name: &'static str,
    /// The library flag `allow-oom`: a function that renews, reads, frees or hands on,
    /// which the server's memory limit must not refuse (one that may add data is refused
    /// at once, as a script's first such write is).
    pub allow_oom: bool,
    /// As a script of its own, it starts with [`ALLOW_OOM`], which does the flag's job
    /// there. Not for a script that never writes first what may take memory.
    pub oom_marker: bool,
    /// As a script of its own, it starts with [`LEVELS`] (the library makes it once, see
    /// [`SHARED`]).
    pub levels: bool,
    /// A lock's fast path: the uncontended call, which ends there. It runs before the
    /// group's rules, so that as a script of its own such a call makes none of them.
    pub fast: Option<Part>,
    /// The body, after the group's rules.
    pub body: Part,
}

/// Functions that share rule files: in the library a `do ... end` block of its own, since
/// a primitive's rules redefine the queue's hooks (`Q`) for its functions only.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    /// The rule files, in order (the queue's first, then those that redefine its hooks).
    pub rules: &'static [Part],
    /// The group's functions.
    pub functions: &'static [Function],
}

/// The files the library makes once, before its groups.
pub const SHARED: &[Part] = &[LEVELS];

const fn function(name: &'static str, allow_oom: bool, body: Part) -> Function {
    Function {
        name,
        allow_oom,
        oom_marker: allow_oom,
        levels: false,
        fast: None,
        body,
    }
}

/// A release: the count rule first as a script of its own.
const fn release(name: &'static str, body: Part) -> Function {
    Function {
        levels: true,
        ..function(name, true, body)
    }
}

/// A function that must run at the memory limit but never writes first what takes memory
/// (it reads, or its first write frees): no marker as a script of its own.
const fn unmarked(function: Function) -> Function {
    Function {
        oom_marker: false,
        ..function
    }
}

/// The library's groups, in the order it makes them.
pub const LIBRARY: &[Group] = &[
    Group {
        rules: &[QUEUE],
        functions: &[
            Function {
                fast: Some(ACQUIRE_FAST),
                ..function("acquire", false, ACQUIRE)
            },
            // No allow_oom.lua: a lock's release never writes first what may take memory
            // (its first write is a DEL, or the PEXPIRE before an inner level's HSET:
            // levels.lua), so the server's memory limit never refuses it, and the
            // uncontended release runs no marker command. (Its function keeps the flag:
            // nothing to lose.)
            unmarked(Function {
                fast: Some(RELEASE_FAST),
                ..release("release", RELEASE)
            }),
            function("cancel", true, CANCEL),
            function("kick", true, KICK),
            function("force_unlock", true, FORCE_UNLOCK),
        ],
    },
    Group {
        rules: &[QUEUE, LEASES, RW],
        functions: &[
            function("rw_acquire", false, RW_ACQUIRE),
            release("rw_release", LEASED_RELEASE),
            function("rw_cancel", true, LEASED_CANCEL),
            function("rw_kick", true, KICK),
            function("rw_force_unlock", true, FORCE_UNLOCK),
        ],
    },
    Group {
        rules: &[QUEUE, LEASES, SEMAPHORE],
        functions: &[
            function("sem_acquire", false, SEM_ACQUIRE),
            release("sem_release", LEASED_RELEASE),
            function("sem_cancel", true, LEASED_CANCEL),
            function("sem_kick", true, KICK),
            function("sem_force_unlock", true, FORCE_UNLOCK),
            function("sem_permits", false, SEM_PERMITS),
        ],
    },
    Group {
        rules: &[LATCH],
        functions: &[
            function("latch_set", false, LATCH_SET),
            function("latch_count_down", true, LATCH_COUNT_DOWN),
            unmarked(function("latch_state", true, LATCH_STATE)),
        ],
    },
    Group {
        rules: &[],
        functions: &[
            function("renew", true, RENEW),
            unmarked(function("inspect", true, INSPECT)),
        ],
    },
];

/// Every function of the library, with its group.
pub fn functions() -> impl Iterator<Item = (&'static Group, &'static Function)> {
    LIBRARY
        .iter()
        .flat_map(|group| group.functions.iter().map(move |f| (group, f)))
}

/// The files of the function `name` as a script of its own, in order: [`ALLOW_OOM`] and
/// [`LEVELS`] where it needs them, its fast path, its group's rules, then its body.
/// `None` for a name that is no function of the library.
pub fn script_parts(name: &str) -> Option<Vec<Part>> {
    let (group, f) = functions().find(|(_, f)| f.name == name)?;
    let mut parts = Vec::new();
    parts.extend(f.oom_marker.then_some(ALLOW_OOM));
    parts.extend(f.levels.then_some(LEVELS));
    parts.extend(f.fast);
    parts.extend_from_slice(group.rules);
    parts.push(f.body);
    Some(parts)
}

/// The text of the function `name` as a script of its own ([`script_parts`] one after
/// another), without the constants line the client puts first.
pub fn script_text(name: &str) -> Option<String> {
    Some(script_parts(name)?.iter().map(|p| p.text).collect())
}
