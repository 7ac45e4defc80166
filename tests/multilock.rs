//! MultiLock and RedLock under contention for free locks, and after a server's call timed
//! out: each try on free locks has exactly one winner, and releases always reach every
//! server.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, MultiLock};
use support::RedisServer;

const PREFIX: &str = "multi:";
const ROUNDS: usize = 30;
const THREADS: usize = 10;

fn client(server: &RedisServer) -> Client {
    support::client(
        &server.url(),
        PREFIX,
        Duration::from_secs(5),
        Duration::from_secs(2),
    )
}

fn key(name: &str) -> String {
    format!("{PREFIX}{{{name}}}")
}

fn exists(server: &RedisServer, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key(name))
        .query(&mut server.connection())
        .expect("EXISTS")
}

/// `ROUNDS` rounds of `THREADS` threads that each call `try_lock` once, all at the same
/// moment, on free locks (`make(thread, round)` builds the thread's MultiLock); the
/// winners keep their guard until every thread has tried. Returns the winners of each
/// round.
fn race(make: impl Fn(usize, usize) -> MultiLock + Sync) -> Vec<usize> {
    let mut winners = Vec::new();
    for round in 0..ROUNDS {
        let won = AtomicUsize::new(0);
        let start = Barrier::new(THREADS);
        let tried = Barrier::new(THREADS);
        thread::scope(|s| {
            for t in 0..THREADS {
                let (make, won, start, tried) = (&make, &won, &start, &tried);
                s.spawn(move || {
                    let lock = make(t, round);
                    start.wait();
                    let guard = lock.try_lock().expect("try_lock");
                    if guard.is_some() {
                        won.fetch_add(1, Ordering::SeqCst);
                    }
                    tried.wait();
                    if let Some(g) = guard {
                        g.unlock().expect("unlock");
                    }
                });
            }
        });
        winners.push(won.into_inner());
    }
    winners
}

fn assert_one_winner_each_round(what: &str, winners: &[usize]) {
    eprintln!("{what}: winners per round {winners:?}");
    assert!(
        winners.iter().all(|&w| w == 1),
        "{what}: every round on free locks must have exactly one winner: {winners:?}"
    );
}

/// Issue 17 item 6: three free locks on one server, one client shared by ten threads.
#[test]
fn try_lock_on_free_locks_of_one_shared_client_has_exactly_one_winner() {
    let server = RedisServer::new();
    let c = client(&server);
    let winners = race(|_, round| {
        MultiLock::new((0..3).map(|i| c.lock(format!("shared-{round}-{i}")))).unwrap()
    });
    assert_one_winner_each_round("one shared client", &winners);
    for round in 0..ROUNDS {
        for i in 0..3 {
            assert!(!exists(&server, &format!("shared-{round}-{i}")));
        }
    }
}

/// The same with a new client per thread and round: no pooled connection yet, so the
/// calls take the clients' ordinary path.
#[test]
fn try_lock_on_free_locks_of_one_server_with_new_clients_has_exactly_one_winner() {
    let server = RedisServer::new();
    let winners = race(|_, round| {
        let c = client(&server);
        MultiLock::new((0..3).map(|i| c.lock(format!("own-{round}-{i}")))).unwrap()
    });
    assert_one_winner_each_round("new clients", &winners);
}

/// Several names on each of three servers, all of them needed: one winner each round.
#[test]
fn try_lock_on_several_names_on_three_servers_has_exactly_one_winner() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let sets: Vec<Vec<Client>> = (0..THREADS)
        .map(|_| servers.iter().map(client).collect())
        .collect();
    let winners = race(|t, round| {
        MultiLock::new(
            sets[t]
                .iter()
                .flat_map(|c| (0..2).map(move |i| c.lock(format!("names-{round}-{i}")))),
        )
        .unwrap()
    });
    assert_one_winner_each_round("two names on three servers", &winners);
}

/// RedLock over three masters: contenders that split the masters retry within the call.
#[test]
fn red_lock_try_lock_on_free_masters_has_exactly_one_winner() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let sets: Vec<Vec<Client>> = (0..THREADS)
        .map(|_| servers.iter().map(client).collect())
        .collect();
    let winners = race(|t, round| {
        MultiLock::red_lock(sets[t].iter().map(|c| c.lock(format!("red-{round}")))).unwrap()
    });
    assert_one_winner_each_round("RedLock on three masters", &winners);
}

