//! One typed function per script the runtime sends: each builds the script's KEYS and ARGV
//! in the order the script reads them (see its header in `lua/`), so that no caller writes
//! them by hand.

use std::fmt::Display;
use std::time::Duration;

use crate::runtime::holds::lease::millis;
use crate::runtime::keys::LockKeys;
use crate::runtime::scripting::scripts::{self, Bundled, Ops, ScriptCall};

/// A call of `script` with a primitive's keys (hash, fence counter, queue, waiters; then
/// the holds' leases and the permits where it has them), the layout every script that can
/// hand a primitive on expects, to add arguments to and run with `Scripting::run`, or to
/// send to several servers at once (`fanout`).
pub(crate) fn command(script: &'static Bundled, keys: &LockKeys) -> ScriptCall {
    command_with(script, keys, &[])
}

/// [`command`]'s call with `more` keys after the object's own (a script that names its
/// last key `KEYS[#KEYS]`, as `force_unlock.lua` does).
pub(crate) fn command_with(
    script: &'static Bundled,
    keys: &LockKeys,
    more: &[&[u8]],
) -> ScriptCall {
    let mut call = ScriptCall::new(script);
    call.key(keys.key())
        .key(keys.fence().as_slice())
        .key(keys.queue().as_slice())
        .key(keys.waiters().as_slice());
    for extra in [&keys.leases(), &keys.permits()] {
        if !extra.is_empty() {
            call.key(extra.as_slice());
        }
    }
    for key in more {
        call.key(*key);
    }
    call
}

/// What a script reads each of its arguments as when it is left out (`defaults[i]` for
/// ARGV[i + 1]), as its header in `lua/` says: `None` for one it needs. An absent ARGV
/// reads as nil in Lua, so a default is only written for an argument the script reads
/// with a fallback (or does not read at all then).
type Defaults = &'static [Option<&'static str>];

/// Adds `args` (ARGV[1] on) to `call`, less those at the end that are at their
/// `defaults`: each string sent costs the server about as much as a command the script
/// runs, and a lock's common calls need few of theirs (see tests/script_cost.rs). An
/// argument past the end of `defaults` is needed, and so is every one before a needed one.
fn add_args(call: &mut ScriptCall, args: &[&dyn Display], defaults: Defaults) {
    let mut text: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    while let Some(last) = text.last() {
        match defaults.get(text.len() - 1) {
            Some(Some(default)) if last == default => {
                text.pop();
            }
            _ => break,
        }
    }
    for arg in text {
        call.arg(arg);
    }
}

/// What a lock's release (`release_fast.lua`, whose header says it) reads each argument as
/// when it is left out: ARGV[2], the lease the remaining levels need, as 0, and ARGV[3],
/// the levels held, as 1 (one level: the release frees the lock).
const RELEASE_DEFAULTS: Defaults = &[None, Some("0"), Some("1")];

/// Releases one level of the lock `keys` held by `holder`, which holds `held` levels and
/// whose remaining levels need `need` ms (`release.lua`).
pub(crate) fn release(keys: &LockKeys, holder: &str, need: u64, held: usize) -> ScriptCall {
    let mut cmd = command(keys.ops.release, keys);
    let args: &[&dyn Display] = &[&holder, &need, &held];
    if keys.has_leases() {
        // ARGV[4], which side's hold it is: read by `leased_release.lua` only (a lock has
        // one side), which needs every argument.
        add_args(&mut cmd, &[args, &[&keys.ops.flags]].concat(), &[]);
    } else {
        // A lock's release of its one level needing no lease, its common call, sends the
        // holder id alone.
        add_args(&mut cmd, args, RELEASE_DEFAULTS);
    }
    cmd
}

