//! Loss pushed to the holder: `lost()` channels and the `on_lease_lost` hook fire within
//! the bound `is_lease_lost()` turns true in (a fixed lease running out, Redis frozen
//! past a watchdog lease, the key force-unlocked by another client), not before, and
//! without anyone polling; a release readies the channel but never calls the hook.

mod support;

use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, RecvTimeoutError, TryRecvError};
use redmutex::{LossReason, LostLease, MultiLock};
use support::clients::Clients;
use support::RedisServer;

const CLIENTS: Clients = Clients::DEFAULT.command(Duration::from_millis(500));

/// The margin on time bounds: generous for a loaded 2-core machine, small beside the
/// leases (1-1.5 s).
const MARGIN: Duration = Duration::from_millis(400);

/// Waits for `lost` to be ready in a `select!` (told of a loss, or closed by a release),
/// up to `until`; the instant.
fn ready_at(lost: &Receiver<LostLease>, until: Instant) -> Option<Instant> {
    select! {
        recv(lost) -> _ => Some(Instant::now()),
        recv(crossbeam_channel::at(until)) -> _ => None,
    }
}

fn not_ready(lost: &Receiver<LostLease>) -> bool {
    matches!(lost.try_recv(), Err(TryRecvError::Empty))
}

/// Whether `lost` was closed without a message: released, not lost.
fn closed(lost: &Receiver<LostLease>) -> bool {
    matches!(lost.try_recv(), Err(TryRecvError::Disconnected))
}

#[test]
fn a_fixed_lease_that_runs_out_reaches_a_select_within_its_bound() {
    let server = RedisServer::new();
    let (client, heard) = CLIENTS
        .prefix("lost:fixed:")
        .watchdog(Duration::from_secs(3))
        .heard_at(&server.url());
    let lease = Duration::from_millis(1500);
    let before = Instant::now();
    let guard = support::leased(&client.lock("nightly"), lease, "acquire");
    let after = Instant::now();
    let lost = guard.lost();
    // Not before its lease: nobody polls, the channel stays empty...
    assert_eq!(ready_at(&lost, before + lease - MARGIN), None);
    assert!(!guard.is_lease_lost());
    // ...and it is ready once the lease is over, within the margin.
    let fired = ready_at(&lost, after + lease + MARGIN).expect("told within the bound");
    assert!(fired >= before + lease, "not before the lease ran out");
    assert!(guard.is_lease_lost(), "the poll agrees at once");
    println!("told {:?} after the lease's end", fired - (before + lease));
    heard
        .each
        .recv_timeout(MARGIN)
        .expect("the hook heard of it");
    assert_eq!(
        *heard.all.lock().unwrap(),
        [("nightly".to_owned(), "Lock", LossReason::LeaseExpired)]
    );
    assert!(matches!(
        guard.unlock(),
        Err(redmutex::Error::LeaseLost { .. })
    ));
    // Once per hold: the unlock that found it lost did not tell the hook again.
    assert!(heard.each.recv_timeout(MARGIN).is_err());
}

#[test]
fn redis_frozen_past_a_watchdog_lease_reaches_a_select_within_its_bound() {
    let server = RedisServer::new();
    let watchdog = Duration::from_millis(1500);
    let (client, heard) = CLIENTS
        .prefix("lost:frozen:")
        .watchdog(watchdog)
        .heard_at(&server.url());
    let guard = client.fair_lock("ledger").lock().unwrap();
    let lost = guard.lost();
    // Renewed: a lease and more go by without a word.
    assert_eq!(ready_at(&lost, Instant::now() + watchdog + MARGIN), None);
    server.freeze();
    let frozen = Instant::now();
    // The last renewal that reached Redis was sent at most a third of a lease before the
    // freeze, so the key lives at least two thirds of a lease past it.
    let earliest = frozen + watchdog * 2 / 3 - MARGIN;
    assert_eq!(
        ready_at(&lost, earliest),
        None,
        "not before the lease may end"
    );
    let fired = ready_at(&lost, frozen + watchdog + MARGIN).expect("told within the bound");
    assert!(guard.is_lease_lost(), "the poll agrees");
    println!("told {:?} after the freeze", fired - frozen);
    heard
        .each
        .recv_timeout(MARGIN)
        .expect("the hook heard of it");
    assert_eq!(
        *heard.all.lock().unwrap(),
        [("ledger".to_owned(), "FairLock", LossReason::RenewalFailed)]
    );
    server.thaw();
    drop(guard);
}

