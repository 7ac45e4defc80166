//! `Semaphore` (issue 8): never more than N permits in use across processes and threads
//! (witnessed inside Redis, with a holder process SIGKILLed mid-run), a killed holder's
//! permits return when its lease ends, waiters wait without polling and are admitted by
//! `add_permits` and releases directly, first come first served, release and operator
//! semantics, bad input, lost replies, and `try_acquire_for`'s bound.
//!
//! The worker and holder processes are this test binary re-executed (`semaphore_entry`).

mod support;

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, Permit, Semaphore};
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, FaultProxy, Monitor, RedisServer};

const ROLE: &str = "REDMUTEX_SEM_ROLE";
const URL: &str = "REDMUTEX_SEM_URL";
const PREFIX: &str = "sem:";

const CLIENTS: Clients = Clients::new(PREFIX);
/// A watchdog long enough that no renewal round falls inside a test's measurements.
const LONG: Duration = Duration::from_secs(30);

/// The function that runs a semaphore script (see `support::function_name`): what its
/// requests carry.
fn acquire_call(server: &RedisServer) -> String {
    support::function_name(&server.url(), "sem_acquire")
}

fn release_call(server: &RedisServer) -> String {
    support::function_name(&server.url(), "sem_release")
}

/// Loads the scripts, the renewal one included, which admitted waiters run to confirm
/// their permits: the windows measured below then hold no load round.
fn load_renew(server: &RedisServer) {
    support::function_name(&server.url(), "renew");
}

fn queue(server: &RedisServer, name: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(Keys::sem(PREFIX, name).aux("queue"))
        .arg(0)
        .arg(-1)
        .query(&mut server.connection())
        .expect("LRANGE")
}

/// Holder id -> permits it holds (the `~used` sum left out).
fn holds(server: &RedisServer, name: &str) -> HashMap<String, i64> {
    let mut all: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(Keys::sem(PREFIX, name).key())
        .query(&mut server.connection())
        .expect("HGETALL");
    all.remove("~used");
    all
}

/// The `~used` sum as stored (0 when absent).
fn used(server: &RedisServer, name: &str) -> i64 {
    let v: Option<i64> = redis::cmd("HGET")
        .arg(Keys::sem(PREFIX, name).key())
        .arg("~used")
        .query(&mut server.connection())
        .expect("HGET");
    v.unwrap_or(0)
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.connection())
        .expect("PTTL")
}

/// The holder ids of `client_id` in semaphore `name`.
fn holders_of(server: &RedisServer, name: &str, client_id: &str) -> Vec<String> {
    let prefix = format!("{client_id}:");
    holds(server, name)
        .into_keys()
        .filter(|h| h.starts_with(&prefix))
        .collect()
}

/// Ends the lease of `holder`'s permits now, behind its client's back (as a pause longer
/// than the lease would).
fn end_lease(server: &RedisServer, name: &str, holder: &str) {
    let _: i64 = redis::cmd("ZADD")
        .arg(Keys::sem(PREFIX, name).aux("leases"))
        .arg("XX")
        .arg(1)
        .arg(holder)
        .query(&mut server.connection())
        .expect("ZADD");
}

/// How many top-level calls of the script `call` (its function, see `acquire_call`) the
/// monitor saw.
fn script_calls(lines: &[String], call: &str) -> usize {
    Monitor::top_level(lines)
        .iter()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            (l.contains("\"fcall\"") || l.contains("\"evalsha\"")) && l.contains(call)
        })
        .count()
}

/// A thread holding permits of a semaphore: it waits for `n` permits, reports `(id, when)`
/// on `got` once it holds them, and releases them when told to (or when dropped).
struct Holder {
    release: mpsc::Sender<()>,
    thread: thread::JoinHandle<Result<(), Error>>,
}

impl Holder {
    fn start(sem: &Semaphore, n: u32, id: usize, got: &mpsc::Sender<(usize, Instant)>) -> Holder {
        let (release, told) = mpsc::channel::<()>();
        let (sem, got) = (sem.clone(), got.clone());
        let thread = thread::spawn(move || {
            let permit = sem
                .try_acquire_with(redmutex::LockOptions::new().permits(n))
                .map(Option::unwrap)?;
            assert_eq!(permit.permits(), n);
            got.send((id, Instant::now())).expect("report");
            let _ = told.recv();
            permit.release()
        });
        Holder { release, thread }
    }

    fn release(self) {
        let _ = self.release.send(());
        self.thread
            .join()
            .expect("holder thread")
            .expect("acquire and release");
    }
}

/// Starts holders one at a time, each once the previous one's entry is in the queue of
/// `name` (so the queue's order is the start order, across clients); `(sem, client id,
/// permits)` each. Returns them and the queue's entries, in order.
fn queue_up(
    server: &RedisServer,
    name: &str,
    waiters: &[(&Semaphore, &str, u32)],
    got: &mpsc::Sender<(usize, Instant)>,
) -> (Vec<Holder>, Vec<String>) {
    let before = queue(server, name).len();
    let mut started = Vec::new();
    for (i, (sem, client_id, n)) in waiters.iter().enumerate() {
        started.push(Holder::start(sem, *n, i, got));
        assert!(
            wait_until(Duration::from_secs(5), || queue(server, name).len()
                == before + i + 1),
            "waiter {i} never queued"
        );
        let q = queue(server, name);
        assert!(
            q[before + i].starts_with(&format!("{client_id}:")),
            "entry {i} of {q:?} is not waiter {i}'s"
        );
    }
    (started, queue(server, name)[before..].to_vec())
}

// ---------------------------------------------------------------------------------------
// The child processes.

/// The semaphore the workers share, and its permits.
const POOL: &str = "pool";
const POOL_PERMITS: u32 = 4;
const WORKERS: usize = 3;
const THREADS: usize = 4;
/// Short, so that the killed worker's permits come back quickly.
const CHAOS_WATCHDOG: Duration = Duration::from_millis(1_000);
const SECTION: Duration = Duration::from_millis(1);
/// The witness's keys: no semaphore key starts like these after the prefix.
const TALLY: &str = "sem:witness:tally";
const OPEN: &str = "sem:witness:open";
const DEAD: &str = "sem:witness:dead";

/// The witness, called by a holder on entering and leaving its section, and by the test
/// for a killed process. KEYS[1] the tallies (HASH), KEYS[2] the open sections (HASH
/// "<pid>:<section>" -> permits), KEYS[3] the killed processes (SET). ARGV[1] "enter",
/// "exit" or "reap", ARGV[2] the caller's pid, ARGV[3] its section, ARGV[4] the permits
/// it holds, ARGV[5] the semaphore's number of permits. Entering adds the permits to
/// `inuse` and records its maximum, and a violation (and the excess) when it passes the
/// number of permits; leaving takes them off again; reaping ends a killed process's open
/// sections (it can no longer be inside) and ignores anything it sent before it died that
/// Redis reads only now.
const WITNESS: &str = r"
local tally, open, dead = KEYS[1], KEYS[2], KEYS[3]
local op, pid = ARGV[1], ARGV[2]
if redis.call('sismember', dead, pid) == 1 then
    return -1
