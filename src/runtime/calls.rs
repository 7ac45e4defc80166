//! One typed function per script the runtime sends: each builds the script's KEYS and ARGV
//! in the order the script reads them (see its header in `lua/`), so that no caller writes
//! them by hand.

use std::time::Duration;

use crate::runtime::keys::LockKeys;
use crate::runtime::lease::millis;
use crate::runtime::queue::{command, command_with};
use crate::runtime::scripts::{self, Ops, ScriptCall};

/// Releases one level of the lock `keys` held by `holder`, which holds `held` levels and
/// whose remaining levels need `need` ms (`release.lua`).
pub(crate) fn release(keys: &LockKeys, holder: &str, need: u64, held: usize) -> ScriptCall {
    let mut cmd = command(keys.ops.release, keys);
    cmd.arg(holder);
    // A lock's release of its one level needing no lease, its common call, sends the
    // holder id alone: `release_fast.lua` reads ARGV[2..3] as 0 and 1 (each string sent
    // costs the server about as much as a command the script runs).
    if keys.has_leases() || need != 0 || held != 1 {
        cmd.arg(need).arg(held);
    }
    // Which side's hold it is: read by `leased_release.lua` only (a lock has one side).
    if keys.has_leases() {
        cmd.arg(keys.ops.flags);
    }
    cmd
}

/// Leaves the queue of the lock `keys` as the thread `holder`, which holds `expected`
/// levels: with `keep`, a level beyond them (the lock was handed over meanwhile) is kept
/// and reported, otherwise given back, leaving `need` ms to the levels held (`cancel.lua`).
pub(crate) fn cancel(
    keys: &LockKeys,
    holder: &str,
    expected: usize,
    need: u64,
    keep: bool,
) -> ScriptCall {
    cancel_as(keys.ops, keys, holder, expected, need, keep)
}

/// [`cancel`] by the rules of `ops` rather than those of the keys' own kind: the read side
/// of a read-write lock left from its write side's keys (they share the object).
pub(crate) fn cancel_as(
    ops: &'static Ops,
    keys: &LockKeys,
    holder: &str,
    expected: usize,
    need: u64,
    keep: bool,
) -> ScriptCall {
    let mut cmd = command(ops.cancel, keys);
    cmd.arg(holder).arg(expected).arg(need).arg(u8::from(keep));
    // As in `release`: read by `leased_cancel.lua` only.
    if ops.field_prefix.is_some() {
        cmd.arg(ops.flags);
    }
    cmd
}

/// Confirms the hold handed to `holder` on the lock `keys` and extends it to `lease_ms`:
/// the renewal script with this one hold (`renew.lua`), whose reply lists it as lost when
/// its pickup window was over first.
pub(crate) fn confirm(keys: &LockKeys, holder: &str, lease_ms: u64) -> ScriptCall {
    renew(&[(keys, holder, lease_ms)], std::iter::empty())
}

/// Renews the holds `holds` (each a lock's keys, its holder id and the lease in ms it
/// needs) and keeps the queue entries `entries` alive (each a lock's keys, the waiting
/// holder id and how long its entry lives in ms), all in one call (`renew.lua`).
pub(crate) fn renew<'a>(
    holds: &[(&LockKeys, &str, u64)],
    entries: impl Iterator<Item = (&'a LockKeys, &'a str, u64)>,
) -> ScriptCall {
    let mut call = ScriptCall::new(&scripts::RENEW);
    call.arg(holds.len());
    for &(keys, holder, lease_ms) in holds {
        let ops = keys.ops;
        call.key(keys.key());
        if ops.field_prefix.is_some() {
            call.key(keys.leases().as_slice()).arg("m");
        } else {
            call.arg("k");
        }
        call.arg(ops.field(holder)).arg(lease_ms);
    }
    for (keys, holder, ttl_ms) in entries {
        call.key(keys.queue().as_slice())
            .key(keys.waiters().as_slice())
            .arg(holder)
            .arg(ttl_ms);
    }
    call
}

/// Checks that the lock `keys`, handed on a pickup window ago, did not lapse with waiters
/// asleep: a free lock goes to the next one (`kick.lua`).
pub(crate) fn kick(keys: &LockKeys) -> ScriptCall {
    command(keys.ops.kick, keys)
}

/// Reads what Redis records of each object of one name (`inspect.lua`): its lock `lock`,
/// read-write lock `rw`, semaphore `sem` and count-down latch (`lock`'s latch key), each
/// laid out as its own kind.
pub(crate) fn inspect(lock: &LockKeys, rw: &LockKeys, sem: &LockKeys) -> ScriptCall {
    let mut call = ScriptCall::new(&scripts::INSPECT);
    call.key(lock.key())
        .key(lock.queue().as_slice())
        .key(lock.fence().as_slice())
        .key(rw.key())
        .key(rw.queue().as_slice())
        .key(sem.key())
        .key(sem.queue().as_slice())
        .key(sem.permits().as_slice())
        .key(lock.latch().as_slice())
        .key(rw.leases().as_slice())
        .key(sem.leases().as_slice());
    call
}

