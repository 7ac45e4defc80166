//! Extending a fixed lease (only while held, never below what another level needs) and
//! capping a watchdog hold (`max_hold`): it ends, is reported lost, and frees the lock.

mod support;

use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use redmutex::{Client, Error, LossReason, LostLease};
use support::clients::Clients;
use support::RedisServer;

const CLIENTS: Clients = Clients::DEFAULT
    .watchdog(Duration::from_millis(1500))
    .command(Duration::from_millis(500));

/// The margin on time bounds: generous for a loaded 2-core machine, small beside the
/// leases (1-3 s).
const MARGIN: Duration = Duration::from_millis(400);

/// The lock's remaining lease on the server.
fn pttl(lock: &redmutex::Lock) -> Duration {
    lock.remaining_lease()
        .unwrap()
        .expect("the lock is held with a lease")
}

fn ready_at(lost: &Receiver<LostLease>, until: Instant) -> Option<Instant> {
    select! {
        recv(lost) -> _ => Some(Instant::now()),
        recv(crossbeam_channel::at(until)) -> _ => None,
    }
}

#[test]
fn extend_moves_a_held_fixed_lease_on_and_its_loss_with_it() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("extend:held:").at(&server.url());
    let lock = c.lock("import");
    let lease = Duration::from_millis(1000);
    let guard = lock
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .unwrap();
    let lost = guard.lost();
    std::thread::sleep(lease / 2); // time is the subject: half the lease goes by
    let extended = Instant::now();
    guard.extend(Duration::from_millis(2000)).unwrap();
    let left = pttl(&lock);
    assert!(left > Duration::from_millis(1500), "{left:?}");
    // Not lost when the first lease would have ended, nor before the new one does...
    assert_eq!(
        ready_at(&lost, extended + Duration::from_millis(2000) - MARGIN),
        None
    );
    assert!(!guard.is_lease_lost());
    // ...and told once it has.
    let fired = ready_at(&lost, extended + Duration::from_millis(2000) + MARGIN)
        .expect("lost once the extended lease ran out");
    assert!(fired >= extended + Duration::from_millis(2000));
    assert!(guard.is_lease_lost());
    // Redis expires it a moment after this process counts it over.
    assert!(support::wait_until(MARGIN, || lock
        .remaining_lease()
        .unwrap()
        .is_none()));
    // Lost: extending sends nothing and says so; the lock stays free.
    assert!(matches!(
        guard.extend(Duration::from_secs(5)),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(lock.remaining_lease().unwrap(), None);
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
}

#[test]
fn extend_on_a_hold_the_server_lost_fails_and_changes_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("extend:gone:").at(&server.url());
    let admin = CLIENTS.prefix("extend:gone:").at(&server.url());
    let lock = c.lock("job");
    let guard = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(3)))
        .map(Option::unwrap)
        .unwrap();
    assert!(admin.lock("job").force_unlock().unwrap());
    // Another holder takes it: the extension must not touch that hold.
    let theirs = std::thread::spawn(move || {
        let g = support::leased(&admin.lock("job"), Duration::from_millis(1500), "acquire");
        let left = admin.lock("job").remaining_lease().unwrap().unwrap();
        std::mem::forget(g);
        left
    })
    .join()
    .unwrap();
    let lost = guard.lost();
    assert!(matches!(
        guard.extend(Duration::from_secs(10)),
        Err(Error::LeaseLost { .. })
    ));
    assert!(
        pttl(&lock) <= theirs,
        "the other holder's lease is untouched"
    );
    assert!(guard.is_lease_lost());
    assert!(ready_at(&lost, Instant::now() + MARGIN).is_some());
}

#[test]
fn extend_never_shortens_the_lease_a_nested_level_needs() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("extend:nested:").at(&server.url());
    let lock = c.lock("n");
    let outer = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(3)))
        .map(Option::unwrap)
        .unwrap();
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_millis(1000)))
        .map(Option::unwrap)
        .unwrap();
    // The inner level asks for less than the outer one still needs: the key keeps the
    // outer's lease.
    inner.extend(Duration::from_millis(1200)).unwrap();
    let left = pttl(&lock);
    assert!(left > Duration::from_millis(2500), "{left:?}");
    let outer_lost = outer.lost();
    drop(inner);
    // The outer level is not lost when the inner extension ends.
    assert_eq!(
        ready_at(&outer_lost, Instant::now() + Duration::from_millis(1500)),
        None
    );
    assert!(!outer.is_lease_lost());
    assert!(pttl(&lock) > Duration::from_millis(500));
    outer.unlock().unwrap();

    // The other way round: an outer extension shorter than a nested level's lease.
    let outer = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_millis(1000)))
        .map(Option::unwrap)
        .unwrap();
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(3)))
        .map(Option::unwrap)
        .unwrap();
    outer.extend(Duration::from_millis(1200)).unwrap();
    assert!(pttl(&lock) > Duration::from_millis(2500));
    drop(outer);
    inner.unlock().unwrap();
}