/// Issue 17 item 7: a call to a master times out (it is frozen for a moment), the master
/// comes back, and the hold is released at once: the release must reach that master too,
/// though its server failed a call well within the second that acquisitions skip it.
/// With every lock needed (`new`), a release skipped there would also make `unlock` fail.
#[test]
fn a_release_reaches_a_master_whose_call_just_timed_out() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let cs: Vec<Client> = servers.iter().map(client).collect();
    // A short bound for the call that times out; a long one for the release, which may
    // need a new connection to the master just thawed on a busy machine.
    let short = Duration::from_millis(150);
    let probe = MultiLock::red_lock(cs.iter().map(|c| c.lock("probe")))
        .unwrap()
        .with_member_timeout(short)
        .unwrap();
    let red = MultiLock::red_lock(cs.iter().map(|c| c.lock("thawed-red")))
        .unwrap()
        .with_member_timeout(Duration::from_secs(1))
        .unwrap();
    let all = MultiLock::new(cs.iter().map(|c| c.lock("thawed-all")))
        .unwrap()
        .with_member_timeout(Duration::from_secs(1))
        .unwrap();
    for (lock, name) in [(&red, "thawed-red"), (&all, "thawed-all")] {
        let guard = lock.lock().expect("lock");
        assert_eq!(guard.held_on(), 3);
        servers[0].freeze();
        let t = Instant::now();
        // Answered by the two others; the frozen master's call times out.
        let locked = probe.is_locked();
        let took = t.elapsed();
        servers[0].thaw();
        assert!(
            took >= short,
            "{name}: the frozen master answered ({took:?})"
        );
        assert!(matches!(locked, Ok(false)), "{name}: {locked:?}");
        // Sent well within the second a failed master is skipped by acquisitions.
        let since = t.elapsed();
        assert!(since < Duration::from_millis(800), "{name}: {since:?}");
        let unlocked = guard.unlock();
        assert!(
            !exists(&servers[0], name),
            "{name}: the release did not reach the master that had timed out (unlock said \
             {unlocked:?})"
        );
        assert!(servers.iter().all(|s| !exists(s, name)), "{name}");
        unlocked.unwrap_or_else(|e| panic!("{name}: unlock failed: {e}"));
    }
}

/// Queue-leaving is sent to a master that just failed a call too: a waiter that gives up
/// leaves no entry behind there.
#[test]
fn a_waiter_leaves_the_queue_of_a_master_whose_call_just_timed_out() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let holders: Vec<Client> = servers.iter().map(client).collect();
    let waiters: Vec<Client> = servers.iter().map(client).collect();
    let make = |cs: &[Client], name: &str, timeout: u64| {
        MultiLock::red_lock(cs.iter().map(|c| c.lock(name)))
            .unwrap()
            .with_member_timeout(Duration::from_millis(timeout))
            .unwrap()
    };
    let held = make(&holders, "queue-left", 150).lock().expect("hold");
    // Leaving the queue may need a new connection to the master just thawed.
    let waiting = make(&waiters, "queue-left", 1000);
    let probe = make(&waiters, "probe", 150);
    let queue = format!("{PREFIX}!queue:{{queue-left}}");
    let queued = |s: &RedisServer| -> i64 {
        redis::cmd("LLEN")
            .arg(&queue)
            .query(&mut s.connection())
            .expect("LLEN")
    };
    thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let got = waiting.try_lock_for(Duration::from_secs(1));
            (format!("{:?}", got.map(|g| g.is_some())), Instant::now())
        });
        assert!(support::wait_until(Duration::from_secs(5), || servers
            .iter()
            .all(|s| queued(s) == 1)));
        servers[0].freeze();
        // The waiter's client fails a call to the frozen master.
        assert!(!probe.is_locked().unwrap());
        let failed = Instant::now();
        servers[0].thaw();
        let (got, gave_up) = waiter.join().unwrap();
        assert_eq!(got, "Ok(false)");
        // It left the queues within the second that acquisitions skip the master.
        let after = gave_up.checked_duration_since(failed);
        assert!(
            after.is_some_and(|a| a < Duration::from_millis(900)),
            "gave up {after:?} after the failure (None: before it)"
        );
    });
    assert_eq!(queued(&servers[0]), 0, "the entry was left on the master");
    held.unlock().expect("unlock");
}

/// A try that splits the masters with a holder of a quorum (one master freed under it)
/// gives up: after a few rounds when the holder's lease looks just granted (it may be
/// another try of the same moment), after one when it is clearly older. Either way it
/// returns `None` quickly and leaves the free master free.
#[test]
fn a_try_that_splits_with_a_real_holder_gives_up_soon() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let with_watchdog = |watchdog: Duration| -> Vec<Client> {
        servers
            .iter()
            .map(|s| support::client(&s.url(), PREFIX, watchdog, Duration::from_secs(2)))
            .collect()
    };
    let holders = with_watchdog(Duration::from_secs(5));
    let red = |cs: &[Client]| MultiLock::red_lock(cs.iter().map(|c| c.lock("split"))).unwrap();
    let held = red(&holders).lock().expect("hold");
    // Freed on one master: the holder keeps a quorum of two.
    assert!(holders[2].lock("split").force_unlock().unwrap());
    for (watchdog, at_most) in [(Duration::from_secs(5), 7), (Duration::from_secs(60), 1)] {
        let tries = with_watchdog(watchdog);
        let lock = red(&tries);
        // Warm: scripts loaded, connections pooled (a failed try, not counted).
        assert!(lock.try_lock().unwrap().is_none());
        let before = servers[2].command_calls();
        let t = Instant::now();
        assert!(lock.try_lock().unwrap().is_none());
        let took = t.elapsed();
        let after = servers[2].command_calls();
        let evalsha = after.get("evalsha").copied().unwrap_or(0)
            - before.get("evalsha").copied().unwrap_or(0);
        // Each round: an acquisition and its giving back.
        let rounds = evalsha / 2;
        eprintln!("a try with a lease of {watchdog:?}: {rounds} rounds in {took:?}");
        assert!(
            (1..=at_most).contains(&rounds),
            "{rounds} rounds against a holder (try's lease {watchdog:?})"
        );
        assert!(took < Duration::from_millis(250), "{took:?}");
        assert!(
            !exists(&servers[2], "split"),
            "the free master was left held"
        );
    }
    held.unlock().expect("unlock");
}
