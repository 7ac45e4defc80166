//! RedLock and MultiLock on real, independent redis-server processes: five masters, some
//! killed or frozen, contenders in several processes, a witness of who was inside.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, MultiLock};
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const PREFIX: &str = "redlock:";

const CLIENTS: Clients = Clients::new(PREFIX).command(Duration::from_millis(500));
const ROLE: &str = "REDMUTEX_REDLOCK_CHILD_ROLE";
const URLS: &str = "REDMUTEX_REDLOCK_CHILD_URLS";
const WITNESS: &str = "REDMUTEX_REDLOCK_CHILD_WITNESS";

fn masters(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::new()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// Two independent sets of clients, one on each master (as two processes would have), with
/// a watchdog of `watchdog`.
fn two_processes(servers: &[RedisServer], watchdog: Duration) -> (Vec<Client>, Vec<Client>) {
    let urls = urls(servers);
    let one = CLIENTS.watchdog(watchdog).each_at(&urls);
    let two = CLIENTS.watchdog(watchdog).each_at(&urls);
    (one, two)
}

fn red_lock(clients: &[Client], name: &str) -> MultiLock {
    MultiLock::red_lock(clients.iter().map(|c| c.lock(name)))
        .expect("red lock")
        .with_member_timeout(Duration::from_millis(150))
        .expect("member timeout")
}

/// The reentry count `holder` has on the lock `name` of `server` (0: none).
fn count(server: &RedisServer, name: &str, holder: &str) -> u32 {
    let n: Option<u32> = redis::cmd("HGET")
        .arg(Keys::lock(PREFIX, name).key())
        .arg(holder)
        .query(&mut server.connection())
        .expect("HGET");
    n.unwrap_or(0)
}

/// The holder id the current thread has on `client`.
fn holder_on(client: &Client, name: &str, server: &RedisServer) -> String {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(Keys::lock(PREFIX, name).key())
        .query(&mut server.connection())
        .expect("HKEYS");
    fields
        .into_iter()
        .find(|f| f.starts_with(client.id()))
        .expect("a hold of this client")
}

/// `name` is held on none of the masters `which` (indices into `servers`).
fn assert_left_on_none(servers: &[RedisServer], which: &[usize], name: &str) {
    for &i in which {
        assert!(
            !support::exists(&mut servers[i].connection(), Keys::lock(PREFIX, name).key()),
            "left held on master {i}"
        );
    }
}

#[test]
fn a_red_lock_is_held_on_every_master_exclusive_and_reentrant() {
    let servers = masters(5);
    let (mine, theirs) = two_processes(&servers, Duration::from_secs(5));
    let lock = red_lock(&mine, "basic");
    let other = red_lock(&theirs, "basic");
    assert_eq!(lock.quorum(), 3);

    let outer = lock.lock().expect("lock");
    assert_eq!(outer.held_on(), 5);
    for (s, c) in servers.iter().zip(&mine) {
        let holder = holder_on(c, "basic", s);
        assert_eq!(count(s, "basic", &holder), 1);
    }
    // Another thread, on other clients or these, cannot have it.
    assert!(thread::scope(|t| t
        .spawn(|| other.try_lock().unwrap().is_none())
        .join()
        .unwrap()));
    assert!(thread::scope(|t| t
        .spawn(|| lock.try_lock().unwrap().is_none())
        .join()
        .unwrap()));
    // The same thread re-enters on every master.
    let inner = lock.lock().expect("re-enter");
    for (s, c) in servers.iter().zip(&mine) {
        assert_eq!(count(s, "basic", &holder_on(c, "basic", s)), 2);
    }
    inner.unlock().expect("inner unlock");
    for (s, c) in servers.iter().zip(&mine) {
        assert_eq!(count(s, "basic", &holder_on(c, "basic", s)), 1);
    }
    assert!(lock.is_locked().unwrap());
    outer.unlock().expect("unlock");
    assert!(servers
        .iter()
        .all(|s| !support::exists(&mut s.connection(), Keys::lock(PREFIX, "basic").key())));
    assert!(!lock.is_locked().unwrap());
    let theirs_now = other.try_lock().unwrap().expect("free for the others");
    // Forced open on every master at once: their release then finds it gone.
    assert!(lock.force_unlock().unwrap());
    assert!(servers
        .iter()
        .all(|s| !support::exists(&mut s.connection(), Keys::lock(PREFIX, "basic").key())));
    assert!(!lock.force_unlock().unwrap());
    assert!(matches!(theirs_now.unlock(), Err(Error::LeaseLost { .. })));
}

/// Threads on two sets of clients take turns on the lock with two of five masters dead:
/// each acquisition still gets a quorum, and the in-process witness never sees two inside.
#[test]
fn with_two_masters_killed_locks_are_still_acquired_and_exclusive() {
    let mut servers = masters(5);
    let urls = urls(&servers);
    servers[1].kill();
    servers[3].kill();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let acquired = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let urls = urls.clone();
            let (inside, overlaps, acquired) = (inside.clone(), overlaps.clone(), acquired.clone());
            thread::spawn(move || {
                let cs = CLIENTS.watchdog(Duration::from_secs(3)).each_at(&urls);
                let lock = red_lock(&cs, "two-down");
                for _ in 0..6 {
                    let guard = lock.lock().unwrap_or_else(|e| panic!("worker {w}: {e}"));
                    assert_eq!(guard.held_on(), 3, "held on the three live masters");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    acquired.fetch_add(1, Ordering::SeqCst);
                    assert!(!guard.is_lease_lost());
                    guard.unlock().expect("unlock with two masters down");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    assert_eq!(acquired.load(Ordering::SeqCst), 24);
    eprintln!(
        "24 acquisitions with two of five masters dead in {:?}",
        started.elapsed()
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_left_on_none(&servers, &[0, 2, 4], "two-down");
}

#[test]
fn with_three_masters_killed_acquisition_fails_at_its_deadline_with_no_quorum() {
    let mut servers = masters(5);
    let urls = urls(&servers);
    let cs = CLIENTS.watchdog(Duration::from_secs(3)).each_at(&urls);
    let lock = red_lock(&cs, "three-down");
    // Warm pools: the live masters answer from pooled connections.
    lock.lock().expect("lock").unlock().expect("unlock");
    for i in [0, 2, 4] {
        servers[i].kill();
    }
    let wait = Duration::from_millis(800);
    let t = Instant::now();
    let err = lock
        .try_lock_for(wait)
        .expect_err("no quorum with three of five masters dead");
    let took = t.elapsed();
    match &err {
        Error::NoQuorum {
            reached,
            members,
            required,
            ..
        } => assert_eq!((*reached, *members, *required), (2, 5, 3), "{err}"),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert!(std::error::Error::source(&err).is_some());
    // At its deadline: not before, and within a member timeout (and a round) after.
    assert!(
        took >= wait && took < wait + Duration::from_millis(600),
        "failed after {took:?} for a wait of {wait:?}"
    );
    // Without a deadline, the failure is reported at once (one round), not waited out.
    let t = Instant::now();
    assert!(matches!(lock.lock(), Err(Error::NoQuorum { .. })));
    let at_once = t.elapsed();
    eprintln!("three masters down: try_lock_for({wait:?}) failed after {took:?}, lock() after {at_once:?}");
    assert!(at_once < Duration::from_millis(700), "{at_once:?}");
    // Nothing is left on the live masters.
    assert_left_on_none(&servers, &[1, 3], "three-down");
}

/// Renewals on every master keep the lock past several leases; once three of five masters
/// are gone the hold cannot stand on a quorum any more, and the guard says so within a
/// lease, not before the renewals stop mattering.
#[test]
fn renewal_keeps_a_red_lock_on_every_master_and_a_lost_quorum_is_reported() {
    const WATCHDOG: Duration = Duration::from_millis(900);
    let mut servers = masters(5);
    let (cs, others) = two_processes(&servers, WATCHDOG);
    let lock = red_lock(&cs, "renewed");
    let guard = lock.lock().expect("lock");
    // Time is the subject: three leases pass.
    thread::sleep(WATCHDOG * 3);
    assert!(!guard.is_lease_lost());
    for s in &servers {
        let pttl: i64 = support::query_key(
            &mut s.connection(),
            "PTTL",
            Keys::lock(PREFIX, "renewed").key(),
        );
        assert!(pttl > 0, "not renewed on a master: {pttl}");
    }
    assert!(red_lock(&others, "renewed").try_lock().unwrap().is_none());

    let killed = Instant::now();
    for i in [0, 1, 2] {
        servers[i].kill();
    }
    assert!(
        support::wait_until(WATCHDOG * 3, || guard.is_lease_lost()),
        "a hold on two of five masters must be reported lost"
    );
    let at = killed.elapsed();
    // The last renewal before the kill was at most a third of a lease earlier.
    assert!(
        at >= WATCHDOG / 2 && at <= WATCHDOG + Duration::from_millis(300),
        "reported {at:?} after the kill, with a lease of {WATCHDOG:?}"
    );
    eprintln!("a hold on two of five masters reported lost {at:?} after the kill");
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
}

/// A waiter queued on every master sends nothing while it waits, and wakes on the
/// holder's release (pub/sub), long before the holder's lease would have run out.
#[test]
fn a_waiter_sleeps_without_commands_and_wakes_on_release() {
    let servers = masters(5);
    let (holder_clients, waiter_clients) = two_processes(&servers, Duration::from_secs(3));
    let held = red_lock(&holder_clients, "wake")
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(20)))
        .map(Option::unwrap)
        .expect("hold");
    let waiting = red_lock(&waiter_clients, "wake");
    let started = Arc::new(Barrier::new(2));
    let woke = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (started, woke) = (started.clone(), woke.clone());
        thread::spawn(move || {
            started.wait();
            let guard = waiting.lock().expect("lock after the release");
            let at = Instant::now();
            woke.store(true, Ordering::SeqCst);
            guard.unlock().expect("unlock");
            at
        })
    };
    started.wait();
    // Queued on every master: each has one entry in the lock's queue.
    let queue = Keys::lock(PREFIX, "wake").queue();
    assert!(support::wait_until(Duration::from_secs(5), || servers
        .iter()
        .all(|s| redis::cmd("LLEN")
            .arg(&queue)
            .query::<i64>(&mut s.connection())
            .unwrap()
            == 1)));
    let before: Vec<_> = servers.iter().map(RedisServer::command_calls).collect();
    // Time is the subject: a second of waiting.
    thread::sleep(Duration::from_secs(1));
    let after: Vec<_> = servers.iter().map(RedisServer::command_calls).collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let sent: Vec<(String, u64)> = a
            .iter()
            .map(|(cmd, n)| (cmd.clone(), n - b.get(cmd).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        // At most one renewal of the queue entry (each second) by the waiter's watchdog,
        // sent twice if the server had to load the script first; no attempt, no poll.
        // (The commands inside the script count too, and the counting's own INFO.)
        let calls = |cmd: &str| sent.iter().find(|(c, _)| c == cmd).map_or(0, |(_, n)| *n);
        assert!(
            calls("fcall") + calls("evalsha") <= 2
                && calls("publish") == 0
                && calls("subscribe") == 0,
            "master {i} saw {sent:?} while the waiter slept"
        );
    }
    assert!(!woke.load(Ordering::SeqCst));
    let released = Instant::now();
    held.unlock().expect("release");
    let woke_at = waiter.join().expect("waiter");
    let latency = woke_at.duration_since(released);
    eprintln!("the RedLock waiter woke {latency:?} after the release");
    support::assert_under(
        latency,
        Duration::from_secs(1),
        format_args!("woke {latency:?} after the release; the holder's lease had 18 s left"),
    );
}

#[test]
fn a_multi_lock_takes_all_of_its_locks_or_none() {
    let server = RedisServer::new();
    let a = Client::builder()
        .url(server.url())
        .key_prefix(PREFIX)
        .build()
        .unwrap();
    let b = Client::builder()
        .url(server.url())
        .key_prefix(PREFIX)
        .build()
        .unwrap();
    let both = MultiLock::new([a.lock("acct-1"), a.lock("acct-2")]).unwrap();
    assert_eq!(both.quorum(), 2);
    let one = b.lock("acct-2").lock().unwrap();
    assert!(thread::scope(|t| t
        .spawn(|| both.try_lock().unwrap().is_none())
        .join()
        .unwrap()));
    // The lock it did get was given back at once.
    assert!(!support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, "acct-1").key()
    ));
    one.unlock().unwrap();
    let guard = both.lock().unwrap();
    assert!(
        support::exists(&mut server.connection(), Keys::lock(PREFIX, "acct-1").key())
            && support::exists(&mut server.connection(), Keys::lock(PREFIX, "acct-2").key())
    );
    guard.unlock().unwrap();
    assert!(
        !support::exists(&mut server.connection(), Keys::lock(PREFIX, "acct-1").key())
            && !support::exists(&mut server.connection(), Keys::lock(PREFIX, "acct-2").key())
    );
}

#[test]
fn bad_input_is_refused_with_typed_errors() {
    let servers = masters(3);
    let urls = urls(&servers);
    let cs = CLIENTS.watchdog(Duration::from_secs(3)).each_at(&urls);
    let invalid = |r: Result<MultiLock, Error>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(invalid(MultiLock::new(Vec::new())));
    assert!(invalid(MultiLock::red_lock([
        cs[0].lock("x"),
        cs[1].lock("x")
    ])));
    assert!(invalid(MultiLock::new([cs[0].lock("x"), cs[0].lock("x")])));
    assert!(invalid(MultiLock::red_lock([
        cs[0].lock("x"),
        cs[0].lock("y"),
        cs[1].lock("x")
    ])));
    let lock = red_lock(&cs, "x");
    assert!(invalid(lock.clone().with_quorum(1)));
    assert!(invalid(lock.clone().with_quorum(4)));
    assert!(invalid(lock.clone().with_member_timeout(Duration::ZERO)));
    assert_eq!(lock.clone().with_quorum(3).unwrap().quorum(), 3);
    assert!(matches!(
        MultiLock::red_lock(cs.iter().map(|c| c.lock(""))),
        Err(Error::InvalidName(_))
    ));
    let replicated = Client::builder()
        .url(urls[0].as_str())
        .sync_replicas(1, Duration::from_millis(100))
        .build()
        .unwrap();
    assert!(invalid(MultiLock::new([replicated.lock("x")])));
    assert!(matches!(
        lock.try_lock_with(redmutex::LockOptions::new().lease(Duration::ZERO))
            .map(Option::unwrap),
        Err(Error::InvalidArgument { .. })
    ));
    // Nothing was written by any of it.
    assert!(servers
        .iter()
        .all(|s| !support::exists(&mut s.connection(), Keys::lock(PREFIX, "x").key())));
    // A hold force-unlocked on a quorum is reported lost on release.
    let guard = lock.lock().unwrap();
    for c in &cs[..2] {
        assert!(c.lock("x").force_unlock().unwrap());
    }
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
}

/// Six threads on three sets of clients contend with all masters up: every acquisition
/// completes (rounds that split the masters between callers do not repeat forever) and
/// nobody is ever inside with another.
#[test]
fn contenders_on_five_masters_take_turns_without_overlap() {
    let servers = masters(5);
    let urls = urls(&servers);
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let sets: Vec<Vec<Client>> = (0..3)
        .map(|_| CLIENTS.watchdog(Duration::from_secs(3)).each_at(&urls))
        .collect();
    thread::scope(|scope| {
        for w in 0..6 {
            let cs = &sets[w % 3];
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            scope.spawn(move || {
                let lock = red_lock(cs, "turns");
                for _ in 0..20 {
                    let guard = lock.lock().expect("lock");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_millis(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().expect("unlock");
                }
            });
        }
    });
    eprintln!("120 contended RedLock acquisitions in {:?}", t.elapsed());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(servers
        .iter()
        .all(|s| !support::exists(&mut s.connection(), Keys::lock(PREFIX, "turns").key())));
}

/// Two processes contend for a RedLock while one of the five masters is frozen (SIGSTOP)
/// for longer than the lease: acquisitions go on with the four others, and the witness (a
/// sixth server the contenders report to) never sees both inside.
#[test]
fn a_master_frozen_past_the_lease_never_lets_two_processes_in() {
    let servers = masters(5);
    let witness = RedisServer::new();
    let urls = urls(&servers).join(" ");
    let witness_url = witness.url();
    let env = [
        (ROLE, "contender"),
        (URLS, urls.as_str()),
        (WITNESS, witness_url.as_str()),
    ];
    let mut children: Vec<ChildProc> = (0..2)
        .map(|_| ChildProc::spawn("child_entry", &env))
        .collect();
    for c in &children {
        c.expect("running");
    }
    let total = |w: &RedisServer| -> u64 {
        redis::cmd("GET")
            .arg("total")
            .query::<Option<u64>>(&mut w.connection())
            .unwrap()
            .unwrap_or(0)
    };
    assert!(support::wait_until(Duration::from_secs(10), || total(
        &witness
    ) >= 10));
    servers[2].freeze();
    let frozen_at = total(&witness);
    // Time is the subject: the freeze outlasts the 1 s lease twice over.
    thread::sleep(Duration::from_millis(2500));
    let during = total(&witness) - frozen_at;
    servers[2].thaw();
    let thawed_at = total(&witness);
    assert!(support::wait_until(Duration::from_secs(10), || total(
        &witness
    ) >= thawed_at
        + 10));
    for c in &mut children {
        c.send("stop");
    }
    let mut acquisitions = 0;
    for c in &children {
        let line = c.next_line();
        let counts: Vec<u64> = line
            .split(' ')
            .map(|n| n.parse().unwrap_or_else(|_| panic!("bad line {line:?}")))
            .collect();
        let [n, overlaps, lost] = counts[..] else {
            panic!("bad line {line:?}")
        };
        // Told apart: a hold lost while inside (its quorum's leases ran out: a renewal
        // missed) is a different failure from a second contender inside.
        assert_eq!(overlaps, 0, "a contender saw another inside");
        assert_eq!(lost, 0, "a hold was lost while its contender was inside");
        acquisitions += n;
    }
    eprintln!("{during} acquisitions while one master was frozen for 2.5 s");
    assert!(during > 0, "no acquisition while one master was frozen");
    assert_eq!(acquisitions, total(&witness));
    let max: u64 = redis::cmd("GET")
        .arg("max")
        .query::<Option<u64>>(&mut witness.connection())
        .unwrap()
        .unwrap_or(0);
    assert_eq!(max, 1, "the witness saw {max} inside at once");
}

#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "contender" => contender(),
        other => panic!("unknown child role {other:?}"),
    }
}

/// Takes the lock again and again until told to stop, reporting to the witness; prints
/// "<acquisitions> <overlaps seen> <holds found lost at their release>".
fn contender() {
    let urls: Vec<String> = std::env::var(URLS)
        .unwrap()
        .split(' ')
        .map(str::to_owned)
        .collect();
    let mut witness = redis::Client::open(std::env::var(WITNESS).unwrap())
        .unwrap()
        .get_connection()
        .unwrap();
    let cs = CLIENTS.watchdog(Duration::from_secs(1)).each_at(&urls);
    let lock = red_lock(&cs, "frozen");
    let stop = support::child::stop_on_stdin();
    say("running");
    let (mut n, mut overlaps, mut lost) = (0u64, 0u64, 0u64);
    while !stop.load(Ordering::SeqCst) {
        let Some(guard) = lock.try_lock_for(Duration::from_secs(5)).expect("acquire") else {
            continue;
        };
        let inside: u64 = redis::cmd("INCR")
            .arg("inside")
            .query(&mut witness)
            .unwrap();
        let _: () = redis::Script::new(
            "if tonumber(redis.call('get', 'max') or '0') < tonumber(ARGV[1]) then \
             redis.call('set', 'max', ARGV[1]) end",
        )
        .arg(inside)
        .invoke(&mut witness)
        .unwrap();
        if inside != 1 {
            overlaps += 1;
        }
        thread::sleep(Duration::from_millis(3));
        let _: i64 = redis::cmd("DECR")
            .arg("inside")
            .query(&mut witness)
            .unwrap();
        let _: i64 = redis::cmd("INCR").arg("total").query(&mut witness).unwrap();
        n += 1;
        if guard.is_lease_lost() {
            lost += 1;
        }
        drop(guard);
    }
    say(&format!("{n} {overlaps} {lost}"));
}
