//! Redis key and channel names of a lock, and the per-thread part of holder ids.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::runtime::scripting::flags;
use crate::runtime::scripting::scripts::Ops;

/// A waiter's channel is the lock key, this, and its client id. Suffixing the key keeps the
/// channel in the key's hash slot, which sharded pub/sub on a cluster needs.
const INBOX_SUFFIX: &[u8] = b":to:";
/// Auxiliary keys (counters now; queues and permits later) start with this byte right
/// after the prefix. Every lock key starts with `{`, `~` or `#` there, so no lock name can
/// produce an auxiliary key, whatever it ends with.
const AUX_MARK: u8 = b'!';
/// What follows the prefix in a read-write lock's key and in a semaphore's ([`aux_key`]'s
/// form, of kinds `rw` and `sem`).
const RW_MARK: &[u8] = b"!rw:";
/// (See [`RW_MARK`].)
const SEM_MARK: &[u8] = b"!sem:";
/// The first byte of a read hold's name in this process (the others have `x`).
const READ_MARK: u8 = b'r';
/// The first byte of an upgradeable read hold's name in this process.
const UPGRADEABLE_MARK: u8 = b'u';

/// How long a semaphore's definition outlives its last use unless its handle says
/// otherwise (`Semaphore::DEFAULT_EXPIRE_AFTER`), in ms.
pub(crate) const DEFAULT_EXPIRE_AFTER_MS: u64 = 24 * 3600 * 1000;

/// The bytes a key prefix must not hold: those that start what follows the prefix in a
/// key (`{`, `~`, `#` of the lock keys, [`AUX_MARK`] of the auxiliary keys), and `}`.
/// Without them, of two different prefixes either neither starts the other, or the longer
/// one goes on with a byte that no key of the shorter one has there: no key of one prefix
/// is ever a key of the other. (Prefix `a!queue:`'s lock `x` would be prefix `a`'s queue of
/// `x`.) The braces would also break the hash tag that keeps a lock's keys in one slot.
pub(crate) const PREFIX_FORBIDDEN: [char; 5] = ['{', '}', '~', '#', AUX_MARK as char];

