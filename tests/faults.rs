//! Faults a lock meets in production, injected into real redis-server processes: the lock
//! must keep working afterwards, or say that it could not.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error};
use support::clients::Clients;
use support::keys::Keys;
use support::{FaultProxy, RedisServer};

const PREFIX: &str = "faults:";

const CLIENTS: Clients = Clients::new(PREFIX)
    .command(Duration::from_millis(500))
    .connect(Duration::from_millis(500));

#[test]
fn redis_restarted_with_its_data_lost() {
    const WATCHDOG: Duration = Duration::from_millis(900);
    let mut server = RedisServer::new();
    let holder = CLIENTS.watchdog(WATCHDOG).at(&server);
    let waiter = CLIENTS.watchdog(WATCHDOG).at(&server);
    let guard = holder.lock("restart").lock().expect("lock");
    let fixed = support::leased(&holder.lock("fixed"), Duration::from_secs(60), "lock fixed");

    let (tx, acquired) = mpsc::channel();
    let lock = waiter.lock("restart");
    let blocked = thread::spawn(move || {
        // Errors while Redis is away are the caller's to retry, like any Redis error;
        // what must not happen is a waiter that sleeps forever.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match lock.try_lock_until(deadline) {
                Ok(Some(g)) => {
                    tx.send(Ok(Instant::now())).unwrap();
                    g.unlock().expect("waiter unlock");
                    return;
                }
                Ok(None) => {
                    tx.send(Err("deadline passed".to_owned())).unwrap();
                    return;
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    });
    let channel = format!("{}:to:", Keys::lock(PREFIX, "restart").key());
    assert!(support::wait_until(Duration::from_secs(10), || {
        support::subscribers(&mut server.connection(), &channel) >= 1
    }));

    server.restart();
    let restarted = Instant::now();

    // The holder learns within about one renewal period.
    assert!(
        support::wait_until(WATCHDOG * 3, || guard.is_lease_lost()),
        "the holder never learned that Redis lost its lock"
    );
    // The waiter is not stranded: the lock is gone, so it takes it.
    let at = acquired
        .recv_timeout(Duration::from_secs(15))
        .expect("the waiter never came back")
        .expect("the waiter gave up");
    blocked.join().unwrap();
    assert!(at - restarted < Duration::from_secs(10));
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
    // A fixed lease has no watchdog to tell it; its unlock finds it gone and says so.
    assert!(matches!(fixed.unlock(), Err(Error::LeaseLost { .. })));
    // New locks work.
    let again = holder.lock("restart").lock().expect("lock after restart");
    again.unlock().expect("unlock after restart");
}

#[test]
fn a_frozen_redis_times_out_and_the_lease_survives_a_short_freeze() {
    let server = RedisServer::new();
    let c = CLIENTS.watchdog(Duration::from_secs(3)).at(&server);
    let guard = c.lock("frozen").lock().expect("lock");
    let other = c.lock("other");

    server.freeze();
    let (err, took) = support::timed(|| {
        thread::spawn(move || other.try_lock().map(|g| g.is_some()))
            .join()
            .unwrap()
            .expect_err("a frozen Redis cannot grant a lock")
    });
    assert!(matches!(err, Error::Timeout { .. }), "got {err:?}");
    // try_lock is bounded: it waits 250 ms for the answer, less than the command timeout.
    assert!(
        took >= Duration::from_millis(240) && took < Duration::from_millis(1000),
        "timed out after {took:?}; a try_lock gives up 250 ms past its (zero) wait"
    );
    // Frozen across at least one renewal tick (every second): that round fails.
    thread::sleep(Duration::from_millis(1200));
    server.thaw();

    // Renewals resume: the lock outlives its 3 s lease.
    thread::sleep(Duration::from_millis(3500));
    assert!(!guard.is_lease_lost());
    assert!(support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, "frozen").key()
    ));
    guard.unlock().expect("unlock after the freeze");
    assert!(!support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, "frozen").key()
    ));
}

