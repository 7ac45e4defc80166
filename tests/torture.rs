//! Torture: 4 processes x 4 threads take a few locks thousands of times, with nested
//! critical sections, while a chaos thread SIGKILLs and restarts workers and freezes the
//! server; once on fenced locks, once on fair ones (issue 7: waiters queue, are handed the
//! lock directly, die in the queue or right after a grant), and once on read-write locks
//! (issue 8: in each process two threads read and two write), by one generic worker. An
//! independent witness inside Redis checks every entry into and exit from a critical
//! section: the lock's one holder is the caller's process, nobody entered while the caller
//! was inside, and fencing tokens strictly increase; for read-write locks (`RW_WITNESS`),
//! no writer is ever inside with anyone else, while readers may share.
//!
//! Half of the outer acquisitions can be cancelled (issue 19): a thread of each worker
//! process cancels a random worker thread's token every few milliseconds, so waits are
//! cancelled in the queue, just as the lock is handed to them, and at every other point;
//! a cancelled call must hold nothing and leave nothing behind (the witness and the
//! progress floors would see a hold or a queue entry left over).
//!
//! One outer acquisition in eight is an owned hold (`lock.owned()`, issue 19, half of them
//! cancellable): it is not nested (owned holds are not reentrant), and its critical
//! section runs on a thread spawned for it, which releases it (or drops it): the witness
//! must see the hold as the one holder while it moves between threads.
//!
//! Some sections nest a short fixed lease inside the watchdog hold and outlast it (the
//! lease rule: the inner level must not cut the outer hold), and some lock names are
//! built to collide with another lock's auxiliary keys (`{x}` and `{x}:fence`): every
//! name must keep making progress.

mod support;

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redmutex::{CancellationToken, Client, Error, Kind, Lock, LockGuard, OwnedGuard};
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const ROLE: &str = "REDMUTEX_TORTURE_ROLE";
const URL: &str = "REDMUTEX_TORTURE_URL";
const KIND: &str = "REDMUTEX_TORTURE_KIND";
const PREFIX: &str = "torture:";

const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(WATCHDOG)
    .command(Duration::from_millis(500));
const LOCKS: [&str; 5] = ["alpha", "{x}", "{x}:fence", "x:fence", "beta:released"];
/// One section in this many nests a short fixed lease and outlasts it.
const LONG_EVERY: u64 = 16;
const INNER_LEASE: Duration = Duration::from_millis(30);
const LONG_SECTION: Duration = Duration::from_millis(50);
const WORKERS: usize = 4;
const THREADS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(8);
/// Short, so that a killed holder's lock frees itself quickly.
const WATCHDOG: Duration = Duration::from_millis(1_000);
/// How often, at most, a worker process cancels one of its threads' waits.
const CANCEL_EVERY_MS: u64 = 6;
/// Server freezes stay well below the lease: they must not cost anyone a lock.
/// The name of the witness connections, which the chaos's connection kills spare.
const WITNESS_NAME: &str = "torture-witness";
const FREEZE: Duration = Duration::from_millis(150);
/// Progress of every name, from the lease rather than the machine's speed: a name whose
/// handoffs waited out the lease would make about `RUN_FOR / WATCHDOG` = 8 sections;
/// handed on by wake-ups, each name makes about 500 on a quiet 2-core machine and 130 to
/// 280 on a loaded one.
const MIN_SECTIONS_PER_LOCK: i64 = 5 * (RUN_FOR.as_millis() / WATCHDOG.as_millis()) as i64;
/// Nor may one name fall far behind the others (measured: the slowest within 30 % of the
/// mean, loaded or not): at least this fraction of the mean.
const MIN_SHARE_OF_MEAN: f64 = 0.25;