end
if op == 'reap' then
    redis.call('sadd', dead, pid)
    local prefix, freed = pid .. ':', 0
    for _, s in ipairs(redis.call('hkeys', open)) do
        if string.sub(s, 1, #prefix) == prefix then
            freed = freed + tonumber(redis.call('hget', open, s))
            redis.call('hdel', open, s)
        end
    end
    redis.call('hincrby', tally, 'inuse', -freed)
    return freed
end
local section, n, limit = pid .. ':' .. ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if op == 'enter' then
    redis.call('hset', open, section, n)
    local inuse = redis.call('hincrby', tally, 'inuse', n)
    if inuse > tonumber(redis.call('hget', tally, 'max') or '0') then
        redis.call('hset', tally, 'max', inuse)
    end
    if inuse > limit then
        redis.call('hincrby', tally, 'violations', 1)
        if inuse - limit > tonumber(redis.call('hget', tally, 'excess') or '0') then
            redis.call('hset', tally, 'excess', inuse - limit)
        end
    end
    if inuse == limit then
        redis.call('hincrby', tally, 'full', 1)
    end
    redis.call('hincrby', tally, 'sections', 1)
    redis.call('hincrby', tally, 'sections:' .. pid, 1)
    return inuse
end
if redis.call('hdel', open, section) == 1 then
    redis.call('hincrby', tally, 'inuse', -n)
end
return 0
";

/// The child side; a no-op in a normal run. Roles: "worker" (`THREADS` threads take 1 or
/// 2 permits of `POOL` in a loop, witnessed, until told "stop"; told "report", the next
/// thread to enter says "inside" and stays there), "holder" (takes 2 of 3 permits of
/// `CRASH` and holds them until killed).
#[test]
fn semaphore_entry() {
    let (Ok(role), Ok(url)) = (std::env::var(ROLE), std::env::var(URL)) else {
        return;
    };
    match role.as_str() {
        "worker" => worker(&url),
        "holder" => {
            let c = CLIENTS.scaled(CRASH_WATCHDOG).at(&url);
            let permit = c
                .semaphore(CRASH, 3)
                .try_acquire_with(redmutex::LockOptions::new().permits(2))
                .map(Option::unwrap)
                .expect("acquire 2");
            say(&format!("held {}", c.id()));
            // Until killed (or the parent is gone).
            for _ in std::io::stdin().lock().lines() {}
            drop(permit);
        }
        other => panic!("unknown role {other}"),
    }
}

fn worker(url: &str) {
    let client = CLIENTS.scaled(CHAOS_WATCHDOG).at(url);
    let stop = Arc::new(AtomicBool::new(false));
    let report = Arc::new(AtomicBool::new(false));
    {
        let (stop, report) = (stop.clone(), report.clone());
        thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref() {
                    Ok("report") => report.store(true, Ordering::SeqCst),
                    _ => break,
                }
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    let errors = Arc::new(AtomicU64::new(0));
    let pid = std::process::id();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let sem = client.semaphore(POOL, POOL_PERMITS);
            let (stop, report, errors) = (stop.clone(), report.clone(), errors.clone());
            let url = url.to_owned();
            thread::spawn(move || {
                let mut con = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .expect("witness connection");
                let witness = redis::Script::new(WITNESS);
                let mut rng = u64::from(pid) << 16 | t as u64 | 1;
                let mut sections = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let n = if rng.is_multiple_of(3) { 2 } else { 1 };
                    let permit = match sem
                        .try_acquire_with(redmutex::LockOptions::new().permits(n))
                        .map(Option::unwrap)
                    {
                        Ok(p) => p,
                        Err(e) => {
                            eprintln!("acquire failed: {e}");
                            errors.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                    };
                    sections += 1;
                    let mut call = |op: &str| {
                        witness
                            .key(TALLY)
                            .key(OPEN)
                            .key(DEAD)
                            .arg(op)
                            .arg(pid)
                            .arg(format!("{t}:{sections}"))
                            .arg(n)
                            .arg(POOL_PERMITS)
                            .invoke::<i64>(&mut con)
                            .expect("witness")
                    };
                    call("enter");
                    if report.swap(false, Ordering::SeqCst) {
                        say("inside");
                        // Killed in here.
                        thread::sleep(Duration::from_secs(5));
                    }
                    thread::sleep(SECTION);
                    call("exit");
                    if let Err(e) = permit.release() {
                        eprintln!("release failed: {e}");
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
                sections
            })
        })
        .collect();
    say(&format!("ready {}", client.id()));
    let sections: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    say(&format!(
        "done {sections} {}",
        errors.load(Ordering::SeqCst)
    ));
}

fn spawn(role: &str, server: &RedisServer) -> ChildProc {
    ChildProc::spawn(
        "semaphore_entry",
        &[(ROLE, role), (URL, server.url().as_str())],
    )
}

fn tally(server: &RedisServer) -> HashMap<String, i64> {
    redis::cmd("HGETALL")
        .arg(TALLY)
        .query(&mut server.connection())
        .expect("HGETALL tally")
}

// ---------------------------------------------------------------------------------------
// 1. Never more than N.

/// Issue 8: 3 processes x 4 threads take 1 or 2 of 4 permits in a loop, each section
/// witnessed in Redis; one process is SIGKILLed while inside a section. The witness never
/// sees more than 4 permits in use and does see all 4 in use; the dead process's permits
/// come back within its lease, and the others go on using the semaphore.
#[test]
fn never_more_than_n_permits_in_use_across_processes_with_one_killed() {
    let server = RedisServer::new();
    let mut workers: Vec<ChildProc> = (0..WORKERS).map(|_| spawn("worker", &server)).collect();
    let ids: Vec<String> = workers
        .iter()
        .map(|w| {
            let line = w.next_line();
            line.strip_prefix("ready ")
                .unwrap_or_else(|| panic!("unexpected line {line}"))
                .to_owned()
        })
        .collect();
    let started = Instant::now();
    // Time is the subject here: all three run together for a while first.
    thread::sleep(Duration::from_millis(1_200));

    // The victim is told to stay inside its next section: it holds permits when killed.
    let victim = &mut workers[0];
    victim.send("report");
    victim.expect("inside");
    victim.child.kill().expect("SIGKILL the victim");
    victim.child.wait().expect("reap the victim");
    let killed = Instant::now();
    let pid = victim.child.id();
    let reaped: i64 = redis::Script::new(WITNESS)
        .key(TALLY)
        .key(OPEN)
        .key(DEAD)
        .arg("reap")
        .arg(pid)
        .arg("")
        .arg(0)
        .arg(POOL_PERMITS)
        .invoke(&mut server.connection())
        .expect("reap");
    assert!(reaped >= 1, "the victim was inside a section when killed");
    let dead_holds = |server: &RedisServer| -> i64 {
        let prefix = format!("{}:", ids[0]);
        holds(server, POOL)
            .into_iter()
            .filter(|(h, _)| h.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum()
    };
    let held_at_kill = dead_holds(&server);
    assert!(
        held_at_kill >= reaped,
        "the dead process's permits vanished at once"
    );
    let at_kill = tally(&server);
    let survivors_at_kill: Vec<i64> = workers[1..]
        .iter()
        .map(|w| at_kill[&format!("sections:{}", w.child.id())])
        .collect();

    // Its holds go when their leases end, while the others keep using the semaphore.
    assert!(
        wait_until(CHAOS_WATCHDOG + Duration::from_secs(1), || dead_holds(
            &server
        ) == 0),
        "the killed process's permits never came back"
    );
    let back = killed.elapsed();
    assert!(
        back <= CHAOS_WATCHDOG + Duration::from_millis(300),
        "the killed process's permits came back {back:?} after the kill, lease {CHAOS_WATCHDOG:?}"
    );
    let back_at = tally(&server);
    // Time is the subject again: the survivors run on without it.
    thread::sleep(Duration::from_millis(1_000));
    for w in &mut workers[1..] {
        w.send("stop");
    }
    for w in &workers[1..] {
        let line = w.next_line();
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("done"), "{line}");
        let _sections: u64 = words.next().unwrap().parse().unwrap();
        let errors: u64 = words.next().unwrap().parse().unwrap();
        assert_eq!(errors, 0, "a survivor's acquire or release failed");
    }
    let t = tally(&server);
    let get = |k: &str| t.get(k).copied().unwrap_or(0);
    let max = get("max");
    assert_eq!(
        get("violations"),
        0,
        "more than {POOL_PERMITS} permits in use (by up to {})",
        get("excess")
    );
    assert!(max <= i64::from(POOL_PERMITS), "max in use {max}");
    assert_eq!(max, i64::from(POOL_PERMITS), "the semaphore was never full");
    for (w, before) in workers[1..].iter().zip(&survivors_at_kill) {
        let after = get(&format!("sections:{}", w.child.id()));
        assert!(
            after - before >= 20,
            "a survivor entered {} sections after the kill",
            after - before
        );
    }
    let full_before = back_at.get("full").copied().unwrap_or(0);
    assert!(
        get("full") > full_before,
        "the semaphore was never full again once the dead process's permits came back"
    );
    eprintln!(
        "never-more-than-N: {} sections in {:?}, max in use {max}, full at {} entries \
         ({} after the return), killed holding {held_at_kill} permits, back {back:?} after the kill",
        get("sections"),
        started.elapsed(),
        get("full"),
        get("full") - full_before,
    );
    for w in workers.drain(1..) {
        w.wait_success();
    }
    assert_eq!(get("inuse"), 0, "sections left open");
    let sem = CLIENTS
        .scaled(LONG)
        .at(&server.url())
        .semaphore(POOL, POOL_PERMITS);
    assert_eq!(sem.available_permits().unwrap(), POOL_PERMITS);
    assert!(queue(&server, POOL).is_empty());
    assert!(
        !support::exists(&mut server.connection(), Keys::sem(PREFIX, POOL).key()),
        "holds left behind"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A killed holder's permits.

const CRASH: &str = "crash";
const CRASH_WATCHDOG: Duration = Duration::from_millis(1_000);

/// The lease `holder` still has on semaphore `name`, by the server's clock.
fn lease_left(server: &RedisServer, name: &str, holder: &str) -> Duration {
    let (ends, (secs, micros)): (Option<u64>, (u64, u64)) = redis::pipe()
        .cmd("ZSCORE")
        .arg(Keys::sem(PREFIX, name).aux("leases"))
        .arg(holder)
        .cmd("TIME")
        .query(&mut server.connection())
        .expect("ZSCORE + TIME");
    let now = secs * 1000 + micros / 1000;
    Duration::from_millis(ends.expect("the holder has a lease").saturating_sub(now))
}

/// Issue 8: a process holding 2 of 3 permits (lease 1 s) is SIGKILLed; a waiter asking for
/// 2 gets them when the dead holder's lease ends: not before, and at most 250 ms after.
/// The third permit stays held throughout, so the semaphore's keys live on: the dead
/// hold's own lease is what ends, not the keys' expiry.
#[test]
fn permits_of_a_killed_holder_return_when_its_lease_ends() {
    let server = RedisServer::new();
    let c = CLIENTS.scaled(LONG).at(&server.url());
    let sem = c.semaphore(CRASH, 3);
    let mut child = spawn("holder", &server);
    let line = child.next_line();
    let dead_id = line.strip_prefix("held ").expect("held").to_owned();
    let bystander = CLIENTS
        .scaled(LONG)
        .at(&server.url())
        .semaphore(CRASH, 3)
        .acquire()
        .unwrap();
    assert_eq!(sem.available_permits().unwrap(), 0);
    let dead = holders_of(&server, CRASH, &dead_id);
    assert_eq!(dead.len(), 1, "one acquisition, one holder: {dead:?}");

    let (tx, rx) = mpsc::channel();
    let waiting = sem.clone();
    let waiter = thread::spawn(move || {
        let permit = waiting
            .try_acquire_with(redmutex::LockOptions::new().permits(2))
            .map(Option::unwrap);
        tx.send(Instant::now()).unwrap();
        permit
    });
    assert!(
        wait_until(Duration::from_secs(5), || queue(&server, CRASH).len() == 1),
        "the waiter never queued"
    );
    child.child.kill().expect("SIGKILL the holder");
    child.child.wait().expect("reap the holder");
    let killed = Instant::now();
    // A renewal the holder sent just before it died may land a moment late: the later
    // of two readings is the lease it really has.
    let first = (Instant::now(), lease_left(&server, CRASH, &dead[0]));
    thread::sleep(Duration::from_millis(20));
    let second = (Instant::now(), lease_left(&server, CRASH, &dead[0]));
    let lease_end = (first.0 + first.1).max(second.0 + second.1);
    let left_at_kill = lease_end - killed;
    assert!(
        left_at_kill <= CRASH_WATCHDOG
            && left_at_kill >= CRASH_WATCHDOG * 2 / 3 - Duration::from_millis(50),
        "a watchdog lease of {CRASH_WATCHDOG:?}, renewed every third, had {left_at_kill:?} left"
    );
    assert_eq!(
        sem.available_permits().unwrap(),
        0,
        "the dead holder's permits are its own until its lease ends"
    );

    let got = rx
        .recv_timeout(Duration::from_secs(3))
        .expect("the waiter never got the dead holder's permits");
    let after_kill = got - killed;
    assert!(
        got + Duration::from_millis(5) >= lease_end,
        "the waiter got the permits {:?} before the dead holder's lease ended",
        lease_end - got
    );
    assert!(
        got <= lease_end + Duration::from_millis(250),
        "the waiter got the permits {:?} after the dead holder's lease ended",
        got - lease_end
    );
    assert!(
        after_kill >= CRASH_WATCHDOG * 2 / 3 - Duration::from_millis(50)
            && after_kill <= CRASH_WATCHDOG + Duration::from_millis(250),
        "{after_kill:?} from the kill to the waiter's grant, lease {CRASH_WATCHDOG:?}"
    );
    eprintln!(
        "killed holder: lease left at kill {left_at_kill:?}, waiter admitted {after_kill:?} \
         after the kill ({:?} after the lease ended)",
        got.saturating_duration_since(lease_end)
    );
    let permit = waiter.join().unwrap().expect("the waiter's acquire");
    assert_eq!(permit.permits(), 2);
    assert!(holders_of(&server, CRASH, &dead_id).is_empty());
    assert_eq!(sem.available_permits().unwrap(), 0);
    assert_eq!(used(&server, CRASH), 3);
    bystander.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1);
    permit.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 3);
}

// ---------------------------------------------------------------------------------------
// 3. add_permits wakes waiters, who do not poll.

/// Issue 8: three waiters (one permit each) on an exhausted semaphore send nothing while
/// they wait; `add_permits(2)` from another client admits exactly two of them within
/// 100 ms with that one script call (no acquire script per waiter); the third stays.
#[test]
fn add_permits_admits_exactly_the_waiters_it_covers_without_polling() {
    const NAME: &str = "gate";
    let server = RedisServer::new();
    let (holder, waiters, operator) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let first = holder.semaphore(NAME, 1).acquire().unwrap();
    let sem = waiters.semaphore(NAME, 1);
    let (got_tx, got) = mpsc::channel();
    let list: Vec<(&Semaphore, &str, u32)> = (0..3).map(|_| (&sem, waiters.id(), 1)).collect();
    let (mut queued, _) = queue_up(&server, NAME, &list, &got_tx);
    let ops = operator.semaphore(NAME, 1);
    // Loads the operators' script, so the window below holds the add and nothing else.
    assert_eq!(ops.permits().unwrap(), 1);
    load_renew(&server);
    let channel = format!("{}:to:", Keys::sem(PREFIX, NAME).key());
    assert_eq!(support::subscribers(&mut server.connection(), &channel), 1);

    // Settled: every waiter is queued and its client subscribed.
    thread::sleep(Duration::from_millis(200));
    let before = server.command_calls();
    thread::sleep(Duration::from_millis(1_000));
    let after = server.command_calls();
    // Commands as Redis counts them: those scripts run are included.
    let sent: HashMap<&String, u64> = after
        .iter()
        .filter(|(cmd, _)| cmd.as_str() != "info")
        .map(|(cmd, n)| (cmd, n - before.get(cmd).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let idle: u64 = sent.values().sum();
    assert_eq!(idle, 0, "commands while three waiters waited 1 s: {sent:?}");

    let monitor = server.monitor();
    let added = Instant::now();
    assert_eq!(ops.add_permits(2).unwrap(), 3);
    let mut admitted = Vec::new();
    for _ in 0..2 {
        let (id, at) = got
            .recv_timeout(Duration::from_secs(2))
            .expect("add_permits(2) left a waiter it covers waiting");
        admitted.push((id, at - added));
    }
    let lines = monitor.stop();
    for (id, latency) in &admitted {
        assert!(
            *latency <= Duration::from_millis(100),
            "waiter {id} got its permit {latency:?} after add_permits"
        );
    }
    let mut ids: Vec<usize> = admitted.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1], "the first two in the queue are admitted");
    assert_eq!(
        script_calls(&lines, &acquire_call(&server)),
        0,
        "a waiter ran the acquire script"
    );
    assert_eq!(
        script_calls(
            &lines,
            &support::function_name(&server.url(), "sem_permits")
        ),
        1
    );
    let renew = support::function_name(&server.url(), "renew");
    let others: Vec<&String> = Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| {
            !l.contains(&support::function_name(&server.url(), "sem_permits"))
                && !l.contains(&renew)
        })
        .collect();
    assert!(others.is_empty(), "commands besides the add: {others:?}");

    // The third stays: nothing is free.
    assert!(
        got.recv_timeout(Duration::from_millis(200)).is_err(),
        "a waiter got a permit nobody had"
    );
    assert_eq!(queue(&server, NAME).len(), 1);
    assert_eq!(ops.available_permits().unwrap(), 0);
    assert_eq!(used(&server, NAME), 3);
    // Handed over, the permits' leases are the pickup window (1 s) until the waiters'
    // client confirms them with its own lease: past that window they are still held.
    let handed = holders_of(&server, NAME, waiters.id());
    assert_eq!(handed.len(), 2);
    thread::sleep(Duration::from_millis(1_300));
    for h in &handed {
        let left = lease_left(&server, NAME, h);
        assert!(
            left > LONG - Duration::from_secs(2),
            "a handed-over permit's lease was not extended to the watchdog's: {left:?}"
        );
    }
    eprintln!(
        "add_permits: {idle} commands in 1 s of waiting; admitted after {:?}; {} top-level \
         commands in the window",
        admitted.iter().map(|(_, l)| *l).collect::<Vec<_>>(),
        Monitor::top_level(&lines).len()
    );
    first.release().unwrap();
    let (id, _) = got.recv_timeout(Duration::from_secs(2)).expect("third");
    assert_eq!(id, 2);
    for h in queued.drain(..) {
        h.release();
    }
    assert_eq!(ops.available_permits().unwrap(), 3);
}

// ---------------------------------------------------------------------------------------
// 4. First come, first served.

/// Issue 8: five waiters (two clients, alternating) queue in a known order behind three
/// holders; each permit released, one at a time, goes to the next one in the queue.
#[test]
fn waiters_get_permits_in_queue_order() {
    const NAME: &str = "line";
    let server = RedisServer::new();
    let (a, b) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let (sa, sb) = (a.semaphore(NAME, 3), b.semaphore(NAME, 3));
    let mut holders: Vec<Permit> = (0..3).map(|_| sa.acquire().unwrap()).collect();
    let (got_tx, got) = mpsc::channel();
    let list: Vec<(&Semaphore, &str, u32)> = (0..5)
        .map(|i| {
            if i % 2 == 0 {
                (&sa, a.id(), 1)
            } else {
                (&sb, b.id(), 1)
            }
        })
        .collect();
    let (waiters, entries) = queue_up(&server, NAME, &list, &got_tx);
    let mut waiters: Vec<Option<Holder>> = waiters.into_iter().map(Some).collect();
    let mut order = Vec::new();
    for step in 0..5 {
        // One permit freed: by one of the first holders, then by the waiters admitted first.
        if step < 3 {
            holders.pop().unwrap().release().unwrap();
        } else {
            waiters[step - 3].take().unwrap().release();
        }
        // The release handed it on before it returned: the queue shows who has it.
        assert_eq!(
            queue(&server, NAME),
            entries[step + 1..],
            "after release {step}"
        );
        let (id, _) = got
            .recv_timeout(Duration::from_secs(2))
            .expect("a freed permit reached no waiter");
        order.push(id);
        assert_eq!(sa.available_permits().unwrap(), 0);
    }
    assert_eq!(
        order,
        [0, 1, 2, 3, 4],
        "the order permits were handed out in"
    );
    for w in waiters.into_iter().flatten() {
        w.release();
    }
    assert_eq!(sa.available_permits().unwrap(), 3);
}

/// Issue 8: a head waiter asking for 3 is not passed by a later one asking for 1, nor by a
/// newcomer's try_acquire, while 1 permit is free; when enough are free it goes first.
#[test]
fn a_large_request_at_the_head_is_not_passed_by_smaller_ones() {
    const NAME: &str = "strict";
    let server = RedisServer::new();
    let (a, b) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let (sa, sb) = (a.semaphore(NAME, 3), b.semaphore(NAME, 3));
    let two = sa
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    let one = sa.acquire().unwrap();
    let (got_tx, got) = mpsc::channel();
    let (mut waiters, entries) = queue_up(
        &server,
        NAME,
        &[(&sa, a.id(), 3), (&sb, b.id(), 1)],
        &got_tx,
    );

    one.release().unwrap();
    assert_eq!(sa.available_permits().unwrap(), 1);
    assert_eq!(queue(&server, NAME), entries, "both still wait, in order");
    assert_eq!(used(&server, NAME), 2);
    assert!(
        sb.try_acquire().unwrap().is_none(),
        "a newcomer took the free permit past the queue"
    );
    assert!(
        got.recv_timeout(Duration::from_millis(200)).is_err(),
        "the waiter asking for 1 passed the one asking for 3"
    );

    two.release().unwrap();
    let (id, _) = got.recv_timeout(Duration::from_secs(2)).expect("head");
    assert_eq!(id, 0, "the head waiter (3 permits) first");
    assert_eq!(queue(&server, NAME), entries[1..]);
    assert_eq!(sa.available_permits().unwrap(), 0);
    waiters.remove(0).release();
    let (id, _) = got.recv_timeout(Duration::from_secs(2)).expect("second");
    assert_eq!(id, 1);
    waiters.remove(0).release();
    assert_eq!(sa.available_permits().unwrap(), 3);
}

/// Issue 8: one release covering several head waiters admits them all at once (no acquire
/// script runs: each confirms its permits with one renewal call, and is admitted within
/// 100 ms), and stops at the first it cannot cover, whom the waiter behind it does not pass.
#[test]
fn a_release_admits_every_head_waiter_it_covers_at_once() {
    const NAME: &str = "batch";
    let server = RedisServer::new();
    let (a, b) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let (sa, sb) = (a.semaphore(NAME, 4), b.semaphore(NAME, 4));
    // Loads the release script, so the window below holds the release and nothing else.
    sa.acquire().unwrap().release().unwrap();
    load_renew(&server);
    let all = sa
        .try_acquire_with(redmutex::LockOptions::new().permits(4))
        .map(Option::unwrap)
        .unwrap();
    let (got_tx, got) = mpsc::channel();
    let wants: [(&Semaphore, &str, u32); 5] = [
        (&sa, a.id(), 1),
        (&sb, b.id(), 1),
        (&sa, a.id(), 1),
        (&sb, b.id(), 2),
        (&sa, a.id(), 1),
    ];
    let (mut waiters, entries) = queue_up(&server, NAME, &wants, &got_tx);

    let monitor = server.monitor();
    let released = Instant::now();
    all.release().unwrap();
    let mut admitted = Vec::new();
    for _ in 0..3 {
        let (id, at) = got
            .recv_timeout(Duration::from_secs(2))
            .expect("a covered waiter was left waiting");
        admitted.push((id, at - released));
    }
    let lines = monitor.stop();
    let mut ids: Vec<usize> = admitted.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2]);
    for (id, latency) in &admitted {
        assert!(
            *latency <= Duration::from_millis(100),
            "waiter {id} admitted {latency:?} after the release"
        );
    }
    assert_eq!(
        script_calls(&lines, &acquire_call(&server)),
        0,
        "a waiter ran the acquire script"
    );
    let renew = support::function_name(&server.url(), "renew");
    let top: Vec<&String> = Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| !l.contains(&renew))
        .collect();
    assert_eq!(script_calls(&lines, &release_call(&server)), 1);
    assert_eq!(top.len(), 1, "commands besides the release: {top:?}");
    assert_eq!(
        queue(&server, NAME),
        entries[3..],
        "the one asking for 2 heads the queue"
    );
    assert_eq!(sa.available_permits().unwrap(), 1);
    assert!(
        got.recv_timeout(Duration::from_millis(200)).is_err(),
        "the last waiter (1) passed the head (2)"
    );
    eprintln!(
        "one release admitted 3 waiters after {:?}",
        admitted.iter().map(|(_, l)| *l).collect::<Vec<_>>()
    );

    // One more permit back: the head (2) fits now, the last (1) then does not.
    waiters.remove(0).release();
    let (id, _) = got.recv_timeout(Duration::from_secs(2)).expect("the 2");
    assert_eq!(id, 3);
    assert_eq!(queue(&server, NAME), entries[4..]);
    waiters.remove(0).release();
    let (id, _) = got.recv_timeout(Duration::from_secs(2)).expect("the last");
    assert_eq!(id, 4);
    for w in waiters {
        w.release();
    }
    assert_eq!(sa.available_permits().unwrap(), 4);
}

