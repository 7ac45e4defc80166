//! Holds a test sets up, and the refusal of a call on a name of another kind.

use std::time::Duration;

/// `lock` taken for a fixed `lease`, waiting as long as it takes: how a test sets up a
/// hold that runs out. `what` names the hold if the acquisition fails.
pub fn leased<K: redmutex::Kind>(
    lock: &redmutex::Lock<K>,
    lease: Duration,
    what: &str,
) -> redmutex::LockGuard<K> {
    lock.try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .expect(what)
}

/// The options of a hold for a fixed lease of `ms`, or (`None`) of a watchdog hold: the
/// defaults, with which `try_lock_with` is `lock`.
pub fn lease_or_watchdog(ms: Option<u64>) -> redmutex::LockOptions {
    match ms {
        Some(ms) => redmutex::LockOptions::new().lease(Duration::from_millis(ms)),
        None => redmutex::LockOptions::new(),
    }
}

/// `result` is the refusal of a call on a name in use by another kind, `in_use`.
pub fn assert_wrong_kind<T: std::fmt::Debug>(result: Result<T, redmutex::Error>, in_use: &str) {
    match result {
        Err(redmutex::Error::WrongKind { in_use: got, .. }) => {
            assert_eq!(got, in_use, "the kind in use")
        }
        other => panic!("expected WrongKind ({in_use} in use), got {other:?}"),
    }
}
