//! Regression tests for the safety holes of issue 6: nested leases that shortened the key's
//! expiry (point 1), lock names colliding with the fencing-token counter (2), holds lost to
//! a data loss that were not marked lost (3), errors after a grant that left a hold (6), the
//! watchdog of a dropped client (7), a forked child re-entering its parent's hold (10), and
//! hold queries and unbounded waits (11).
//!
//! Every check of the key's expiry goes through a separate plain connection (`PTTL`), so it
//! sees what other clients of the lock see.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, MultiLock};
use support::child::{say, ChildProc};
use support::clients::{build, Clients};
use support::keys::Keys;
use support::{FaultProxy, RedisServer};

const PREFIX: &str = "holes:";

const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_secs(3))
    .command(Duration::from_secs(1));
const ROLE: &str = "REDMUTEX_HOLES_CHILD_ROLE";
const URL: &str = "REDMUTEX_HOLES_CHILD_URL";

/// The remaining lease of `key` in ms as Redis reports it (-2: no such key).
fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("PTTL")
}

const MS300: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------------------
// Point 1: nested leases
// ---------------------------------------------------------------------------------------

/// Point 1: a nested fixed lease shorter than the outer watchdog lease must not shorten the
/// key's expiry. Before the fix the inner acquire set PEXPIRE 300 ms: the key expired while
/// the outer guard still held it and another client got the lock.
#[test]
fn a_short_nested_lease_does_not_shorten_a_watchdog_hold() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    let lock = a.lock("nest-wd");
    let outer = lock.lock().expect("outer lock");
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(MS300))
        .map(Option::unwrap)
        .expect("inner lock");
    let left = pttl(&mut con, &Keys::lock(PREFIX, "nest-wd").key());
    assert!(
        left > 2000,
        "the nested 300 ms lease shortened the watchdog hold: PTTL {left} ms"
    );
    thread::sleep(Duration::from_millis(800)); // "work" past the inner lease
    let stolen = b.lock("nest-wd").try_lock().expect("try_lock");
    assert!(
        stolen.is_none(),
        "another client took the lock while the outer guard held it"
    );
    assert!(!outer.is_lease_lost(), "the outer guard lost its lease");
    drop(inner);
    outer.unlock().expect("outer unlock");
}

/// Point 1: a nested fixed lease shorter than the outer fixed lease must not shorten it.
/// Before the fix PTTL dropped from 10 s to 300 ms.
#[test]
fn a_short_nested_lease_does_not_shorten_a_longer_fixed_hold() {
    let (server, c) = CLIENTS.serve();
    let mut con = server.connection();
    let lock = c.lock("nest-fixed");
    let outer = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(10)))
        .map(Option::unwrap)
        .expect("outer lock");
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(MS300))
        .map(Option::unwrap)
        .expect("inner lock");
    let left = pttl(&mut con, &Keys::lock(PREFIX, "nest-fixed").key());
    assert!(
        left > 9000,
        "the nested 300 ms lease shortened the outer 10 s lease: PTTL {left} ms"
    );
    drop(inner);
    outer.unlock().expect("outer unlock");
}

/// Point 1: releasing a nested level restores what is left of the outer fixed lease, not
/// a fresh full lease. Before the fix the release set PEXPIRE 1 s again at ~500 ms, so the
/// lock outlived the outer lease by half a second.
#[test]
fn releasing_a_nested_level_restores_only_what_is_left_of_the_outer_lease() {
    let (server, c) = CLIENTS.serve();
    let mut con = server.connection();
    let lock = c.lock("nest-rest");
    let outer = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(1)))
        .map(Option::unwrap)
        .expect("outer lock");
    let t0 = Instant::now(); // the outer lease started before this
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(1)))
        .map(Option::unwrap)
        .expect("inner lock");
    thread::sleep(Duration::from_millis(500).saturating_sub(t0.elapsed()));
    let unlocking = Instant::now();
    inner.unlock().expect("inner unlock");
    // The client computes what is left of the outer lease before sending the release; the
    // server applies it when the script runs, up to one unlock call later.
    let transit = unlocking.elapsed().as_millis() as i64 + 1;
    let elapsed = t0.elapsed().as_millis() as i64;
    let left = pttl(&mut con, &Keys::lock(PREFIX, "nest-rest").key());
    assert!(
        left > 0,
        "the outer level's lease is not over yet, but the key is gone: PTTL {left}"
    );
    assert!(
        left <= 1000 - elapsed + transit + 1 && left < 600,
        "the nested release restored a fresh lease: PTTL {left} ms, {elapsed} ms into a 1 s \
         lease (release call took {transit} ms)"
    );
    // The lock frees itself when the outer lease ends, not half a second later.
    assert!(
        support::wait_until(
            Duration::from_millis(1150).saturating_sub(t0.elapsed()),
            || !support::exists(&mut con, Keys::lock(PREFIX, "nest-rest").key())
        ),
        "the lock outlived its outer 1 s lease"
    );
    drop(outer);
}