// ---------------------------------------------------------------------------------------
// 5. Release.

/// Issue 8: release gives the permits back, so does dropping, also on a thread other
/// than the one that acquired (a `Permit` is `Send`); nothing is left in Redis after.
#[test]
fn release_and_drop_give_permits_back_on_any_thread() {
    const NAME: &str = "rel";
    fn is_send<T: Send>() {}
    is_send::<Permit>();
    let server = RedisServer::new();
    let c = CLIENTS.scaled(LONG).at(&server.url());
    let sem = c.semaphore(NAME, 3);

    let p = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    assert_eq!(p.permits(), 2);
    assert!(!p.is_lease_lost());
    assert_eq!(sem.available_permits().unwrap(), 1);
    let h = holds(&server, NAME);
    assert_eq!(h.values().copied().collect::<Vec<_>>(), [2], "{h:?}");
    assert_eq!(used(&server, NAME), 2);
    p.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 3);
    assert!(
        !support::exists(&mut server.connection(), Keys::sem(PREFIX, NAME).key()),
        "holds left after the last release"
    );
    assert!(!support::exists(
        &mut server.connection(),
        Keys::sem(PREFIX, NAME).aux("leases")
    ));

    {
        let _p = sem.acquire().unwrap();
        assert_eq!(sem.available_permits().unwrap(), 2);
    }
    assert_eq!(
        sem.available_permits().unwrap(),
        3,
        "a dropped permit gives back"
    );

    // Taken here, released on another thread.
    let p = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(3))
        .map(Option::unwrap)
        .unwrap();
    assert!(sem.try_acquire().unwrap().is_none());
    thread::spawn(move || p.release())
        .join()
        .unwrap()
        .expect("release on another thread");
    assert_eq!(sem.available_permits().unwrap(), 3);
    // Taken on another thread, dropped here.
    let other = sem.clone();
    let p = thread::spawn(move || {
        other
            .try_acquire_with(redmutex::LockOptions::new().permits(2))
            .map(Option::unwrap)
            .unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1);
    drop(p);
    assert_eq!(sem.available_permits().unwrap(), 3);
    assert!(holds(&server, NAME).is_empty());
    assert_eq!(used(&server, NAME), 0);
}