/// Whether `prefix` can be a key prefix: `Err` says why not.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(PREFIX_FORBIDDEN) {
        return Err(format!(
            "key_prefix must not contain any of {}: another prefix's keys could be this one's",
            PREFIX_FORBIDDEN
                .iter()
                .map(|c| format!("'{c}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// The Redis names of one lock (or other primitive), and the kind of it a handle is.
///
/// Every held lock keeps these, so they are laid out for size: the names used on every
/// call (hold, key, inbox, channel) are slices of one allocation, `<mark><key>:to:<client
/// id>`, the name and the kind of object are read from the key, and the auxiliary keys
/// are made on demand.
pub(crate) struct LockKeys {
    // `x` (`r` for read holds) and the key, then the inbox suffix and the client id.
    names: Box<[u8]>,
    // Where the key ends in `names`, and where the prefix ends in the key.
    key_end: usize,
    prefix_len: usize,
    pub(crate) ops: &'static Ops,
    // A semaphore's: how long its definition outlives its last use, in ms (see
    // `Semaphore::with_expire_after`). Here rather than on the handle because every
    // script that raises a permit's lease raises the definition's expiry too, the
    // watchdog's renewal included, and the watchdog keeps a hold's keys, not its handle.
    expire_after_ms: u64,
}

impl std::fmt::Debug for LockKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockKeys")
            .field("key", &String::from_utf8_lossy(self.key()))
            .finish_non_exhaustive()
    }
}

/// What a handle is an object of: a lock (and its latch), a read-write lock or a semaphore.
/// A read-write lock and a semaphore live in keys of their own (`<prefix>!rw:…`,
/// `<prefix>!sem:…`); a name is one kind at a time all the same (see
/// [`LockKeys::other_kinds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    Lock,
    ReadWrite,
    Semaphore,
}

impl LockKeys {
    /// The first bytes a [`hold`](Self::hold) name may start with, the key following: the
    /// holds of one object's every side.
    pub(crate) const HOLD_MARKS: [u8; 3] = [b'x', READ_MARK, UPGRADEABLE_MARK];

    /// The name the handle was made for: the inverse of [`LockKeys::new`]'s key forms.
    pub(crate) fn name(&self) -> &[u8] {
        let rest = self.lock_part();
        match rest.first() {
            Some(b'{') => &rest[1..rest.len() - 1],
            Some(b'~') => &rest[1..],
            // "#{<16 hex digits>}" and the name.
            _ => &rest[19..],
        }
    }

    /// What the handle is an object of: a read-write lock's and a semaphore's keys are
    /// auxiliary keys of the lock key of their name, which starts with `{`, `~` or `#`.
    fn object(&self) -> Object {
        let rest = &self.key()[self.prefix_len..];
        if rest.starts_with(RW_MARK) {
            Object::ReadWrite
        } else if rest.starts_with(SEM_MARK) {
            Object::Semaphore
        } else {
            Object::Lock
        }
    }

    /// The kind of object this handle is, as [`KIND_NAMES`] numbers it from 1.
    fn kind(&self) -> usize {
        match self.object() {
            Object::Lock => 1,
            Object::ReadWrite => 2,
            Object::Semaphore => 3,
        }
    }

    /// The main key of each kind the name can be, in [`KIND_NAMES`]'s order: the lock
    /// hash, the read-write lock's holds, the semaphore's holds, the count-down latch.
    /// Each exists exactly while that kind has a holder (or, the latch, while it counts).
    fn kind_keys(&self) -> [Vec<u8>; 4] {
        let prefix = &self.key()[..self.prefix_len];
        let lock = [prefix, self.lock_part()].concat();
        let rw = aux_key(prefix, &lock, b"rw");
        let sem = aux_key(prefix, &lock, b"sem");
        let latch = aux_key(prefix, &lock, b"latch");
        [lock, rw, sem, latch]
    }

    /// The main keys of the name's kinds other than this handle's (`None`) or than the
    /// count-down latch (`Some(Latch)`), in [`KIND_NAMES`]'s order: a name is one kind at
    /// a time. The acquire scripts (and the latch's set) take them as their last three
    /// keys, and refuse the name while one of them exists (`Q.look` in `lua/queue.lua`);
    /// all are in the name's hash slot.
    pub(crate) fn other_kinds(&self, latch: bool) -> [Vec<u8>; 3] {
        let own = if latch { 4 } else { self.kind() };
        let mut others = self
            .kind_keys()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i + 1 != own)
            .map(|(_, k)| k);
        [(); 3].map(|()| others.next().expect("three other kinds"))
    }

    /// The key less the prefix and the object's mark: the lock key form of the name.
    fn lock_part(&self) -> &[u8] {
        let rest = &self.key()[self.prefix_len..];
        let mark = match self.object() {
            Object::Lock => 0,
            Object::ReadWrite => RW_MARK.len(),
            Object::Semaphore => SEM_MARK.len(),
        };
        &rest[mark..]
    }

    /// The object's own key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.names[1..self.key_end]
    }

    /// The prefix of every client's channel for this lock: `<key>:to:`. The scripts make it
    /// themselves from the key (`lua/queue.lua`); this is the form they rely on, tested.
    #[cfg(test)]
    pub(crate) fn inbox(&self) -> &[u8] {
        &self.names[1..self.key_end + INBOX_SUFFIX.len()]
    }

    /// This client's channel: where the scripts tell its waiting threads their turn.
    pub(crate) fn channel(&self) -> &[u8] {
        &self.names[1..]
    }

    /// What this process files a thread's hold under: the key, marked apart for read
    /// holds, which a thread may have beside a write hold of the same lock. Never reaches
    /// Redis.
    pub(crate) fn hold(&self) -> &[u8] {
        &self.names[..self.key_end]
    }

    /// Whether the object has holds of several sides ([`HOLD_MARKS`](Self::HOLD_MARKS)): a
    /// read-write lock's read, write and upgradeable holds.
    pub(crate) fn has_sides(&self) -> bool {
        self.object() == Object::ReadWrite
    }

    /// For a write or upgradeable handle of a read-write lock, the read holds'
    /// [`hold`](Self::hold): a thread with one must not wait to write (unless it also holds
    /// the upgradeable side) nor for the upgradeable side.
    pub(crate) fn read_hold(&self) -> Option<Vec<u8>> {
        (self.object() == Object::ReadWrite && self.names[0] != READ_MARK)
            .then(|| [&[READ_MARK][..], self.key()].concat())
    }

    /// For a write handle of a read-write lock, the upgradeable holds'
    /// [`hold`](Self::hold): a thread with one may write while it reads (an upgrade).
    pub(crate) fn upgradeable_hold(&self) -> Option<Vec<u8>> {
        (self.object() == Object::ReadWrite && self.names[0] == b'x')
            .then(|| [&[UPGRADEABLE_MARK][..], self.key()].concat())
    }

    /// The fencing token counter.
    pub(crate) fn fence(&self) -> Vec<u8> {
        self.aux(b"fence")
    }

    /// The waiters' queue.
    pub(crate) fn queue(&self) -> Vec<u8> {
        self.aux(b"queue")
    }

    /// The waiters' deadlines.
    pub(crate) fn waiters(&self) -> Vec<u8> {
        self.aux(b"waiters")
    }

    /// Whether the holds have leases of their own (read-write locks, semaphores).
    pub(crate) fn has_leases(&self) -> bool {
        self.ops.field_prefix.is_some()
    }

    /// The holds' own leases (read-write locks, semaphores); empty for a lock.
    pub(crate) fn leases(&self) -> Vec<u8> {
        if self.has_leases() {
            self.aux(b"leases")
        } else {
            Vec::new()
        }
    }

    /// How long a semaphore's definition ([`permits`](Self::permits)) outlives its last
    /// use, in ms (unused by the other kinds).
    pub(crate) fn expire_after_ms(&self) -> u64 {
        self.expire_after_ms
    }

    /// These keys with the semaphore's definition living `ms` past its last use.
    pub(crate) fn set_expire_after_ms(&mut self, ms: u64) {
        self.expire_after_ms = ms;
    }

    /// A semaphore's number of permits, its definition; empty for the others.
    pub(crate) fn permits(&self) -> Vec<u8> {
        if self.object() == Object::Semaphore {
            self.aux(b"permits")
        } else {
            Vec::new()
        }
    }

    /// The count-down latch of the same name (a different object).
    pub(crate) fn latch(&self) -> Vec<u8> {
        self.aux(b"latch")
    }

    /// The id of the call that last set the latch, so that a repeat of it recognizes it.
    pub(crate) fn latch_setter(&self) -> Vec<u8> {
        self.aux(b"setter")
    }

    /// The id of the call that last force-unlocked the lock, for the same reason.
    pub(crate) fn forced(&self) -> Vec<u8> {
        self.aux(b"forced")
    }

    /// A key of one `MultiLock`'s check that two clients' members are not one key of one
    /// server (see `MultiLock::check_distinct`), `nonce` its own: in the lock's hash slot,
    /// under its prefix, and no object's key (`list` passes it by).
    pub(crate) fn probe(&self, nonce: u64) -> Vec<u8> {
        self.aux(format!("probe{nonce:016x}").as_bytes())
    }

    fn aux(&self, kind: &[u8]) -> Vec<u8> {
        let key = self.key();
        aux_key(&key[..self.prefix_len], key, kind)
    }

    /// Each of the three forms a key can take starts differently right after the prefix
    /// (`{`, `~`, `#`), and each keeps the whole name, so distinct names never share a key.
    /// The prefix is known to hold no brace, so the first `{` after it opens the tag.
    pub(crate) fn new(
        prefix: &[u8],
        name: Vec<u8>,
        client_id: &str,
        object: Object,
        ops: &'static Ops,
    ) -> LockKeys {
        let mut key = Vec::with_capacity(prefix.len() + name.len() + 20);
        key.extend_from_slice(prefix);
        if !name.contains(&b'{') && !name.contains(&b'}') {
            key.push(b'{');
            key.extend_from_slice(&name);
            key.push(b'}');
        } else if has_hash_tag(&name) {
            // The user chose the tag, e.g. to keep this lock beside their own keys.
            key.push(b'~');
            key.extend_from_slice(&name);
        } else {
            // Braces that cannot form a tag (a '}' first, or "{}"): tag a digest instead.
            key.extend_from_slice(format!("#{{{:016x}}}", fnv1a(&name)).as_bytes());
            key.extend_from_slice(&name);
        }
        let key = match object {
            Object::Lock => key,
            Object::ReadWrite => aux_key(prefix, &key, b"rw"),
            Object::Semaphore => aux_key(prefix, &key, b"sem"),
        };
        // Names that never reach Redis: the first byte tells read and upgradeable holds
        // from the others.
        let mark = if ops.flags & flags::READ != 0 {
            READ_MARK
        } else if ops.flags & flags::UPGRADEABLE != 0 {
            UPGRADEABLE_MARK
        } else {
            b'x'
        };
        let names = [&[mark][..], &key[..], INBOX_SUFFIX, client_id.as_bytes()].concat();
        LockKeys {
            names: names.into_boxed_slice(),
            key_end: 1 + key.len(),
            prefix_len: prefix.len(),
            ops,
            expire_after_ms: DEFAULT_EXPIRE_AFTER_MS,
        }
    }
}

