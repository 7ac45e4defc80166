//! `sync_replicas`: acquisitions and releases wait for replicas, and an acquisition the
//! replicas did not confirm is rolled back.

mod support;

use std::time::{Duration, Instant};

use redmutex::{Client, Error};
use support::clients::{build, Clients};
use support::keys::Keys;

const CLIENTS: Clients =
    Clients::new("replicas:").command(SYNC_WAIT.saturating_add(Duration::from_secs(2)));

/// How long `WAIT` waits for the replicas. A replica answers the primary's GETACK within
/// a millisecond on a quiet machine, but with both cores busy it was once not scheduled
/// for a whole second (`NotReplicated { acked: 0 }` with the replica up).
const SYNC_WAIT: Duration = Duration::from_secs(3);

#[test]
fn acquisitions_wait_for_replicas_and_roll_back_without_them() {
    let primary = support::primary();
    let mut replica = support::synced_replica(&primary);

    let c = build(CLIENTS.builder_at(&primary).sync_replicas(1, SYNC_WAIT));
    let lock = c.lock("replicated");
    let guard = lock.lock().expect("lock with a replica up");
    let nested = lock.lock().expect("re-entry with a replica up");
    // The replica has the lock: a failover to it would keep it.
    let on_replica: Vec<i64> = redis::cmd("HVALS")
        .arg(Keys::lock("replicas:", "replicated").key())
        .query(&mut replica.connection())
        .unwrap();
    assert_eq!(on_replica, vec![2]);
    drop(nested);
    guard.unlock().expect("unlock with a replica up");

    replica.kill();
    let t = Instant::now();
    let err = c
        .lock("lonely")
        .try_lock()
        .expect_err("no replica can confirm");
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acked: 0,
                required: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.lock_name(), Some("lonely"), "{err}");
    assert!(
        t.elapsed() >= SYNC_WAIT - Duration::from_millis(100),
        "WAIT did not wait"
    );
    // Rolled back: not held, free for anyone.
    assert!(!c.lock("lonely").is_locked().unwrap());
    let plain = Client::builder()
        .url(primary.url())
        .key_prefix("replicas:")
        .build()
        .unwrap();
    // Not `try_lock()`: its 250 ms budget includes this new client's first connection,
    // which a loaded machine can take longer to make (then `Error::Pool`, nothing said).
    let g = plain
        .lock("lonely")
        .try_lock_for(Duration::from_secs(2))
        .unwrap()
        .expect("free");
    g.unlock().unwrap();
    // A fenced acquisition rolls back the same way.
    assert!(matches!(
        c.fenced_lock("lonely").try_lock(),
        Err(Error::NotReplicated { .. })
    ));
    assert!(!plain.lock("lonely").is_locked().unwrap());
}

#[test]
fn a_release_the_replicas_miss_is_reported() {
    let primary = support::primary();
    let mut replica = support::synced_replica(&primary);
    let c = build(CLIENTS.builder_at(&primary).sync_replicas(1, SYNC_WAIT));
    let guard = c.lock("release").lock().expect("lock");
    replica.kill();
    assert!(matches!(
        guard.unlock(),
        Err(Error::NotReplicated { acked: 0, .. })
    ));
    // Free on the primary all the same.
    assert!(!c.lock("release").is_locked().unwrap());
}

#[test]
fn bad_sync_settings_are_refused() {
    for (n, t) in [
        (0, Duration::from_millis(100)),
        (1, Duration::ZERO),
        (1, Duration::from_secs(3)),
    ] {
        let built = Client::builder()
            .url("redis://127.0.0.1:1/")
            .sync_replicas(n, t)
            .build();
        assert!(
            matches!(built, Err(Error::InvalidArgument { .. })),
            "{n} {t:?}"
        );
    }
}

