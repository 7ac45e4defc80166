//! Owned holds (`Lock::owned` → `OwnedLock` → `OwnedGuard`): a hold that belongs to the acquisition,
//! not to a thread, moved to another thread and released, dropped, lost and renewed there;
//! not reentrant either way; a thread pool passing holds to its workers never lets two jobs
//! in at once.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, TryRecvError};
use redmutex::{
    CancellationToken, Error, Fair, Fenced, LossReason, LostLease, OwnedGuard, Plain, Read,
    Upgradeable, Write,
};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const CLIENTS: Clients = Clients::DEFAULT
    .watchdog(WATCHDOG)
    .command(Duration::from_millis(500));

/// The margin on time bounds: generous for a loaded 2-core machine, small beside the
/// leases (1.5 s).
const MARGIN: Duration = Duration::from_millis(400);
const WATCHDOG: Duration = Duration::from_millis(1500);
/// How long setup steps may take.
const SETUP: Duration = Duration::from_secs(5);

/// Waits (up to 5 s) until `n` waiters are queued on the plain lock `name`.
fn await_queued(server: &RedisServer, prefix: &str, name: &str, n: i64) {
    let queue = Keys::lock(prefix, name).queue();
    let mut con = server.connection();
    let mut seen = -1;
    let ok = support::wait_until(SETUP, || {
        seen = redis::cmd("LLEN").arg(&queue).query(&mut con).unwrap();
        seen == n
    });
    assert!(ok, "LLEN {queue} is {seen}, expected {n}");
}

fn not_ready(lost: &Receiver<LostLease>) -> bool {
    matches!(lost.try_recv(), Err(TryRecvError::Empty))
}

/// Asserts the acquisition was refused with `Error::Cancelled`.
#[track_caller]
fn assert_cancelled<T: std::fmt::Debug>(outcome: &Result<T, Error>) {
    assert!(
        matches!(outcome, Err(Error::Cancelled { .. })),
        "{outcome:?}"
    );
}

fn assert_send_sync_static<T: Send + Sync + 'static>() {}

#[test]
fn owned_guards_of_every_kind_are_send_sync_and_static() {
    assert_send_sync_static::<OwnedGuard>();
    assert_send_sync_static::<OwnedGuard<Plain>>();
    assert_send_sync_static::<OwnedGuard<Fair>>();
    assert_send_sync_static::<OwnedGuard<Fenced>>();
    assert_send_sync_static::<OwnedGuard<Read>>();
    assert_send_sync_static::<OwnedGuard<Write>>();
    assert_send_sync_static::<OwnedGuard<Upgradeable>>();
    // The thread guards stay !Send: the `compile_fail` doc test on `LockGuard` says so.
}

#[test]
fn an_owned_guard_moved_to_another_thread_is_released_there() {
    let server = RedisServer::new();
    let prefix = "owned:moved:";
    let (a, b) = (
        CLIENTS.prefix(prefix).at(&server.url()),
        CLIENTS.prefix(prefix).at(&server.url()),
    );
    for kind in ["plain", "fair", "fenced"] {
        let name = format!("job:{kind}");
        let guard_thread = match kind {
            "plain" => {
                let guard = a.lock(name.as_str()).owned().lock().unwrap();
                thread::spawn(move || guard.unlock())
            }
            "fair" => {
                let guard = a.fair_lock(name.as_str()).owned().lock().unwrap();
                thread::spawn(move || guard.unlock())
            }
            _ => {
                let guard = a.fenced_lock(name.as_str()).owned().lock().unwrap();
                assert!(guard.token() > 0);
                thread::spawn(move || guard.unlock())
            }
        };
        // Held until the other thread releases it: the taking thread does not own it.
        guard_thread
            .join()
            .unwrap()
            .expect("released on the other thread");
        assert!(
            !support::exists(&mut server.connection(), Keys::lock(prefix, &name).key()),
            "{kind}: key left"
        );
        let other = b.lock(name.as_str()).try_lock().unwrap();
        assert!(
            other.is_some(),
            "{kind}: another client takes it afterwards"
        );
    }
}