/// The witness, called at the start and at the end of every critical section. KEYS[1]
/// its hash, KEYS[2] the lock's hash (same slot); ARGV[1] "enter" or "exit", ARGV[2] the
/// caller's client id, ARGV[3] an id of this critical section, ARGV[4] the hold's fencing
/// token (0 for locks without tokens). A violation is a lock whose holders (fields not
/// starting with `~`) are not exactly one thread of the caller's client, an exit finding
/// that someone else entered meanwhile, or (fenced locks) a hold whose recorded token is
/// not the caller's, or an entry whose token is not larger than every one seen before.
/// Returns the violations.
const WITNESS: &str = r"
local w, lock, op = KEYS[1], KEYS[2], ARGV[1]
local client, section, token = ARGV[2], ARGV[3], ARGV[4]
local violations = 0
local holders, mine = 0, 0
for _, field in ipairs(redis.call('hkeys', lock)) do
    if string.sub(field, 1, 1) ~= '~' then
        holders = holders + 1
        if string.sub(field, 1, #client + 1) == client .. ':' then
            mine = mine + 1
        end
    end
end
if holders ~= 1 or mine ~= 1 then
    violations = violations + 1
end
local fenced = token ~= '0'
if fenced and redis.call('hget', lock, '~fence') ~= token then
    violations = violations + 1
end
if op == 'enter' then
    if fenced and tonumber(token) <= tonumber(redis.call('hget', w, 'last') or '0') then
        violations = violations + 1
    end
    if redis.call('hexists', w, 'inside') == 1 then
        -- The previous holder never left: it was killed inside.
        redis.call('hincrby', w, 'takeovers', 1)
    end
    redis.call('hset', w, 'inside', section, 'last', token)
    redis.call('hincrby', w, 'entries', 1)
else
    if redis.call('hget', w, 'inside') ~= section then
        violations = violations + 1
    end
    redis.call('hdel', w, 'inside')
end
if violations > 0 then
    redis.call('hincrby', w, 'violations', violations)
end
return violations
";

/// The witness of read-write locks, called like `WITNESS` with ARGV[4] the side, 'r' or
/// 'w', and KEYS[2] the read-write lock's holds. The sections inside are kept in its hash
/// as `in:<section>` -> `<side> <client id>`. A section whose client no longer has a hold
/// of its side in the lock was killed inside and its lease passed: it is dropped (a
/// takeover). A violation is a writer entering or leaving while another section is
/// inside, a reader while a writer is inside, a caller whose own hold is not in the lock's
/// hash, a writer whose hold is not the only one there, and a section found dropped when
/// it leaves (its hold vanished while it was inside). Counts the most readers inside at
/// once (`max_readers`). Returns the violations.
const RW_WITNESS: &str = r"
local w, lock, op = KEYS[1], KEYS[2], ARGV[1]
local client, section, side = ARGV[2], ARGV[3], ARGV[4]
local me = 'in:' .. section
local violations = 0
local reads, writes, nreads, nwrites = {}, {}, 0, 0
for _, field in ipairs(redis.call('hkeys', lock)) do
    local kind = string.sub(field, 1, 2)
    local holder_client = string.match(string.sub(field, 3), '^(.*):%d+$')
    if kind == 'r:' then
        reads[holder_client], nreads = true, nreads + 1
    elseif kind == 'w:' then
        writes[holder_client], nwrites = true, nwrites + 1
    end
end
if side == 'w' then
    if nwrites ~= 1 or not writes[client] or nreads > 0 then
        violations = violations + 1
    end
elseif nwrites > 0 or not reads[client] then
    violations = violations + 1
end
local readers, writers = 0, 0
local all = redis.call('hgetall', w)
for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 3) == 'in:' and f ~= me then
        local s, c = string.match(all[i + 1], '^(%a) (.*)$')
        if (s == 'r' and reads[c]) or (s == 'w' and writes[c]) then
            if s == 'r' then readers = readers + 1 else writers = writers + 1 end
        else
            redis.call('hdel', w, f)
            redis.call('hincrby', w, 'takeovers', 1)
        end
    end
end
if writers > 0 or (side == 'w' and readers > 0) then
    violations = violations + 1
end
if op == 'enter' then
    redis.call('hset', w, me, side .. ' ' .. client)
    redis.call('hincrby', w, 'entries', 1)
    if side == 'r' and readers + 1 > tonumber(redis.call('hget', w, 'max_readers') or '0') then
        redis.call('hset', w, 'max_readers', readers + 1)
    end
else
    if redis.call('hdel', w, me) == 0 then
        violations = violations + 1
    end
end
if violations > 0 then
    redis.call('hincrby', w, 'violations', violations)
end
return violations
";

/// The witness's own key: no lock key starts like this after the prefix.
fn witness_key(name: &str) -> String {
    format!("{PREFIX}witness:{name}")
}

/// Counts one `what` in `name`'s witness record; an error is ignored, as everywhere in the
/// workers (Redis may be frozen or its scripts flushed).
fn tally(con: &mut redis::Connection, name: &str, what: &str) {
    let _ = redis::cmd("HINCRBY")
        .arg(witness_key(name))
        .arg(what)
        .arg(1)
        .query::<i64>(con);
}

