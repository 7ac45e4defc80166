//! The Redis names of a lock's keys, as the library makes them (`src/runtime/keys.rs`,
//! which is private): tests look into Redis through these instead of spelling the names
//! out, so one place follows the layout (`docs/redis-layout.md`).
//!
//! A lock `name` of prefix `p` lives in `p{name}` (`p~name` when the name carries a hash
//! tag of its own, `p#{<digest>}name` when its braces form none); a read-write lock in
//! `p!rw:{name}`, a semaphore in `p!sem:{name}`. Each object's auxiliary keys are
//! `p!<kind>:<its key less the prefix>`.

/// The prefix of a client that sets none.
pub const DEFAULT_PREFIX: &str = "redmutex:";

/// The keys of one object (a lock, read-write lock or semaphore) of one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    /// The object's own key less the prefix, e.g. `!rw:{name}`.
    rest: String,
}

impl Keys {
    /// A lock's (plain, fair or fenced; the count-down latch of the name hangs off it).
    pub fn lock(prefix: &str, name: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
            rest: lock_part(name),
        }
    }

    /// A read-write lock's.
    pub fn rw(prefix: &str, name: &str) -> Keys {
        Keys::lock(prefix, name).object("rw")
    }

    /// A semaphore's.
    pub fn sem(prefix: &str, name: &str) -> Keys {
        Keys::lock(prefix, name).object("sem")
    }

    /// The object of mark `kind` (`rw`, `sem`) of this lock's name.
    fn object(self, kind: &str) -> Keys {
        Keys {
            rest: format!("!{kind}:{}", self.rest),
            prefix: self.prefix,
        }
    }

    /// The object's own key (the lock hash; a read-write lock's or semaphore's holds).
    pub fn key(&self) -> String {
        format!("{}{}", self.prefix, self.rest)
    }

    /// The auxiliary key `kind` of the object: `<prefix>!<kind>:<key less the prefix>`.
    pub fn aux(&self, kind: &str) -> String {
        format!("{}!{kind}:{}", self.prefix, self.rest)
    }

    /// The waiters' queue.
    pub fn queue(&self) -> String {
        self.aux("queue")
    }

    /// The waiters' deadlines.
    pub fn waiters(&self) -> String {
        self.aux("waiters")
    }

    /// The fencing token counter.
    pub fn fence(&self) -> String {
        self.aux("fence")
    }

    /// The holds' own leases (read-write locks, semaphores).
    pub fn leases(&self) -> String {
        self.aux("leases")
    }

    /// A semaphore's number of permits.
    pub fn permits(&self) -> String {
        self.aux("permits")
    }

    /// The count-down latch of the same name.
    pub fn latch(&self) -> String {
        self.aux("latch")
    }
}

/// A lock's key form of `name`, less the prefix (see the module's comment).
fn lock_part(name: &str) -> String {
    if !name.contains(['{', '}']) {
        format!("{{{name}}}")
    } else if has_hash_tag(name) {
        format!("~{name}")
    } else {
        format!("#{{{:016x}}}{name}", fnv1a(name.as_bytes()))
    }
}

/// Whether Redis Cluster would hash `s` by a `{tag}` inside it.
fn has_hash_tag(s: &str) -> bool {
    match s.find('{') {
        Some(open) => matches!(s[open + 1..].find('}'), Some(len) if len > 0),
        None => false,
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The channel a client listens on for what is told to it alone.
pub fn control_channel(prefix: &str, client: &redmutex::Client) -> String {
    format!("{}{}", control_prefix(prefix), client.id())
}

/// What every client's own channel of `prefix` starts with.
pub fn control_prefix(prefix: &str) -> String {
    format!("{prefix}__control:")
}

/// The pattern of every client's own channel of `prefix`.
pub fn control_channels(prefix: &str) -> String {
    format!("{}*", control_prefix(prefix))
}
