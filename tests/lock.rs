//! End-to-end tests of `Lock` and `LockGuard` against real `redis-server` processes, one
//! per test, so the tests run in parallel and may kill connections or inspect the whole
//! keyspace without disturbing each other.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, ClientBuilder, Error, Lock};
use support::clients::Clients;
use support::keys::{Keys, DEFAULT_PREFIX};
use support::{free_port, wait_until, RedisServer};

/// The key of a lock named `name` (plain names, default prefix).
/// Clients whose command timeout is half their watchdog's, as it must be shorter.
fn with_watchdog(timeout: Duration) -> Clients {
    Clients::DEFAULT.watchdog(timeout).command(timeout / 2)
}

fn key_of(name: &str) -> Vec<u8> {
    Keys::lock(DEFAULT_PREFIX, name).key().into_bytes()
}

fn channel_of(name: &str) -> Vec<u8> {
    let mut channel = key_of(name);
    channel.extend_from_slice(b":to:");
    channel
}

fn pttl(con: &mut redis::Connection, key: &[u8]) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

/// The reentry counts stored in the lock hash, one per holder field.
fn hvals(con: &mut redis::Connection, key: &[u8]) -> Vec<i64> {
    redis::cmd("HVALS").arg(key).query(con).unwrap()
}

fn hkeys(con: &mut redis::Connection, key: &[u8]) -> Vec<String> {
    redis::cmd("HKEYS").arg(key).query(con).unwrap()
}

fn dbsize(con: &mut redis::Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).unwrap()
}

fn all_keys(con: &mut redis::Connection) -> Vec<Vec<u8>> {
    redis::cmd("KEYS").arg("*").query(con).unwrap()
}

/// Connections subscribed to `channel`.
/// Subscriptions to the lock's channels (`channel` is their common prefix).
fn numsub(con: &mut redis::Connection, channel: &[u8]) -> i64 {
    support::subscribers(con, channel)
}

