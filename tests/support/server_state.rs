//! Reading and disturbing a server's state from a test: keys, subscriptions, connections.

use std::time::Duration;

use super::{keys, wait_until, RedisServer};

/// Kills every connection of `con`'s server but `con` itself and those named `spare`
/// (`CLIENT KILL ID`): the calls in flight on them fail with their outcome unknown, and
/// their clients reconnect. Returns how many were killed.
pub fn kill_connections(con: &mut redis::Connection, spare: Option<&str>) -> usize {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query(con)
        .expect("CLIENT ID");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(con)
        .expect("CLIENT LIST");
    let mut killed = 0;
    for line in list.lines() {
        let field = |name: &str| {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        let Some(id) = field("id").and_then(|id| id.parse::<i64>().ok()) else {
            continue;
        };
        if id != me && (spare.is_none() || field("name") != spare) {
            // Gone already (its process killed meanwhile) is fine.
            let done: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query(con);
            killed += usize::from(done.is_ok());
        }
    }
    killed
}

/// The length of list `key` (a lock's queue, say).
pub fn llen(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("LLEN").arg(key).query(con).expect("LLEN")
}

/// The answer of `command key` (`GET`, `PTTL`, `HGETALL`...): a test reading one key
/// straight from Redis.
pub fn query_key<T: redis::FromRedisValue>(
    con: &mut redis::Connection,
    command: &str,
    key: impl redis::ToRedisArgs,
) -> T {
    redis::cmd(command)
        .arg(key)
        .query(con)
        .unwrap_or_else(|e| panic!("{command}: {e}"))
}

/// Whether `key` exists.
pub fn exists(con: &mut redis::Connection, key: impl redis::ToRedisArgs) -> bool {
    redis::cmd("EXISTS").arg(key).query(con).expect("EXISTS")
}

/// Blocks until `client`'s pub/sub connection listens on its own channel
/// (`<prefix>__control:<client id>`), which a client subscribes on a thread of its own
/// once it first holds or waits: a count of commands that starts after this counts the
/// calls' own traffic only.
pub fn await_own_channel(server: &RedisServer, prefix: &str, client: &redmutex::Client) {
    let own = keys::control_channel(prefix, client);
    assert!(
        wait_until(Duration::from_secs(10), || {
            subscribers(&mut server.connection(), &own) == 1
        }),
        "the client never subscribed {own}"
    );
}

/// How many subscriptions there are to channels starting with `prefix` (a lock's
/// channels are `<key>:to:<client id>`, one per client waiting on it).
pub fn subscribers(con: &mut redis::Connection, prefix: impl AsRef<[u8]>) -> i64 {
    counted(con, prefix.as_ref(), "CHANNELS", "NUMSUB").expect("PUBSUB CHANNELS")
}

/// The sharded subscriptions (`SSUBSCRIBE`) of channels starting with `prefix` on the
/// node `con` reaches: a cluster's waiters listen so on Redis 7.0 and later and Valkey.
/// None before 7.0, which has no sharded pub/sub.
pub fn shard_subscribers(con: &mut redis::Connection, prefix: impl AsRef<[u8]>) -> i64 {
    counted(con, prefix.as_ref(), "SHARDCHANNELS", "SHARDNUMSUB").unwrap_or(0)
}

/// The subscriptions of the channels starting with `prefix` that `PUBSUB <list>` names, as
/// `PUBSUB <count>` counts them; `Err` when the server refuses the listing.
fn counted(
    con: &mut redis::Connection,
    prefix: &[u8],
    list: &str,
    count: &str,
) -> redis::RedisResult<i64> {
    let mut pattern = prefix.to_vec();
    pattern.push(b'*');
    let channels: Vec<Vec<u8>> = redis::cmd("PUBSUB").arg(list).arg(pattern).query(con)?;
    if channels.is_empty() {
        return Ok(0);
    }
    let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg(count)
        .arg(&channels)
        .query(con)
        .unwrap_or_else(|e| panic!("PUBSUB {count}: {e}"));
    Ok(counts
        .chunks(2)
        .map(|pair| match pair.get(1) {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        })
        .sum())
}