#[test]
fn an_owned_guard_dropped_on_another_thread_releases_it() {
    let server = RedisServer::new();
    let prefix = "owned:dropped:";
    let (a, b) = (
        CLIENTS.prefix(prefix).at(&server.url()),
        CLIENTS.prefix(prefix).at(&server.url()),
    );
    let guard = a.lock("job").owned().lock().unwrap();
    assert!(support::exists(
        &mut server.connection(),
        Keys::lock(prefix, "job").key()
    ));
    assert!(
        b.lock("job").try_lock().unwrap().is_none(),
        "held meanwhile"
    );
    thread::spawn(move || drop(guard)).join().unwrap();
    assert!(
        !support::exists(&mut server.connection(), Keys::lock(prefix, "job").key()),
        "the drop released it"
    );
    assert!(b.lock("job").try_lock().unwrap().is_some());
}

#[test]
fn an_owned_hold_lost_on_another_thread_is_told_there() {
    let server = RedisServer::new();
    let prefix = "owned:lost:";
    let (a, heard) = CLIENTS.prefix(prefix).heard_at(&server);
    let b = CLIENTS.prefix(prefix).at(&server.url());
    let guard = a.lock("job").owned().lock().unwrap();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(0);
    let holder = thread::spawn(move || {
        let lost = guard.lost();
        assert!(not_ready(&lost) && !guard.is_lease_lost());
        ready_tx.send(()).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let fired = select! {
            recv(lost) -> r => {
                assert_eq!(r.map(|l| l.reason()), Ok(LossReason::Deleted), "what was lost");
                Instant::now()
            }
            recv(crossbeam_channel::at(until)) -> _ => panic!("never told of the loss"),
        };
        assert!(guard.is_lease_lost(), "lost on the thread that has it");
        (fired, guard.unlock())
    });
    ready_rx.recv().unwrap();
    assert!(b.lock("job").force_unlock().unwrap());
    let forced = Instant::now();
    let (fired, unlocked) = holder.join().unwrap();
    // The next renewal round (a third of the lease) finds the hold gone.
    let took = fired.saturating_duration_since(forced);
    println!("told {took:?} after the force_unlock");
    assert!(took <= WATCHDOG / 3 + MARGIN, "told after {took:?}");
    assert!(
        matches!(unlocked, Err(Error::LeaseLost { .. })),
        "{unlocked:?}"
    );
    heard
        .each
        .recv_timeout(MARGIN)
        .expect("the hook heard of it");
    assert_eq!(
        *heard.all.lock().unwrap(),
        [("job".to_owned(), "Lock", LossReason::Deleted)],
        "the hook is told once"
    );
}

#[test]
fn an_owned_hold_is_renewed_past_its_lease_on_another_thread() {
    let server = RedisServer::new();
    let prefix = "owned:renewed:";
    let a = CLIENTS.prefix(prefix).at(&server.url());
    let b = CLIENTS.prefix(prefix).at(&server.url());
    let guard = a.lock("job").owned().lock().unwrap();
    let acquired = Instant::now();
    let lost = guard.lost();
    let holder = thread::spawn(move || {
        // Time is the subject: held well past two leases on a thread that never took it.
        thread::sleep(Duration::from_secs(4));
        assert!(!guard.is_lease_lost(), "renewed, not lost");
        guard.unlock()
    });
    // Watched from here while the other thread holds it: still there, still renewed.
    while acquired.elapsed() < Duration::from_millis(3500) {
        assert!(
            support::exists(&mut server.connection(), Keys::lock(prefix, "job").key()),
            "the key expired"
        );
        assert!(
            b.lock("job").try_lock().unwrap().is_none(),
            "taken meanwhile"
        );
        assert!(not_ready(&lost), "told of a loss");
        thread::sleep(Duration::from_millis(250));
    }
    holder.join().unwrap().expect("released after 4 s");
    assert!(!support::exists(
        &mut server.connection(),
        Keys::lock(prefix, "job").key()
    ));
    assert!(
        lost.recv_timeout(MARGIN).is_err(),
        "ready (disconnected) once released"
    );
}

