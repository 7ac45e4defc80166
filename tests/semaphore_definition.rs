//! A semaphore's definition, its number of permits in Redis (issue 38): it lives while the
//! semaphore is used and `expire_after` past its last use (never while a permit is held),
//! so names made per entity do not grow Redis without bound; no key a semaphore writes is
//! left without an expiry; and a handle made with a number of permits the semaphore was
//! neither made with nor has now is refused with a typed error naming both, changing
//! nothing. Each on FCALL and on EVALSHA (`use_functions(false)`, Redis 6.2's only way).

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Error, LockOptions, Semaphore};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const PREFIX: &str = "semdef:";

/// The watchdog lease of these tests' clients: renewed a third into it.
const LEASE: Duration = Duration::from_secs(2);
/// How long a definition outlives its last use here.
const IDLE: Duration = Duration::from_secs(1);

fn clients(functions: bool) -> Clients {
    Clients::new(PREFIX).scaled(LEASE).functions(functions)
}

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

fn definition(name: &str) -> String {
    Keys::sem(PREFIX, name).permits()
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.connection())
        .expect("PTTL")
}

/// The definition's and the holds' PTTL, read together.
fn pttls(server: &RedisServer, name: &str) -> (i64, i64) {
    redis::pipe()
        .atomic()
        .cmd("PTTL")
        .arg(definition(name))
        .cmd("PTTL")
        .arg(Keys::sem(PREFIX, name).key())
        .query(&mut server.connection())
        .expect("PTTL")
}

/// Every key of the tests' prefix, sorted.
fn all_keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}*"))
        .query(&mut server.connection())
        .expect("KEYS");
    keys.sort();
    keys
}

/// Every key of the prefix with its serialized value (no expiry in it), sorted.
fn snapshot(server: &RedisServer) -> Vec<(String, Vec<u8>)> {
    let mut con = server.connection();
    all_keys(server)
        .into_iter()
        .map(|k| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut con).expect("DUMP");
            (k, dump)
        })
        .collect()
}

/// The keys of the prefix that have no expiry.
fn without_expiry(server: &RedisServer) -> Vec<String> {
    all_keys(server)
        .into_iter()
        .filter(|k| pttl(server, k) == -1)
        .collect()
}

/// Waits (polling EXISTS, which expires a key the instant its time is up) until `key`
/// is gone; the time that took, or `None` after `within`.
fn gone_after(server: &RedisServer, key: &str, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut con = server.connection();
    while start.elapsed() < within {
        if !support::exists(&mut con, key) {
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(10));
    }
    None
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new().permits(n)
}

/// Acquire/release cycles leave the definition with an expiry of `expire_after` past the
/// last lease it gave (the release ends that lease, so no more than that): it is gone
/// `expire_after` after the last release at the earliest, a lease later at the latest,
/// and then no key of the semaphore is left.
fn the_definition_expires_after_its_last_use(functions: bool) {
    const NAME: &str = "cycles";
    let server = RedisServer::new();
    let c = clients(functions).at(&server);
    let sem = c.semaphore(NAME, 3).with_expire_after(IDLE).unwrap();
    for _ in 0..5 {
        sem.acquire().unwrap().release().unwrap();
        let two = sem.try_acquire_with(permits(2)).unwrap().expect("no wait");
        assert_eq!(sem.available_permits().unwrap(), 1);
        drop(two);
    }
    let released = Instant::now();
    let left = pttl(&server, &definition(NAME));
    assert!(
        left > ms(IDLE) - 100 && left <= ms(IDLE + LEASE),
        "after acquire/release cycles the definition expires in {left} ms, not within \
         ({IDLE:?}, {IDLE:?} + the lease {LEASE:?}]"
    );
    assert_eq!(
        all_keys(&server),
        [definition(NAME)],
        "nothing is held: only the definition is left"
    );
    gone_after(
        &server,
        &definition(NAME),
        IDLE + LEASE + Duration::from_secs(2),
    )
    .expect("the definition outlived expire_after and a lease past its last use");
    let gone = released.elapsed();
    assert!(
        gone >= IDLE - Duration::from_millis(100),
        "the definition went {gone:?} after the last release, before expire_after ({IDLE:?})"
    );
    assert!(
        all_keys(&server).is_empty(),
        "keys left: {:?}",
        all_keys(&server)
    );
    eprintln!("definition: {left} ms left after the last release, gone {gone:?} after it");
    // Used again, it is made anew with the handle's number.
    assert_eq!(sem.permits().unwrap(), 3);
}

#[test]
fn the_definition_expires_after_its_last_use_on_fcall() {
    the_definition_expires_after_its_last_use(true);
}

#[test]
fn the_definition_expires_after_its_last_use_on_evalsha() {
    the_definition_expires_after_its_last_use(false);
}

