//! Issue 26 (Safety 3), item 1: no key the library writes for one name is ever a key of
//! another name, on either way of running the scripts. Scripts sent with EVALSHA (Redis
//! 6.2, or `use_functions(false)` anywhere) start with `lua/allow_oom.lua`, which deleted
//! `KEYS[1] .. ':!oom'`, "a key that never exists": for a name with a hash tag it is the
//! key of another lock (`job{t}` → `job{t}:!oom`), so a release of one lock freed the
//! other while its holder's guard still said held. (The prelude now touches only the
//! call's own first key.) Each test holds the victim with a
//! client of its own (running the scripts the server's default way) and drives the other
//! name with a client that sends EVALSHA, on the server under test.

mod support;

use std::time::Duration;

use redmutex::Client;
use support::clients::Clients;
use support::{wait_until, RedisServer};

const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_secs(30))
    .command(Duration::from_secs(2));
const PREFIX: &str = "kc:";

/// A client that runs the scripts with `EVALSHA` (`use_functions(false)`), whatever the
/// server has: the path whose marker collided. `watchdog`: its holds' watchdog timeout.
fn evalsha_client(server: &RedisServer, watchdog: Duration) -> Client {
    Client::builder()
        .url(server.url())
        .key_prefix(PREFIX)
        .watchdog_timeout(watchdog)
        .command_timeout(watchdog / 3)
        .use_functions(false)
        .build()
        .expect("build client")
}

/// A server, the client that holds the victim on it, and a third client that checks
/// nobody else can take the victim.
fn victim_and_third() -> (RedisServer, Client, Client) {
    let (server, victim) = CLIENTS.serve();
    let third = CLIENTS.at(&server);
    (server, victim, third)
}

/// The lock `job{t}:!oom`, held by one client, outlives a release, a cancelled wait and a
/// force-unlock of the lock `job{t}` by another: nobody else can take it meanwhile.
#[test]
fn releasing_a_lock_leaves_the_lock_named_after_its_marker_alone() {
    let (server, victim, third) = victim_and_third();
    let held = victim.lock("job{t}:!oom");
    let guard = held.lock().unwrap();
    let still_held = |after: &str| {
        assert_eq!(held.hold_count().unwrap(), 1, "after {after}: hold lost");
        assert!(
            third.lock("job{t}:!oom").try_lock().unwrap().is_none(),
            "after {after}: a third client took the lock held by another"
        );
    };

    let client = evalsha_client(&server, Duration::from_secs(30));
    let lock = client.lock("job{t}");
    lock.lock().unwrap().unlock().unwrap();
    still_held("a release");
    // A wait that times out leaves the queue (cancel.lua).
    let other = third.lock("job{t}").lock().unwrap();
    assert!(lock
        .try_lock_for(Duration::from_millis(20))
        .unwrap()
        .is_none());
    still_held("a cancelled wait");
    drop(other);
    lock.force_unlock().unwrap();
    still_held("a force-unlock");
    guard.unlock().unwrap();
}

/// The same for read-write locks: the write hold of `job{t}:!oom` outlives a read hold of
/// `job{t}` taken and released, and a force-unlock of it.
#[test]
fn releasing_a_read_write_lock_leaves_the_one_named_after_its_marker_alone() {
    let (server, victim, third) = victim_and_third();
    let held = victim.read_write_lock("job{t}:!oom");
    let guard = held.write_lock().lock().unwrap();
    let still_held = |after: &str| {
        assert_eq!(held.write_lock().hold_count().unwrap(), 1, "after {after}");
        let rw = third.read_write_lock("job{t}:!oom");
        assert!(
            rw.read_lock().try_lock().unwrap().is_none(),
            "after {after}: a third client read under another's write hold"
        );
    };

    let client = evalsha_client(&server, Duration::from_secs(30));
    let rw = client.read_write_lock("job{t}");
    rw.read_lock().lock().unwrap().unlock().unwrap();
    still_held("a read release");
    rw.write_lock().lock().unwrap().unlock().unwrap();
    still_held("a write release");
    rw.write_lock().force_unlock().unwrap();
    still_held("a force-unlock");
    guard.unlock().unwrap();
}

/// The same for semaphores: the one permit of `job{t}:!oom`, held, is not handed to a
/// third client after permits of `job{t}` are taken and given back.
#[test]
fn releasing_a_permit_leaves_the_semaphore_named_after_its_marker_alone() {
    let (server, victim, third) = victim_and_third();
    let held = victim.semaphore("job{t}:!oom", 1);
    let permit = held.acquire().unwrap();
    let still_held = |after: &str| {
        assert_eq!(held.available_permits().unwrap(), 0, "after {after}");
        assert!(
            third
                .semaphore("job{t}:!oom", 1)
                .try_acquire()
                .unwrap()
                .is_none(),
            "after {after}: a third client took a permit beyond the semaphore's one"
        );
    };

    let client = evalsha_client(&server, Duration::from_secs(30));
    let sem = client.semaphore("job{t}", 1);
    sem.acquire().unwrap().release().unwrap();
    still_held("a release");
    permit.release().unwrap();
}

/// A watchdog renewal of `q{t}` (renew.lua) runs the marker too, on every round, with no
/// release at all: the lock `q{t}:!oom` outlives two rounds.
#[test]
fn a_renewal_leaves_the_lock_named_after_its_marker_alone() {
    let (server, victim) = CLIENTS.serve();
    let held = victim.lock("q{t}:!oom");
    let guard = held.lock().unwrap();

    // Renews every third of a second or so; nothing else of its runs meanwhile.
    let client = evalsha_client(&server, Duration::from_secs(1));
    let renewed = client.lock("q{t}").lock().unwrap();
    let evalsha = || server.command_calls().get("evalsha").copied().unwrap_or(0);
    let before = evalsha();
    assert!(
        wait_until(Duration::from_secs(10), || evalsha() >= before + 2),
        "no two renewals of q{{t}} within 10 s"
    );
    assert_eq!(
        held.hold_count().unwrap(),
        1,
        "the renewals freed q{{t}}:!oom"
    );
    assert!(
        CLIENTS
            .at(&server)
            .lock("q{t}:!oom")
            .try_lock()
            .unwrap()
            .is_none(),
        "a third client took q{{t}}:!oom while its holder's guard is alive"
    );
    renewed.unlock().unwrap();
    guard.unlock().unwrap();
}

/// The same for count-down latches: counting `job{t}` down leaves the latch
/// `job{t}:!oom` counting.
#[test]
fn counting_a_latch_down_leaves_the_latch_named_after_its_marker_alone() {
    let (server, victim) = CLIENTS.serve();
    let counting = victim.count_down_latch("job{t}:!oom");
    assert!(counting.try_set_count(2).unwrap());

    let client = evalsha_client(&server, Duration::from_secs(30));
    let latch = client.count_down_latch("job{t}");
    assert!(latch.try_set_count(3).unwrap());
    assert_eq!(latch.count_down().unwrap(), 2);
    assert_eq!(
        counting.count().unwrap(),
        2,
        "the latch job{{t}}:!oom opened"
    );
}