#[test]
fn a_freeze_longer_than_the_lease_is_reported() {
    const WATCHDOG: Duration = Duration::from_millis(900);
    let server = RedisServer::new();
    let c = CLIENTS.watchdog(WATCHDOG).at(&server);
    let guard = c.lock("long-freeze").lock().expect("lock");
    server.freeze();
    thread::sleep(WATCHDOG + Duration::from_millis(600));
    server.thaw();
    assert!(
        support::wait_until(WATCHDOG * 3, || guard.is_lease_lost()),
        "a lease that ran out during the freeze must be reported lost"
    );
    assert!(guard.unlock().is_err());
}

/// While Redis stays frozen (or unreachable), a watchdog lease stops being renewed: the
/// guard must say it is lost once the lease can have run out on the server, without
/// waiting for Redis to come back; and once it said so, `unlock()` says `LeaseLost`
/// whatever Redis still holds.
///
/// The guard counts its lease from when the last renewal was sent, Redis from when it ran
/// it, so the loss may show a little before the key's expiry (by the renewal's one-way
/// latency, which load stretches): the bounds are a fraction of the lease on both sides.
/// Redis is frozen right after a renewal landed (and its reply went out), so that no
/// renewal lands between reading the key's expiry and the freeze.
#[test]
fn a_lease_that_runs_out_while_redis_is_frozen_is_reported_while_frozen() {
    const WATCHDOG: Duration = Duration::from_millis(1_500);
    const MARGIN: Duration = Duration::from_millis(300);
    let server = RedisServer::new();
    let c = CLIENTS.watchdog(WATCHDOG).at(&server);
    let guard = c.lock("frozen-loss").lock().expect("lock");
    let mut con = server.connection();
    let pttl = |con: &mut redis::Connection| -> u64 {
        redis::cmd("PTTL")
            .arg(Keys::lock(PREFIX, "frozen-loss").key())
            .query(con)
            .expect("PTTL")
    };
    // Wait for a renewal to land (the expiry jumps back up), then freeze at once: the next
    // one is a third of the lease away.
    let mut last = pttl(&mut con);
    let mut renewed = None;
    assert!(
        support::wait_until(WATCHDOG * 2, || {
            let seen = Instant::now();
            let left = pttl(&mut con);
            if left > last + 100 {
                renewed = Some((seen, left));
                return true;
            }
            last = left;
            false
        }),
        "the watchdog never renewed the lease"
    );
    let (seen, left) = renewed.expect("set above");
    // Redis may write the renewal's reply after this connection's (both in one round of
    // its event loop): one more round trip makes sure it went out before the freeze.
    let _: String = redis::cmd("PING").query(&mut con).expect("PING");
    server.freeze();
    let frozen = seen.elapsed();
    assert!(
        frozen < WATCHDOG / 6,
        "froze {frozen:?} after the renewal: the next one may have landed"
    );
    let expires = seen + Duration::from_millis(left);
    let reported = support::wait_until(WATCHDOG * 3, || guard.is_lease_lost());
    let at = Instant::now();
    server.thaw();
    assert!(
        reported,
        "a lease that ran out while Redis was frozen was not reported"
    );
    eprintln!(
        "lease loss reported {} ms from the key's expiry (negative: before it)",
        at.saturating_duration_since(seen).as_millis() as i64 - left as i64
    );
    assert!(
        at + MARGIN >= expires,
        "reported {:?} before the key's expiry",
        expires - at
    );
    assert!(
        at <= expires + MARGIN,
        "reported {:?} after the key's expiry",
        at - expires
    );
    let r = guard.unlock();
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "{r:?}");
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "frozen-loss").key()
        ),
        "nothing left behind"
    );
}

#[test]
fn script_flush_between_calls_changes_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.watchdog(Duration::from_secs(5)).at(&server);
    let lock = c.lock("flushed");
    // The scripts and the library (a restart without persistence loses both).
    let flush = || {
        let what: &[&str] = if support::server_kind().has_functions() {
            &["SCRIPT", "FUNCTION"]
        } else {
            &["SCRIPT"]
        };
        for what in what {
            redis::cmd(what)
                .arg("FLUSH")
                .exec(&mut server.connection())
                .unwrap()
        }
    };
    let outer = lock.lock().unwrap();
    flush();
    let inner = lock.lock().unwrap();
    flush();
    assert_eq!(lock.hold_count().unwrap(), 2);
    drop(inner);
    flush();
    outer.unlock().unwrap();
    flush();
    assert!(!lock.is_locked().unwrap());
    let fenced = c.fenced_lock("flushed").lock().unwrap();
    flush();
    fenced.unlock().unwrap();
}