/// A handle made without `with_expire_after` keeps the definition a day past its last
/// use (`Semaphore::DEFAULT_EXPIRE_AFTER`), and says so.
#[test]
fn the_default_expiry_is_a_day() {
    let server = RedisServer::new();
    let c = clients(true).at(&server);
    let sem = c.semaphore("daily", 2);
    assert_eq!(
        Semaphore::DEFAULT_EXPIRE_AFTER,
        Duration::from_secs(24 * 3600)
    );
    drop(sem.acquire().unwrap());
    let left = pttl(&server, &definition("daily"));
    let day = ms(Semaphore::DEFAULT_EXPIRE_AFTER);
    assert!(
        left > day - 60_000 && left <= day + ms(LEASE),
        "the default definition expires in {left} ms"
    );
    assert!(
        format!("{sem:?}").contains("expire_after: 86400s"),
        "{sem:?}"
    );
}

/// While a permit is held (renewed by the watchdog across twice its lease, or a fixed
/// lease longer than `expire_after`), the definition never expires: it outlives the
/// holds by `expire_after` at every look. Released, it goes `expire_after` to
/// `expire_after` and a lease later.
fn a_held_semaphore_keeps_its_definition(functions: bool) {
    const NAME: &str = "held";
    let server = RedisServer::new();
    let c = clients(functions).at(&server);
    let sem = c.semaphore(NAME, 2).with_expire_after(IDLE).unwrap();
    let permit = sem.acquire().unwrap();
    let start = Instant::now();
    let mut looks = 0;
    let mut least = i64::MAX;
    while start.elapsed() < 2 * LEASE {
        let (def, holds) = pttls(&server, NAME);
        assert!(
            holds > 0,
            "the held permit's holds lapsed ({holds}) at {:?}",
            start.elapsed()
        );
        assert!(
            def >= holds + ms(IDLE) - 50 && def <= ms(LEASE + IDLE) + 50,
            "at {:?} with a permit held the definition expires in {def} ms, the holds in \
             {holds} ms: not expire_after ({IDLE:?}) past them",
            start.elapsed()
        );
        least = least.min(def);
        looks += 1;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(looks >= 20, "only {looks} looks in {:?}", 2 * LEASE);
    assert!(!permit.is_lease_lost());
    // A fixed lease longer than expire_after and the watchdog's.
    let long = Duration::from_secs(5);
    let fixed = sem
        .try_acquire_with(permits(1).lease(long))
        .unwrap()
        .expect("no wait");
    let (def, holds) = pttls(&server, NAME);
    assert!(
        holds > ms(long) - 500 && def >= holds + ms(IDLE) - 50 && def <= ms(long + IDLE),
        "with a {long:?} lease held: definition {def} ms, holds {holds} ms"
    );
    fixed.release().unwrap();
    permit.release().unwrap();
    let released = Instant::now();
    gone_after(
        &server,
        &definition(NAME),
        long + IDLE + Duration::from_secs(2),
    )
    .expect("the definition stayed");
    let gone = released.elapsed();
    assert!(
        gone >= IDLE - Duration::from_millis(100),
        "the definition went {gone:?} after the last release, before expire_after ({IDLE:?})"
    );
    assert!(all_keys(&server).is_empty(), "{:?}", all_keys(&server));
    eprintln!(
        "held {:?}: the definition's least PTTL {least} ms; gone {gone:?} after the release",
        2 * LEASE
    );
}

#[test]
fn a_held_semaphore_keeps_its_definition_on_fcall() {
    a_held_semaphore_keeps_its_definition(true);
}

#[test]
fn a_held_semaphore_keeps_its_definition_on_evalsha() {
    a_held_semaphore_keeps_its_definition(false);
}

/// `expire_after` under a second (a handed-over permit's pickup window, which the
/// definition must outlive) or over ten years is refused at once.
#[test]
fn an_expiry_out_of_range_is_refused() {
    let server = RedisServer::new();
    let c = clients(true).at(&server);
    let sem = c.semaphore("range", 2);
    for bad in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(10 * 365 * 24 * 3600 + 1),
    ] {
        match sem.with_expire_after(bad) {
            Err(Error::InvalidArgument { reason, lock, .. }) => {
                assert!(reason.contains("expire_after"), "{reason}");
                assert_eq!(lock.as_deref(), Some("range"));
            }
            other => panic!("with_expire_after({bad:?}): {other:?}"),
        }
    }
    assert!(sem.with_expire_after(Duration::from_secs(1)).is_ok());
    assert!(
        all_keys(&server).is_empty(),
        "a refused setting wrote something"
    );
}

