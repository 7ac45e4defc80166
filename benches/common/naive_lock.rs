//! The naive baseline lock (rslock-style `SET NX PX`, polled).

/// The floor every bench measures redmutex against: an rslock-style lock, taken with
/// `SET key token NX PX lease` (callers poll on failure) and given back by a script that
/// deletes the key only while it holds the caller's token.
pub struct NaiveLock {
    release: redis::Script,
}

impl NaiveLock {
    pub fn new() -> NaiveLock {
        NaiveLock {
            release: redis::Script::new(
                r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"#,
            ),
        }
    }

    /// One try: true when `key` was free and now holds `token` for `lease_ms`.
    pub fn try_lock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        token: impl redis::ToRedisArgs,
        lease_ms: u64,
    ) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .query(con)
            .expect("SET NX PX");
        set.is_some()
    }

    /// Gives `key` back; fails the bench if it no longer held `token` (a bench whose
    /// naive lock expired under it measured nothing).
    pub fn unlock(&self, con: &mut redis::Connection, key: &str, token: impl redis::ToRedisArgs) {
        let deleted = self.compare_and_delete(con, key, token);
        assert_eq!(deleted, 1, "the naive lock was not ours any more");
    }

    /// The release script alone: 1 when it deleted the key (the floors' one script round
    /// trip runs it on a key that does not exist).
    pub fn compare_and_delete(
        &self,
        con: &mut redis::Connection,
        key: &str,
        token: impl redis::ToRedisArgs,
    ) -> i64 {
        self.release
            .key(key)
            .arg(token)
            .invoke(con)
            .expect("compare-and-delete")
    }
}