#[test]
fn owned_holds_are_not_reentrant_either_way() {
    let server = RedisServer::new();
    let prefix = "owned:reentry:";
    let a = CLIENTS.prefix(prefix).at(&server.url());
    let lock = a.lock("job");

    // A thread hold, then an owned acquisition by the same thread: refused, it waits.
    let thread_guard = lock.lock().unwrap();
    assert!(lock.owned().try_lock().unwrap().is_none());
    let started = Instant::now();
    assert!(lock
        .owned()
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(started.elapsed() >= Duration::from_millis(300), "waited");
    // The thread itself still re-enters.
    let nested = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    drop(nested);
    thread_guard.unlock().unwrap();

    // An owned hold, then the same thread: neither a thread acquisition nor a second owned
    // one re-enters it; it does not count as the thread's.
    let owned = lock.owned().try_lock().unwrap().expect("free");
    assert!(lock.try_lock().unwrap().is_none());
    assert!(lock
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(lock.owned().try_lock().unwrap().is_none(), "two owners");
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert!(!lock.is_held_by_current_thread().unwrap());

    // A blocked owned acquisition gets it once the first owned hold is released elsewhere.
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.owned().lock())
    };
    await_queued(&server, prefix, "job", 1);
    assert!(!waiter.is_finished(), "waits behind the owned hold");
    thread::spawn(move || owned.unlock())
        .join()
        .unwrap()
        .unwrap();
    let second = waiter.join().unwrap().expect("handed the lock");
    assert!(lock.is_locked().unwrap());
    second.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn owned_read_holds_share_and_exclude_writers() {
    let server = RedisServer::new();
    let a = CLIENTS.prefix("owned:rw:").at(&server.url());
    let rw = a.read_write_lock("doc");
    let r1 = rw.read_lock().owned().lock().unwrap();
    let r2 = rw
        .read_lock()
        .owned()
        .try_lock()
        .unwrap()
        .expect("readers share");
    assert!(rw.write_lock().owned().try_lock().unwrap().is_none());
    assert!(rw.write_lock().try_lock().unwrap().is_none());
    let (t1, t2) = (
        thread::spawn(move || r1.unlock()),
        thread::spawn(move || r2.unlock()),
    );
    t1.join().unwrap().unwrap();
    t2.join().unwrap().unwrap();
    let w = rw
        .write_lock()
        .owned()
        .try_lock()
        .unwrap()
        .expect("free for a writer");
    assert!(rw.read_lock().try_lock().unwrap().is_none());
    thread::spawn(move || w.unlock()).join().unwrap().unwrap();
}

#[test]
fn a_blocked_owned_acquisition_is_cancelled() {
    let server = RedisServer::new();
    let prefix = "owned:cancel:";
    let a = CLIENTS.prefix(prefix).at(&server.url());
    let lock = a.lock("job");
    let held = lock.lock().unwrap();
    let token = CancellationToken::new();
    let waiter = {
        let (lock, token) = (lock.clone(), token.clone());
        thread::spawn(move || {
            lock.owned()
                .try_lock_with(redmutex::LockOptions::new().cancellable(&token))
                .map(Option::unwrap)
        })
    };
    await_queued(&server, prefix, "job", 1);
    assert!(!waiter.is_finished());
    let cancelled = Instant::now();
    token.cancel();
    let outcome = waiter.join().unwrap();
    let took = cancelled.elapsed();
    println!("cancelled call returned {took:?} after cancel()");
    assert_cancelled(&outcome);
    assert!(
        took < Duration::from_millis(200),
        "returned {took:?} after cancel"
    );
    await_queued(&server, prefix, "job", 0);
    // The bounded variant: a token cancelled before the call fails it at once.
    let outcome = lock.owned().try_lock_with(
        redmutex::LockOptions::new()
            .wait_until(Instant::now() + SETUP)
            .cancellable(&token),
    );
    assert_cancelled(&outcome);
    held.unlock().unwrap();
    assert!(
        lock.owned().try_lock().unwrap().is_some(),
        "no ghost holds it"
    );
}

#[test]
fn an_owned_fixed_lease_runs_out_and_extends() {
    let server = RedisServer::new();
    let a = CLIENTS.prefix("owned:lease:").at(&server.url());
    let lease = Duration::from_millis(1000);
    let guard = a
        .lock("job")
        .owned()
        .try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .unwrap();
    let acquired = Instant::now();
    guard.extend(Duration::from_millis(2000)).unwrap();
    let lost = guard.lost();
    let holder = thread::spawn(move || {
        let r = lost.recv_timeout(Duration::from_secs(10));
        assert_eq!(r.map(|l| l.reason()), Ok(LossReason::LeaseExpired));
        let fired = Instant::now();
        assert!(guard.is_lease_lost());
        (fired, guard.unlock())
    });
    let (fired, unlocked) = holder.join().unwrap();
    let at = fired - acquired;
    println!("extended lease ended after {at:?}");
    assert!(
        at + MARGIN >= Duration::from_millis(2000),
        "too early: {at:?}"
    );
    assert!(
        at <= Duration::from_millis(2000) + MARGIN,
        "too late: {at:?}"
    );
    assert!(
        matches!(unlocked, Err(Error::LeaseLost { .. })),
        "{unlocked:?}"
    );
    assert!(matches!(
        a.lock("job")
            .try_lock()
            .unwrap()
            .map(|g| g.extend(Duration::from_secs(1))),
        Some(Err(Error::InvalidArgument { .. }))
    ));
}

#[test]
fn a_thread_pool_passing_owned_holds_never_lets_two_jobs_in() {
    let server = RedisServer::new();
    let prefix = "owned:pool:";
    let a = CLIENTS.prefix(prefix).at(&server.url());
    let lock = a.fenced_lock("shared");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<(usize, OwnedGuard<Fenced>)>();
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (jobs, inside, most, done, tokens) = (
                jobs_rx.clone(),
                inside.clone(),
                most.clone(),
                done.clone(),
                tokens.clone(),
            );
            thread::spawn(move || {
                for (job, guard) in jobs {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push((job, guard.token()));
                    thread::sleep(Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.unlock().expect("released by the worker");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // The dispatcher takes each job's hold and hands it to whichever worker is free: it
    // blocks until the previous job's worker released it.
    for job in 0..8 {
        let guard = lock.owned().lock().unwrap();
        jobs_tx.send((job, guard)).unwrap();
    }
    drop(jobs_tx);
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 8);
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two jobs were inside at once"
    );
    let tokens = tokens.lock().unwrap();
    let mut by_job = tokens.clone();
    by_job.sort();
    assert!(
        by_job.windows(2).all(|w| w[0].1 < w[1].1),
        "fencing tokens grow job after job: {by_job:?}"
    );
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn an_owned_waiter_of_a_fair_lock_is_handed_it_in_turn() {
    let server = RedisServer::new();
    let prefix = "owned:fair:";
    let (a, b) = (
        CLIENTS.prefix(prefix).at(&server.url()),
        CLIENTS.prefix(prefix).at(&server.url()),
    );
    let held = a.fair_lock("job").lock().unwrap();
    let (order_tx, order) = crossbeam_channel::unbounded();
    let first = {
        let (lock, order_tx) = (a.fair_lock("job"), order_tx.clone());
        thread::spawn(move || {
            let guard = lock.owned().lock().unwrap();
            order_tx.send(("owned", Instant::now())).unwrap();
            guard
        })
    };
    await_queued(&server, prefix, "job", 1);
    let second = {
        let lock = b.fair_lock("job");
        thread::spawn(move || {
            let guard = lock.lock().unwrap();
            order_tx.send(("thread", Instant::now())).unwrap();
            guard.unlock()
        })
    };
    await_queued(&server, prefix, "job", 2);
    let released = Instant::now();
    held.unlock().unwrap();
    // Handed over by the release, not after a pickup window (1 s) or a lease.
    let (who, at) = order.recv_timeout(SETUP).unwrap();
    assert_eq!(who, "owned", "first come, first served");
    let took = at - released;
    println!("owned waiter handed the lock {took:?} after the release");
    assert!(
        took < Duration::from_millis(500),
        "handed over after {took:?}"
    );
    // Its guard comes back from the thread that took it and is released by another one.
    let guard = first.join().unwrap();
    assert!(order.try_recv().is_err(), "the next waiter waits for it");
    thread::spawn(move || guard.unlock())
        .join()
        .unwrap()
        .unwrap();
    let (who, _) = order.recv_timeout(SETUP).unwrap();
    assert_eq!(who, "thread");
    second.join().unwrap().unwrap();
}