/// Whether `r` is the refusal of a handle made with `made` permits on a semaphore that has
/// `has` (and was made with `defined`).
fn assert_refused<T: std::fmt::Debug>(r: Result<T, Error>, has: u32, defined: u32, made: u32) {
    match r {
        Err(Error::InvalidArgument { reason, lock, .. }) => {
            assert!(
                reason.contains(&format!("has {has} permits"))
                    && reason.contains(&format!("made with {made}")),
                "{reason}"
            );
            if has != defined {
                assert!(
                    reason.contains(&format!("defined with {defined}")),
                    "{reason}"
                );
            }
            assert!(lock.is_some(), "the error names the semaphore");
        }
        other => panic!("a handle made with {made} on {has} (defined with {defined}): {other:?}"),
    }
}

/// A handle made with 5 on a name defined with 3 is refused at every acquisition with
/// `InvalidArgument` naming both numbers, and nothing changes (not even the definition's
/// expiry); reading the number is no acquisition. Handles made with the number the
/// semaphore was defined with keep working after an operator changes it, and so do
/// handles made with its number now. `try_set_permits` defines it as a first use does.
fn another_number_is_refused(functions: bool) {
    const NAME: &str = "counted";
    let server = RedisServer::new();
    let c = clients(functions).at(&server);
    let three = c.semaphore(NAME, 3);
    // A fixed lease: no renewal changes the keys while they are compared.
    let held = three
        .try_acquire_with(permits(1).lease(Duration::from_secs(30)))
        .unwrap()
        .expect("no wait");
    let five = clients(functions).at(&server).semaphore(NAME, 5);
    let before = snapshot(&server);
    let def_before = pttl(&server, &definition(NAME));
    assert_refused(five.acquire(), 3, 3, 5);
    assert_refused(five.try_acquire(), 3, 3, 5);
    assert_refused(five.try_acquire_for(Duration::from_millis(50)), 3, 3, 5);
    assert_refused(five.try_acquire_with(permits(2).lease(LEASE)), 3, 3, 5);
    assert_eq!(
        snapshot(&server),
        before,
        "a refused acquisition changed something"
    );
    assert!(pttl(&server, &definition(NAME)) <= def_before);
    assert_eq!(five.permits().unwrap(), 3, "reading is no acquisition");
    assert_eq!(five.available_permits().unwrap(), 2);

    // The operators' tools change the number; the handles made with the number the
    // semaphore was defined with keep working, and so do those made with the new one.
    assert_eq!(five.add_permits(1).unwrap(), 4);
    let four = c.semaphore(NAME, 4);
    let p4 = four.acquire().unwrap();
    let p3 = three.acquire().unwrap();
    assert_refused(five.acquire(), 4, 3, 5);
    assert_eq!(three.available_permits().unwrap(), 1);
    // The definition keeps the number it was defined with beside the number now.
    let stored: String = support::query_key(&mut server.connection(), "GET", definition(NAME));
    assert_eq!(stored, "4 3");
    assert_eq!(three.reduce_permits(1).unwrap(), 3);
    let stored: String = support::query_key(&mut server.connection(), "GET", definition(NAME));
    assert_eq!(stored, "3 3");
    assert_refused(four.try_acquire(), 3, 3, 4);
    drop((held, p3, p4));
    five.set_permits(5).unwrap();
    let p5 = five.acquire().unwrap();
    assert_eq!(five.available_permits().unwrap(), 4);
    drop(p5);

    // try_set_permits defines a fresh name as a first use does.
    let one = c.semaphore("slots", 1);
    assert!(one.try_set_permits(3).unwrap());
    assert_refused(one.acquire(), 3, 3, 1);
    drop(c.semaphore("slots", 3).acquire().unwrap());
}

#[test]
fn another_number_is_refused_on_fcall() {
    another_number_is_refused(true);
}

#[test]
fn another_number_is_refused_on_evalsha() {
    another_number_is_refused(false);
}

/// A waiter whose handle's number an operator's change left neither the number the
/// semaphore was defined with nor its number now is refused at its next attempt (when
/// the fixed lease it waited behind ends) and leaves the queue.
#[test]
fn a_waiter_whose_number_went_away_is_refused_and_leaves_the_queue() {
    const NAME: &str = "moved";
    let server = RedisServer::new();
    let (a, b) = (clients(true).at(&server), clients(true).at(&server));
    let three = a.semaphore(NAME, 3);
    assert_eq!(three.add_permits(1).unwrap(), 4);
    // Long enough for the waiter to queue and the number to change first, even on a
    // loaded machine.
    let lease = Duration::from_secs(2);
    let all = three
        .try_acquire_with(permits(4).lease(lease))
        .unwrap()
        .expect("no wait");
    let taken = Instant::now();
    let four = b.semaphore(NAME, 4);
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || tx.send((four.acquire().map(drop), Instant::now())));
    assert!(
        support::wait_until(Duration::from_secs(2), || {
            support::llen(&mut server.connection(), &Keys::sem(PREFIX, NAME).queue()) == 1
        }),
        "the waiter never queued"
    );
    assert_eq!(three.reduce_permits(1).unwrap(), 3);
    assert!(
        taken.elapsed() < lease,
        "too slow to test: the lease ended first"
    );
    let (r, at) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("still waiting");
    waiter.join().unwrap().expect("the test thread hung up");
    assert_refused(r, 3, 3, 4);
    assert!(
        at - taken >= lease - Duration::from_millis(50),
        "refused {:?} after the hold it waited behind was taken, before its lease ended",
        at - taken
    );
    assert_eq!(
        support::llen(&mut server.connection(), &Keys::sem(PREFIX, NAME).queue()),
        0
    );
    assert!(all.release().is_err(), "the fixed lease ended");
}