/// Issue 8: permits whose lease ended behind their holder's back: the watchdog reports it
/// (`is_lease_lost`) within one of its periods and release says `LeaseLost`; so does the
/// release of a holder whose watchdog has not looked yet, which finds them gone (issue 26).
/// Either way the permits come back once, and
/// others' permits are untouched.
#[test]
fn a_release_after_the_lease_ended_is_refused() {
    const NAME: &str = "lost";
    const WATCHDOG: Duration = Duration::from_millis(600);
    let server = RedisServer::new();
    let (watched, slow) = (
        CLIENTS.scaled(WATCHDOG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let (sw, ss) = (watched.semaphore(NAME, 4), slow.semaphore(NAME, 4));
    let lost = sw
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    let lost_id = holders_of(&server, NAME, watched.id());
    let kept = ss.acquire().unwrap();
    let kept_id = holders_of(&server, NAME, slow.id());
    let unnoticed = ss.acquire().unwrap();
    let unnoticed_id: Vec<String> = holders_of(&server, NAME, slow.id())
        .into_iter()
        .filter(|h| !kept_id.contains(h))
        .collect();
    assert_eq!(
        (lost_id.len(), kept_id.len(), unnoticed_id.len()),
        (1, 1, 1)
    );
    assert_eq!(sw.available_permits().unwrap(), 0);

    end_lease(&server, NAME, &lost_id[0]);
    end_lease(&server, NAME, &unnoticed_id[0]);
    let t = Instant::now();
    assert!(
        wait_until(WATCHDOG, || lost.is_lease_lost()),
        "the watchdog ({WATCHDOG:?}) never reported the lost lease"
    );
    let noticed = t.elapsed();
    // Back to the others at once: 4 - the one still held.
    assert_eq!(sw.available_permits().unwrap(), 3);
    assert!(matches!(lost.release(), Err(Error::LeaseLost { .. })));
    assert!(!unnoticed.is_lease_lost(), "its watchdog has not looked");
    assert!(matches!(unnoticed.release(), Err(Error::LeaseLost { .. })));
    assert_eq!(used(&server, NAME), 1, "freed once each, not twice");
    assert_eq!(
        holds(&server, NAME).into_keys().collect::<Vec<_>>(),
        kept_id
    );
    assert_eq!(sw.available_permits().unwrap(), 3);
    kept.release().unwrap();
    assert_eq!(sw.available_permits().unwrap(), 4);
    eprintln!("lease ended behind the holder's back: reported lost after {noticed:?}");
}

// ---------------------------------------------------------------------------------------
// 6. Operators.

/// Issue 8: the first use stores the handle's number of permits (issue 38: for a day past
/// its last use, not forever), and later handles with other numbers see it (issue 38:
/// but may not acquire through it); holds expire with their leases; add, reduce
/// and set change the number; reducing below what is held keeps the holders' permits and
/// admits nobody until enough are released; raising the number admits waiters.
#[test]
fn operators_change_the_stored_number_of_permits() {
    const NAME: &str = "ops";
    const WATCHDOG: Duration = Duration::from_secs(5);
    let server = RedisServer::new();
    let c = CLIENTS.scaled(WATCHDOG).at(&server.url());
    let sem = c.semaphore(NAME, 3);
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::sem(PREFIX, NAME).aux("permits")
        ),
        "made without touching Redis"
    );
    assert_eq!(sem.permits().unwrap(), 3);
    // Issue 38: the definition expires a day (`DEFAULT_EXPIRE_AFTER`) past its last use.
    let day = Semaphore::DEFAULT_EXPIRE_AFTER.as_millis() as i64;
    let left = pttl(&server, &Keys::sem(PREFIX, NAME).aux("permits"));
    assert!(
        left > day - 60_000 && left <= day,
        "the number expires a day past its last use: {left} ms"
    );
    let other = CLIENTS.scaled(LONG).at(&server.url()).semaphore(NAME, 10);
    assert_eq!(
        other.permits().unwrap(),
        3,
        "the stored number counts, not the handle's"
    );
    assert_eq!(other.available_permits().unwrap(), 3);
    // Issue 38: never silently: acquiring through a handle made with another number is
    // refused (tests/semaphore_definition.rs).
    assert!(matches!(
        other.try_acquire(),
        Err(Error::InvalidArgument { .. })
    ));
    let fresh = CLIENTS
        .scaled(LONG)
        .at(&server.url())
        .semaphore("ops-other", 10);
    let p = fresh.acquire().unwrap();
    assert_eq!(
        fresh.available_permits().unwrap(),
        9,
        "acquiring first creates it too"
    );
    drop(p);

    let p1 = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    for k in [
        Keys::sem(PREFIX, NAME).key(),
        Keys::sem(PREFIX, NAME).aux("leases"),
    ] {
        let ttl = pttl(&server, &k);
        assert!(
            ttl > 0 && ttl <= WATCHDOG.as_millis() as i64,
            "{k} expires with the lease ({WATCHDOG:?}): {ttl}"
        );
    }
    // The definition outlives the lease by a day.
    let left = pttl(&server, &Keys::sem(PREFIX, NAME).aux("permits"));
    assert!(
        left > day && left <= day + WATCHDOG.as_millis() as i64,
        "{left}"
    );
    assert_eq!(sem.add_permits(2).unwrap(), 5);
    assert_eq!(sem.available_permits().unwrap(), 3);
    let p2 = sem.acquire().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 2);

    // Below what is held: 3 held of 2.
    assert_eq!(sem.reduce_permits(3).unwrap(), 2);
    assert_eq!(sem.permits().unwrap(), 2);
    assert_eq!(sem.available_permits().unwrap(), 0);
    assert_eq!(used(&server, NAME), 3, "the holders keep their permits");
    assert!(!p1.is_lease_lost() && !p2.is_lease_lost());
    assert!(sem.try_acquire().unwrap().is_none());
    p2.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 0, "2 held of 2");
    assert!(sem.try_acquire().unwrap().is_none());
    p1.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 2);

    // Raising the number admits waiters, as many as it covers.
    let all = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    let (got_tx, got) = mpsc::channel();
    let (mut waiters, _) = queue_up(&server, NAME, &[(&sem, c.id(), 2)], &got_tx);
    sem.set_permits(3).unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1);
    assert_eq!(queue(&server, NAME).len(), 1, "1 free does not cover 2");
    let raised = Instant::now();
    sem.set_permits(4).unwrap();
    let (_, at) = got
        .recv_timeout(Duration::from_secs(2))
        .expect("set_permits(4) left the waiter waiting");
    assert!(
        at - raised <= Duration::from_millis(100),
        "admitted {:?} after set_permits",
        at - raised
    );
    assert_eq!(sem.available_permits().unwrap(), 0);
    sem.set_permits(1).unwrap();
    assert_eq!(sem.permits().unwrap(), 1);
    assert_eq!(sem.available_permits().unwrap(), 0);
    waiters.remove(0).release();
    all.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1);

    // Nothing held: the holds are gone, the number stays (a day, at least).
    assert!(!support::exists(
        &mut server.connection(),
        Keys::sem(PREFIX, NAME).key()
    ));
    assert!(!support::exists(
        &mut server.connection(),
        Keys::sem(PREFIX, NAME).aux("leases")
    ));
    let stored: String = support::query_key(
        &mut server.connection(),
        "GET",
        Keys::sem(PREFIX, NAME).aux("permits"),
    );
    // One permit now; the semaphore was made with 3 (see semaphore.lua).
    assert_eq!(stored, "1 3");
    assert!(pttl(&server, &Keys::sem(PREFIX, NAME).aux("permits")) > day - 60_000);
}