#[test]
fn a_key_of_another_type_is_an_error_and_stays_untouched() {
    let server = RedisServer::new();
    let c = CLIENTS.watchdog(Duration::from_secs(5)).at(&server);
    let mut con = server.connection();
    redis::cmd("SET")
        .arg(Keys::lock(PREFIX, "taken").key())
        .arg("user data")
        .exec(&mut con)
        .unwrap();
    let lock = c.lock("taken");
    for result in [
        lock.try_lock().map(|g| g.is_some()),
        lock.try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(1)))
            .map(Option::unwrap)
            .map(|_| true),
    ] {
        match result {
            Err(Error::NotALock { source: e, .. }) => {
                assert!(e.to_string().contains("WRONGTYPE"), "{e}")
            }
            other => panic!("expected a WRONGTYPE error, got {other:?}"),
        }
    }
    // This thread has no guard of the lock: answered locally, without touching the key.
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert!(matches!(lock.is_locked(), Ok(true)));
    let value: String = support::query_key(&mut con, "GET", Keys::lock(PREFIX, "taken").key());
    assert_eq!(value, "user data");
    let ttl: i64 = support::query_key(&mut con, "TTL", Keys::lock(PREFIX, "taken").key());
    assert_eq!(ttl, -1, "no expiry was put on the user's key");
}

#[test]
fn dropping_the_client_while_guards_live_lets_leases_expire() {
    const WATCHDOG: Duration = Duration::from_millis(600);
    let server = RedisServer::new();
    let c = CLIENTS.watchdog(WATCHDOG).at(&server);
    let guard = c.lock("orphan").lock().expect("lock");
    let forgotten = c.lock("forgotten").lock().expect("lock");
    // A forgotten guard is never released: its lease must still end once the client
    // (and with it the watchdog) is gone.
    std::mem::forget(forgotten);
    let lock = c.lock("orphan");
    drop(c);
    drop(lock);
    // The guard keeps the client's internals alive (it can still release); only a
    // forgotten guard's lock outlives it, and its lease expires once the watchdog stops.
    guard.unlock().expect("a live guard still releases");
    let t = Instant::now();
    assert!(
        support::wait_until(Duration::from_secs(5), || !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "forgotten").key()
        )),
        "a forgotten guard's lease was renewed forever"
    );
    assert!(
        t.elapsed() <= WATCHDOG + Duration::from_millis(500),
        "expired only after {:?}",
        t.elapsed()
    );
}

/// The function that runs the bundled script `script` (see `support::function_name`):
/// what its requests carry.
fn call(server: &RedisServer, script: &str) -> String {
    support::function_name(&server.url(), script)
}

/// A client whose connections pass through `proxy`, with the scripts already loaded.
fn through(proxy: &FaultProxy) -> Client {
    let c = Client::builder()
        .url(proxy.url())
        .key_prefix(PREFIX)
        .build()
        .expect("build client");
    c.lock("warm-up").lock().unwrap().unlock().unwrap();
    c
}

#[test]
fn a_release_whose_reply_is_lost_is_retried_without_releasing_twice() {
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let c = through(&proxy);
    let lock = c.lock("lost-release");
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();

    proxy.lose_next_reply_to(&call(&server, "release"));
    inner.unlock().expect("the retried release succeeds");
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    // Released once: the outer level still holds the lock.
    assert_eq!(lock.hold_count().unwrap(), 1);
    assert!(c.lock("lost-release").is_locked().unwrap());
    let other = CLIENTS.watchdog(Duration::from_secs(5)).at(&server);
    assert!(other.lock("lost-release").try_lock().unwrap().is_none());

    // The outermost release losing its reply: the retry finds the lock already free and
    // reports `NotHeld`, never success for a lock it cannot vouch for.
    proxy.lose_next_reply_to(&call(&server, "release"));
    let r = outer.unlock();
    assert_eq!(proxy.lost_replies(), 2);
    assert!(matches!(r, Ok(()) | Err(Error::NotHeld { .. })), "{r:?}");
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "lost-release").key()
        ),
        "the lock is free"
    );
}