/// Script executions so far (FCALL, or EVALSHA where functions are not used, plus EVAL
/// should the library ever fall back to it).
fn script_calls(server: &RedisServer) -> u64 {
    let calls = server.command_calls();
    ["fcall", "evalsha", "eval"]
        .iter()
        .map(|c| calls.get(*c).copied().unwrap_or(0))
        .sum()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn mutual_exclusion_across_threads_and_clients() {
    const CLIENTS: usize = 2;
    const THREADS: usize = 4;
    const N: usize = 50;
    let server = RedisServer::new();
    let inside = AtomicUsize::new(0);
    let overlaps = AtomicUsize::new(0);
    let barrier = Barrier::new(CLIENTS * THREADS);
    thread::scope(|s| {
        for _ in 0..CLIENTS {
            let client = Clients::DEFAULT.at(&server);
            for t in 0..THREADS {
                let lock = client.lock("counter");
                let (server, inside, overlaps, barrier) = (&server, &inside, &overlaps, &barrier);
                s.spawn(move || {
                    let mut con = server.connection();
                    barrier.wait();
                    for i in 0..N {
                        let guard = lock.lock().unwrap();
                        // Nested sections must not let anybody else in either.
                        let nested = ((i + t) % 5 == 0).then(|| lock.lock().unwrap());
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        // A deliberately non-atomic read-modify-write: any overlap loses
                        // an update.
                        let v: Option<i64> =
                            redis::cmd("GET").arg("counter").query(&mut con).unwrap();
                        thread::yield_now();
                        let _: () = redis::cmd("SET")
                            .arg("counter")
                            .arg(v.unwrap_or(0) + 1)
                            .query(&mut con)
                            .unwrap();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(nested);
                        if i % 2 == 0 {
                            guard.unlock().unwrap();
                        } else {
                            drop(guard);
                        }
                    }
                });
            }
        }
    });
    let mut con = server.connection();
    let counter: i64 = redis::cmd("GET").arg("counter").query(&mut con).unwrap();
    assert_eq!(counter, (CLIENTS * THREADS * N) as i64);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(!support::exists(&mut con, key_of("counter")));
}

/// Checks this thread's view and Redis's view of a hold of depth `n`.
fn assert_depth(lock: &Lock, client: &Client, con: &mut redis::Connection, n: u32) {
    let key = key_of("nested");
    assert_eq!(lock.hold_count().unwrap(), n);
    assert_eq!(lock.is_held_by_current_thread().unwrap(), n > 0);
    assert_eq!(lock.is_locked().unwrap(), n > 0);
    if n == 0 {
        assert!(!support::exists(con, &key));
    } else {
        assert_eq!(hvals(con, &key), vec![i64::from(n)]);
        let fields = hkeys(con, &key);
        assert!(
            fields[0].starts_with(&format!("{}:", client.id())),
            "{fields:?}"
        );
    }
}

#[test]
fn reentrancy_three_levels_deep() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = Clients::DEFAULT.at(&server);
    let other = Clients::DEFAULT.at(&server);
    let lock = client.lock("nested");
    let other_lock = other.lock("nested");

    let g1 = lock.lock().unwrap();
    assert_depth(&lock, &client, &mut con, 1);
    let g2 = lock.lock().unwrap();
    assert_depth(&lock, &client, &mut con, 2);
    let g3 = lock.try_lock().unwrap().expect("re-entry never waits");
    assert_depth(&lock, &client, &mut con, 3);
    // Another thread of the same client is not the holder.
    thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(lock.hold_count().unwrap(), 0);
            assert!(!lock.is_held_by_current_thread().unwrap());
            assert!(lock.try_lock().unwrap().is_none());
        });
    });
    drop(g3);
    assert_depth(&lock, &client, &mut con, 2);
    g2.unlock().unwrap();
    assert_depth(&lock, &client, &mut con, 1);
    assert!(other_lock.try_lock().unwrap().is_none());
    drop(g1);
    assert_depth(&lock, &client, &mut con, 0);

    // Out of order: the outermost guard first. The lock stays held until every level is.
    let g1 = lock.lock().unwrap();
    let g2 = lock.lock().unwrap();
    let g3 = lock.lock().unwrap();
    assert_depth(&lock, &client, &mut con, 3);
    g1.unlock().unwrap();
    assert_depth(&lock, &client, &mut con, 2);
    assert!(other_lock.try_lock().unwrap().is_none());
    drop(g3);
    assert_depth(&lock, &client, &mut con, 1);
    assert!(other_lock.try_lock().unwrap().is_none());
    // The watchdog lease survives out-of-order release.
    let left = lock.remaining_lease().unwrap().unwrap();
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(30),
        "{left:?}"
    );
    g2.unlock().unwrap();
    assert_depth(&lock, &client, &mut con, 0);
    let g = other_lock
        .try_lock()
        .unwrap()
        .expect("free after the last level");
    g.unlock().unwrap();
}

#[test]
fn waiters_blocked_until_the_outermost_release() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = Clients::DEFAULT.at(&server);
    let other = Clients::DEFAULT.at(&server);
    let lock = client.lock("outer");
    let other_lock = other.lock("outer");

    let g1 = lock.lock().unwrap();
    let g2 = lock.lock().unwrap();
    let g3 = lock.lock().unwrap();

    let (tx, rx) = mpsc::channel::<(&str, Instant)>();
    thread::scope(|s| {
        for (who, l) in [("same client", &lock), ("other client", &other_lock)] {
            let tx = tx.clone();
            s.spawn(move || {
                let guard = l.lock().unwrap();
                tx.send((who, Instant::now())).unwrap();
                guard.unlock().unwrap();
            });
        }
        // Both clients' pub/sub connections subscribed: both waiters are past their
        // first attempt.
        assert!(wait_until(Duration::from_secs(5), || {
            numsub(&mut con, &channel_of("outer")) >= 2
        }));
        for (level, guard) in [(3, g3), (2, g2)] {
            assert_eq!(lock.hold_count().unwrap(), level);
            drop(guard);
            assert!(other_lock.try_lock().unwrap().is_none());
            thread::scope(|s2| {
                s2.spawn(|| assert!(lock.try_lock().unwrap().is_none()));
            });
            // Give a wrongly woken waiter the chance to show itself.
            assert!(
                rx.recv_timeout(Duration::from_millis(150)).is_err(),
                "a waiter got the lock while {} level(s) were held",
                level - 1
            );
        }
        assert_eq!(lock.hold_count().unwrap(), 1);
        let released = Instant::now();
        g1.unlock().unwrap();
        for _ in 0..2 {
            let (who, at) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            let after = at.duration_since(released);
            assert!(after < Duration::from_secs(1), "{who} took {after:?}");
        }
    });
    assert!(!support::exists(&mut con, key_of("outer")));
}

