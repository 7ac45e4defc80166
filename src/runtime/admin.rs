//! The administrative side of a `Client`: what Redis records of an object
//! ([`inspect`](Client::inspect)), every object of the key prefix ([`list`](Client::list)),
//! and freeing an object whoever holds it ([`force_unlock`](Client::force_unlock)).

use std::collections::HashMap;
use std::time::Duration;

use crate::runtime::keys::{self, LockKeys, Object};
use crate::runtime::scripting::calls;
use crate::runtime::scripting::scripts;
use crate::{Client, Error, HolderMetadata, LockInfo, LockKind, LockName, Semaphore};

impl Client {
    /// What Redis records right now of each object called `name` that exists: its lock,
    /// read-write lock, semaphore and count-down latch (see [`LockInfo`]); empty when
    /// none does. One script call, reading only.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.inspect("nightly")?.first() {
    ///     Some(info) => println!("held by {:?}, {:?} left", info.holders, info.remaining_lease),
    ///     None => println!("free"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn inspect(&self, name: impl LockName) -> Result<Vec<LockInfo>, Error> {
        let name = name.into_name();
        self.inspect_name(&name).map_err(|e| e.on_lock(&name))
    }

    /// [`inspect`](Client::inspect) of the name `name`: one call reads every kind's keys,
    /// each read as its own kind's layout.
    fn inspect_name(&self, name: &[u8]) -> Result<Vec<LockInfo>, Error> {
        crate::name::check(name, "lock names must not be empty")?;
        let c = &self.inner.exec.config;
        // Each with its own kind's layout, so that the leases' keys are named.
        let keys = |object, ops| LockKeys::new(&c.key_prefix, name.to_vec(), "", object, ops);
        let (lock, rw, sem) = (
            keys(Object::Lock, &scripts::PLAIN),
            keys(Object::ReadWrite, &scripts::READ),
            keys(Object::Semaphore, &scripts::PERMITS),
        );
        let call = calls::inspect(&lock, &rw, &sem);
        let (l, r, m, latch): InspectReply = self
            .inner
            .exec
            .run(|con| self.inner.exec.eval(con, &call))?;
        let mut out: Vec<LockInfo> = [
            (l, &lock, LockKind::Lock),
            (r, &rw, LockKind::ReadWrite),
            (m, &sem, LockKind::Semaphore),
        ]
        .into_iter()
        .filter_map(|(found, keys, kind)| Some(held_info(name, keys, kind, found?)))
        .collect();
        if let Some(found) = latch {
            out.push(latch_info(name, &lock, found));
        }
        Ok(out)
    }

    /// Every object of this client's key prefix whose name matches the glob `pattern`
    /// (`*`, `?`, `[abc]`; `"*"` for all), as [`inspect`](Client::inspect) reports it,
    /// sorted by name. Walks the keyspace with `SCAN` (never `KEYS`), so it does not
    /// block the server, and an object created or removed meanwhile may be missed. On a
    /// Redis Cluster every primary is walked (as `CLUSTER SLOTS` names them when the call
    /// starts); a slot that moves meanwhile may be missed or seen twice (seen once here).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// for info in client.list("deploy-*")? {
    ///     println!("{} {} {:?}", info.kind, info.name, info.holders);
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let glob = glob::Pattern::new(pattern)
            .map_err(|e| Error::invalid(format!("bad pattern {pattern:?}: {e}")))?;
        let prefix = self.inner.exec.config.key_prefix.clone();
        let mut matching = Vec::new();
        for b in &prefix {
            if b"*?[]\\".contains(b) {
                matching.push(b'\\');
            }
            matching.push(*b);
        }
        matching.push(b'*');
        let mut names = std::collections::BTreeSet::new();
        // A SCAN cursor belongs to one server: a cluster's primaries are walked one by one.
        let nodes = if self.inner.exec.is_cluster() {
            self.inner.exec.run(|con| con.primaries())?
        } else {
            vec![None]
        };
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(matching.as_slice())
                    .arg("COUNT")
                    .arg(1000);
                let (next, keys): (u64, Vec<Vec<u8>>) = self
                    .inner
                    .exec
                    .run(|con| con.query_on(&scan, node.as_ref()))?;
                for key in keys {
                    if let Some((_, _, name)) = keys::object_of(&prefix, &key) {
                        if glob.matches(&String::from_utf8_lossy(&name)) {
                            names.insert(name);
                        }
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        let mut out = Vec::new();
        for name in names {
            out.extend(self.inspect(name)?);
        }
        Ok(out)
    }

    /// Frees every object called `name` that can be held, whoever holds it: its lock
    /// (plain, fair or fenced holds), every reader and the writer of its read-write lock,
    /// and every permit held of its semaphore (its number of permits stays), each handed
    /// on to its first waiters. Returns the kinds that were held, as [`LockKind`]'s
    /// `Display` names them; empty when none was. A count-down latch has no holder and is left as it
    /// is. An administrative operation (what `redmutex unlock --force` runs), like
    /// [`Lock::force_unlock`](crate::Lock::force_unlock): the former holders are not stopped, but their clients are
    /// told at once (their guards' `lost()` fire, the hook is called) and their releases
    /// fail with [`Error::LeaseLost`]. Each kind is freed in one script of its own; a key holding someone else's
    /// data fails with a `WRONGTYPE` error and is left as it is, and then the kinds after
    /// it (in the order above) are not tried.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// // An operator clears a lock left by a stuck job (its client is told at once).
    /// let freed = client.force_unlock("nightly-import")?;
    /// println!("freed: {freed:?}"); // e.g. ["Lock"]
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn force_unlock(&self, name: impl LockName) -> Result<Vec<&'static str>, Error> {
        let name = name.into_name();
        let mut freed = Vec::new();
        if self.lock(name.clone()).force_unlock()? {
            freed.push(LockKind::Lock.as_str());
        }
        if self
            .read_write_lock(name.clone())
            .write_lock()
            .force_unlock()?
        {
            freed.push(LockKind::ReadWrite.as_str());
        }
        if Semaphore::new(self, name, 0).force_unlock()? {
            freed.push(LockKind::Semaphore.as_str());
        }
        Ok(freed)
    }
}

