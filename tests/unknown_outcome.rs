//! Attempts whose outcome is unknown (a timed-out reply, a frozen server): the level Redis
//! may have granted anyway must not stay taken, by nobody, for a whole lease.

mod support;

use std::time::{Duration, Instant};

use redmutex::Error;
use support::clients::Clients;
use support::keys::Keys;

const CLIENTS: Clients = Clients::new("ghosts:")
    .watchdog(WATCHDOG)
    .command(Duration::from_secs(1));

const WATCHDOG: Duration = Duration::from_secs(6);

/// Before the fix there was no clean-up at all: the level granted by the script that ran
/// after the thaw stayed until its 6 s lease ran out.
#[test]
fn a_timed_out_attempt_that_ran_late_is_given_back_before_its_lease_ends() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("late");
    // Warm the pool and load the scripts, so the attempt below is sent (not stuck
    // connecting) and runs when the server thaws (not refused with NOSCRIPT).
    c.lock("warm").lock().unwrap().unlock().unwrap();

    let thaw = support::Thaw(&server);
    server.freeze();
    let (r, took) = support::timed(|| lock.try_lock_for(Duration::from_millis(100)));
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "a frozen server cannot answer: {r:?}"
    );
    assert!(
        took < Duration::from_millis(800),
        "bounded call took {took:?}"
    );
    drop(thaw);

    // The script sent before the freeze runs once Redis is thawed: the lock is taken by a
    // thread that was told it did not get it.
    let key = &Keys::lock("ghosts:", "late").key();
    let thawed = Instant::now();

    assert!(
        support::wait_until(Duration::from_secs(4), || !support::exists(
            &mut server.connection(),
            key
        )),
        "the doubtful level was still there {:?} after the thaw",
        thawed.elapsed()
    );
    let gone_after = thawed.elapsed();
    // Given back by the watchdog thread (at the latest on its next round, a third of the
    // lease), well before the 6 s lease would have let it go.
    assert!(
        gone_after < WATCHDOG / 2,
        "gone only after {gone_after:?}, about the lease"
    );

    // The same thread's later grant is a clean hold of one level.
    let g = lock.try_lock().unwrap().expect("free again");
    assert_eq!(lock.hold_count().unwrap(), 1);
    g.unlock().unwrap();
    assert!(!support::exists(&mut server.connection(), key));
}

/// A doubtful attempt by a thread that already holds the lock: the clean-up gives back the
/// extra level only, never the levels the thread really holds.
#[test]
fn cleaning_up_a_doubtful_nested_attempt_keeps_the_outer_hold() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("nested");
    let outer = lock.lock().unwrap();

    let thaw = support::Thaw(&server);
    server.freeze();
    let r = lock.try_lock_for(Duration::from_millis(50));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    drop(thaw);

    let key = &Keys::lock("ghosts:", "nested").key();
    let count = || -> Option<i64> {
        let vals: Vec<i64> = redis::cmd("HVALS")
            .arg(key)
            .query(&mut server.connection())
            .unwrap();
        vals.first().copied()
    };
    assert!(
        support::wait_until(Duration::from_secs(4), || count() == Some(1)),
        "the extra level was not given back: count {:?}",
        count()
    );
    assert!(!outer.is_lease_lost());
    assert_eq!(lock.hold_count().unwrap(), 1);
    outer.unlock().unwrap();
    assert!(!support::exists(&mut server.connection(), key));
}