#[test]
fn releasing_a_hold_that_is_gone_fails_with_lease_lost() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = Clients::DEFAULT.at(&server);
    let lock = client.lock("admin");

    assert!(!lock.force_unlock().unwrap());
    let guard = lock.lock().unwrap();
    assert!(lock.force_unlock().unwrap());
    assert!(!lock.force_unlock().unwrap());
    assert!(!support::exists(&mut con, key_of("admin")));
    assert_eq!(lock.hold_count().unwrap(), 0);
    // The force_unlock told the holder's client (or the release finds it gone): lost.
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));

    // A stale guard while another thread of the same client holds the lock.
    let stale = lock.lock().unwrap();
    let stale_nested = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(30)))
        .map(Option::unwrap)
        .unwrap();
    assert!(lock.force_unlock().unwrap());
    let (held_tx, held_rx) = mpsc::channel();
    let (check_tx, check_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let lock = &lock;
        let holder = s.spawn(move || {
            let guard = lock.lock().unwrap();
            held_tx.send(()).unwrap();
            check_rx.recv().unwrap();
            assert_eq!(lock.hold_count().unwrap(), 1);
            guard.unlock()
        });
        held_rx.recv().unwrap();
        assert!(matches!(
            stale_nested.unlock(),
            Err(Error::LeaseLost { .. })
        ));
        // Dropping a stale guard (best effort, logged) must not touch the new holder either.
        drop(stale);
        assert_eq!(hvals(&mut con, &key_of("admin")), vec![1]);
        check_tx.send(()).unwrap();
        holder.join().unwrap().unwrap();
    });
    assert!(!support::exists(&mut con, key_of("admin")));

    // Another client releasing a lock only this one holds.
    let other = Clients::DEFAULT.at(&server);
    let guard = lock.lock().unwrap();
    other.lock("admin").force_unlock().unwrap();
    let theirs = other.lock("admin").lock().unwrap();
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(other.lock("admin").hold_count().unwrap(), 1);
    theirs.unlock().unwrap();
}

