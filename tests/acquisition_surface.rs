//! The acquisition surface of issue 27: every lock-like type's four lock_api names plus one
//! taking `LockOptions` (a fixed lease, a wait, a cancellation token, permits), the owned
//! form with the same names, the read-write lock's std-style guards, and the Redisson
//! names users bring (`try_set_permits`).

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redmutex::{CancellationToken, Error, Kind, Lock, LockOptions};
use support::{Clients, Keys, RedisServer};

const WATCHDOG: Duration = Duration::from_millis(1500);
/// The margin on time bounds: generous for a loaded 2-core machine.
const MARGIN: Duration = Duration::from_millis(400);

const CLIENTS: Clients = Clients::new("s:")
    .watchdog(WATCHDOG)
    .command(Duration::from_millis(500));

fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

/// Takes `lock` with a fixed lease through the options, and checks the lease is that one
/// (not the watchdog's) and that a second client cannot have it meanwhile.
fn fixed_lease_through_options<K: Kind>(
    server: &RedisServer,
    lock: &Lock<K>,
    other: &Lock<K>,
    key: &str,
) {
    let lease = Duration::from_millis(700);
    let guard = lock
        .try_lock_with(LockOptions::new().lease(lease))
        .unwrap()
        .expect("no wait bound: held");
    let left = pttl(server, key);
    assert!(
        left > 0 && left <= 700,
        "{}: the key's lease is the fixed one, not the watchdog's: {left} ms",
        K::NAME
    );
    if K::NAME != "ReadLock" {
        assert!(other.try_lock().unwrap().is_none(), "{}: held", K::NAME);
    }
    guard.unlock().unwrap();
}

#[test]
fn every_kind_takes_a_fixed_lease_through_the_options() {
    let server = RedisServer::new();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    fixed_lease_through_options(
        &server,
        &a.lock("l"),
        &b.lock("l"),
        &Keys::lock("s:", "l").key(),
    );
    fixed_lease_through_options(
        &server,
        &a.fair_lock("f"),
        &b.fair_lock("f"),
        &Keys::lock("s:", "f").key(),
    );
    fixed_lease_through_options(
        &server,
        &a.fenced_lock("x"),
        &b.fenced_lock("x"),
        &Keys::lock("s:", "x").key(),
    );
    let (rw_a, rw_b) = (a.read_write_lock("rw"), b.read_write_lock("rw"));
    let rw_key = &Keys::rw("s:", "rw").key();
    fixed_lease_through_options(&server, &rw_a.write_lock(), &rw_b.write_lock(), rw_key);
    fixed_lease_through_options(&server, &rw_a.read_lock(), &rw_b.read_lock(), rw_key);
    fixed_lease_through_options(
        &server,
        &rw_a.upgradeable_lock(),
        &rw_b.upgradeable_lock(),
        rw_key,
    );
}

#[test]
fn the_owned_form_has_the_same_names_and_its_guards_move() {
    let server = RedisServer::new();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    let owned = a.lock("o").owned();
    let other = b.lock("o");

    let guard = owned.lock().unwrap();
    assert!(
        owned.try_lock().unwrap().is_none(),
        "an owned hold is not reentrant"
    );
    assert!(other.try_lock().unwrap().is_none());
    thread::spawn(move || guard.unlock())
        .join()
        .unwrap()
        .unwrap();

    let guard = owned.try_lock().unwrap().expect("free");
    drop(guard);
    let guard = owned
        .try_lock_for(Duration::from_millis(100))
        .unwrap()
        .expect("free");
    drop(guard);
    let guard = owned
        .try_lock_until(Instant::now() + Duration::from_millis(100))
        .unwrap()
        .expect("free");
    drop(guard);

    let lease = Duration::from_millis(700);
    let guard = owned
        .try_lock_with(LockOptions::new().lease(lease).wait_for(Duration::ZERO))
        .unwrap()
        .expect("free");
    let left = pttl(&server, &Keys::lock("s:", "o").key());
    assert!(left > 0 && left <= 700, "the fixed lease: {left} ms");
    // Moved to another thread, its fixed lease runs out there and it says so.
    let lost = thread::spawn(move || {
        let _ = guard.lost().recv_timeout(Duration::from_secs(3));
        (guard.is_lease_lost(), guard.unlock())
    })
    .join()
    .unwrap();
    assert!(lost.0, "the fixed lease ran out");
    assert!(
        matches!(lost.1, Err(Error::LeaseLost { .. })),
        "{:?}",
        lost.1
    );
}