#[test]
fn a_force_unlock_by_another_client_reaches_a_select_of_every_level() {
    let server = RedisServer::new();
    let watchdog = Duration::from_millis(1500);
    let (client, heard) = CLIENTS
        .prefix("lost:forced:")
        .watchdog(watchdog)
        .heard_at(&server.url());
    let other = Clients::DEFAULT
        .prefix("lost:forced:")
        .watchdog(watchdog)
        .command(Duration::from_millis(500))
        .at(&server.url());
    let guard = client.lock("job:7").lock().unwrap();
    let nested = client.lock("job:7").lock().unwrap();
    let (outer_lost, inner_lost) = (guard.lost(), nested.lost());
    assert!(not_ready(&outer_lost) && not_ready(&inner_lost));
    assert!(other.lock("job:7").force_unlock().unwrap());
    let forced = Instant::now();
    // Told on the client's own channel at once (tests/lost_lease_any_call.rs bounds that); here every
    // level is told, within the next renewal round (a third of the lease) at the latest.
    let bound = forced + watchdog / 3 + MARGIN;
    let fired = ready_at(&outer_lost, bound).expect("told by the next renewal at the latest");
    assert!(ready_at(&inner_lost, bound).is_some());
    assert!(guard.is_lease_lost() && nested.is_lease_lost());
    println!("told {:?} after the force_unlock", fired - forced);
    heard
        .each
        .recv_timeout(MARGIN)
        .expect("the hook heard of it");
    assert_eq!(
        *heard.all.lock().unwrap(),
        [("job:7".to_owned(), "Lock", LossReason::Deleted)],
        "one hold, told once"
    );
}

#[test]
fn released_guards_ready_their_receivers_and_the_hook_is_not_called() {
    let server = RedisServer::new();
    let lease = Duration::from_millis(1000);
    let (client, heard) = CLIENTS
        .prefix("lost:released:")
        .watchdog(lease)
        .heard_at(&server.url());
    let lock = client.lock("r");

    let guard = lock.lock().unwrap();
    let lost = guard.lost();
    guard.unlock().unwrap();
    assert!(closed(&lost));

    // A nested level's release readies its own channel only.
    let outer = lock
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .unwrap();
    let inner = lock.lock().unwrap();
    let (outer_lost, inner_lost) = (outer.lost(), inner.lost());
    drop(inner);
    assert!(closed(&inner_lost));
    assert!(not_ready(&outer_lost));
    drop(outer);
    assert!(closed(&outer_lost));

    // Dropped after lost() was asked for, well within its fixed lease.
    let fixed = lock
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .unwrap();
    let fixed_lost = fixed.lost();
    drop(fixed);
    assert!(closed(&fixed_lost), "released, not lost");

    let permit = client.semaphore("pool", 2).acquire().unwrap();
    let permit_lost = permit.lost();
    assert!(not_ready(&permit_lost));
    permit.release().unwrap();
    assert!(closed(&permit_lost));

    let multi = MultiLock::new([client.lock("m1"), client.lock("m2")]).unwrap();
    let held = multi
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .unwrap();
    let multi_lost = held.lost();
    assert!(not_ready(&multi_lost));
    held.unlock().unwrap();
    assert!(closed(&multi_lost));

    // Past every lease: nothing released was reported lost.
    assert_eq!(
        heard.each.recv_timeout(lease + MARGIN),
        Err(RecvTimeoutError::Timeout),
        "{:?}",
        heard.all.lock().unwrap()
    );
}