/// Point 1: a watchdog renewal must not shorten a longer nested fixed lease. Before the
/// fix the first renewal (every 300 ms) set PEXPIRE 900 ms over the 5 s lease.
#[test]
fn a_watchdog_renewal_does_not_shorten_a_longer_nested_fixed_lease() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS
        .watchdog(Duration::from_millis(900))
        .command(MS300)
        .at(&server.url());
    let lock = c.lock("nest-renew");
    let outer = lock.lock().expect("outer lock");
    let inner = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(5)))
        .map(Option::unwrap)
        .expect("inner lock");
    // Past at least one renewal (every 300 ms); time is the subject here.
    thread::sleep(Duration::from_millis(700));
    let left = pttl(&mut con, &Keys::lock(PREFIX, "nest-renew").key());
    assert!(
        left > 4000,
        "a watchdog renewal shortened the nested 5 s lease: PTTL {left} ms"
    );
    drop(inner);
    outer.unlock().expect("outer unlock");
}

/// Point 1: the `sync_replicas` rollback of a nested acquisition restores the outer level's
/// need. Before the fix the nested 300 ms lease (and the rollback's PEXPIRE 300) let the
/// key expire during WAIT: the outer watchdog hold was gone (PTTL -2).
#[test]
fn a_rolled_back_nested_acquisition_keeps_the_outer_lease() {
    let primary = support::primary();
    let replica = support::synced_replica(&primary);
    let mut con = primary.connection();
    let c = build(
        CLIENTS
            .watchdog(Duration::from_secs(6))
            .command(Duration::from_secs(2))
            .builder_at(&primary)
            .sync_replicas(1, Duration::from_secs(1)),
    );
    let lock = c.lock("nest-repl");
    // A replica that has just synced may miss its first WAIT; a refused acquisition is
    // rolled back, so trying again is safe.
    let mut outer = lock.lock();
    for _ in 1..5 {
        if outer.is_ok() {
            break;
        }
        outer = lock.lock();
    }
    let outer = outer.expect("outer lock, confirmed by the replica");

    replica.freeze();
    let thaw = support::Thaw(&replica);
    let nested = lock
        .try_lock_with(redmutex::LockOptions::new().lease(MS300))
        .map(Option::unwrap);
    assert!(
        matches!(nested, Err(Error::NotReplicated { acked: 0, .. })),
        "expected NotReplicated with the replica frozen, got {nested:?}"
    );
    let left = pttl(&mut con, &Keys::lock(PREFIX, "nest-repl").key());
    assert!(
        left > 4000,
        "the rolled-back nested 300 ms level shortened the outer 6 s watchdog lease: \
         PTTL {left} ms"
    );
    assert!(!outer.is_lease_lost(), "the outer guard lost its lease");
    drop(thaw);
    outer.unlock().expect("outer unlock with the replica back");
}

// ---------------------------------------------------------------------------------------
// Point 2: lock names vs the fencing-token counter
// ---------------------------------------------------------------------------------------

/// Point 2: `user:{42}:fence` is an ordinary lock name that never meets the token counter
/// of the fenced lock `user:{42}`. Before the fix it was the counter's key: taking it
/// failed with WRONGTYPE, and its force_unlock deleted the counter (tokens restarted at 1).
#[test]
fn a_lock_named_like_a_fence_counter_is_an_ordinary_lock() {
    let (_server, c) = CLIENTS.serve();
    let fenced = c.fenced_lock("user:{42}");
    let mut last = 0;
    for _ in 0..2 {
        let g = fenced.lock().expect("fenced lock");
        assert!(
            g.token() > last,
            "tokens must grow: {} after {last}",
            g.token()
        );
        last = g.token();
        g.unlock().expect("fenced unlock");
    }

    let plain = c.lock("user:{42}:fence");
    let g = plain
        .try_lock()
        .expect("a lock named user:{42}:fence must be usable")
        .expect("the lock user:{42}:fence is free");
    assert_eq!(plain.hold_count().expect("hold_count"), 1);
    g.unlock().expect("plain unlock");
    let _g = plain.lock().expect("plain lock again");
    assert!(plain.force_unlock().expect("force_unlock"), "it was held");

    let g = fenced.lock().expect("fenced lock after the force_unlock");
    assert!(
        g.token() > last,
        "force_unlock of user:{{42}}:fence made the token go back: {} after {last}",
        g.token()
    );
}