#[test]
fn an_acquire_whose_reply_is_lost_counts_one_level() {
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let c = through(&proxy);
    let lock = c.lock("lost-acquire");

    proxy.lose_next_reply_to(&call(&server, "acquire"));
    let outer = lock.lock().expect("the retried acquire succeeds");
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert_eq!(lock.hold_count().unwrap(), 1, "one level, not two");

    proxy.lose_next_reply_to(&call(&server, "acquire"));
    let inner = lock.lock().expect("the retried re-entry succeeds");
    assert_eq!(proxy.lost_replies(), 2);
    assert_eq!(lock.hold_count().unwrap(), 2, "two levels, not three");

    drop(inner);
    outer.unlock().unwrap();
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "lost-acquire").key()
        ),
        "fully released"
    );

    // Fenced: the retry keeps the token the lost call drew.
    let fenced = c.fenced_lock("lost-fenced");
    let first = fenced.lock().unwrap().token();
    proxy.lose_next_reply_to(&call(&server, "acquire"));
    let g = fenced.lock().unwrap();
    assert_eq!(proxy.lost_replies(), 3);
    assert_eq!(g.token(), first + 1, "one token drawn, not two");
    assert_eq!(fenced.hold_count().unwrap(), 1);
    g.unlock().unwrap();
}

#[test]
fn stale_pooled_connections_after_a_restart_are_replaced_transparently() {
    let mut server = RedisServer::new();
    let c = CLIENTS.watchdog(Duration::from_secs(5)).at(&server);
    // Fill the pool with several connections.
    thread::scope(|s| {
        for i in 0..4 {
            let c = c.clone();
            s.spawn(move || drop(c.lock(format!("fill-{i}")).lock().unwrap()));
        }
    });
    server.restart();
    // Every pooled connection is now dead; the first calls still succeed.
    for i in 0..4 {
        let g = c
            .lock(format!("after-{i}"))
            .lock()
            .expect("lock after restart");
        g.unlock().expect("unlock after restart");
    }
}

/// Issue 7, point 4: a waiter's attempt that queues it, whose reply is lost (the client
/// repeats it on another connection), leaves one queue entry, keeps the waiter's place,
/// and the waiter still gets the lock from the release.
#[test]
fn a_queuing_attempt_whose_reply_is_lost_queues_once() {
    const NAME: &str = "lost-join";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let w = through(&proxy);
    let holder = CLIENTS.watchdog(Duration::from_secs(5)).at(&server);
    // The waiter's client listens on the lock already (it waited a moment ago), so its
    // next lock() queues with its very first attempt: the one whose reply is lost.
    let guard = holder.fair_lock(NAME).lock().expect("holder");
    let lock = w.fair_lock(NAME);
    let warm = thread::spawn(move || lock.lock().map(|g| g.unlock()));
    assert!(support::wait_until(
        Duration::from_secs(5),
        || support::llen(&mut server.connection(), &Keys::lock(PREFIX, NAME).queue()) == 1
    ));
    guard.unlock().unwrap();
    warm.join()
        .unwrap()
        .expect("warm-up lock")
        .expect("warm-up unlock");

    let guard = holder.fair_lock(NAME).lock().expect("holder again");
    let acquire = call(&server, "acquire");
    proxy.lose_next_reply_to(&acquire);
    let lock = w.fair_lock(NAME);
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let g = lock.lock();
        tx.send(()).unwrap();
        g.map(|g| g.unlock())
    });
    assert!(
        support::wait_until(Duration::from_secs(5), || proxy.lost_replies() == 1),
        "the fault was never injected"
    );
    assert!(support::wait_until(
        Duration::from_secs(5),
        || support::llen(&mut server.connection(), &Keys::lock(PREFIX, NAME).queue()) == 1
    ));
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the waiter got a held lock"
    );
    assert_eq!(
        support::llen(&mut server.connection(), &Keys::lock(PREFIX, NAME).queue()),
        1,
        "queued once, not twice"
    );
    guard.unlock().unwrap();
    rx.recv_timeout(Duration::from_secs(2))
        .expect("the release handed the lock to the waiter");
    waiter
        .join()
        .unwrap()
        .expect("waiter lock")
        .expect("waiter unlock");
    assert_eq!(
        support::llen(&mut server.connection(), &Keys::lock(PREFIX, NAME).queue()),
        0
    );
    assert!(
        !support::exists(&mut server.connection(), Keys::lock(PREFIX, NAME).key()),
        "the lock is free"
    );
}