#[test]
fn explicit_lease_expires_and_the_old_guard_cannot_release() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = Clients::DEFAULT.at(&server);
    let other = Clients::DEFAULT.at(&server);
    let lock = client.lock("lease");
    let key = key_of("lease");

    let start = Instant::now();
    let guard = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_millis(700)))
        .map(Option::unwrap)
        .unwrap();
    let left = lock.remaining_lease().unwrap().expect("held");
    assert!(
        left > Duration::ZERO && left <= Duration::from_millis(700),
        "{left:?}"
    );
    if start.elapsed() < Duration::from_millis(500) {
        assert!(!guard.is_lease_lost());
    }
    assert!(wait_until(Duration::from_secs(5), || !support::exists(
        &mut con, &key
    )));
    let gone = start.elapsed();
    assert!(
        gone >= Duration::from_millis(500) && gone <= Duration::from_secs(2),
        "key gone after {gone:?}"
    );
    assert!(guard.is_lease_lost());
    assert_eq!(lock.remaining_lease().unwrap(), None);

    let other_lock = other.lock("lease");
    let theirs = other_lock.try_lock().unwrap().expect("free after expiry");
    assert_eq!(other_lock.hold_count().unwrap(), 1);
    // The guard said its lease was lost: so does its unlock (issue 17, item 13).
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(other_lock.hold_count().unwrap(), 1);
    assert_eq!(hvals(&mut con, &key), vec![1]);
    assert!(pttl(&mut con, &key) > 0);
    theirs.unlock().unwrap();

    // The same thread taking the lock again after its lease ran out: the stale guard must
    // not take a level from the new hold.
    let stale = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_millis(300)))
        .map(Option::unwrap)
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || !support::exists(
        &mut con, &key
    )));
    let fresh = lock.lock().unwrap();
    // Taking it again showed the stale hold gone on the server: the guard says it was lost.
    assert!(stale.is_lease_lost());
    assert!(matches!(stale.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(lock.hold_count().unwrap(), 1);
    assert_eq!(hvals(&mut con, &key), vec![1]);
    fresh.unlock().unwrap();
    assert!(!support::exists(&mut con, &key));
}

#[test]
fn watchdog_keeps_a_lock_past_three_timeouts() {
    const TIMEOUT: Duration = Duration::from_millis(600);
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = with_watchdog(TIMEOUT).at(&server);
    let lock = client.lock("kept");
    let key = key_of("kept");

    let guard = lock.lock().unwrap();
    let start = Instant::now();
    // Time is the subject: sample the lease until well past 3x its length.
    while start.elapsed() < Duration::from_millis(2200) {
        let ttl = pttl(&mut con, &key);
        assert!(
            ttl > 0 && ttl <= 600,
            "PTTL {ttl} after {:?}",
            start.elapsed()
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert!(!guard.is_lease_lost());
    assert_eq!(lock.hold_count().unwrap(), 1);
    let left = lock.remaining_lease().unwrap().unwrap();
    assert!(left > Duration::ZERO && left <= TIMEOUT, "{left:?}");

    guard.unlock().unwrap();
    assert!(!support::exists(&mut con, &key));
    // A renewal round already under way may finish; after that, none may run.
    thread::sleep(TIMEOUT / 3);
    let before = script_calls(&server);
    thread::sleep(TIMEOUT);
    assert_eq!(script_calls(&server), before, "watchdog still renewing");
    assert!(!support::exists(&mut con, &key));
}

#[test]
fn watchdog_reports_a_lost_lease() {
    const TIMEOUT: Duration = Duration::from_millis(600);
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = with_watchdog(TIMEOUT).at(&server);
    let lock = client.lock("lost");

    let guard = lock.lock().unwrap();
    assert!(!guard.is_lease_lost());
    let _: () = redis::cmd("DEL")
        .arg(key_of("lost"))
        .query(&mut con)
        .unwrap();
    let start = Instant::now();
    assert!(
        wait_until(2 * TIMEOUT, || guard.is_lease_lost()),
        "not reported lost after {:?}",
        start.elapsed()
    );
    // Documented: once the watchdog found the lease gone, unlock reports LeaseLost.
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
    // The renewal never resurrected the key.
    assert!(!support::exists(&mut con, key_of("lost")));
    let g = Clients::DEFAULT
        .at(&server)
        .lock("lost")
        .try_lock()
        .unwrap();
    assert!(g.is_some());
}

#[test]
fn try_lock_for_gives_up_close_to_its_bound() {
    let (server, client) = Clients::DEFAULT.serve();
    let other = Clients::DEFAULT.at(&server);
    let lock = client.lock("bounded");
    let other_lock = other.lock("bounded");

    let past = Instant::now();
    let held = lock.lock().unwrap();

    let start = Instant::now();
    assert!(other_lock
        .try_lock_for(Duration::from_millis(400))
        .unwrap()
        .is_none());
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited <= Duration::from_millis(900),
        "{waited:?}"
    );

    // A deadline in the past is one attempt, like try_lock.
    let start = Instant::now();
    assert!(other_lock.try_lock_until(past).unwrap().is_none());
    assert!(other_lock.try_lock_for(Duration::ZERO).unwrap().is_none());
    assert!(start.elapsed() < Duration::from_millis(300));

    held.unlock().unwrap();
    let g = other_lock.try_lock_until(past).unwrap().expect("free");
    assert_eq!(other_lock.hold_count().unwrap(), 1);
    g.unlock().unwrap();
    let g = other_lock
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_until(past)
                .lease(Duration::from_secs(5)),
        )
        .unwrap()
        .expect("free");
    g.unlock().unwrap();
}

/// Holds `name` through `holder` with a 30 s lease, blocks a thread of `waiter` in
/// `lock()` on it, runs `meanwhile` once the waiter is subscribed, releases, and returns
/// how long after the release the waiter's `lock()` returned. The lease is long, so only
/// the release message (or a reconnect) can wake the waiter.
fn release_to_waiter(
    holder: &Client,
    waiter: &Client,
    con: &mut redis::Connection,
    name: &str,
    meanwhile: impl FnOnce(&mut redis::Connection),
) -> Duration {
    let guard = support::leased(&holder.lock(name), Duration::from_secs(30), "acquire");
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        let waiter_lock = waiter.lock(name);
        s.spawn(move || {
            let g = waiter_lock.lock().unwrap();
            tx.send(Instant::now()).unwrap();
            g.unlock().unwrap();
        });
        assert!(wait_until(Duration::from_secs(5), || {
            numsub(con, &channel_of(name)) >= 1
        }));
        meanwhile(con);
        assert!(rx.try_recv().is_err(), "acquired while held");
        let released = Instant::now();
        guard.unlock().unwrap();
        let woke = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        woke.duration_since(released)
    })
}