/// Point 2: holding the plain lock `user:{7}:fence` does not stop the fenced lock
/// `user:{7}`. Before the fix the fenced acquire failed on the counter (WRONGTYPE) after it
/// had already written the hold: `user:{7}` stayed locked by nobody (a ghost).
#[test]
fn a_fenced_lock_works_while_a_lock_named_like_its_counter_is_held() {
    let (server, c) = CLIENTS.serve();
    let mut con = server.connection();
    let _plain = c.lock("user:{7}:fence").lock().expect("plain lock");
    let fenced = c.fenced_lock("user:{7}");
    let attempt = fenced.try_lock();
    let ghost = support::exists(&mut con, Keys::lock(PREFIX, "user:{7}").key());
    let g = match attempt {
        Ok(Some(g)) => g,
        other => panic!(
            "fenced user:{{7}} while user:{{7}}:fence is held: {other:?} \
             (key user:{{7}} left locked: {ghost})"
        ),
    };
    assert!(g.token() >= 1);
    g.unlock().expect("fenced unlock");
    assert!(
        !support::exists(&mut con, Keys::lock(PREFIX, "user:{7}").key()),
        "user:{{7}} still locked after its unlock"
    );
}

/// Point 2: names that look like auxiliary keys of other names are all ordinary locks:
/// fenced locks on all of them at once are granted, and after a force_unlock of every one
/// each name's next token is larger. Before the fix `{x}` and `{x}:fence` shared a key
/// (counter vs lock hash): one of them failed with WRONGTYPE.
#[test]
fn adversarial_names_never_share_a_counter() {
    let (_server, c) = CLIENTS.serve();
    let names: [&str; 16] = [
        "x",
        "x:fence",
        "{x}:fence",
        "x}:fence",
        "{x}",
        "x:released",
        "{x}:released",
        "}x:fence",
        "x:queue",
        "{x}:queue",
        "x:timeouts",
        "{x}:timeouts",
        "x:permits",
        "{x}:permits",
        "x:fence:fence",
        "{x}:fence:fence",
    ];
    let locks: Vec<_> = names.iter().map(|n| c.fenced_lock(*n)).collect();
    let mut last = vec![0u64; names.len()];
    for round in 0..3 {
        let guards: Vec<_> = locks
            .iter()
            .zip(&names)
            .map(|(l, n)| match l.try_lock() {
                Ok(Some(g)) => g,
                other => panic!("round {round}: fenced lock {n:?} not granted: {other:?}"),
            })
            .collect();
        for ((g, n), last) in guards.iter().zip(&names).zip(&mut last) {
            assert!(
                g.token() > *last,
                "round {round}: token of {n:?} went from {last} to {}",
                g.token()
            );
            *last = g.token();
        }
        // Every name freed administratively before any is taken again.
        for (l, n) in locks.iter().zip(&names) {
            assert!(
                l.force_unlock().expect("force_unlock"),
                "round {round}: {n:?} was not held"
            );
        }
        for g in guards {
            assert!(
                g.unlock().is_err(),
                "a force-unlocked guard must not release"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Point 3: a hold lost to a data loss is marked lost on re-acquisition
// ---------------------------------------------------------------------------------------

fn flushall(server: &RedisServer) {
    redis::cmd("FLUSHALL")
        .exec(&mut server.connection())
        .expect("FLUSHALL");
}

/// Point 3 (watchdog lease): after FLUSHALL the same thread's next `lock()` starts a new
/// hold; the old guard must report its lease lost and refuse to unlock. Before the fix
/// `g1.is_lease_lost()` stayed false and `g1.unlock()` was `Err(NotHeld)`.
#[test]
fn a_hold_lost_to_flushall_is_marked_lost_when_the_thread_takes_the_lock_again() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("flushed");
    let g1 = lock.lock().expect("first lock");
    flushall(&server);
    let g2 = lock.lock().expect("second lock");
    assert!(
        g1.is_lease_lost(),
        "the hold FLUSHALL removed is not marked lost"
    );
    let r = g1.unlock();
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "unlock of the lost hold: expected LeaseLost, got {r:?}"
    );
    assert_eq!(lock.hold_count().expect("hold_count"), 1, "g2 must hold");
    assert!(!g2.is_lease_lost());
    g2.unlock().expect("second unlock");
}

/// Point 3 (fixed lease): as above with fixed leases. Before the fix `g1.is_lease_lost()`
/// stayed false.
#[test]
fn a_fixed_hold_lost_to_flushall_is_marked_lost_when_the_thread_takes_the_lock_again() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("flushed-fixed");
    let lease = Duration::from_secs(10);
    let g1 = lock
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .expect("first lock");
    flushall(&server);
    let g2 = lock
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .expect("second lock");
    assert!(
        g1.is_lease_lost(),
        "the fixed hold FLUSHALL removed is not marked lost"
    );
    let r = g1.unlock();
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "unlock of the lost hold: expected LeaseLost, got {r:?}"
    );
    assert_eq!(lock.hold_count().expect("hold_count"), 1, "g2 must hold");
    g2.unlock().expect("second unlock");
}