/// Issue 7, point 4: a `try_lock_for` whose deadline passes leaves the queue; when the
/// reply of that cancel is lost and the call repeated, nothing is left behind: no entry,
/// no hold, and the holder's lock is untouched.
#[test]
fn a_cancel_whose_reply_is_lost_leaves_nothing_behind() {
    const NAME: &str = "lost-cancel";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let w = through(&proxy);
    let holder = CLIENTS.watchdog(Duration::from_secs(5)).at(&server);
    let guard = holder.fair_lock(NAME).lock().expect("holder");
    let cancel = call(&server, "cancel");
    proxy.lose_next_reply_to(&cancel);
    let got = w
        .fair_lock(NAME)
        .try_lock_for(Duration::from_millis(400))
        .expect("the repeated cancel succeeds");
    assert!(got.is_none(), "the lock was held throughout");
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert_eq!(
        support::llen(&mut server.connection(), &Keys::lock(PREFIX, NAME).queue()),
        0,
        "the waiter left the queue"
    );
    assert!(holder.fair_lock(NAME).is_locked().unwrap());
    assert_eq!(holder.fair_lock(NAME).hold_count().unwrap(), 1);
    guard.unlock().expect("the holder's lock was untouched");
    assert!(
        !support::exists(&mut server.connection(), Keys::lock(PREFIX, NAME).key()),
        "no ghost hold"
    );
}

/// A bounded call stays bounded even while the clean-up of the same thread's earlier
/// doubtful attempt on the lock is stuck (Redis slow to answer it): the call used to wait
/// for that clean-up, up to its own bound (a sixth of the watchdog timeout, 5 s here),
/// before sending anything.
#[test]
fn a_bounded_try_does_not_wait_for_a_stuck_clean_up() {
    const NAME: &str = "stuck-clean-up";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let client = through(&proxy);
    let lock = client.lock(NAME);
    lock.lock().unwrap().unlock().unwrap();
    let acquire = call(&server, "acquire");
    let cancel = call(&server, "cancel");
    proxy.watch(&cancel);
    // The attempt reaches Redis only after its call gave up: its outcome is unknown, and
    // the watchdog's clean-up of it is held up 3 s by the proxy.
    proxy.delay_requests_containing(&acquire, Duration::from_secs(1));
    proxy.delay_requests_containing(&cancel, Duration::from_secs(3));
    let first = lock.try_lock_for(Duration::from_millis(50));
    assert!(matches!(first, Err(Error::Timeout { .. })), "{first:?}");
    assert!(
        proxy.wait_seen(&cancel, 1, Duration::from_secs(5)),
        "the clean-up was never sent"
    );
    proxy.delay_requests_containing(&acquire, Duration::ZERO);
    let (second, took) = support::timed(|| lock.try_lock_for(Duration::from_millis(100)));
    println!("try_lock_for(100ms) beside a stuck clean-up: {took:?}, {second:?}");
    // Its deadline (100 ms) + the 250 ms grace, with room for a loaded machine; waiting
    // for the clean-up takes the rest of its 3 s.
    assert!(
        took < Duration::from_millis(1500),
        "try_lock_for(100ms) took {took:?} ({second:?})"
    );
    match second {
        Err(Error::Timeout { .. }) => {}
        // The clean-up may have ended meanwhile on a slow machine; then the lock is free.
        Ok(Some(guard)) => guard.unlock().unwrap(),
        other => panic!("{other:?}"),
    }
    proxy.delay_requests_containing(&cancel, Duration::ZERO);
    // Nothing taken in doubt is left behind, and the lock works.
    assert!(support::wait_until(Duration::from_secs(10), || {
        !support::exists(&mut server.connection(), Keys::lock(PREFIX, NAME).key())
    }));
    lock.try_lock_for(Duration::from_secs(5))
        .unwrap()
        .expect("the lock afterwards")
        .unlock()
        .unwrap();
}