#[test]
fn torture_entry() {
    let Some((role, url)) = support::child::entry(ROLE, URL) else {
        return;
    };
    assert_eq!(role, "worker");
    let client = CLIENTS.at(&url);
    say("started");
    // Each thread's current token; the canceller cancels one and puts a fresh one there.
    let tokens: Arc<Vec<Mutex<CancellationToken>>> = Arc::new(
        (0..THREADS)
            .map(|_| Mutex::new(CancellationToken::new()))
            .collect(),
    );
    {
        let tokens = tokens.clone();
        thread::spawn(move || {
            let mut rng = u64::from(std::process::id()) | 1;
            loop {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                thread::sleep(Duration::from_millis(1 + rng % CANCEL_EVERY_MS));
                let slot = &tokens[(rng >> 8) as usize % THREADS];
                let mut token = slot.lock().unwrap();
                token.cancel();
                *token = CancellationToken::new();
            }
        });
    }
    let threads = match std::env::var(KIND).as_deref() {
        Ok("fair") => {
            let fair = Worker {
                make: Client::fair_lock,
                tag: |_| "0".to_owned(),
                owned_tag: |_| "0".to_owned(),
                witness: WITNESS,
                key: |name| Keys::lock(PREFIX, name).key(),
            };
            fair.spawn(&client, &url, &tokens, 0..THREADS)
        }
        Ok("rw") => {
            let read = Worker::rw_side(|c, name| c.read_write_lock(name).read_lock());
            let write = Worker::rw_side(|c, name| c.read_write_lock(name).write_lock());
            let mut threads = read.spawn(&client, &url, &tokens, 0..THREADS / 2);
            threads.extend(write.spawn(&client, &url, &tokens, THREADS / 2..THREADS));
            threads
        }
        _ => {
            let fenced = Worker {
                make: Client::fenced_lock,
                tag: |g| g.token().to_string(),
                owned_tag: |g| g.token().to_string(),
                witness: WITNESS,
                key: |name| Keys::lock(PREFIX, name).key(),
            };
            fenced.spawn(&client, &url, &tokens, 0..THREADS)
        }
    };
    for t in threads {
        let _ = t.join();
    }
}

/// A side of the read-write locks, as the witness tags its holds (ARGV[4]).
trait Side: Kind {
    const TAG: &'static str;
}

impl Side for redmutex::Read {
    const TAG: &'static str = "r";
}

impl Side for redmutex::Write {
    const TAG: &'static str = "w";
}