#[test]
fn permits_and_multilocks_are_told_of_their_loss() {
    let server = RedisServer::new();
    let watchdog = Duration::from_millis(1500);
    let (client, heard) = CLIENTS
        .prefix("lost:others:")
        .watchdog(watchdog)
        .heard_at(&server.url());
    let other = Clients::DEFAULT
        .prefix("lost:others:")
        .watchdog(watchdog)
        .command(Duration::from_millis(500))
        .at(&server.url());

    // All of a MultiLock's locks must stand: one force-unlocked loses it.
    let multi = MultiLock::new([client.lock("a"), client.lock("b")]).unwrap();
    let held = multi.lock().unwrap();
    let multi_lost = held.lost();
    assert!(not_ready(&multi_lost));
    assert!(other.lock("b").force_unlock().unwrap());
    let forced = Instant::now();
    assert!(ready_at(&multi_lost, forced + watchdog / 3 + MARGIN).is_some());
    assert!(held.is_lease_lost());

    // A fixed lease's validity ends before the lease does: told by then, not before.
    let lease = Duration::from_millis(1500);
    let before = Instant::now();
    let fixed = MultiLock::new([client.lock("c"), client.lock("d")])
        .unwrap()
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .unwrap();
    let fixed_lost = fixed.lost();
    assert_eq!(ready_at(&fixed_lost, before + lease / 2), None);
    assert!(ready_at(&fixed_lost, before + lease + MARGIN).is_some());
    assert!(fixed.is_lease_lost());

    // Permits whose keys are deleted behind their back.
    let permit = client.semaphore("pool", 1).acquire().unwrap();
    let permit_lost = permit.lost();
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("lost:others:!sem*")
        .query(&mut con)
        .unwrap();
    assert!(!keys.is_empty());
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut con).unwrap();
    let deleted = Instant::now();
    assert!(ready_at(&permit_lost, deleted + watchdog / 3 + MARGIN).is_some());
    assert!(permit.is_lease_lost());

    // The hook runs on its own thread, just after the channels are readied.
    let pool = ("pool".to_owned(), "Semaphore", LossReason::Deleted);
    while !heard.all.lock().unwrap().contains(&pool) {
        if heard.each.recv_timeout(MARGIN).is_err() {
            break;
        }
    }
    let heard: Vec<_> = heard.all.lock().unwrap().clone();
    assert!(
        heard.contains(&("b".to_owned(), "Lock", LossReason::Deleted)),
        "{heard:?}"
    );
    assert!(
        heard.contains(&("pool".to_owned(), "Semaphore", LossReason::Deleted)),
        "{heard:?}"
    );
}

/// Issue 38: `recv()` on a `lost()` channel tells a loss from a release. A loss sends
/// what was lost, and why, then closes the channel (`Ok`, then `Err`); a release only
/// closes it (`Err` at once). So code that waits for a message fires on a loss, for every
/// guard type: a lock's (each of its nested levels), an owned guard's, a permit's, a
/// `MultiLock`'s (a member lost, or its validity over).
#[test]
fn a_loss_sends_what_was_lost_and_a_release_only_disconnects() {
    let server = RedisServer::new();
    let watchdog = Duration::from_millis(1500);
    let clients = CLIENTS.prefix("lost:told:").watchdog(watchdog);
    let (client, other) = (clients.at(&server), clients.at(&server));
    let wait = watchdog + MARGIN;
    // The one message, then closed: what was lost, as (name, kind, reason).
    let told = |what: &str, lost: &Receiver<LostLease>| {
        let told = lost.recv_timeout(wait);
        assert!(told.is_ok(), "{what}: a loss sends a message: {told:?}");
        assert_eq!(
            lost.recv_timeout(wait).map(drop),
            Err(RecvTimeoutError::Disconnected),
            "{what}: one message, then closed"
        );
        let told = told.unwrap();
        (told.name_lossy(), told.kind(), told.reason())
    };

    // A lock force-unlocked: both nested levels get the message.
    let guard = client.lock("held").lock().unwrap();
    let nested = client.lock("held").lock().unwrap();
    let (lost, nested_lost) = (guard.lost(), nested.lost());
    assert!(other.lock("held").force_unlock().unwrap());
    let deleted = ("held".to_owned(), "Lock", LossReason::Deleted);
    assert_eq!(told("outer", &lost), deleted);
    assert_eq!(told("nested", &nested_lost), deleted);
    drop((nested, guard));

    // A fixed lease that runs out.
    let fixed = support::leased(&client.lock("fixed"), Duration::from_millis(600), "acquire");
    assert_eq!(
        told("a fixed lease", &fixed.lost()),
        ("fixed".to_owned(), "Lock", LossReason::LeaseExpired)
    );
    drop(fixed);

    // An owned guard, and a permit, force-unlocked.
    let owned = client.fair_lock("owned").owned().lock().unwrap();
    let owned_lost = owned.lost();
    assert!(other.fair_lock("owned").force_unlock().unwrap());
    assert_eq!(
        told("an owned guard", &owned_lost),
        ("owned".to_owned(), "FairLock", LossReason::Deleted)
    );
    drop(owned);
    let permit = client.semaphore("pool", 1).acquire().unwrap();
    let permit_lost = permit.lost();
    assert_eq!(other.force_unlock("pool").unwrap(), ["semaphore"]);
    assert_eq!(
        told("a permit", &permit_lost),
        ("pool".to_owned(), "Semaphore", LossReason::Deleted)
    );
    drop(permit);

    // A MultiLock: a member lost (that member is named), and a fixed lease's validity
    // over (its first member, LeaseExpired).
    let multi = MultiLock::new([client.lock("m1"), client.lock("m2")]).unwrap();
    let held = multi.lock().unwrap();
    let multi_lost = held.lost();
    assert!(other.lock("m2").force_unlock().unwrap());
    assert_eq!(
        told("a MultiLock's member", &multi_lost),
        ("m2".to_owned(), "Lock", LossReason::Deleted)
    );
    drop(held);
    let held = multi
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_millis(600)))
        .map(Option::unwrap)
        .unwrap();
    assert_eq!(
        told("a MultiLock's validity", &held.lost()),
        ("m1".to_owned(), "Lock", LossReason::LeaseExpired)
    );
    drop(held);

    // Releases: closed at once, no message.
    let guard = client.lock("released").lock().unwrap();
    let lost = guard.lost();
    guard.unlock().unwrap();
    assert!(closed(&lost));
    let held = multi.lock().unwrap();
    let lost = held.lost();
    held.unlock().unwrap();
    assert!(closed(&lost));
}

