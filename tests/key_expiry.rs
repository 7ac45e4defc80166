//! No key the library writes lives forever: every kind, held, waited for, force-unlocked
//! and at rest, through `FCALL` and `EVALSHA`, leaves only keys with an expiry, so names
//! made per entity (a lock per order, a semaphore per tenant) never grow Redis without
//! bound.

mod support;

use std::thread;
use std::time::Duration;

use redmutex::{Client, LockOptions};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const PREFIX: &str = "expiry:";
const CLIENTS: Clients = Clients::new(PREFIX);

/// Every key in the server with no expiry, by name.
fn without_expiry(server: &RedisServer) -> Vec<String> {
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    keys.into_iter()
        .filter(|k| {
            let pttl: i64 = redis::cmd("PTTL").arg(k).query(&mut con).unwrap();
            pttl == -1
        })
        .collect()
}

/// Takes, re-enters, waits for, hands over and force-unlocks every kind of `client`,
/// with `other` as the second party; checks `server` has no key without an expiry while
/// held and queued, and at rest.
fn every_kind(server: &RedisServer, client: &Client, other: &Client, tag: &str) {
    let name = |kind: &str| format!("{kind}-{tag}");
    let wait = || LockOptions::new().wait_for(Duration::from_secs(5));
    let plain = client.lock(name("plain"));
    let fair = client.fair_lock(name("fair"));
    let fenced = client.fenced_lock(name("fenced"));
    let rw = client.read_write_lock(name("rw"));
    let sem = client.semaphore(name("sem"), 1);
    let latch = client.count_down_latch(name("latch"));
    let held = (
        plain.lock().unwrap(),
        plain.lock().unwrap(),
        fair.lock().unwrap(),
        fenced.lock().unwrap(),
        rw.upgradeable_lock().lock().unwrap(),
        rw.read_lock().lock().unwrap(),
        sem.acquire().unwrap(),
    );
    assert!(latch.try_set_count(2).unwrap());
    latch.count_down().unwrap();
    thread::scope(|s| {
        // A waiter on each kind, queued behind the holds.
        let waiters = [
            s.spawn(|| drop(other.lock(name("plain")).try_lock_with(wait()).unwrap())),
            s.spawn(|| drop(other.fair_lock(name("fair")).try_lock_with(wait()).unwrap())),
            s.spawn(|| {
                drop(
                    other
                        .fenced_lock(name("fenced"))
                        .try_lock_with(wait())
                        .unwrap(),
                )
            }),
            s.spawn(|| {
                let rw = other.read_write_lock(name("rw"));
                drop(rw.write_lock().try_lock_with(wait()).unwrap())
            }),
            s.spawn(|| {
                drop(
                    other
                        .semaphore(name("sem"), 1)
                        .try_acquire_with(wait())
                        .unwrap(),
                )
            }),
        ];
        let queues = [
            Keys::lock(PREFIX, &name("plain")).queue(),
            Keys::lock(PREFIX, &name("fair")).queue(),
            Keys::lock(PREFIX, &name("fenced")).queue(),
            Keys::rw(PREFIX, &name("rw")).queue(),
            Keys::sem(PREFIX, &name("sem")).queue(),
        ];
        let mut con = server.connection();
        assert!(
            support::wait_until(Duration::from_secs(5), || {
                queues.iter().all(|q| support::llen(&mut con, q) >= 1)
            }),
            "every waiter queued"
        );
        assert_eq!(
            without_expiry(server),
            Vec::<String>::new(),
            "{tag}: held, waited for"
        );
        // An operator frees two of them; the releases hand the rest on.
        assert!(plain.force_unlock().unwrap());
        assert!(fenced.force_unlock().unwrap());
        drop(held);
        for w in waiters {
            w.join().unwrap();
        }
    });
    latch.count_down().unwrap();
    assert_eq!(
        without_expiry(server),
        Vec::<String>::new(),
        "{tag}: at rest"
    );
}

#[test]
fn no_key_is_left_without_an_expiry() {
    let server = RedisServer::new();
    for (functions, tag) in [(true, "fcall"), (false, "evalsha")] {
        let clients = CLIENTS.functions(functions).metadata("job 7");
        let (client, other) = (clients.at(&server), clients.at(&server));
        every_kind(&server, &client, &other, tag);
    }
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(keys.len() >= 4, "something was left to look at: {keys:?}");
}