/// Issue 17, item 3: a hold handed over by a release starts with the 1 s pickup window as
/// its lease; a failover takes longer than that. With `sync_replicas`, `lock()` returns a
/// handed-over hold only once it is extended to its full lease and the replicas confirmed
/// it: the replica has the hold, with (about) the whole lease, the moment `lock()` returns.
#[test]
fn a_hold_taken_by_handoff_is_extended_and_replicated_before_lock_returns() {
    let primary = support::primary();
    let replica = support::synced_replica(&primary);
    let (holder, waiter) = (
        build(CLIENTS.builder_at(&primary).sync_replicas(1, SYNC_WAIT)),
        build(CLIENTS.builder_at(&primary).sync_replicas(1, SYNC_WAIT)),
    );
    for (name, lease) in [("handed-watchdog", None), ("handed-fixed", Some(5_000))] {
        let key = Keys::lock("replicas:", name).key();
        let queue = Keys::lock("replicas:", name).queue();
        let full = lease.map_or(30_000, |ms: u64| ms as i64);
        let guard = holder.fair_lock(name).lock().expect("holder");
        let lock = waiter.fair_lock(name);
        let mut on_replica = replica.connection();
        let key_in = key.clone();
        let thread = std::thread::spawn(move || {
            let g = lock
                .try_lock_with(support::lease_or_watchdog(lease))
                .map(Option::unwrap)
                .expect("waiter");
            // Read at once: what a failover right now would find on the replica.
            let pttl: i64 = support::query_key(&mut on_replica, "PTTL", &key_in);
            let fields: Vec<String> = redis::cmd("HKEYS")
                .arg(&key_in)
                .query(&mut on_replica)
                .unwrap();
            (pttl, fields, g.unlock())
        });
        let mut con = primary.connection();
        assert!(
            support::wait_until(Duration::from_secs(5), || support::llen(&mut con, &queue)
                == 1),
            "{name}: setup: the waiter never queued"
        );
        guard.unlock().expect("holder unlock");
        let (pttl, fields, unlocked) = thread.join().unwrap();
        let holders: Vec<&String> = fields.iter().filter(|f| !f.starts_with('~')).collect();
        assert!(
            holders.len() == 1 && holders[0].starts_with(waiter.id()),
            "{name}: the replica does not have the handed-over hold: {fields:?}"
        );
        assert!(
            pttl >= full - 1_000,
            "{name}: the replica's lease of a handed-over hold is {pttl} ms, not ~{full} ms"
        );
        unlocked.expect("waiter unlock");
    }
}

/// Issue 40, the protocol model's finding 2: with `sync_replicas`, the watchdog's renewals
/// were not WAITed for, yet the guard counted its validity from each one. A failover to a
/// replica that missed the renewals ends the hold at the earlier expiry the replica has,
/// while the guard still believes it holds (another client may then be granted). A renewal
/// now counts toward the guard's validity only once the replicas have it: with the replica
/// gone, the guard is told its hold is lost when the last replicated lease ends.
#[test]
fn a_renewal_the_replicas_miss_does_not_extend_the_guard() {
    // A lease long enough for a WAIT that a loaded machine's replica answers in time
    // (a 300 ms WAIT, with a 3 s lease, timed out on the acquisition once in CI and half
    // the time with both cores busy; the other tests here WAIT 3 s).
    const WATCHDOG: Duration = Duration::from_secs(9);
    // Shorter than the renewal period (a third of the lease, 3 s), so the WAIT of a
    // renewal ends before the next one is due.
    const WAIT: Duration = Duration::from_millis(2500);
    let primary = support::primary();
    let mut replica = support::synced_replica(&primary);
    let c = build(
        CLIENTS
            .watchdog(WATCHDOG)
            .command(WAIT + Duration::from_secs(2))
            .builder_at(&primary)
            .sync_replicas(1, WAIT),
    );
    let sent = Instant::now();
    let guard = c.lock("renewed").lock().expect("lock with a replica up");
    let lost = guard.lost();
    replica.kill();
    // The renewals still reach the primary (it keeps extending the key); none reach a
    // replica, so the last lease a failover would keep is the acquisition's.
    let told = lost
        .recv_timeout(WATCHDOG * 3)
        .expect("the guard was never told that its renewals reach no replica");
    let at = sent.elapsed();
    assert_eq!(
        told.reason(),
        redmutex::LossReason::RenewalFailed,
        "{told:?}"
    );
    assert!(
        at >= WATCHDOG - Duration::from_millis(100),
        "told after {at:?}, before the replicated lease ({WATCHDOG:?}) ended"
    );
    assert!(
        at < WATCHDOG + Duration::from_secs(2),
        "told after {at:?}, long after the replicated lease ({WATCHDOG:?}) ended"
    );
    assert!(guard.is_lease_lost());
}