// ---------------------------------------------------------------------------------------
// Point 6: an error after the grant leaves no hold
// ---------------------------------------------------------------------------------------

/// The README's minimal ACL rule, for the prefix of this file.
const ACL_RULE: &str = "on >s3cret-pw resetchannels ~holes:* &holes:* -@all \
    +evalsha +script|load +exists +hget +hmget +pttl +subscribe +unsubscribe +publish +ping +wait \
    +hincrby +hset +hexists +pexpire +del +incr";

/// A server with the user `locker` whose rule is [`ACL_RULE`] without `missing`, and the
/// URL that logs in as it.
fn acl_server(missing: &str) -> (RedisServer, String) {
    let server = RedisServer::new();
    let rule = ACL_RULE.replace(missing, "");
    assert_ne!(rule, ACL_RULE, "{missing} is in the rule");
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg("locker");
    for part in support::acl_rule_words(&rule) {
        cmd.arg(part);
    }
    cmd.exec(&mut server.connection()).expect("ACL SETUSER");
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}/", server.port());
    (server, url)
}

/// Point 6: a WAIT refused by ACL after the acquire script granted the lock must not leave
/// the lock held. Before the fix `lock()` failed but the key stayed locked for a lease.
#[test]
fn a_refused_wait_leaves_no_hold() {
    let (server, url) = acl_server(" +wait");
    let c = build(
        CLIENTS
            .builder_at(&url)
            .sync_replicas(1, Duration::from_millis(100)),
    );
    let r = c.lock("no-wait").lock();
    assert!(r.is_err(), "WAIT is refused, yet lock() returned {r:?}");
    let mut con = server.connection();
    assert!(
        !support::exists(&mut con, Keys::lock(PREFIX, "no-wait").key()),
        "lock() failed but left the lock held (PTTL {} ms)",
        pttl(&mut con, &Keys::lock(PREFIX, "no-wait").key())
    );
}

/// Point 6: an INCR refused by ACL (the fencing token) must not leave the lock held.
/// Before the fix the acquire script wrote the hold before the INCR failed.
#[test]
fn a_refused_incr_leaves_no_hold() {
    let (server, url) = acl_server(" +incr");
    let c = CLIENTS
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1))
        .at(&url);
    let r = c.fenced_lock("no-incr").try_lock();
    assert!(r.is_err(), "INCR is refused, yet try_lock() returned {r:?}");
    let mut con = server.connection();
    assert!(
        !support::exists(&mut con, Keys::lock(PREFIX, "no-incr").key()),
        "try_lock() failed but left the lock held (PTTL {} ms)",
        pttl(&mut con, &Keys::lock(PREFIX, "no-incr").key())
    );
}

// ---------------------------------------------------------------------------------------
// Point 7: the watchdog of a dropped client; builder bounds
// ---------------------------------------------------------------------------------------

/// Point 7: once the last Client and Lock handle is dropped the watchdog stops, so a live
/// watchdog guard must learn that its lease is lost. Before the fix the lease silently ran
/// out while `is_lease_lost()` stayed false.
#[test]
fn dropping_the_last_handle_marks_watchdog_guards_lost() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS
        .watchdog(Duration::from_millis(900))
        .command(MS300)
        .at(&server.url());
    let lock = c.lock("orphan");
    let g = lock.lock().expect("lock");
    drop(lock);
    drop(c);
    assert!(
        support::wait_until(Duration::from_secs(3), || g.is_lease_lost()),
        "no handle is left and the watchdog stopped, but the guard still looks held \
         (key exists: {})",
        support::exists(&mut con, Keys::lock(PREFIX, "orphan").key())
    );
    drop(g);
}

/// Point 7: the builder refuses a watchdog timeout not longer than the command timeout (a
/// renewal could then take longer than the lease). Before the fix both were accepted.
#[test]
fn a_watchdog_timeout_not_above_the_command_timeout_is_refused() {
    let secs = Duration::from_secs;
    for (watchdog, command) in [(secs(1), secs(1)), (secs(1), secs(2))] {
        let r = Client::builder()
            .url("redis://127.0.0.1:1/")
            .watchdog_timeout(watchdog)
            .command_timeout(command)
            .build();
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "watchdog {watchdog:?} with command timeout {command:?}: {r:?}"
        );
    }
    let r = Client::builder()
        .url("redis://127.0.0.1:1/")
        .watchdog_timeout(secs(3))
        .command_timeout(secs(1))
        .build();
    assert!(r.is_ok(), "watchdog 3 s with command timeout 1 s: {r:?}");
}

// ---------------------------------------------------------------------------------------
// Point 10: fork
// ---------------------------------------------------------------------------------------