#[test]
fn bad_input_is_typed_and_changes_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("extend:bad:").at(&server.url());
    let lock = c.lock("b");
    let fixed = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(2)))
        .map(Option::unwrap)
        .unwrap();
    let before = pttl(&lock);
    assert!(matches!(
        fixed.extend(Duration::ZERO),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        fixed.extend(Duration::from_secs(11 * 365 * 24 * 3600)),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(pttl(&lock) <= before);
    fixed.unlock().unwrap();

    let watched = lock.lock().unwrap();
    let before = pttl(&lock);
    assert!(matches!(
        watched.extend(Duration::from_secs(60)),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(pttl(&lock) <= before, "a watchdog lease is not extended");
    watched.unlock().unwrap();

    for bad in [Duration::ZERO, Duration::from_millis(500)] {
        // (Not longer than the command timeout, 500 ms.)
        assert!(matches!(
            lock.with_max_hold(bad),
            Err(Error::InvalidArgument { .. })
        ));
    }
    assert!(lock.with_max_hold(Duration::from_millis(501)).is_ok());
    assert!(matches!(
        Client::builder()
            .url(server.url())
            .command_timeout(Duration::from_secs(1))
            .max_hold(Duration::from_secs(1))
            .build(),
        Err(Error::InvalidArgument { .. })
    ));
}

/// A watchdog hold capped at `max_hold` is renewed until then, no longer: reported lost
/// (channel, poll, hook with `MaxHold`) not before the cap, by the cap plus a lease at
/// the latest, and the lock is free for others then.
fn capped(lock: &redmutex::Lock, cap: Duration, heard: &Receiver<(String, LossReason)>) {
    let watchdog = Duration::from_millis(1500);
    let before = Instant::now();
    let guard = lock.lock().unwrap();
    let lost = guard.lost();
    // Renewed until the cap (past a whole lease, when the cap is longer)...
    assert_eq!(ready_at(&lost, before + cap - MARGIN), None);
    assert!(!guard.is_lease_lost());
    // ...and lost once it is reached, at the latest a lease later.
    let fired = ready_at(&lost, before + cap + watchdog + MARGIN).expect("lost after the cap");
    println!("a hold capped at {cap:?} lost after {:?}", fired - before);
    assert!(fired >= before + cap, "not before the cap");
    assert!(guard.is_lease_lost());
    assert_eq!(
        heard.recv_timeout(MARGIN),
        Ok((
            String::from_utf8_lossy(lock.name()).into_owned(),
            LossReason::MaxHold
        ))
    );
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
}

#[test]
fn max_hold_ends_a_watchdog_hold_and_reports_it() {
    let server = RedisServer::new();
    let (tx, heard) = crossbeam_channel::unbounded();
    let build = |cap: Option<Duration>| {
        let tx = tx.clone();
        let b = Client::builder()
            .url(server.url())
            .key_prefix("extend:cap:")
            .watchdog_timeout(Duration::from_millis(1500))
            .command_timeout(Duration::from_millis(500))
            .on_lease_lost(move |l| {
                let _ = tx.send((l.name_lossy(), l.reason()));
            });
        match cap {
            Some(cap) => b.max_hold(cap),
            None => b,
        }
        .build()
        .unwrap()
    };
    let other = CLIENTS.prefix("extend:cap:").at(&server.url());

    // Client-wide.
    let c = build(Some(Duration::from_millis(2500)));
    let lock = c.lock("client-wide");
    capped(&lock, Duration::from_millis(2500), &heard);
    // The server let it go (a moment after this process counts it over).
    let free = || other.lock("client-wide").try_lock().unwrap().is_some();
    assert!(
        support::wait_until(MARGIN, free),
        "the capped hold freed the lock"
    );

    // Per handle, on a client without a cap; other handles are not capped.
    let c = build(None);
    let lock = c
        .lock("per-handle")
        .with_max_hold(Duration::from_millis(2500))
        .unwrap();
    let uncapped = c.lock("uncapped").lock().unwrap();
    capped(&lock, Duration::from_millis(2500), &heard);
    let free = || other.lock("per-handle").try_lock().unwrap().is_some();
    assert!(support::wait_until(MARGIN, free));
    // A cap shorter than the watchdog lease (1.5 s) shortens the first lease.
    let short = c
        .lock("short")
        .with_max_hold(Duration::from_millis(1000))
        .unwrap();
    capped(&short, Duration::from_millis(1000), &heard);
    let free = || other.lock("short").try_lock().unwrap().is_some();
    assert!(support::wait_until(MARGIN, free));
    assert!(
        !uncapped.is_lease_lost(),
        "a handle without a cap is renewed on"
    );
    uncapped.unlock().unwrap();
}