#[test]
fn a_wait_in_the_options_is_measured_from_each_call() {
    let server = RedisServer::new();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    let _held = b.lock("w").lock().unwrap();
    let options = LockOptions::new().wait_for(Duration::from_millis(300));
    for round in 0..2 {
        let started = Instant::now();
        assert!(a
            .lock("w")
            .try_lock_with(options.clone())
            .unwrap()
            .is_none());
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(300) + MARGIN,
            "round {round}: waited {waited:?} for a 300 ms wait"
        );
    }
    // A deadline already past makes one attempt.
    let started = Instant::now();
    let past = LockOptions::new().wait_until(Instant::now());
    assert!(a.lock("w").try_lock_with(past).unwrap().is_none());
    assert!(started.elapsed() < MARGIN);
}

#[test]
fn bad_options_are_refused_before_anything_is_sent() {
    let server = RedisServer::new();
    let client = CLIENTS.at(&server);
    // Setup traffic (connections, script loading) first, so that the count below is ours.
    drop(client.lock("warm").lock().unwrap());
    let before = server.total_calls();
    let lock = client.lock("bad");
    let refusals = [
        lock.try_lock_with(LockOptions::new().lease(Duration::ZERO))
            .map(drop),
        lock.try_lock_with(LockOptions::new().permits(2)).map(drop),
        lock.owned()
            .try_lock_with(LockOptions::new().permits(0))
            .map(drop),
        client
            .semaphore("bad", 4)
            .try_acquire_with(LockOptions::new().permits(0))
            .map(drop),
        client
            .semaphore("bad", 4)
            .try_acquire_with(LockOptions::new().lease(Duration::from_secs(3650 * 86_400 * 2)))
            .map(drop),
    ];
    for (i, r) in refusals.into_iter().enumerate() {
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "refusal {i}: {r:?}"
        );
    }
    // `total_calls` itself is one command (INFO), counted after its reply.
    assert_eq!(server.total_calls(), before + 1, "nothing was sent");
}

#[test]
fn a_semaphore_takes_permits_a_lease_and_a_token_through_the_options() {
    let server = RedisServer::new();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    let sem = a.semaphore("gpus", 4);
    let three = sem
        .try_acquire_with(
            LockOptions::new()
                .permits(3)
                .lease(Duration::from_millis(800)),
        )
        .unwrap()
        .expect("free");
    assert_eq!(three.permits(), 3);
    assert_eq!(sem.available_permits().unwrap(), 1);

    // Two more permits wait; a cancel stops the wait and leaves nothing held.
    let token = CancellationToken::new();
    let waiter = {
        let sem = b.semaphore("gpus", 4);
        let options = LockOptions::new().permits(2).cancellable(&token);
        thread::spawn(move || sem.try_acquire_with(options).map(|p| p.is_some()))
    };
    assert!(
        support::wait_until(Duration::from_secs(5), || {
            redis::cmd("LLEN")
                .arg(Keys::sem("s:", "gpus").queue())
                .query::<i64>(&mut server.connection())
                .unwrap()
                == 1
        }),
        "the waiter queued"
    );
    token.cancel();
    let result = waiter.join().unwrap();
    assert!(matches!(result, Err(Error::Cancelled { .. })), "{result:?}");
    assert_eq!(
        sem.available_permits().unwrap(),
        1,
        "the cancelled wait holds nothing"
    );

    // The fixed lease runs out: the permits come back without a release.
    let lost = three.lost();
    assert!(
        lost.recv_timeout(Duration::from_millis(800) + Duration::from_secs(2))
            .is_ok(),
        "told of the loss"
    );
    assert!(support::wait_until(Duration::from_secs(3), || {
        sem.available_permits().unwrap() == 4
    }));
}