/// The child side of the fork test; a no-op in a normal run.
#[test]
fn child_entry() {
    support::child::run_role(ROLE, URL, &[("fork", fork_holder)]);
}

/// Exit status of the forked process when every lock call failed as it should.
const FORK_REFUSED: i32 = 0;

/// Holds `forked`, forks, and lets the forked copy try the inherited client.
fn fork_holder(url: &str) {
    // A long watchdog period: no renewal runs (holding a pooled connection) at the fork.
    let c = CLIENTS
        .watchdog(Duration::from_secs(30))
        .command(Duration::from_secs(1))
        .at(url);
    let lock = c.lock("forked");
    let guard = lock.lock().expect("lock");
    // SAFETY: the forked copy only makes lock calls and a release on the inherited client
    // (which must refuse them) and leaves by _exit, running no destructor or atexit handler.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // Never dropped: _exit below. Before the fix lock() and try_lock() re-entered the
        // parent's hold and the inherited guard's unlock took a level off it.
        let a = lock.lock();
        let b = lock.try_lock();
        let u = guard.unlock();
        let refused = |e: Option<&Error>| matches!(e, Some(Error::Forked { .. }));
        // One bit per call that was not refused.
        let code = i32::from(!refused(a.as_ref().err()))
            | i32::from(!refused(b.as_ref().err())) << 1
            | i32::from(!refused(u.as_ref().err())) << 2;
        // SAFETY: ends the forked process at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "forked child status {status:#x}");
    say(&format!("exit {}", libc::WEXITSTATUS(status)));
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read from the parent");
    say(&format!("unlock {:?}", guard.unlock()));
}

/// Point 10: a process forked (without exec) from a holder must not use the parent's
/// client: `lock()`, `try_lock()` and the inherited guard's `unlock()` fail with
/// `Error::Forked`, and the parent's hold keeps its count. Before the fix all three went
/// through: two re-entries and one release of the parent's hold (status 7, count 2).
#[test]
fn a_forked_child_cannot_use_the_parents_client() {
    let server = RedisServer::new();
    let mut child = ChildProc::spawn("child_entry", &[(ROLE, "fork"), (URL, &server.url())]);
    let status = child.next_line();
    let mut con = server.connection();
    let counts: Vec<i64> = redis::cmd("HVALS")
        .arg(Keys::lock(PREFIX, "forked").key())
        .query(&mut con)
        .expect("HVALS");
    assert_eq!(
        status,
        format!("exit {FORK_REFUSED}"),
        "calls in the forked child that did not fail with Forked (bits: 1 lock(), \
         2 try_lock(), 4 the guard's unlock()); hold counts {counts:?}"
    );
    assert_eq!(
        counts,
        vec![1],
        "the forked child changed the parent's hold"
    );
    child.send("unlock");
    child.expect("unlock Ok(())");
    child.wait_success();
}

// ---------------------------------------------------------------------------------------
// Point 11: hold queries without a local hold; unbounded waits
// ---------------------------------------------------------------------------------------

/// Calls by command name, without the harness's own INFO.
fn calls_but_info(server: &RedisServer) -> Vec<(String, u64)> {
    let mut calls: Vec<_> = server
        .command_calls()
        .into_iter()
        .filter(|(name, _)| name != "info")
        .collect();
    calls.sort();
    calls
}

/// Point 11: `hold_count()` and `is_held_by_current_thread()` on a thread without a live
/// guard answer from the local table and send nothing. Before the fix each sent an HGET.
#[test]
fn hold_queries_of_a_thread_holding_nothing_send_no_command() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("quiet");
    // This thread held the lock once, so the client has connections and scripts loaded.
    lock.lock().expect("lock").unlock().expect("unlock");
    // Another thread holds it now, with a fixed lease (no watchdog traffic meanwhile).
    let (held_tx, held) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let other = lock.clone();
    let holder = thread::spawn(move || {
        let g = other
            .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(10)))
            .map(Option::unwrap)
            .expect("other thread's lock");
        held_tx.send(()).unwrap();
        let _ = done.recv();
        g.unlock().expect("other thread's unlock");
    });
    held.recv().expect("the other thread holds the lock");

    let before = calls_but_info(&server);
    assert_eq!(lock.hold_count().expect("hold_count"), 0);
    assert!(!lock.is_held_by_current_thread().expect("is_held"));
    let fenced = c.fenced_lock("quiet");
    assert_eq!(fenced.hold_count().expect("fenced hold_count"), 0);
    assert!(!fenced.is_held_by_current_thread().expect("fenced is_held"));
    let after = calls_but_info(&server);
    assert_eq!(
        before, after,
        "hold queries of a thread holding nothing sent commands"
    );
    done_tx.send(()).unwrap();
    holder.join().expect("holder thread");
}