/// Leaves the queue of the lock `keys` as the thread `holder`, which holds `expected`
/// levels, by the rules of `ops` (the keys' own kind's, `keys.ops`, or the read side's of
/// a read-write lock left from its write side's keys: they share the object): with `keep`,
/// a level beyond them (the lock was handed over meanwhile) is kept and reported,
/// otherwise given back, leaving `need` ms to the levels held (`cancel.lua`).
pub(crate) fn cancel(
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
/// holder id and how long its entry lives in ms; those of one lock next to each other,
/// or it is told more than once), all in one call (`renew.lua`).
pub(crate) fn renew<'a>(
    holds: &[(&LockKeys, &str, u64)],
    entries: impl Iterator<Item = (&'a LockKeys, &'a str, u64)>,
) -> ScriptCall {
    let mut call = ScriptCall::new(&scripts::RENEW);
    call.arg(holds.len());
    for &(keys, holder, lease_ms) in holds {
        let ops = keys.ops;
        call.key(keys.key());
        let permits = keys.permits();
        if !permits.is_empty() {
            // A semaphore's definition outlives the lease renewed here (see `renew.lua`).
            call.key(keys.leases().as_slice())
                .key(permits.as_slice())
                .arg("s");
        } else if ops.field_prefix.is_some() {
            call.key(keys.leases().as_slice()).arg("m");
        } else {
            call.arg("k");
        }
        call.arg(ops.field(holder)).arg(lease_ms);
        if !permits.is_empty() {
            call.arg(keys.expire_after_ms());
        }
    }
    // One group per queue, of its entries next to each other: the script refreshes a
    // queue's entries together.
    let entries: Vec<_> = entries.collect();
    let mut rest = entries.as_slice();
    while let Some(&(keys, ..)) = rest.first() {
        let n = rest
            .iter()
            .take_while(|(other, ..)| other.key() == keys.key())
            .count();
        let (group, after) = rest.split_at(n);
        call.key(keys.queue().as_slice())
            .key(keys.waiters().as_slice())
            .arg(n);
        for &(_, holder, ttl_ms) in group {
            call.arg(holder).arg(ttl_ms);
        }
        rest = after;
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
    /// the number of permits the handle was made with (the semaphore is created with it,
    /// and a semaphore defined otherwise refuses it).
    pub(crate) amount: Option<(u32, u32)>,
    /// The client's metadata text; only sent when set, so that a client without it sends
    /// what it always did.
    pub(crate) metadata: Option<&'a str>,
}

/// What `acquire.lua` (and `acquire_fast.lua` before it; their headers say it) reads each
/// of ARGV[1..7] as when it is left out: the levels held, the flags and ARGV[5] (whether to
/// queue) as 0. ARGV[6..7], the entry's lifetime and ticket, are read only when ARGV[5]
/// is 1: an attempt that does not queue sends 0 for them, and one that queues sends a
/// ticket of at least 1 (`NEXT_TICKET`), so neither is left out then, nor anything before.
const ACQUIRE_DEFAULTS: Defaults = &[
    None,
    None,
    Some("0"),
    Some("0"),
    Some("0"),
    Some("0"),
    Some("0"),
];

/// The same for the read-write lock's and the semaphore's acquire (`rw_acquire.lua`,
/// `sem_acquire.lua`): they need the levels held and the flags (never 0 for them), and
/// read ARGV[5..7] as `acquire.lua` does.
const LEASED_ACQUIRE_DEFAULTS: Defaults =
    &[None, None, None, None, Some("0"), Some("0"), Some("0")];

/// An acquire attempt on the lock `keys` (see `lua/acquire.lua`).
pub(crate) fn acquire(keys: &LockKeys, a: &Acquire<'_>) -> ScriptCall {
    let (ticket, ttl) = a.join.unwrap_or((0, 0));
    debug_assert!(
        a.join.is_none() || ticket != 0,
        "a queued attempt's ticket is 0"
    );
    let mut call = command(keys.ops.acquire, keys);
    // Last: the other kinds' keys of the name, which the script refuses it for.
    for other in keys.other_kinds(false) {
        call.key(other);
    }
    let join = u8::from(a.join.is_some());
    let mut args: Vec<&dyn Display> = vec![
        &a.holder,
        &a.lease_ms,
        &a.held,
        &a.flags,
        &join,
        &ttl,
        &ticket,
    ];
    let expire_after = keys.expire_after_ms();
    if let Some((amount, initial)) = &a.amount {
        args.push(amount);
        args.push(initial);
        args.push(&expire_after);
    }
    if let Some(text) = &a.metadata {
        args.push(text);
    }
    // A plain lock's new hold that does not queue (a lock's first attempt, a `try_lock`)
    // sends the holder id and the lease alone.
    let defaults = if keys.has_leases() {
        LEASED_ACQUIRE_DEFAULTS
    } else {
        ACQUIRE_DEFAULTS
    };
    add_args(&mut call, &args, defaults);
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
/// semaphore `keys`, created with `initial` permits, at most `max`; its definition lives
/// the keys' `expire_after` past this use at least (`sem_permits.lua`).
pub(crate) fn sem_permits(keys: &LockKeys, op: &str, n: u32, initial: u32, max: u32) -> ScriptCall {
    let mut call = command(&scripts::SEM_PERMITS, keys);
    call.arg(op)
        .arg(n)
        .arg(initial)
        .arg(max)
        .arg(keys.expire_after_ms());
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