/// The kinds of object a name can be, numbered from 1 in this order by the scripts (their
/// refusal `{-4, kind}`), named as [`LockInfo::kind`](crate::LockInfo::kind) names them.
pub(crate) const KIND_NAMES: [&str; 4] =
    ["lock", "read-write lock", "semaphore", "count-down latch"];

/// The name of kind `kind` as a script numbers it ([`KIND_NAMES`]).
pub(crate) fn kind_name(kind: i64) -> &'static str {
    usize::try_from(kind - 1)
        .ok()
        .and_then(|i| KIND_NAMES.get(i))
        .copied()
        .unwrap_or("different kind of object")
}

/// The auxiliary key `kind` of the lock whose key is `key`: `<prefix>!<kind>:<key less the
/// prefix>`. The prefix and `kind` hold no brace, so the first `{` is the lock key's own:
/// the same hash slot. `kind` holds no `:`, so different kinds never meet either.
fn aux_key(prefix: &[u8], key: &[u8], kind: &[u8]) -> Vec<u8> {
    debug_assert!(!kind.contains(&b':') && !kind.contains(&b'{') && !kind.contains(&b'}'));
    let rest = &key[prefix.len()..];
    let mut aux = Vec::with_capacity(key.len() + kind.len() + 2);
    aux.extend_from_slice(prefix);
    aux.push(AUX_MARK);
    aux.extend_from_slice(kind);
    aux.push(b':');
    aux.extend_from_slice(rest);
    aux
}