/// What an acquire attempt tells `acquire.lua` (and the kinds' own acquire scripts) besides
/// the lock's keys.
pub(crate) struct Acquire<'a> {
    pub(crate) holder: &'a str,
    pub(crate) lease_ms: u64,
    /// The levels the thread believes it holds, so that a repeat cannot count one twice.
    pub(crate) held: usize,
    /// The kind's flags, where the client listens (`Executor::listener_flags`) and how
    /// (`Subscription::listen_flags`).
    pub(crate) flags: u8,
    /// The ticket and entry lifetime in ms to queue with, if the attempt queues.
    pub(crate) join: Option<(u64, u64)>,
    /// For a kind that takes an amount per call (a semaphore): the permits asked for and
    /// the number of permits to create the semaphore with.
    pub(crate) amount: Option<(u32, u32)>,
    /// The client's metadata text; only sent when set, so that a client without it sends
    /// what it always did.
    pub(crate) metadata: Option<&'a str>,
}

/// An acquire attempt on the lock `keys` (see `lua/acquire.lua`).
pub(crate) fn acquire(keys: &LockKeys, a: &Acquire<'_>) -> ScriptCall {
    let (ticket, ttl) = a.join.unwrap_or((0, 0));
    let mut call = command(keys.ops.acquire, keys);
    // Last: the other kinds' keys of the name, which the script refuses it for.
    for other in keys.other_kinds(false) {
        call.key(other);
    }
    call.arg(a.holder).arg(a.lease_ms);
    let queue_args = a.join.is_some() || a.amount.is_some() || a.metadata.is_some();
    // The levels held and the flags only when they say something (or hold the place of
    // those after them): a plain lock's new hold that does not queue sends two arguments,
    // and `acquire.lua` reads the missing ARGV[3..4] as 0 (each string sent costs the
    // server about as much as a command the script runs). The other kinds' flags are
    // never 0.
    if queue_args || a.held != 0 || a.flags != 0 {
        call.arg(a.held).arg(a.flags);
    }
    // The queue's arguments only when they say something (or hold the place of those
    // after them): an attempt that does not queue (a lock's first, a `try_lock`) ends
    // here, and the scripts read the missing ARGV[5] as 0.
    if queue_args {
        call.arg(u8::from(a.join.is_some())).arg(ttl).arg(ticket);
    }
    if let Some((amount, initial)) = a.amount {
        call.arg(amount).arg(initial);
    }
    if let Some(text) = a.metadata {
        call.arg(text);
    }
    call
}

/// Frees the lock `keys` whoever holds it (`lua/force_unlock.lua`), as the call `call_id`
/// remembered for `memory`; the freed holders' clients are told on their own channels,
/// named from `own_channel_prefix`.
pub(crate) fn force_unlock(
    keys: &LockKeys,
    call_id: &str,
    memory: Duration,
    own_channel_prefix: &[u8],
) -> ScriptCall {
    // The call-id key last.
    let mut call = command_with(keys.ops.force_unlock, keys, &[&keys.forced()]);
    call.arg(call_id)
        .arg(millis(memory))
        .arg(own_channel_prefix);
    call
}

/// Runs the semaphore operation `op` (`"add"`, `"reduce"` or a read) with `n` on the
/// semaphore `keys`, created with `initial` permits, at most `max` (`sem_permits.lua`).
pub(crate) fn sem_permits(keys: &LockKeys, op: &str, n: u32, initial: u32, max: u32) -> ScriptCall {
    let mut call = command(&scripts::SEM_PERMITS, keys);
    call.arg(op).arg(n).arg(initial).arg(max);
    call
}

/// Sets the count-down latch `key` to `count` expiring after `expire_after`, unless it is
/// counting already (`lua/latch_set.lua`): `setter` records the id `call_id` of the call
/// that set it for `memory`, and `others` are the name's other kinds' keys, which must not
/// be held.
pub(crate) fn latch_set(
    key: &[u8],
    setter: &[u8],
    others: &[Vec<u8>],
    count: u64,
    expire_after: Duration,
    call_id: &str,
    memory: Duration,
) -> ScriptCall {
    let mut call = ScriptCall::new(&scripts::LATCH_SET);
    call.key(key).key(setter);
    for other in others {
        call.key(other.as_slice());
    }
    call.arg(count)
        .arg(millis(expire_after))
        .arg(call_id)
        .arg(millis(memory));
    call
}

/// Counts the latch `key` down by one, publishing `message` on `channel` when it opens
/// (`lua/latch_count_down.lua`).
pub(crate) fn latch_count_down(key: &[u8], channel: &[u8], message: &[u8]) -> ScriptCall {
    let mut call = ScriptCall::new(&scripts::LATCH_COUNT_DOWN);
    call.key(key).arg(channel).arg(message);
    call
}

/// Reads the latch `key`'s count and remaining time (`lua/latch_state.lua`).
pub(crate) fn latch_state(key: &[u8]) -> ScriptCall {
    let mut call = ScriptCall::new(&scripts::LATCH_STATE);
    call.key(key);
    call
}
