//! `sync_replicas`: acquisitions and releases wait for replicas, and an acquisition the
//! replicas did not confirm is rolled back.

mod support;

use std::time::{Duration, Instant};

use redmutex::{Client, Error};
use support::RedisServer;

/// A primary that starts a replica's sync at once instead of waiting 5 s for others.
fn primary() -> RedisServer {
    RedisServer::with_args(&["--repl-diskless-sync-delay", "0"])
}

/// A replica of `primary`, returned once writes stream to it: the replica has read a
/// value written after its sync. (`INFO` and `WAIT` can look ready earlier: after a
/// diskless sync the primary streams only from the replica's first ACK.)
fn synced_replica(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    let replica = RedisServer::with_args(&["--replicaof", "127.0.0.1", &port]);
    let (mut p, mut r) = (primary.connection(), replica.connection());
    assert!(
        support::wait_until(Duration::from_secs(10), || {
            let n: i64 = redis::cmd("INCR").arg("probe").query(&mut p).unwrap();
            let seen: Option<i64> = redis::cmd("GET").arg("probe").query(&mut r).unwrap();
            seen == Some(n)
                || support::wait_until(Duration::from_millis(100), || {
                    redis::cmd("GET")
                        .arg("probe")
                        .query::<Option<i64>>(&mut r)
                        .unwrap()
                        == Some(n)
                })
        }),
        "the replica never synced"
    );
    replica
}

fn client(primary: &RedisServer, replicas: u32) -> Client {
    Client::builder()
        .url(primary.url())
        .key_prefix("replicas:")
        .sync_replicas(replicas, Duration::from_millis(1000))
        .command_timeout(Duration::from_secs(2))
        .build()
        .expect("build client")
}

#[test]
fn acquisitions_wait_for_replicas_and_roll_back_without_them() {
    let primary = primary();
    let mut replica = synced_replica(&primary);

    let c = client(&primary, 1);
    let lock = c.lock("replicated");
    let guard = lock.lock().expect("lock with a replica up");
    let nested = lock.lock().expect("re-entry with a replica up");
    // The replica has the lock: a failover to it would keep it.
    let on_replica: Vec<i64> = redis::cmd("HVALS")
        .arg("replicas:{replicated}")
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
                required: 1
            }
        ),
        "{err:?}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(900),
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
    let primary = primary();
    let mut replica = synced_replica(&primary);
    let c = client(&primary, 1);
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
        assert!(matches!(built, Err(Error::InvalidArgument(_))), "{n} {t:?}");
    }
}