/// The object a Redis key of this prefix is, and the name it was made from: `None` for
/// auxiliary keys that are not an object of their own (queues, counters, leases) and keys
/// no name produces. The inverse of [`LockKeys::new`]'s key forms. A semaphore's number of
/// permits is its semaphore: it is defined while no permit is held.
pub(crate) fn object_of(prefix: &[u8], key: &[u8]) -> Option<(Object, bool, Vec<u8>)> {
    let rest = key.strip_prefix(prefix)?;
    let mut permits = false;
    let (object, latch, rest) = if let Some(rest) = rest.strip_prefix(RW_MARK) {
        (Object::ReadWrite, false, rest)
    } else if let Some(rest) = rest.strip_prefix(SEM_MARK) {
        (Object::Semaphore, false, rest)
    } else if let Some(rest) = rest.strip_prefix(b"!latch:") {
        (Object::Lock, true, rest)
    } else if let Some(rest) = rest
        .strip_prefix(b"!permits:")
        .and_then(|r| r.strip_prefix(SEM_MARK))
    {
        permits = true;
        (Object::Semaphore, false, rest)
    } else {
        (Object::Lock, false, rest)
    };
    let name = match rest.first()? {
        b'{' => rest.strip_suffix(b"}")?[1..].to_vec(),
        b'~' => rest[1..].to_vec(),
        // "#{<16 hex digits>}" and the name.
        b'#' if rest.len() > 19 && rest[1] == b'{' && rest[18] == b'}' => rest[19..].to_vec(),
        _ => return None,
    };
    // Only a key the name really produces (not, say, a latch's ":opened" channel name).
    let made = LockKeys::new(
        prefix,
        name.clone(),
        "",
        object,
        &crate::runtime::scripting::scripts::PLAIN,
    );
    let expected = if latch {
        made.latch()
    } else if permits {
        made.permits()
    } else {
        made.key().to_vec()
    };
    (expected == key && !name.is_empty()).then_some((object, latch, name))
}

/// Whether Redis Cluster would hash `s` by a `{tag}` inside it (first '{', then the first
/// '}' after it, with at least one byte between).
pub(crate) fn has_hash_tag(s: &[u8]) -> bool {
    match s.iter().position(|&b| b == b'{') {
        Some(open) => match s[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) => len > 0,
            None => false,
        },
        None => false,
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

static NEXT_THREAD_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    // Drawn once per thread from a process-wide counter, so no two threads of a process
    // (even one started after another ended) ever share a holder id.
    static THREAD_TOKEN: u64 = NEXT_THREAD_TOKEN.fetch_add(1, Ordering::Relaxed);
}

/// A token no thread has, nor will: the holder id of one semaphore acquisition.
pub(crate) fn fresh_token() -> u64 {
    NEXT_THREAD_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// This thread's token, the second half of its holder ids.
pub(crate) fn thread_token() -> u64 {
    THREAD_TOKEN.with(|t| *t)
}

/// The holder id of `token` in the client `client_id`.
pub(crate) fn holder_id(client_id: &str, token: u64) -> String {
    format!("{client_id}:{token}")
}

#[cfg(test)]
mod tests;