#[test]
fn a_waiter_wakes_promptly_on_release() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let (holder, waiter) = (Clients::DEFAULT.at(&server), Clients::DEFAULT.at(&server));
    let latency = release_to_waiter(&holder, &waiter, &mut con, "handoff", |_| {});
    assert!(latency < Duration::from_millis(300), "{latency:?}");
}

#[test]
fn invalid_names_and_durations_change_nothing() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = Clients::DEFAULT.at(&server);

    let empty = client.lock("");
    let now = Instant::now();
    let s = Duration::from_secs(1);
    let bad_name = |r: Result<(), Error>| assert!(matches!(r, Err(Error::InvalidName(_))), "{r:?}");
    bad_name(empty.lock().map(drop));
    bad_name(
        empty
            .try_lock_with(redmutex::LockOptions::new().lease(s))
            .map(Option::unwrap)
            .map(drop),
    );
    bad_name(empty.try_lock().map(drop));
    bad_name(empty.try_lock_for(s).map(drop));
    bad_name(empty.try_lock_until(now).map(drop));
    bad_name(
        empty
            .try_lock_with(redmutex::LockOptions::new().wait_for(s).lease(s))
            .map(drop),
    );
    bad_name(
        empty
            .try_lock_with(redmutex::LockOptions::new().wait_until(now).lease(s))
            .map(drop),
    );
    bad_name(empty.is_locked().map(drop));
    bad_name(empty.is_held_by_current_thread().map(drop));
    bad_name(empty.hold_count().map(drop));
    bad_name(empty.remaining_lease().map(drop));
    bad_name(empty.force_unlock().map(drop));
    assert_eq!(empty.name(), b"");

    let lock = client.lock("durations");
    let bad_arg =
        |r: Result<(), Error>| assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    bad_arg(
        lock.try_lock_with(redmutex::LockOptions::new().lease(Duration::ZERO))
            .map(Option::unwrap)
            .map(drop),
    );
    bad_arg(
        lock.try_lock_with(redmutex::LockOptions::new().lease(Duration::MAX))
            .map(Option::unwrap)
            .map(drop),
    );
    bad_arg(
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(s)
                .lease(Duration::ZERO),
        )
        .map(drop),
    );
    bad_arg(
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(s)
                .lease(Duration::MAX),
        )
        .map(drop),
    );
    bad_arg(
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_until(now)
                .lease(Duration::ZERO),
        )
        .map(drop),
    );

    let url = server.url();
    let builders: Vec<(&str, ClientBuilder)> = vec![
        ("pool_size 0", Client::builder().url(&url).pool_size(0)),
        (
            "zero watchdog",
            Client::builder().url(&url).watchdog_timeout(Duration::ZERO),
        ),
        (
            "huge watchdog",
            Client::builder().url(&url).watchdog_timeout(Duration::MAX),
        ),
        (
            "zero connect timeout",
            Client::builder().url(&url).connect_timeout(Duration::ZERO),
        ),
        (
            "zero command timeout",
            Client::builder().url(&url).command_timeout(Duration::ZERO),
        ),
        (
            "brace prefix",
            Client::builder().url(&url).key_prefix("a{b"),
        ),
        (
            "watchdog not longer than the command timeout",
            Client::builder()
                .url(&url)
                .watchdog_timeout(Duration::from_secs(1))
                .command_timeout(Duration::from_secs(1)),
        ),
        ("empty url", Client::builder().url("")),
        ("http url", Client::builder().url("http://127.0.0.1:6379/")),
        ("garbage url", Client::builder().url("not a url")),
    ];
    for (what, builder) in builders {
        let r = builder.build();
        assert!(
            matches!(
                r,
                Err(Error::InvalidArgument { .. } | Error::InvalidUrl { .. } | Error::Redis { .. })
            ),
            "{what}: {r:?}"
        );
    }

    assert_eq!(dbsize(&mut con), 0);
    assert_eq!(script_calls(&server), 0);

    // A wait too long for the clock is no error: it waits as long as it takes.
    let forever = lock
        .try_lock_for(Duration::MAX)
        .unwrap()
        .expect("free lock");
    forever.unlock().unwrap();
    let forever = lock
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::MAX)
                .lease(s),
        )
        .unwrap()
        .expect("free lock");
    forever.unlock().unwrap();

    // Any other byte string up to the longest allowed is a name: it locks, excludes and
    // unlocks (a longer one is refused, tests/names.rs).
    let other = Clients::DEFAULT.at(&server);
    let long = vec![b'n'; redmutex::MAX_NAME_LEN];
    let names: [&[u8]; 12] = [
        b"a\x00b\xff",
        b"line\nbreak\r\n",
        b"\t",
        &long,
        b"{",
        b"}",
        b"{}",
        b"}{",
        b"a{b}c",
        b"with spaces in it",
        "ünïcødé 🔒".as_bytes(),
        b"x}{y}",
    ];
    for name in names {
        let lock = client.lock(name);
        assert_eq!(lock.name(), name);
        let guard = lock.lock().unwrap();
        let nested = lock.lock().unwrap();
        let keys = all_keys(&mut con);
        assert_eq!(keys.len(), 1, "{name:?}: {keys:?}");
        assert!(contains(&keys[0], name), "{name:?}: {keys:?}");
        assert_eq!(hvals(&mut con, &keys[0]), vec![2]);
        assert!(other.lock(name).try_lock().unwrap().is_none(), "{name:?}");
        assert!(other.lock(name).is_locked().unwrap());
        drop(nested);
        guard.unlock().unwrap();
        assert_eq!(dbsize(&mut con), 0, "{name:?}");
    }
}