/// What `inspect.lua` reads of an object that can be held (lock, read-write lock,
/// semaphore), when its keys exist: its key's Redis type and time to live, its hash's
/// fields and values one after the other, its queue, its number of permits (a semaphore)
/// and the holds whose own lease has ended.
type HeldReply = (
    String,
    i64,
    Vec<Vec<u8>>,
    Vec<Vec<u8>>,
    Option<u64>,
    Vec<Vec<u8>>,
);

/// `inspect.lua`'s reply: the lock, the read-write lock, the semaphore, and the latch's
/// Redis type, time to live and count.
type InspectReply = (
    Option<HeldReply>,
    Option<HeldReply>,
    Option<HeldReply>,
    Option<(String, i64, Option<u64>)>,
);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A key's time to live in ms as a lease: `None` when it has none or there is no key.
fn lease(pttl: i64) -> Option<Duration> {
    (pttl >= 0).then(|| Duration::from_millis(pttl as u64))
}

/// The [`LockInfo`] of the object `name` of the kind `kind` that `found` describes: a key
/// of another Redis type than a hash (or none: only waiters) is someone else's
/// ([`LockKind::Foreign`]).
fn held_info(name: &[u8], keys: &LockKeys, kind: LockKind, found: HeldReply) -> LockInfo {
    let (redis_type, pttl, fields, queue, extra, ended) = found;
    let mut info = LockInfo {
        name: text(name),
        kind: if redis_type == "hash" || redis_type == "none" {
            kind
        } else {
            LockKind::Foreign
        },
        key: text(keys.key()),
        holders: Vec::new(),
        remaining_lease: lease(pttl),
        waiters: queue.iter().map(|w| text(w)).collect(),
        token: None,
        count: if kind == LockKind::Semaphore {
            extra
        } else {
            None
        },
        metadata: Vec::new(),
    };
    let records = read_holds(&mut info, &fields, &ended);
    // Only the holds shown: a record whose hold is not there is never reported.
    for pair in fields.chunks_exact(2) {
        let Some(record) = records.get(pair[0].as_slice()) else {
            continue;
        };
        if !info.holders.iter().any(|(h, _)| h.as_bytes() == pair[0]) {
            continue;
        }
        if let Some(metadata) = parse_metadata(text(&pair[0]), record) {
            info.metadata.push(metadata);
        }
    }
    info
}

/// Reads the holds hash's `fields` into `info`: its holders (less those whose own lease
/// has `ended`, gone whether or not a script has dropped them yet) and its fencing token.
/// Returns the metadata records, by the holder they are for.
fn read_holds<'a>(
    info: &mut LockInfo,
    fields: &'a [Vec<u8>],
    ended: &[Vec<u8>],
) -> HashMap<&'a [u8], &'a Vec<u8>> {
    let mut records = HashMap::new();
    for pair in fields.chunks_exact(2) {
        if let Some(holder) = pair[0].strip_prefix(META_PREFIX) {
            records.insert(holder, &pair[1]);
            continue;
        }
        let value = std::str::from_utf8(&pair[1])
            .ok()
            .and_then(|v| v.parse().ok());
        match (pair[0].first(), value) {
            (Some(b'~'), v) => {
                if pair[0] == b"~fence" {
                    info.token = v;
                }
            }
            (_, Some(_)) if ended.contains(&pair[0]) => {}
            (_, Some(count)) => info.holders.push((text(&pair[0]), count)),
            (_, None) => {}
        }
    }
    records
}

/// The [`LockInfo`] of the count-down latch `name` (its key `lock.latch()`) that `found`
/// describes: a key of another Redis type than a string is someone else's.
fn latch_info(name: &[u8], lock: &LockKeys, found: (String, i64, Option<u64>)) -> LockInfo {
    let (redis_type, pttl, count) = found;
    LockInfo {
        name: text(name),
        kind: if redis_type == "string" {
            LockKind::CountDownLatch
        } else {
            LockKind::Foreign
        },
        key: text(&lock.latch()),
        holders: Vec::new(),
        remaining_lease: lease(pttl),
        waiters: Vec::new(),
        token: None,
        count,
        metadata: Vec::new(),
    }
}

/// The prefix of a holds hash's field that records the metadata of the hold named by the
/// rest of it (see `lua/queue.lua`).
const META_PREFIX: &[u8] = b"~m:";

/// A hold's metadata record, `"<server ms> <text>"`; `None` when it is not one.
fn parse_metadata(holder: String, record: &[u8]) -> Option<HolderMetadata> {
    let space = record.iter().position(|&b| b == b' ')?;
    let ms: u64 = std::str::from_utf8(&record[..space]).ok()?.parse().ok()?;
    Some(HolderMetadata {
        holder,
        text: String::from_utf8_lossy(&record[space + 1..]).into_owned(),
        since: std::time::UNIX_EPOCH + Duration::from_millis(ms),
    })
}
