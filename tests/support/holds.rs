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

/// A hold's release, to run later, and what it returned.
pub type Unlock = Box<dyn FnOnce() -> Result<(), redmutex::Error>>;

/// `name` held as a fair lock (`fair`) or a plain one, waiting as long as it takes; its
/// release runs later.
#[track_caller]
pub fn hold_lock(client: &redmutex::Client, name: &str, fair: bool) -> Unlock {
    if fair {
        let guard = client.fair_lock(name).lock().unwrap();
        Box::new(move || guard.unlock())
    } else {
        let guard = client.lock(name).lock().unwrap();
        Box::new(move || guard.unlock())
    }
}

/// `name`'s fair lock taken by `client` once a grant its waiter left unconfirmed lapsed
/// and passed on (waiting up to 5 s for that).
#[track_caller]
pub fn take_lapsed_grant(
    client: &redmutex::Client,
    name: &str,
) -> redmutex::LockGuard<redmutex::Fair> {
    client
        .fair_lock(name)
        .try_lock_for(Duration::from_secs(5))
        .expect("other")
        .expect("the lapsed grant never passed on")
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