/// No key a semaphore writes is left without an expiry: holds, leases, queue, waiters,
/// the definition, the forced-unlock record, after every kind of call.
#[test]
fn no_key_is_left_without_an_expiry() {
    let server = RedisServer::new();
    let (a, b) = (clients(true).at(&server), clients(false).at(&server));
    let sem = a.semaphore("mix", 2);
    let other = b.semaphore("mix", 2);
    let p = sem.try_acquire_with(permits(2)).unwrap().expect("no wait");
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let other = other.clone();
        thread::spawn(move || tx.send(other.acquire().map(drop)))
    };
    assert!(support::wait_until(Duration::from_secs(2), || {
        support::llen(&mut server.connection(), &Keys::sem(PREFIX, "mix").queue()) == 1
    }));
    assert!(other
        .try_acquire_for(Duration::from_millis(100))
        .unwrap()
        .is_none());
    assert_eq!(
        without_expiry(&server),
        Vec::<String>::new(),
        "held, one waiting"
    );
    assert_eq!(sem.add_permits(1).unwrap(), 3);
    rx.recv_timeout(Duration::from_secs(2))
        .expect("the waiter was not admitted")
        .unwrap();
    waiter.join().unwrap().expect("the test thread hung up");
    assert_eq!(sem.reduce_permits(1).unwrap(), 2);
    sem.set_permits(4).unwrap();
    assert!(!sem.try_set_permits(7).unwrap());
    assert!(b.semaphore("defined", 2).try_set_permits(2).unwrap());
    assert_eq!(b.semaphore("read", 6).permits().unwrap(), 6);
    assert_eq!(a.force_unlock("mix").unwrap(), ["semaphore"]);
    assert!(p.release().is_err());
    let held = sem.acquire().unwrap();
    assert_eq!(
        without_expiry(&server),
        Vec::<String>::new(),
        "after every call"
    );
    held.release().unwrap();
    let keys = all_keys(&server);
    assert!(keys.len() >= 4, "{keys:?}");
    assert_eq!(without_expiry(&server), Vec::<String>::new(), "at rest");
}

/// A definition written by a version before definitions expired (a bare number, no
/// expiry) is read as both numbers and given an expiry by the first acquisition, on every
/// server (Redis 7.0's `PEXPIRE ... GT` sets none where there is none).
fn a_definition_without_an_expiry_gets_one(functions: bool) {
    const NAME: &str = "legacy";
    let server = RedisServer::new();
    let _: () = redis::cmd("SET")
        .arg(definition(NAME))
        .arg(3)
        .query(&mut server.connection())
        .expect("SET");
    let c = clients(functions).at(&server);
    let sem = c.semaphore(NAME, 3).with_expire_after(IDLE).unwrap();
    assert_refused(c.semaphore(NAME, 2).try_acquire(), 3, 3, 2);
    assert_eq!(
        pttl(&server, &definition(NAME)),
        -1,
        "a refusal changes nothing"
    );
    let p = sem.acquire().unwrap();
    let left = pttl(&server, &definition(NAME));
    assert!(
        left > ms(LEASE + IDLE) - 200 && left <= ms(LEASE + IDLE),
        "an earlier version's definition expires in {left} ms once acquired"
    );
    assert_eq!(sem.available_permits().unwrap(), 2);
    p.release().unwrap();
    // An operator's change writes it the way this version does.
    assert_eq!(sem.add_permits(1).unwrap(), 4);
    let stored: String = support::query_key(&mut server.connection(), "GET", definition(NAME));
    assert_eq!(stored, "4 3");
    assert!(pttl(&server, &definition(NAME)) > 0);
}

#[test]
fn a_definition_without_an_expiry_gets_one_on_fcall() {
    a_definition_without_an_expiry_gets_one(true);
}

#[test]
fn a_definition_without_an_expiry_gets_one_on_evalsha() {
    a_definition_without_an_expiry_gets_one(false);
}