/// Point 11: `try_lock_for(Duration::MAX)` waits like `lock()`. Before the fix it failed at
/// once with `InvalidArgument` (the deadline overflows the clock).
#[test]
fn try_lock_for_duration_max_waits_for_a_held_lock() {
    let (_server, c) = CLIENTS.serve();
    let lock = c.lock("forever");
    let (held_tx, held) = std::sync::mpsc::channel();
    let other = lock.clone();
    let holder = thread::spawn(move || {
        let g = other.lock().expect("other thread's lock");
        held_tx.send(()).unwrap();
        thread::sleep(Duration::from_millis(200)); // holds briefly
        let released = Instant::now();
        g.unlock().expect("other thread's unlock");
        released
    });
    held.recv().expect("the other thread holds the lock");
    let t = Instant::now();
    let r = lock.try_lock_for(Duration::MAX);
    let got = Instant::now();
    let released = holder.join().expect("holder thread");
    let g = match r {
        Ok(Some(g)) => g,
        other => panic!(
            "try_lock_for(Duration::MAX) on a held lock, after {:?}: {other:?}",
            got - t
        ),
    };
    assert!(
        got.saturating_duration_since(released) < Duration::from_secs(1),
        "acquired {:?} after the release",
        got.saturating_duration_since(released)
    );
    g.unlock().expect("unlock");
}

// ---------------------------------------------------------------------------------------
// Issue 17: the lock's own hold bookkeeping
// ---------------------------------------------------------------------------------------

/// The function that runs the bundled script `script` (see `support::function_name`):
/// what its requests carry.
fn call(server: &RedisServer, script: &str) -> String {
    support::function_name(&server.url(), script)
}

/// Issue 17, item 1: a thread holds a lock while another thread of its client waits for it
/// (so the client listens on the lock's channel, and a new call of the holder queues with
/// its first attempt). The holder's nested `try_lock_for` fails (its acquire answered with
/// an error). Before the fix the failed call, marked queued, left with a cancel that said
/// the thread held no level: `cancel.lua` deleted the outer hold and handed the lock to the
/// waiting thread while the outer guard still said it held the lock.
#[test]
fn a_failed_re_entry_keeps_the_outer_hold() {
    const NAME: &str = "reentry-fails";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let mut con = server.connection();
    let a = CLIENTS
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1))
        .at(&proxy.url());
    a.lock("warm-up").lock().unwrap().unlock().unwrap();
    let b = CLIENTS.at(&server);
    // A pooled connection first: a single try has no time to connect on a busy machine.
    assert!(!b.lock(NAME).is_locked().unwrap());
    let lock = a.lock(NAME);
    let outer = lock.lock().expect("outer");

    let (tx, got) = mpsc::channel();
    let other = lock.clone();
    let waiter = thread::spawn(move || {
        let g = other.lock();
        tx.send(()).unwrap();
        g.map(|g| g.unlock())
    });
    assert!(
        support::wait_until(Duration::from_secs(5), || support::llen(
            &mut con,
            &Keys::lock(PREFIX, NAME).queue()
        ) == 1),
        "the other thread never queued"
    );

    let acquire = call(&server, "acquire");
    proxy.fail_next_request_with(&acquire, "-ERR injected\r\n");
    let r = lock.try_lock_for(Duration::from_millis(300));
    assert!(matches!(r, Err(Error::Redis { .. })), "{r:?}");
    assert_eq!(proxy.failed_requests(), 1, "the fault was injected");

    // Before the fix the clean-up ran within a watchdog round (1 s) and handed the lock on.
    assert!(
        got.recv_timeout(Duration::from_millis(1_500)).is_err(),
        "the waiting thread got the lock while the outer guard held it"
    );
    assert!(
        b.lock(NAME).try_lock().unwrap().is_none(),
        "another client got in"
    );
    assert!(!outer.is_lease_lost(), "the outer guard lost its hold");
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "the outer level is held once"
    );
    assert_eq!(
        support::llen(&mut con, &Keys::lock(PREFIX, NAME).queue()),
        1,
        "the waiter kept its place"
    );

    outer.unlock().expect("outer unlock");
    got.recv_timeout(Duration::from_secs(2))
        .expect("the waiter got the lock once the outer guard released it");
    waiter
        .join()
        .unwrap()
        .expect("waiter lock")
        .expect("waiter unlock");
    assert!(
        !support::exists(&mut con, Keys::lock(PREFIX, NAME).key()),
        "fully released"
    );
}