// ---------------------------------------------------------------------------------------
// 7. Bad input.

/// Every operation of `sem`, each with its outcome (the permit, if any, given back).
fn every_op(sem: &Semaphore) -> Vec<(&'static str, Result<(), Error>)> {
    let soon = Instant::now() + Duration::from_millis(50);
    let ms50 = Duration::from_millis(50);
    vec![
        ("acquire", sem.acquire().map(drop)),
        (
            "try_acquire_with(permits 1)",
            sem.try_acquire_with(redmutex::LockOptions::new().permits(1))
                .map(Option::unwrap)
                .map(drop),
        ),
        ("try_acquire", sem.try_acquire().map(drop)),
        (
            "try_acquire_with(permits 1, no wait)",
            sem.try_acquire_with(
                redmutex::LockOptions::new()
                    .permits(1)
                    .wait_for(std::time::Duration::ZERO),
            )
            .map(drop),
        ),
        ("try_acquire_for", sem.try_acquire_for(ms50).map(drop)),
        ("try_acquire_until", sem.try_acquire_until(soon).map(drop)),
        (
            "try_acquire_with(permits, wait_for)",
            sem.try_acquire_with(redmutex::LockOptions::new().permits(1).wait_for(ms50))
                .map(drop),
        ),
        (
            "try_acquire_with(permits, wait_until)",
            sem.try_acquire_with(redmutex::LockOptions::new().permits(1).wait_until(soon))
                .map(drop),
        ),
        ("available_permits", sem.available_permits().map(drop)),
        ("permits", sem.permits().map(drop)),
        ("add_permits", sem.add_permits(1).map(drop)),
        ("reduce_permits", sem.reduce_permits(1).map(drop)),
        ("set_permits", sem.set_permits(2)),
    ]
}