// Once failed: a name carrying a hash tag was used verbatim as the key, so "{a}" mapped
// to the key of the plain name "a" ("redmutex:{a}") and the two aliased.
#[test]
fn distinct_names_never_share_a_lock() {
    let (server, client) = Clients::DEFAULT.serve();
    let other = Clients::DEFAULT.at(&server);
    // Each pair differs as byte strings, so each is two independent locks.
    for (a, b) in [("a", "{a}"), ("orders", "{orders}")] {
        let guard = client.lock(a).lock().unwrap();
        let theirs = other.lock(b).try_lock().unwrap();
        assert!(theirs.is_some(), "holding {a:?} also locked {b:?}");
        drop(theirs);
        guard.unlock().unwrap();
    }
}

#[test]
fn guards_are_released_when_a_panic_unwinds() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = Clients::DEFAULT.at(&server);
    let other = Clients::DEFAULT.at(&server);
    let lock = client.lock("panicky");

    let (held_tx, held_rx) = mpsc::channel();
    let worker = {
        let lock = lock.clone();
        thread::spawn(move || {
            let _outer = lock
                .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(30)))
                .map(Option::unwrap)
                .unwrap();
            let _inner = lock.lock().unwrap();
            held_tx.send(lock.hold_count().unwrap()).unwrap();
            panic!("intentional panic while holding the lock");
        })
    };
    assert_eq!(held_rx.recv().unwrap(), 2);
    assert!(worker.join().is_err());
    // The leases had 30 s left: only the unwinding drops could have freed it.
    assert!(!support::exists(&mut con, key_of("panicky")));
    let g = other.lock("panicky").try_lock().unwrap();
    assert!(g.is_some());
}