/// Issue 17, item 13: once a guard says its lease is lost, `unlock()` says `LeaseLost`,
/// whatever Redis still holds (and the hold, still ours, is given back). Each guard's
/// acquisition reaches Redis 1 s after it was sent (the proxy holds every script call
/// back), so its hold on the server outlives what the guard can vouch for by that much:
/// the guard reports the loss at its lease (2.5 s) after sending, while Redis keeps the
/// hold until 3.5 s. Before the fix the release, sent inside that window, found the hold and
/// returned `Ok`.
#[test]
fn a_guard_that_said_lost_never_unlocks_ok() {
    const LEASE: Duration = Duration::from_millis(2_500);
    const LAG: Duration = Duration::from_secs(1);
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let mut con = server.connection();
    let c = CLIENTS
        .watchdog(LEASE)
        .command(Duration::from_secs(2))
        .at(&proxy.url());
    // Every script loaded before the faults begin.
    c.lock("warm-up").lock().unwrap().unlock().unwrap();
    let rw = c.read_write_lock("warm-up");
    rw.read_lock().lock().unwrap().unlock().unwrap();
    rw.write_lock().lock().unwrap().unlock().unwrap();
    c.semaphore("warm-up", 1)
        .acquire()
        .unwrap()
        .release()
        .unwrap();

    let check = |what: &str, (said, r): (Duration, Result<(), Error>)| {
        eprintln!("{what}: lost after {said:?}, unlock {r:?}");
        // Not before its lease, and well before the hold ends on the server (3.5 s).
        assert!(
            said >= LEASE - Duration::from_millis(50) && said < LEASE + LAG,
            "{what}: the loss showed after {said:?}"
        );
        assert!(matches!(r, Err(Error::LeaseLost { .. })), "{what}: {r:?}");
    };

    // A plain lock, renewed by the watchdog, and with a fixed lease.
    let lock = c.lock("lagging");
    check(
        "watchdog lock",
        lagging(
            &proxy,
            LAG,
            || lock.lock(),
            |g| g.is_lease_lost(),
            |g| g.unlock(),
        ),
    );
    assert!(
        !support::exists(&mut con, Keys::lock(PREFIX, "lagging").key()),
        "the hold, still ours, was given back"
    );
    check(
        "fixed lock",
        lagging(
            &proxy,
            LAG,
            || {
                lock.try_lock_with(redmutex::LockOptions::new().lease(LEASE))
                    .map(Option::unwrap)
            },
            |g| g.is_lease_lost(),
            |g| g.unlock(),
        ),
    );
    assert!(!support::exists(
        &mut con,
        Keys::lock(PREFIX, "lagging").key()
    ));

    // The read and write sides of a read-write lock.
    let rw = c.read_write_lock("lagging");
    check(
        "read guard",
        lagging(
            &proxy,
            LAG,
            || {
                rw.read_lock()
                    .try_lock_with(redmutex::LockOptions::new().lease(LEASE))
                    .map(Option::unwrap)
            },
            |g| g.is_lease_lost(),
            |g| g.unlock(),
        ),
    );
    check(
        "write guard",
        lagging(
            &proxy,
            LAG,
            || rw.write_lock().lock(),
            |g| g.is_lease_lost(),
            |g| g.unlock(),
        ),
    );
    assert!(
        rw.write_lock().try_lock().unwrap().is_some(),
        "the rw lock is free"
    );

    // A semaphore's permit.
    let sem = c.semaphore("lagging", 1);
    check(
        "permit",
        lagging(
            &proxy,
            LAG,
            || sem.acquire(),
            |p| p.is_lease_lost(),
            |p| p.release(),
        ),
    );
    assert_eq!(sem.available_permits().unwrap(), 1, "the permit came back");

    // A MultiLock with a fixed lease (its validity ends before its members' holds).
    // Its members on two clients, so that their calls lag side by side, not in turn.
    let c2 = CLIENTS
        .watchdog(LEASE)
        .command(Duration::from_secs(2))
        .at(&proxy.url());
    c2.lock("warm-up").lock().unwrap().unlock().unwrap();
    let multi = MultiLock::new([c.lock("lagging-1"), c2.lock("lagging-2")])
        .unwrap()
        .with_member_timeout(Duration::from_secs(2))
        .unwrap();
    let (said, r) = lagging(
        &proxy,
        LAG,
        || {
            multi
                .try_lock_with(redmutex::LockOptions::new().lease(LEASE))
                .map(Option::unwrap)
        },
        |g| g.is_lease_lost(),
        |g| g.unlock(),
    );
    eprintln!("multi: lost after {said:?}, unlock {r:?}");
    assert!(said < LEASE + LAG, "the loss showed after {said:?}");
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "multi: {r:?}");
}