/// Issue 38, "a slow `on_lease_lost` hook holds back every other hold's `lost()`": the
/// hook ran on the thread that fires the loss timers, so while it ran no other hold's
/// lease end was told (a 3 s hook: a 400 ms lease told at 3.1 s). Here the hook blocks
/// (on a channel the test holds) in its call for the first loss; meanwhile a fixed lease
/// that runs out is told within its bound, a `force_unlock` (another path) is told too,
/// and the hook is called for none of them until the first call returns, then for both,
/// in order.
#[test]
fn a_blocked_hook_holds_back_no_other_holds_loss_and_is_told_of_each_in_order() {
    let server = RedisServer::new();
    let watchdog = Duration::from_millis(1500);
    let clients = CLIENTS.prefix("lost:slow-hook:").watchdog(watchdog);
    let (called_tx, called) = crossbeam_channel::unbounded();
    let (open, gate) = crossbeam_channel::bounded::<()>(0);
    let client = support::build(clients.builder_at(&server.url()).on_lease_lost(
        move |lost: &redmutex::LostLease| {
            let _ = called_tx.send((lost.name_lossy(), lost.reason()));
            // As slow as the test wants: until it drops `open`.
            let _ = gate.recv();
        },
    ));
    let other = clients.at(&server.url());

    let first_lease = Duration::from_millis(200);
    let first = support::leased(&client.lock("first"), first_lease, "first");
    let lease = Duration::from_millis(1000);
    let before = Instant::now();
    let second = support::leased(&client.lock("second"), lease, "second");
    let after = Instant::now();
    let second_lost = second.lost();
    let third = client.lock("third").lock().unwrap();
    let third_lost = third.lost();

    // The hook is told of "first" and stays in that call.
    assert_eq!(
        called.recv_timeout(first_lease + MARGIN),
        Ok(("first".to_owned(), LossReason::LeaseExpired))
    );
    assert!(first.is_lease_lost());

    // "second" is told at its lease's end all the same: not before, and within the margin.
    assert_eq!(ready_at(&second_lost, before + lease - MARGIN), None);
    let fired = ready_at(&second_lost, after + lease + MARGIN)
        .expect("told at the lease's end while the hook is busy");
    assert!(fired >= before + lease, "not before the lease ran out");
    assert!(second.is_lease_lost(), "the poll agrees");
    println!("told {:?} after the lease's end", fired - (before + lease));
    // It is really over: another client takes it.
    let taken = other
        .lock("second")
        .try_lock_for(MARGIN)
        .unwrap()
        .expect("the lease is over on the server too");
    drop(taken);

    // A loss told by the server (a force_unlock) is marked while the hook is busy too.
    assert!(other.lock("third").force_unlock().unwrap());
    let forced = Instant::now();
    ready_at(&third_lost, forced + watchdog / 3 + MARGIN)
        .expect("told of the force_unlock while the hook is busy");
    assert!(third.is_lease_lost());

    // Still in the first call: the others wait for it, in the order they were lost.
    assert_eq!(called.try_recv(), Err(TryRecvError::Empty));
    drop(open);
    let rest: Vec<_> = (0..2).map(|_| called.recv_timeout(MARGIN)).collect();
    assert_eq!(
        rest,
        [
            Ok(("second".to_owned(), LossReason::LeaseExpired)),
            Ok(("third".to_owned(), LossReason::Deleted)),
        ]
    );
    assert_eq!(
        called.recv_timeout(MARGIN),
        Err(RecvTimeoutError::Timeout),
        "once per hold"
    );
}