#[test]
fn building_while_redis_is_down_succeeds_and_fails_on_use() {
    let port = free_port();
    let client = Client::builder()
        .url(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .build()
        .expect("building does not connect");
    let lock = client.lock("down");
    let start = Instant::now();
    let r = lock.lock();
    assert!(
        matches!(
            r,
            Err(Error::Pool { .. } | Error::Redis { .. } | Error::Timeout { .. })
        ),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(lock.try_lock().is_err());
    assert!(lock.is_locked().is_err());

    // Redis coming up later: the same client starts working.
    let port_arg = port.to_string();
    let server = RedisServer::with_args(&["--port", &port_arg]);
    assert!(wait_until(Duration::from_secs(5), || {
        matches!(lock.try_lock(), Ok(Some(_)))
    }));
    let g = lock.lock().unwrap();
    assert!(support::exists(&mut server.connection(), key_of("down")));
    g.unlock().unwrap();
}

#[test]
fn waiter_survives_its_pubsub_connection_being_killed() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let (holder, waiter) = (Clients::DEFAULT.at(&server), Clients::DEFAULT.at(&server));
    // Released while the waiter's subscription is (probably) gone: the release message
    // may never reach it, so the reconnect itself must make it look again.
    let latency = release_to_waiter(&holder, &waiter, &mut con, "resub", |con| {
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(con)
            .unwrap();
        // The waiter's, and the holder's once its reader is up (a client listens on its
        // own channel while it holds anything).
        assert!((1..=2).contains(&killed), "{killed}");
    });
    assert!(latency < Duration::from_secs(3), "{latency:?}");
    // And the reconnected subscription serves the next wait as usual.
    let latency = release_to_waiter(&holder, &waiter, &mut con, "resub", |_| {});
    assert!(latency < Duration::from_secs(1), "{latency:?}");
}

#[test]
fn debug_output_hides_the_password() {
    const SECRET: &str = "hunter2-s3cret";
    for url in [
        format!("redis://user:{SECRET}@127.0.0.1:6379/0"),
        format!("redis://:{SECRET}@127.0.0.1:6379/"),
        format!("redis://{SECRET}@127.0.0.1/"),
    ] {
        let builder = Client::builder().url(&url);
        let shown = format!("{builder:?}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
        let client = builder.build().unwrap();
        let shown = format!("{client:?} {:?}", client.lock("x"));
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
    }
    let err = Client::open(format!("redis://user:{SECRET}@127.0.0.1:notaport/")).unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(SECRET), "{shown}");
}

#[test]
fn handles_are_clone_send_sync() {
    fn assert_clone_send_sync<T: Clone + Send + Sync + 'static>() {}
    fn assert_error<T: std::error::Error + Send + Sync + 'static>() {}
    assert_clone_send_sync::<Client>();
    assert_clone_send_sync::<Lock>();
    assert_error::<Error>();
}

#[test]
fn one_release_wakes_one_waiting_thread_per_process() {
    let (server, holder) = Clients::DEFAULT.serve();
    let waiters = Clients::DEFAULT.at(&server);
    // Load the scripts, so that no NOSCRIPT retry shows up in the counts below.
    holder.lock("herd").lock().unwrap().unlock().unwrap();
    // And the renewal script, with which the hold handed to the waiter is confirmed or
    // extended.
    let _: String = redis::Script::new(support::manifest::RENEW.text)
        .prepare_invoke()
        .load(&mut server.connection())
        .unwrap();
    let guard = support::leased(&holder.lock("herd"), Duration::from_secs(30), "acquire");
    let before = script_calls(&server);
    let (acquired_tx, acquired) = mpsc::channel();
    let (release_tx, release_rx) = shared_channel();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let lock = waiters.lock("herd");
            let (acquired_tx, release_rx) = (acquired_tx.clone(), release_rx.clone());
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                acquired_tx.send(()).unwrap();
                // Bounded, so that a failed assertion below cannot hang the test.
                let _ = release_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(10));
                g.unlock().unwrap();
            })
        })
        .collect();
    // Each waiter tries, subscribes, tries again (a thread starting once the process's
    // subscription is confirmed queues with its first try), then sleeps in the queue (30 s
    // of lease left). All three queued is the signal: how many tried twice is scheduling.
    let mut con = server.connection();
    let queued = wait_until(Duration::from_secs(5), || {
        redis::cmd("LLEN")
            .arg(Keys::lock(DEFAULT_PREFIX, "herd").queue())
            .query::<i64>(&mut con)
            .unwrap()
            == 3
    });
    assert!(queued, "the waiters never queued");
    let asleep = script_calls(&server);
    assert!(
        (before + 3..=before + 6).contains(&asleep),
        "{} attempts by 3 waiters: one or two each",
        asleep - before
    );
    // Then they sleep: nothing runs for a while.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        script_calls(&server),
        asleep,
        "the waiters must sleep, not poll"
    );

    guard.unlock().unwrap();
    acquired.recv_timeout(Duration::from_secs(5)).unwrap();
    // The others stay asleep: no thundering herd inside one process.
    let herd = acquired.recv_timeout(Duration::from_millis(300));
    let calls = script_calls(&server);
    for _ in 0..3 {
        release_tx.send(()).unwrap();
    }
    assert!(
        herd.is_err(),
        "a second waiter got the lock while the first held it"
    );
    // The waiter takes its grant without a confirmation (the grant's server time shows it
    // fresh); the watchdog extends it a third into the window, about when this count is
    // taken, so that one renewal may or may not be in.
    assert!(
        (asleep + 1..=asleep + 2).contains(&calls),
        "{} calls: the release, which hands the lock to the first waiter (queued longer \
         than the starvation bound), and at most the watchdog's one extension of that \
         waiter's hold: nothing else",
        calls - asleep
    );
    for t in threads {
        t.join().unwrap();
    }
    assert!(!holder.lock("herd").is_locked().unwrap());
}

