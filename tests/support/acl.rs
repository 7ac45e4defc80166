//! ACL users for the tests, their rules as the server under test takes them.

use super::{server_kind, RedisServer};

/// The words of an ACL rule as the server under test takes it: one without functions
/// (before Redis 7.0) refuses `+fcall` and `+function|load`, and the sharded pub/sub
/// commands of a cluster's rule (`+ssubscribe +sunsubscribe +spublish`), which a user
/// there does not need, so they are left out (docs/servers.md and docs/redis-layout.md
/// say so for users).
pub fn acl_rule_words(rule: &str) -> Vec<&str> {
    let since_7 = [
        "+fcall",
        "+function",
        "+ssubscribe",
        "+sunsubscribe",
        "+spublish",
    ];
    let functions = server_kind().has_functions();
    rule.split_whitespace()
        .filter(|w| functions || !since_7.iter().any(|c| w.starts_with(c)))
        .collect()
}

/// The minimal ACL rule for the default prefix (docs/redis-layout.md, "The ACL").
pub const MINIMAL_ACL_RULE: &str = "on >s3cret-pw resetchannels ~redmutex:* &redmutex:* -@all \
    +fcall +function|load +evalsha +script|load +exists +hget +hmget +hgetall +pttl +subscribe \
    +unsubscribe +publish +ping +wait +hincrby +hset +hexists +pexpire +del +incr +time +type \
    +hkeys +hdel +rpush +lindex +lpop +lrem +lrange +get +set +decr +zadd +zscore +zrem +zcard \
    +zrange +zrangebyscore";

/// Makes (or changes) the ACL user `name` with `rule`, its words as
/// [`acl_rule_words`] leaves them for this server.
pub fn set_acl_user(server: &RedisServer, name: &str, rule: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name);
    for part in acl_rule_words(rule) {
        cmd.arg(part);
    }
    cmd.exec(&mut server.connection()).expect("ACL SETUSER");
}
