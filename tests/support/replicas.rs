//! A primary and its replicas, returned once in sync.

use std::time::Duration;

use super::{wait_until, RedisServer};

/// A primary that starts a replica's sync at once instead of waiting 5 s for others.
pub fn primary() -> RedisServer {
    RedisServer::with_args(&["--repl-diskless-sync-delay", "0"])
}

/// A replica of `primary`, returned once writes stream to it: the replica has read a
/// value written after its sync. (`INFO` and `WAIT` can look ready earlier: after a
/// diskless sync the primary streams only from the replica's first ACK.)
pub fn synced_replica(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    let replica = RedisServer::with_args(&["--replicaof", "127.0.0.1", &port]);
    let (mut p, mut r) = (primary.connection(), replica.connection());
    assert!(
        wait_until(Duration::from_secs(10), || {
            let n: i64 = redis::cmd("INCR").arg("probe").query(&mut p).unwrap();
            let seen: Option<i64> = redis::cmd("GET").arg("probe").query(&mut r).unwrap();
            seen == Some(n)
                || wait_until(Duration::from_millis(100), || {
                    redis::cmd("GET")
                        .arg("probe")
                        .query::<Option<i64>>(&mut r)
                        .unwrap()
                        == Some(n)
                })
        }),
        "the replica never synced"
    );
    // Its data is not enough for WAIT: the primary counts a replica that has just loaded
    // its sync only from its first REPLCONF ACK (sent once a second), so a short WAIT
    // before then times out. Wait for the primary to count it.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let acked: i64 = redis::cmd("WAIT").arg(1).arg(200).query(&mut p).unwrap();
            acked >= 1
        }),
        "the primary never counted the replica's acknowledgements"
    );
    replica
}