/// Takes a guard through `proxy` with every script call held back `lag`, waits for the
/// guard to say its lease is lost, lifts the lag and unlocks: how long after sending the
/// acquisition the loss showed, and what unlocking said.
fn lagging<G>(
    proxy: &FaultProxy,
    lag: Duration,
    take: impl FnOnce() -> Result<G, Error>,
    lost: impl Fn(&G) -> bool,
    unlock: impl FnOnce(G) -> Result<(), Error>,
) -> (Duration, Result<(), Error>) {
    // Script calls as either command: a client whose server refused FCALL sends EVALSHA.
    proxy.delay_requests_containing("FCALL", lag);
    proxy.delay_requests_containing("EVALSHA", lag);
    let sent = Instant::now();
    let guard = take().expect("acquired");
    assert!(
        support::wait_until(Duration::from_secs(5), || lost(&guard)),
        "the guard never said its lease was lost"
    );
    let said = sent.elapsed();
    proxy.delay_requests_containing("FCALL", Duration::ZERO);
    proxy.delay_requests_containing("EVALSHA", Duration::ZERO);
    (said, unlock(guard))
}

/// Issue 17, item 1, in the scripts: a cancel told fewer levels than the thread holds by
/// more than the one an attempt can add takes nothing (the caller miscounted), and a
/// cancel told one level fewer still gives back just that ghost level.
#[test]
fn a_cancel_never_takes_levels_the_thread_holds() {
    const NAME: &str = "cancel-miscounted";
    let (server, c) = CLIENTS.serve();
    let mut con = server.connection();
    let lock = c.lock(NAME);
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(Keys::lock(PREFIX, NAME).key())
        .query(&mut con)
        .unwrap();
    let holder = fields.into_iter().find(|f| !f.starts_with('~')).unwrap();
    let cancel = |expected: u32| -> Vec<i64> {
        redis::Script::new(&support::queued_script(support::manifest::CANCEL.text))
            .key(Keys::lock(PREFIX, NAME).key())
            .key(Keys::lock(PREFIX, NAME).fence())
            .key(Keys::lock(PREFIX, NAME).queue())
            .key(Keys::lock(PREFIX, NAME).waiters())
            .arg(&holder)
            .arg(expected)
            .arg(3_000)
            .arg(0)
            .invoke(&mut server.connection())
            .expect("cancel")
    };
    let count = |con: &mut redis::Connection| -> Option<i64> {
        redis::cmd("HGET")
            .arg(Keys::lock(PREFIX, NAME).key())
            .arg(&holder)
            .query(con)
            .unwrap()
    };
    // Told none of the two levels: nothing taken.
    assert_eq!(cancel(0), vec![0, 0]);
    assert_eq!(
        count(&mut con),
        Some(2),
        "a miscounted cancel took held levels"
    );
    // Told one: the level beyond it (a ghost, as far as the script can tell) goes.
    assert_eq!(cancel(1), vec![0, 0]);
    assert_eq!(count(&mut con), Some(1));
    assert!(
        pttl(&mut con, &Keys::lock(PREFIX, NAME).key()) > 2_000,
        "the remaining level keeps its lease"
    );
    assert!(!outer.is_lease_lost());
    drop(inner);
    outer.unlock().unwrap();
}

/// Issue 17, item 1: a re-entry never queues, but a thread whose hold is gone on the server
/// is not re-entering: its attempt, refused, marks the old hold lost at once, and the call
/// waits as a new acquisition (in the queue, woken by the release).
#[test]
fn a_re_entry_into_a_hold_gone_on_the_server_waits_as_a_new_acquisition() {
    const NAME: &str = "reentry-gone";
    let server = RedisServer::new();
    let mut con = server.connection();
    let (a, b) = (CLIENTS.at(&server), CLIENTS.at(&server));
    let lock = a.lock(NAME);
    let outer = lock.lock().expect("outer");
    assert!(b.lock(NAME).force_unlock().unwrap());
    let (held_tx, held) = mpsc::channel();
    let theirs = b.lock(NAME);
    let url = server.url();
    let other = thread::spawn(move || {
        let g = theirs.lock().expect("the other client's lock");
        held_tx.send(()).unwrap();
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        // Released once the first client's thread waits in the queue.
        let queued = support::wait_until(Duration::from_secs(5), || {
            support::llen(&mut con, &Keys::lock(PREFIX, NAME).queue()) == 1
        });
        g.unlock().expect("the other client's unlock");
        queued
    });
    held.recv().unwrap();
    let again = lock
        .try_lock_for(Duration::from_secs(5))
        .expect("try_lock_for")
        .expect("acquired after the other client's release");
    assert!(other.join().unwrap(), "the thread never queued");
    assert!(outer.is_lease_lost(), "the old hold was not reported lost");
    assert_eq!(lock.hold_count().unwrap(), 1, "one level: the new hold");
    assert!(matches!(outer.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(lock.hold_count().unwrap(), 1, "the old guard took nothing");
    again.unlock().expect("unlock");
    assert!(!support::exists(&mut con, Keys::lock(PREFIX, NAME).key()));
}