fn dbsize(server: &RedisServer) -> i64 {
    redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .expect("DBSIZE")
}

/// Issue 8: a semaphore of zero permits, zero permits asked for, adding past
/// `MAX_PERMITS`, reducing by more than there are, an empty name: typed errors, and
/// nothing written or changed.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.scaled(LONG).at(&server.url());
    for (op, r) in every_op(&c.semaphore("zero", 0)) {
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{op}: {r:?}"
        );
    }
    for (op, r) in every_op(&c.semaphore("", 3)) {
        assert!(matches!(r, Err(Error::InvalidName(_))), "{op}: {r:?}");
    }
    let sem = c.semaphore("bad", 3);
    for (what, r) in [
        (
            "try_acquire_with(permits 0)",
            sem.try_acquire_with(redmutex::LockOptions::new().permits(0))
                .map(Option::unwrap)
                .map(drop),
        ),
        (
            "try_acquire_with(permits 0, no wait)",
            sem.try_acquire_with(
                redmutex::LockOptions::new()
                    .permits(0)
                    .wait_for(std::time::Duration::ZERO),
            )
            .map(drop),
        ),
        (
            "try_acquire_with(permits 0, wait_for)",
            sem.try_acquire_with(
                redmutex::LockOptions::new()
                    .permits(0)
                    .wait_for(Duration::from_millis(50)),
            )
            .map(drop),
        ),
        (
            "try_acquire_with(permits 0, wait_until)",
            sem.try_acquire_with(
                redmutex::LockOptions::new()
                    .permits(0)
                    .wait_until(Instant::now()),
            )
            .map(drop),
        ),
    ] {
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what}: {r:?}"
        );
    }
    assert_eq!(dbsize(&server), 0, "a refused call wrote something");

    let held = sem.acquire().unwrap();
    assert!(matches!(
        sem.add_permits(u32::MAX),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(sem.permits().unwrap(), 3);
    assert_eq!(
        sem.add_permits(redmutex::MAX_PERMITS - 3).unwrap(),
        u32::MAX
    );
    assert!(matches!(
        sem.add_permits(1),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(sem.permits().unwrap(), redmutex::MAX_PERMITS);
    assert_eq!(sem.available_permits().unwrap(), u32::MAX - 1);
    assert_eq!(sem.reduce_permits(u32::MAX - 3).unwrap(), 3);
    assert!(matches!(
        sem.reduce_permits(4),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(sem.permits().unwrap(), 3);
    assert_eq!(sem.available_permits().unwrap(), 2);
    assert_eq!(used(&server, "bad"), 1);
    held.release().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(
        keys,
        [Keys::sem(PREFIX, "bad").aux("permits")],
        "only the semaphore that was used"
    );
}

/// A client of `url` that gives up on Redis within 200 ms.
fn impatient(url: &str) -> Client {
    Client::builder()
        .url(url)
        .key_prefix(PREFIX)
        .connect_timeout(Duration::from_millis(200))
        .command_timeout(Duration::from_millis(200))
        .watchdog_timeout(Duration::from_secs(1))
        .build()
        .expect("building a client does not connect")
}

/// Issue 8: a Redis that is not there, or dies while permits are held: every operation
/// fails with `Pool` or `Redis` (no panic), within its timeouts.
#[test]
fn a_redis_that_is_down_gives_errors() {
    // Port 1: nobody listens there, and no parallel test's server can (it is privileged).
    let nowhere = impatient("redis://127.0.0.1:1/");
    let t = Instant::now();
    for (op, r) in every_op(&nowhere.semaphore("down", 3)) {
        assert!(
            matches!(r, Err(Error::Pool { .. } | Error::Redis { .. })),
            "{op}: {r:?}"
        );
    }
    let nothing_there = t.elapsed();
    assert!(
        nothing_there < Duration::from_secs(8),
        "13 failed calls took {nothing_there:?}"
    );

    let mut server = RedisServer::new();
    let c = impatient(&server.url());
    let sem = c.semaphore("dies", 3);
    let p = sem.acquire().unwrap();
    let dropped = sem.acquire().unwrap();
    server.kill();
    // The dead server's port is taken over at once (before a parallel test's server could
    // get it) by a listener that hangs up on every connection: Redis is gone for good. It
    // keeps the port until the test binary exits.
    let listener = std::net::TcpListener::bind(("127.0.0.1", server.port()))
        .expect("take over the dead server's port");
    thread::spawn(move || {
        for con in listener.incoming() {
            match con {
                Ok(con) => drop(con),
                Err(_) => return,
            }
        }
    });
    let t = Instant::now();
    let r = p.release();
    assert!(
        matches!(r, Err(Error::Pool { .. } | Error::Redis { .. })),
        "{r:?}"
    );
    drop(dropped);
    for (op, r) in every_op(&sem) {
        assert!(
            matches!(r, Err(Error::Pool { .. } | Error::Redis { .. })),
            "{op}: {r:?}"
        );
    }
    let died = t.elapsed();
    assert!(
        died < Duration::from_secs(8),
        "15 failed calls took {died:?}"
    );
    eprintln!("Redis down: 13 calls failed in {nothing_there:?}; after it died, 15 in {died:?}");
}

// ---------------------------------------------------------------------------------------
// 8. Lost replies.

/// A client whose connections pass through `proxy`, with the semaphore scripts loaded.
fn through(proxy: &FaultProxy, watchdog: Duration) -> Client {
    let c = Client::builder()
        .url(proxy.url())
        .key_prefix(PREFIX)
        .watchdog_timeout(watchdog)
        .command_timeout(Duration::from_millis(1_000).min(watchdog / 3))
        .build()
        .expect("build client");
    let warm = c.semaphore("warm-up", 1);
    warm.acquire().unwrap().release().unwrap();
    warm.permits().unwrap();
    c
}

/// Issue 8: an acquisition whose reply is lost (the client repeats it on another
/// connection) holds its permits once; a release whose reply is lost frees them once.
#[test]
fn lost_replies_take_and_free_permits_once() {
    const NAME: &str = "lossy";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let c = through(&proxy, LONG);
    let sem = c.semaphore(NAME, 4);
    let other = CLIENTS.scaled(LONG).at(&server.url()).semaphore(NAME, 4);
    let bystander = other.acquire().unwrap();

    proxy.lose_next_reply_to(&acquire_call(&server));
    let p = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .expect("the repeated acquire succeeds");
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert_eq!(p.permits(), 2);
    assert_eq!(holders_of(&server, NAME, c.id()).len(), 1, "one holder");
    assert_eq!(
        used(&server, NAME),
        3,
        "2 + the bystander's 1, not 2 + 2 + 1"
    );
    assert_eq!(sem.available_permits().unwrap(), 1);

    proxy.lose_next_reply_to(&acquire_call(&server));
    let q = sem
        .try_acquire()
        .unwrap()
        .expect("the repeated try_acquire");
    assert_eq!(proxy.lost_replies(), 2);
    assert_eq!(sem.available_permits().unwrap(), 0);
    q.release().unwrap();

    proxy.lose_next_reply_to(&release_call(&server));
    let r = p.release();
    assert_eq!(proxy.lost_replies(), 3, "the fault was injected");
    // The repeat finds the permits given back already: it cannot vouch for them.
    assert!(matches!(r, Ok(()) | Err(Error::NotHeld { .. })), "{r:?}");
    assert_eq!(
        used(&server, NAME),
        1,
        "freed once: the bystander's permit still counts"
    );
    assert_eq!(sem.available_permits().unwrap(), 3);
    assert!(sem
        .try_acquire_with(
            redmutex::LockOptions::new()
                .permits(4)
                .wait_for(std::time::Duration::ZERO)
        )
        .unwrap()
        .is_none());
    let three = sem
        .try_acquire_with(
            redmutex::LockOptions::new()
                .permits(3)
                .wait_for(std::time::Duration::ZERO),
        )
        .unwrap()
        .expect("3 free");
    drop(three);
    bystander.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 4);
    assert!(!support::exists(
        &mut server.connection(),
        Keys::sem(PREFIX, NAME).key()
    ));
    eprintln!("a release whose reply was lost returned {r:?}");
}

/// Issue 8: an acquisition answered too late (the caller already failed with `Timeout`)
/// takes permits nobody holds; the client's clean-up gives them back within half a
/// watchdog timeout (a renewal period and a half), well before their lease would end.
#[test]
fn permits_granted_to_an_acquisition_that_timed_out_are_given_back() {
    const NAME: &str = "late";
    const WATCHDOG: Duration = Duration::from_secs(3);
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let c = through(&proxy, WATCHDOG);
    let sem = c.semaphore(NAME, 3);
    assert_eq!(sem.permits().unwrap(), 3);
    let watcher = CLIENTS.scaled(LONG).at(&server.url()).semaphore(NAME, 3);

    // Reaches Redis 450 ms late: after a try_acquire gave up (250 ms), before the
    // clean-up's second round.
    let sha = acquire_call(&server);
    proxy.delay_requests_containing(&sha, Duration::from_millis(450));
    let t0 = Instant::now();
    let r = sem.try_acquire_with(
        redmutex::LockOptions::new()
            .permits(2)
            .wait_for(std::time::Duration::ZERO),
    );
    let failed = Instant::now();
    proxy.delay_requests_containing(&sha, Duration::ZERO);
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(
        failed - t0 < Duration::from_millis(450),
        "try_acquire gave up after {:?}",
        failed - t0
    );
    assert!(proxy.wait_forwarded(&sha, 1, Duration::from_secs(2)));
    let landed = Instant::now();
    let mut seen_taken = false;
    assert!(
        wait_until(Duration::from_secs(4), || {
            let free = watcher.available_permits().unwrap();
            seen_taken |= free == 1;
            free == 3
        }),
        "the permits were never given back"
    );
    let back = failed.elapsed();
    assert!(
        back <= WATCHDOG / 2 + Duration::from_millis(300),
        "given back {back:?} after the failure (lease {WATCHDOG:?}): not by the clean-up"
    );
    assert!(holders_of(&server, NAME, c.id()).is_empty());
    assert!(queue(&server, NAME).is_empty());
    eprintln!(
        "late grant: taken {} (landed {:?} after the failure), given back {back:?} after it",
        if seen_taken { "and seen" } else { "(not seen)" },
        landed - failed
    );
}

// ---------------------------------------------------------------------------------------
// 9. try_acquire_for.

/// Issue 8: try_acquire_for gives up close to its bound (not before, at most 150 ms
/// after), leaves the queue and takes nothing; a waiter queued behind a head that gives
/// up is admitted by that give-up.
#[test]
fn try_acquire_for_gives_up_on_time_and_leaves_the_queue() {
    const NAME: &str = "timed";
    const WAIT: Duration = Duration::from_millis(300);
    let server = RedisServer::new();
    let (a, b) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let (sa, sb) = (a.semaphore(NAME, 2), b.semaphore(NAME, 2));
    // The admitted waiter's confirmation below is then one round trip, not a NOSCRIPT round.
    load_renew(&server);
    let held = sa
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    for n in [1, 2] {
        let (r, took) = support::timed(|| {
            sb.try_acquire_with(redmutex::LockOptions::new().permits(n).wait_for(WAIT))
                .unwrap()
        });
        assert!(r.is_none(), "nothing was free");
        assert!(
            took >= WAIT && took <= WAIT + Duration::from_millis(150),
            "try_acquire_with(permits {n}, wait {WAIT:?}) took {took:?}"
        );
        assert!(queue(&server, NAME).is_empty(), "left its entry behind");
        let waiting: HashMap<String, String> = support::query_key(
            &mut server.connection(),
            "HGETALL",
            Keys::sem(PREFIX, NAME).aux("waiters"),
        );
        assert!(waiting.is_empty(), "left its waiter data: {waiting:?}");
        assert_eq!(used(&server, NAME), 2, "took a permit");
        eprintln!("try_acquire_with(permits {n}, wait {WAIT:?}) returned None after {took:?}");
    }
    let deadline = Instant::now() + WAIT;
    assert!(sb.try_acquire_until(deadline).unwrap().is_none());
    assert!(Instant::now() >= deadline);
    held.release().unwrap();
    assert_eq!(sa.available_permits().unwrap(), 2);

    // A head asking for 2 while 1 is free holds up a later waiter asking for 1 until it
    // gives up; its leaving admits that waiter.
    let one = sa.acquire().unwrap();
    let (head_tx, head_rx) = mpsc::channel();
    let head = sb.clone();
    let started = Instant::now();
    let head_thread = thread::spawn(move || {
        let r = head
            .try_acquire_with(redmutex::LockOptions::new().permits(2).wait_for(WAIT))
            .map(|p| p.is_some());
        head_tx.send(Instant::now()).unwrap();
        r
    });
    assert!(wait_until(Duration::from_secs(2), || queue(&server, NAME)
        .len()
        == 1));
    let (got_tx, got) = mpsc::channel();
    let (mut behind, _) = queue_up(&server, NAME, &[(&sa, a.id(), 1)], &got_tx);
    let gave_up = head_rx.recv_timeout(Duration::from_secs(2)).expect("head");
    assert!(!head_thread.join().unwrap().unwrap(), "the head never fit");
    let (_, admitted) = got
        .recv_timeout(Duration::from_secs(2))
        .expect("the waiter behind the head was never admitted");
    assert!(
        admitted >= started + WAIT,
        "the waiter behind passed the head {:?} before its deadline",
        started + WAIT - admitted
    );
    assert!(
        admitted <= gave_up + Duration::from_millis(100),
        "admitted {:?} after the head gave up",
        admitted - gave_up
    );
    eprintln!(
        "a head giving up admitted the waiter behind it {:?} later",
        admitted.saturating_duration_since(gave_up)
    );
    behind.remove(0).release();
    one.release().unwrap();
    assert_eq!(sa.available_permits().unwrap(), 2);
    assert!(queue(&server, NAME).is_empty());
}

// ---------------------------------------------------------------------------------------
// Requests the semaphore can never satisfy.

/// Asking for more permits than the semaphore has (here 3 of 2) fails at once with
/// `InvalidArgument`, writing nothing (no queue entry, not even the semaphore's number):
/// queued, it would have waited forever, and everyone behind it with it. A request for
/// what there is still succeeds.
#[test]
fn a_request_for_more_permits_than_there_are_fails_at_once() {
    const NAME: &str = "oversized";
    let server = RedisServer::new();
    let c = CLIENTS.scaled(LONG).at(&server.url());
    let sem = c.semaphore(NAME, 2);
    let (tx, rx) = mpsc::channel();
    let asking = sem.clone();
    let started = Instant::now();
    let _waiter = thread::spawn(move || {
        let r = asking
            .try_acquire_with(redmutex::LockOptions::new().permits(3))
            .map(Option::unwrap)
            .map(drop);
        let _ = tx.send(r);
    });
    let r = rx.recv_timeout(Duration::from_secs(2)).unwrap_or_else(|_| {
        panic!(
            "try_acquire_with(permits 3) of 2 permits still waits after 2 s (queue {:?})",
            queue(&server, NAME)
        )
    });
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "not at once");
    assert_eq!(dbsize(&server), 0, "the refused call wrote something");
    for (what, r) in [
        (
            "try_acquire_with(permits 3, no wait)",
            sem.try_acquire_with(
                redmutex::LockOptions::new()
                    .permits(3)
                    .wait_for(std::time::Duration::ZERO),
            )
            .map(drop),
        ),
        (
            "try_acquire_with(permits 3, wait_for)",
            sem.try_acquire_with(
                redmutex::LockOptions::new()
                    .permits(3)
                    .wait_for(Duration::from_secs(5)),
            )
            .map(drop),
        ),
    ] {
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what}: {r:?}"
        );
    }
    // Nobody is blocked behind it: the semaphore's permits are all there.
    let both = sem
        .try_acquire_with(
            redmutex::LockOptions::new()
                .permits(2)
                .wait_for(Duration::from_secs(2)),
        )
        .unwrap()
        .expect("2 of 2 permits");
    both.release().unwrap();
    assert!(queue(&server, NAME).is_empty());
}

/// A waiter at the head asking for more permits than a later `reduce_permits` (or
/// `set_permits`) leaves fails at once with `InvalidArgument` and leaves the queue: the
/// waiter behind it, asking for what there still is, gets it on the next release instead
/// of waiting behind an impossible request forever.
#[test]
fn reducing_the_permits_below_a_queued_request_fails_it_and_frees_the_queue() {
    const NAME: &str = "shrunk";
    let server = RedisServer::new();
    let (a, b) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let (sa, sb) = (a.semaphore(NAME, 3), b.semaphore(NAME, 3));
    let held = sa
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    // The big one waits for 2 (1 free), the small one behind it.
    let (big_tx, big) = mpsc::channel();
    let big_sem = sa.clone();
    let big_thread = thread::spawn(move || {
        let r = big_sem
            .try_acquire_with(redmutex::LockOptions::new().permits(2))
            .map(Option::unwrap)
            .map(|p| p.release());
        let _ = big_tx.send(r);
    });
    assert!(
        wait_until(Duration::from_secs(5), || queue(&server, NAME).len() == 1),
        "the big request never queued"
    );
    let (got_tx, got) = mpsc::channel();
    let (mut small, entries) = queue_up(&server, NAME, &[(&sb, b.id(), 1)], &got_tx);
    assert_eq!(
        queue(&server, NAME).len(),
        2,
        "{entries:?} behind the big one"
    );

    assert_eq!(sa.reduce_permits(2).unwrap(), 1, "3 less 2");
    let r = big
        .recv_timeout(Duration::from_secs(2))
        .unwrap_or_else(|_| {
            panic!(
                "the request for 2 of now 1 permit still waits after 2 s (queue {:?})",
                queue(&server, NAME)
            )
        });
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    big_thread.join().unwrap();
    assert_eq!(queue(&server, NAME), entries, "only the small one waits");
    assert!(
        got.recv_timeout(Duration::from_millis(200)).is_err(),
        "2 held of 1: nothing to give"
    );
    held.release().unwrap();
    got.recv_timeout(Duration::from_secs(2))
        .expect("the waiter behind the impossible request never got its permit");
    small.remove(0).release();
    assert!(queue(&server, NAME).is_empty());
    assert_eq!(sa.available_permits().unwrap(), 1);

    // The same through set_permits, with the big one at the head again.
    let one = sa.acquire().unwrap();
    sa.set_permits(3).unwrap();
    let (big_tx, big) = mpsc::channel();
    let big_sem = sa.clone();
    let big_thread = thread::spawn(move || {
        let _ = big_tx.send(
            big_sem
                .try_acquire_with(redmutex::LockOptions::new().permits(3))
                .map(Option::unwrap)
                .map(drop),
        );
    });
    assert!(
        wait_until(Duration::from_secs(5), || queue(&server, NAME).len() == 1),
        "the big request never queued"
    );
    sa.set_permits(2).unwrap();
    let r = big
        .recv_timeout(Duration::from_secs(2))
        .expect("set_permits(2) left a request for 3 waiting");
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    big_thread.join().unwrap();
    assert!(queue(&server, NAME).is_empty());
    one.release().unwrap();
}

/// Issue 17, item 2, for permits: a permit handed over by a release has a pickup window
/// that starts at the release, on the server. A grant message that reaches the waiter
/// after it (a slow link) finds the permit lapsed and given to another client: the waiter
/// must not return it (two permits in use on a one-permit semaphore), but confirm it with
/// the server first, and wait on when it is gone.
#[test]
fn a_permit_granted_after_its_pickup_window_is_not_returned_as_held() {
    const NAME: &str = "late-permit";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let (holder, other) = (
        CLIENTS.scaled(LONG).at(&server.url()),
        CLIENTS.scaled(LONG).at(&server.url()),
    );
    let waiter = CLIENTS.scaled(LONG).at(&proxy.url());
    let first = holder.semaphore(NAME, 1).acquire().expect("holder");
    let other_holds = Arc::new(AtomicBool::new(false));
    let (done, returned) = mpsc::channel();
    let sem = waiter.semaphore(NAME, 1);
    let flag = other_holds.clone();
    let thread = thread::spawn(move || {
        let p = sem.acquire().expect("waiter");
        let beside_other = flag.load(Ordering::SeqCst);
        let lost = p.is_lease_lost();
        done.send(()).unwrap();
        (beside_other, lost, p.release())
    });
    assert!(
        wait_until(Duration::from_secs(5), || queue(&server, NAME).len() == 1),
        "setup: the waiter never queued"
    );
    // From here on every message to the waiter's client arrives 1.5 s late.
    proxy.delay_replies_containing("\r\nmessage\r\n", Duration::from_millis(1_500));
    let released = Instant::now();
    first.release().expect("holder release");
    let taken = other
        .semaphore(NAME, 1)
        .try_acquire_for(Duration::from_secs(5))
        .expect("other")
        .expect("the lapsed grant never passed on");
    other_holds.store(true, Ordering::SeqCst);
    proxy.delay_replies_containing("\r\nmessage\r\n", Duration::ZERO);
    let early = returned
        .recv_timeout(
            (released + Duration::from_millis(2_500)).saturating_duration_since(Instant::now()),
        )
        .is_ok();
    let in_use = used(&server, NAME);
    other_holds.store(false, Ordering::SeqCst);
    taken.release().expect("other release");
    let (beside_other, lost, released_ok) = thread.join().unwrap();
    assert!(
        !early && !beside_other,
        "the waiter's acquire() returned a permit while another client held the only one \
         ({in_use} in use, is_lease_lost {lost})"
    );
    assert!(!lost, "the waiter's confirmed permit looks lost");
    released_ok.expect("the waiter releases its permit");
    assert_eq!(used(&server, NAME), 0);
}