impl<K: Side> Worker<K> {
    /// The workers of one side of the read-write locks, `make` taking that side.
    fn rw_side(make: fn(&Client, &'static str) -> Lock<K>) -> Worker<K> {
        Worker {
            make,
            tag: |_| K::TAG.to_owned(),
            owned_tag: |_| K::TAG.to_owned(),
            witness: RW_WITNESS,
            key: |name| Keys::rw(PREFIX, name).key(),
        }
    }
}

/// What worker threads of one kind `K` take and how their sections are witnessed.
struct Worker<K: Kind> {
    /// The lock of a name.
    make: fn(&Client, &'static str) -> Lock<K>,
    /// The witness's ARGV[4] for a hold: its fencing token ("0" for kinds without), or
    /// the side of a read-write lock. The same for every level of one hold.
    tag: fn(&LockGuard<K>) -> String,
    /// The same for an owned hold.
    owned_tag: fn(&OwnedGuard<K>) -> String,
    witness: &'static str,
    /// The key of the lock's holds, which the witness inspects (KEYS[2]).
    key: fn(&str) -> String,
}

impl<K: Kind> Worker<K> {
    /// Threads numbered `ids` (of a worker process) taking the locks nested two deep,
    /// forever, each section checked by the witness; thread `t`'s cancellable waits use
    /// `tokens[t]`.
    fn spawn(
        &self,
        client: &Client,
        url: &str,
        tokens: &Arc<Vec<Mutex<CancellationToken>>>,
        ids: Range<usize>,
    ) -> Vec<JoinHandle<()>> {
        ids.map(|t| {
            let client = client.clone();
            let url = url.to_owned();
            let tokens = tokens.clone();
            let (make, tag, witness, key) = (self.make, self.tag, self.witness, self.key);
            let owned_tag = self.owned_tag;
            thread::spawn(move || {
                let mut con = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .expect("witness connection");
                // Named, so that the chaos's connection kills spare it: they are for the
                // library's connections, whose calls then fail with their outcome unknown.
                redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(WITNESS_NAME)
                    .query::<()>(&mut con)
                    .expect("name the witness connection");
                let witness = redis::Script::new(witness);
                let mut rng = u64::from(std::process::id()) << 8 | t as u64;
                let mut sections = 0u64;
                loop {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let name = LOCKS[(rng % LOCKS.len() as u64) as usize];
                    let lock = make(&client, name);
                    // Redis may be frozen or the scripts flushed: errors are retried,
                    // never fatal. What must never happen is a witnessed overlap.
                    let long = rng.is_multiple_of(LONG_EVERY);
                    // Every other acquisition waits with the token the canceller may fire.
                    let token = (rng & 2 == 0).then(|| tokens[t].lock().unwrap().clone());
                    let cancellable = |token| redmutex::LockOptions::new().cancellable(token);
                    if (rng >> 20) & 7 == 0 {
                        let owned = match &token {
                            Some(token) => lock
                                .owned()
                                .try_lock_with(cancellable(token))
                                .map(Option::unwrap),
                            None => lock.owned().lock(),
                        };
                        if matches!(owned, Err(Error::Cancelled { .. })) {
                            tally(&mut con, name, "cancelled");
                        }
                        let Ok(owned) = owned else { continue };
                        sections += 1;
                        let section = format!("{}:{t}:{sections}", std::process::id());
                        let (client_id, witness) = (client.id().to_owned(), witness.clone());
                        // The section and the release run on another thread, which gets
                        // the witness connection for the while.
                        let moved = thread::spawn(move || {
                            let tag = owned_tag(&owned);
                            let call = |op: &str, con: &mut redis::Connection| {
                                witness
                                    .key(witness_key(name))
                                    .key(key(name))
                                    .arg(op)
                                    .arg(&client_id)
                                    .arg(&section)
                                    .arg(&tag)
                                    .invoke::<i64>(con)
                            };
                            let _ = call("enter", &mut con);
                            thread::yield_now();
                            let _ = call("exit", &mut con);
                            tally(&mut con, name, "owned");
                            if rng & 4 == 0 {
                                let _ = owned.unlock();
                            } else {
                                drop(owned);
                            }
                            con
                        });
                        con = moved.join().expect("the owned section's thread");
                        continue;
                    }
                    let outer = match &token {
                        Some(token) => lock.try_lock_with(cancellable(token)).map(Option::unwrap),
                        None => lock.lock(),
                    };
                    if matches!(outer, Err(Error::Cancelled { .. })) {
                        tally(&mut con, name, "cancelled");
                    }
                    let Ok(outer) = outer else { continue };
                    let inner = if long {
                        lock.try_lock_with(redmutex::LockOptions::new().lease(INNER_LEASE))
                            .map(Option::unwrap)
                    } else {
                        lock.lock()
                    };
                    let Ok(inner) = inner else { continue };
                    assert_eq!(tag(&outer), tag(&inner), "one hold, one token");
                    sections += 1;
                    let section = format!("{}:{t}:{sections}", std::process::id());
                    let call = |op: &str, con: &mut redis::Connection| {
                        witness
                            .key(witness_key(name))
                            .key(key(name))
                            .arg(op)
                            .arg(client.id())
                            .arg(&section)
                            .arg(tag(&outer))
                            .invoke::<i64>(con)
                    };
                    let _ = call("enter", &mut con);
                    if long {
                        // Outlives the inner level's lease: the watchdog hold must last.
                        thread::sleep(LONG_SECTION);
                    } else {
                        thread::yield_now();
                    }
                    let _ = call("exit", &mut con);
                    drop(inner);
                    let _ = outer.unlock();
                }
            })
        })
        .collect()
    }
}

/// The original torture, on fenced locks.
#[test]
fn torture_no_two_holders_ever_overlap() {
    torture("fenced");
}

/// Issue 7: the torture on fair locks (queueing, direct handoff, waiters SIGKILLed in the
/// queue or holding a fresh grant, server freezes): 0 violations, every name progresses.
#[test]
fn torture_fair_locks_no_two_holders_ever_overlap() {
    torture("fair");
}

/// Issue 8: the torture on read-write locks, two reading and two writing threads per
/// process: 0 violations (no writer ever inside with anyone), readers did share, every
/// name progresses.
#[test]
fn torture_read_write_locks_no_writer_ever_overlaps() {
    torture("rw");
}

fn torture(kind: &str) {
    let server = RedisServer::new();
    let url = server.url();
    let spawn = || {
        ChildProc::spawn(
            "torture_entry",
            &[(ROLE, "worker"), (URL, url.as_str()), (KIND, kind)],
        )
    };
    let mut workers: Vec<ChildProc> = (0..WORKERS).map(|_| spawn()).collect();
    for w in &workers {
        w.expect("started");
    }

    let (mut kills, mut freezes, mut cuts) = (0, 0, 0);
    let started = Instant::now();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut chaos = server.connection();
    while started.elapsed() < RUN_FOR {
        thread::sleep(Duration::from_millis(400));
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng % 4 == 1 {
            // Every connection of the workers' clients dropped at once, pub/sub included:
            // calls in flight fail with their outcome unknown (a release or a cancel that
            // may have run), and the clients reconnect.
            support::kill_connections(&mut chaos, Some(WITNESS_NAME));
            cuts += 1;
        }
        if rng.is_multiple_of(3) {
            server.freeze();
            thread::sleep(FREEZE);
            server.thaw();
            freezes += 1;
        } else {
            // SIGKILL mid-flight, holder or not, and start a replacement.
            let i = (rng % WORKERS as u64) as usize;
            workers[i] = spawn();
            workers[i].expect("started");
            kills += 1;
        }
    }
    drop(workers);

    let mut con = server.connection();
    let (mut entries, mut takeovers, mut violations) = (0i64, 0i64, 0i64);
    let mut cancelled = 0i64;
    let mut owned = 0i64;
    let mut per_lock = Vec::new();
    let mut max_readers = 0i64;
    let mut starved = Vec::new();
    for name in LOCKS {
        let figures: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(witness_key(name))
            .arg("entries")
            .arg("takeovers")
            .arg("violations")
            .arg("max_readers")
            .arg("cancelled")
            .arg("owned")
            .query(&mut con)
            .expect("witness figures");
        let [e, t, v, m, c, o] = figures[..] else {
            panic!("HMGET of six fields: {figures:?}");
        };
        cancelled += c.unwrap_or(0);
        owned += o.unwrap_or(0);
        let shared = match m {
            Some(m) => format!(", at most {m} readers inside at once"),
            None => String::new(),
        };
        eprintln!(
            "torture ({kind}): lock {name:?}: {} critical sections{shared}",
            e.unwrap_or(0)
        );
        max_readers = max_readers.max(m.unwrap_or(0));
        per_lock.push((name, e.unwrap_or(0)));
        entries += e.unwrap_or(0);
        takeovers += t.unwrap_or(0);
        violations += v.unwrap_or(0);
    }
    eprintln!(
        "torture ({kind}): {WORKERS} processes x {THREADS} threads, {} locks, {:.1} s: \
         {entries} critical sections (each nested 2 deep), {kills} workers SIGKILLed and \
         restarted, {freezes} server freezes of {FREEZE:?}, {cuts} times every library \
         connection killed, {takeovers} takeovers from \
         another holder, {cancelled} waits cancelled, {owned} owned holds released on \
         another thread, violations {violations}",
        LOCKS.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        violations, 0,
        "{kind}: two holders overlapped, or a token went backwards"
    );
    let mean = entries as f64 / LOCKS.len() as f64;
    for (name, e) in per_lock {
        if e < MIN_SECTIONS_PER_LOCK || (e as f64) < MIN_SHARE_OF_MEAN * mean {
            starved.push((name, e));
        }
    }
    // No floor on the total: it measures the CPU share (2,200 to 3,100 sections per run
    // on a quiet 2-core machine, 600 to 1,300 on a loaded one), not progress, which the
    // floors per name check.
    assert!(
        starved.is_empty(),
        "{kind}: locks that made (almost) no progress (floor {MIN_SECTIONS_PER_LOCK}, or \
         {MIN_SHARE_OF_MEAN} of the mean {mean:.0}): {starved:?}"
    );
    assert!(cancelled > 0, "{kind}: no wait was cancelled");
    assert!(owned > 0, "{kind}: no owned hold moved between threads");
    assert!(
        kills >= 5 && freezes >= 2 && cuts >= 2,
        "{kind}: {kills} kills, {freezes} freezes, {cuts} connection cuts"
    );
    if kind == "rw" {
        assert!(
            max_readers >= 2,
            "rw: readers never shared a lock (at most {max_readers} inside at once)"
        );
    }
}