type Shared<T> = std::sync::Arc<std::sync::Mutex<mpsc::Receiver<T>>>;

/// An mpsc channel whose receiving end several threads can share.
fn shared_channel() -> (mpsc::Sender<()>, Shared<()>) {
    let (tx, rx) = mpsc::channel();
    (tx, std::sync::Arc::new(std::sync::Mutex::new(rx)))
}

#[test]
fn nested_fixed_and_watchdog_leases_restore_each_other() {
    const WATCHDOG: Duration = Duration::from_millis(600);
    let server = RedisServer::new();
    let mut con = server.connection();
    let client = with_watchdog(WATCHDOG).at(&server);
    let lock = client.lock("mixed");
    let key = key_of("mixed");

    // Fixed outer lease, watchdog inner level: renewed while the inner level lives.
    let outer = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(20)))
        .map(Option::unwrap)
        .unwrap();
    assert!(pttl(&mut con, &key) > 10_000);
    let inner = lock.lock().unwrap();
    // The key's expiry is the longest lease a held level needs: re-entry never cuts it.
    assert!(
        pttl(&mut con, &key) > 10_000,
        "re-entry kept the outer level's longer lease"
    );
    thread::sleep(WATCHDOG * 2); // time is the subject: renewals must keep it alive
    assert!(
        support::exists(&mut con, &key),
        "the watchdog level kept the lock"
    );
    drop(inner);
    // Back to the outer level's lease: fixed, not renewed.
    let left = pttl(&mut con, &key);
    assert!(
        left > 10_000 && left <= 20_000,
        "outer lease restored: {left} ms"
    );
    outer.unlock().unwrap();

    // Watchdog outer, fixed inner: dropping the inner level hands back to the watchdog.
    let outer = lock.lock().unwrap();
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(20)))
        .map(Option::unwrap)
        .unwrap();
    assert!(pttl(&mut con, &key) > 10_000);
    drop(inner);
    assert!(pttl(&mut con, &key) <= 600, "watchdog lease restored");
    thread::sleep(WATCHDOG * 2);
    assert!(support::exists(&mut con, &key), "still renewed");
    assert!(!outer.is_lease_lost());
    outer.unlock().unwrap();
    assert!(!support::exists(&mut con, &key));
}

#[test]
fn a_bounded_wait_with_an_explicit_lease_gets_that_lease() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let (holder, waiter) = (Clients::DEFAULT.at(&server), Clients::DEFAULT.at(&server));
    let held = support::leased(
        &holder.lock("bounded"),
        Duration::from_millis(400),
        "acquire",
    );
    let t = Instant::now();
    // Waits for the holder's lease to run out (it never releases), then holds for 5 s.
    let guard = waiter
        .lock("bounded")
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::from_secs(5))
                .lease(Duration::from_secs(5)),
        )
        .unwrap()
        .expect("acquired once the holder's lease ran out");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let left = pttl(&mut con, &key_of("bounded"));
    assert!(left > 4_000 && left <= 5_000, "{left} ms");
    // Its fixed lease ran out: the guard says lost (issue 17, item 13).
    assert!(matches!(held.unlock(), Err(Error::LeaseLost { .. })));
    guard.unlock().unwrap();
}