#[test]
fn try_set_permits_defines_only_a_semaphore_not_defined_yet() {
    let server = RedisServer::new();
    let client = CLIENTS.at(&server);
    let sem = client.semaphore("slots", 1);
    assert!(sem.try_set_permits(3).unwrap(), "a fresh name is defined");
    assert_eq!(sem.permits().unwrap(), 3);
    assert!(!sem.try_set_permits(5).unwrap(), "defined already");
    assert_eq!(sem.permits().unwrap(), 3, "unchanged");
    // A name defined by its first use is defined too.
    let used = client.semaphore("used", 2);
    drop(used.acquire().unwrap());
    assert!(!used.try_set_permits(7).unwrap());
    assert_eq!(used.permits().unwrap(), 2);
    assert!(matches!(
        sem.try_set_permits(0),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(sem.permits().unwrap(), 3);
}

#[test]
fn read_and_write_return_guards_as_std_does() {
    let server = RedisServer::new();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    let (rw_a, rw_b) = (a.read_write_lock("cfg"), b.read_write_lock("cfg"));

    let r1 = rw_a.read().unwrap();
    let r2 = thread::spawn({
        let rw_b = rw_b.clone();
        move || rw_b.try_read().unwrap().is_some()
    })
    .join()
    .unwrap();
    assert!(r2, "readers share");
    assert!(
        rw_b.try_write().unwrap().is_none(),
        "no writer beside a reader"
    );
    let started = Instant::now();
    assert!(rw_b
        .try_write_for(Duration::from_millis(200))
        .unwrap()
        .is_none());
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(rw_b
        .try_write_until(Instant::now() + Duration::from_millis(50))
        .unwrap()
        .is_none());
    r1.unlock().unwrap();

    let w = rw_b.write().unwrap();
    assert!(
        rw_a.try_read().unwrap().is_none(),
        "no reader beside a writer"
    );
    assert!(rw_a
        .try_read_for(Duration::from_millis(100))
        .unwrap()
        .is_none());
    assert!(rw_a
        .try_read_until(Instant::now() + Duration::from_millis(50))
        .unwrap()
        .is_none());
    // The writer's own thread may read (downgrade).
    let downgrade = rw_b.read().unwrap();
    w.unlock().unwrap();
    assert!(
        rw_a.try_read().unwrap().is_some(),
        "readers come in after the write"
    );
    downgrade.unlock().unwrap();
    let w = rw_a.try_write().unwrap().expect("free");
    w.unlock().unwrap();
}

/// The everyday tasks of issue 27 written as a std, parking_lot or tokio-util user guesses
/// them, where the guess is now the call (the others are led there by the compiler's
/// "a method with a similar name" or by rustdoc's aliases: see the CHANGELOG).
#[test]
fn the_guesses_users_bring_compile_and_do_what_they_say() {
    let server = RedisServer::new();
    let client = CLIENTS.at(&server);

    // std's RwLock::read()/write() return guards.
    let rw = client.read_write_lock("g-rw");
    let reading = rw.read().unwrap();
    // As with std, writing while this thread reads never waits for itself.
    assert!(matches!(rw.try_write(), Err(Error::WouldDeadlock { .. })));
    drop(reading);
    drop(rw.write().unwrap());
    // Redisson's readLock() is the side as a handle.
    assert_eq!(rw.read_lock().hold_count().unwrap(), 0);

    // tokio-util's name, and a cancellable wait that returns Option.
    let token = CancellationToken::new();
    let lock = client.lock("g-lock");
    let guard: Option<redmutex::LockGuard> = lock
        .try_lock_with(LockOptions::new().cancellable(&token))
        .unwrap();
    // The owned form: a hold that moves into a thread.
    drop(guard);
    let owned = lock.owned().lock().unwrap();
    thread::spawn(move || owned.unlock())
        .join()
        .unwrap()
        .unwrap();

    // Redisson's trySetPermits(3) sets an undefined semaphore only.
    let sem = client.semaphore("g-sem", 1);
    assert!(sem.try_set_permits(3).unwrap());
    assert_eq!(sem.available_permits().unwrap(), 3);
}
