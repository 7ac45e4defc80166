//! Cancelling a blocked acquisition from another thread (`CancellationToken`): the call wakes at
//! once, leaves the queue in one step (no ghost entry: the next waiter is served as soon as
//! the lock frees, not after a pickup window), holds nothing, and returns
//! `Err(Cancelled)`; for every primitive that waits in a queue.
//!
//! Bounds. "At once" is measured from `cancel()` to the call's return: one wake-up and
//! the one round trip of the leave-the-queue script. The issue asks for 10 ms; quiet runs
//! stay well inside it (the distribution test prints it), but these tests also run with
//! both cores of a small machine busy, where a thread can wait tens of milliseconds for a
//! core, so they assert `CANCEL_BOUND` (100 ms). A ghost entry at the head of the queue
//! would cost the next waiter the whole 1 s pickup window (the lock handed to a waiter
//! that no longer listens), so "served without delay" is `SERVED_BOUND` (500 ms), well
//! below it.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{CancellationToken, Error, MultiLock};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, FaultProxy, RedisServer};

const PREFIX: &str = "cancel:";

const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_secs(10))
    .command(Duration::from_secs(2));
/// From `cancel()` to the call's return, on a loaded machine (10 ms asked; see above).
const CANCEL_BOUND: Duration = Duration::from_millis(100);
/// From the lock freeing to the next waiter holding it: far below the 1 s pickup window a
/// ghost entry would cost.
const SERVED_BOUND: Duration = Duration::from_millis(500);
/// How long setup steps (a waiter showing in the queue) may take.
const SETUP: Duration = Duration::from_secs(5);

fn await_len(con: &mut redis::Connection, key: &str, n: i64, who: &str) {
    let mut seen = -1;
    let ok = wait_until(SETUP, || {
        seen = support::llen(con, key);
        seen == n
    });
    assert!(ok, "{who}: LLEN {key} is {seen}, expected {n}");
}

/// What one cancellation showed.
struct Outcome {
    /// From `cancel()` to the cancelled call's return.
    cancelled_in: Duration,
    /// From the lock freeing (the holder's release returned, or the cancel when the
    /// cancelled waiter alone kept the next one out) to the next waiter holding it.
    served_in: Duration,
}

/// A holder holds (`hold`); a waiter blocks in `wait` with a token; a next waiter blocks
/// behind it (`next`); the token is cancelled. The cancelled call must return
/// `Err(Cancelled)` within `CANCEL_BOUND`, leave the queue at once (LLEN back to one, the
/// next waiter's), and the next waiter must hold the lock within `SERVED_BOUND` of the
/// holder's release. With `next_in_on_cancel` the next waiter is not kept out by the
/// holder (readers behind a cancelled writer): it must get in within that bound of the
/// cancel, before the holder releases.
fn cancel_queued_waiter<G1, G2, G3>(
    server: &RedisServer,
    queue: &str,
    hold: impl FnOnce() -> G1 + Send,
    wait: impl FnOnce(&CancellationToken) -> Result<G2, Error> + Send,
    next: impl FnOnce() -> G3 + Send,
    next_in_on_cancel: bool,
) -> Outcome {
    let mut con = server.connection();
    assert_eq!(support::llen(&mut con, queue), 0, "a queue before the test");
    let token = CancellationToken::new();
    let (cancelled_in, served_in) = thread::scope(|s| {
        let (held_tx, held_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (released_tx, released_rx) = mpsc::channel();
        s.spawn(move || {
            let g = hold();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
            drop(g);
            released_tx.send(Instant::now()).unwrap();
        });
        held_rx.recv_timeout(SETUP).expect("the holder holds");

        let (result_tx, result_rx) = mpsc::channel();
        let t = token.clone();
        s.spawn(move || {
            let r = wait(&t).map(drop);
            result_tx.send((r, Instant::now())).unwrap();
        });
        await_len(&mut con, queue, 1, "the cancellable waiter queued");

        let (got_tx, got_rx) = mpsc::channel();
        s.spawn(move || {
            let g = next();
            got_tx.send(Instant::now()).unwrap();
            drop(g);
        });
        await_len(&mut con, queue, 2, "the next waiter queued behind it");

        let cancelled = Instant::now();
        token.cancel();
        let (r, returned) = result_rx
            .recv_timeout(SETUP)
            .expect("the cancelled call returned");
        assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
        let cancelled_in = returned - cancelled;
        assert!(
            cancelled_in <= CANCEL_BOUND,
            "the cancelled call returned {cancelled_in:?} after the cancel"
        );
        let served_in = if next_in_on_cancel {
            let got = got_rx.recv_timeout(SETUP).expect("the next waiter got in");
            release_tx.send(()).unwrap();
            released_rx.recv_timeout(SETUP).expect("released");
            got - cancelled
        } else {
            // Out of the queue before the call returned: only the next waiter is left.
            assert_eq!(
                support::llen(&mut con, queue),
                1,
                "the cancelled waiter left a ghost"
            );
            assert!(
                got_rx.try_recv().is_err(),
                "the next waiter got the lock while it was held"
            );
            release_tx.send(()).unwrap();
            let released = released_rx.recv_timeout(SETUP).expect("released");
            let got = got_rx
                .recv_timeout(SETUP)
                .expect("the next waiter got the lock");
            got.saturating_duration_since(released)
        };
        assert!(
            served_in <= SERVED_BOUND,
            "the next waiter was served {served_in:?} after the lock freed"
        );
        (cancelled_in, served_in)
    });
    assert!(
        wait_until(SETUP, || support::llen(&mut con, queue) == 0),
        "the queue kept entries"
    );
    Outcome {
        cancelled_in,
        served_in,
    }
    .report(queue)
}

impl Outcome {
    fn report(self, what: &str) -> Outcome {
        eprintln!(
            "{what}: cancelled in {:?}, next served in {:?}",
            self.cancelled_in, self.served_in
        );
        self
    }
}

#[test]
fn a_blocked_lock_is_cancelled_at_once_and_the_next_waiter_served() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    cancel_queued_waiter(
        &server,
        &Keys::lock(PREFIX, "plain").queue(),
        || a.lock("plain").lock().unwrap(),
        |t| {
            b.lock("plain")
                .try_lock_with(redmutex::LockOptions::new().cancellable(t))
                .map(Option::unwrap)
        },
        || c.lock("plain").lock().unwrap(),
        false,
    );
}

#[test]
fn a_blocked_fair_lock_is_cancelled_at_once_and_the_next_waiter_served() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    cancel_queued_waiter(
        &server,
        &Keys::lock(PREFIX, "fair").queue(),
        || a.fair_lock("fair").lock().unwrap(),
        |t| {
            b.fair_lock("fair")
                .try_lock_with(
                    redmutex::LockOptions::new()
                        .wait_until(Instant::now() + Duration::from_secs(60))
                        .cancellable(t),
                )
                .map(|g| g.expect("a cancel, not the deadline"))
        },
        || c.fair_lock("fair").lock().unwrap(),
        false,
    );
}

#[test]
fn a_blocked_read_is_cancelled_at_once_and_the_next_writer_served() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    cancel_queued_waiter(
        &server,
        &Keys::rw(PREFIX, "rw-read").queue(),
        || a.read_write_lock("rw-read").write_lock().lock().unwrap(),
        |t| {
            b.read_write_lock("rw-read")
                .read_lock()
                .try_lock_with(redmutex::LockOptions::new().cancellable(t))
                .map(Option::unwrap)
        },
        || c.read_write_lock("rw-read").write_lock().lock().unwrap(),
        false,
    );
}

/// A writer waiting behind a reader keeps the readers that come after it out (writers are
/// not starved): cancelling it must let them in at once, while the first reader still
/// reads.
#[test]
fn a_blocked_write_is_cancelled_at_once_and_the_readers_behind_it_let_in() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    cancel_queued_waiter(
        &server,
        &Keys::rw(PREFIX, "rw-write").queue(),
        || a.read_write_lock("rw-write").read_lock().lock().unwrap(),
        |t| {
            b.read_write_lock("rw-write")
                .write_lock()
                .try_lock_with(redmutex::LockOptions::new().cancellable(t))
                .map(Option::unwrap)
        },
        || c.read_write_lock("rw-write").read_lock().lock().unwrap(),
        true,
    );
}

#[test]
fn a_blocked_semaphore_acquire_is_cancelled_at_once_and_the_next_waiter_served() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    cancel_queued_waiter(
        &server,
        &Keys::sem(PREFIX, "sem").queue(),
        || {
            a.semaphore("sem", 2)
                .try_acquire_with(redmutex::LockOptions::new().permits(2))
                .map(Option::unwrap)
                .unwrap()
        },
        |t| {
            b.semaphore("sem", 2)
                .try_acquire_with(redmutex::LockOptions::new().cancellable(t))
                .map(Option::unwrap)
        },
        || c.semaphore("sem", 2).acquire().unwrap(),
        false,
    );
}

#[test]
fn a_blocked_multilock_is_cancelled_at_once_and_the_next_waiter_served() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    let both = MultiLock::new([b.lock("multi-1"), b.lock("multi-2")]).unwrap();
    cancel_queued_waiter(
        &server,
        &Keys::lock(PREFIX, "multi-1").queue(),
        || a.lock("multi-1").lock().unwrap(),
        |t| {
            both.try_lock_with(redmutex::LockOptions::new().cancellable(t))
                .map(Option::unwrap)
        },
        || c.lock("multi-1").lock().unwrap(),
        false,
    );
    // The member it did get in its rounds was given back each time.
    let mut con = server.connection();
    let exists: bool = support::query_key(&mut con, "EXISTS", format!("{PREFIX}{{multi-2}}"));
    assert!(!exists, "the cancelled MultiLock kept a member");
}

/// A token cancelled before the call: `Cancelled` at once, and not one command sent.
#[test]
fn a_token_cancelled_before_the_call_sends_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let semaphore = c.semaphore("pre-sem", 1);
    let both = MultiLock::new([c.lock("pre-1"), c.lock("pre-2")]).unwrap();
    // Warm the pools and load the scripts: what follows is the calls' own traffic only.
    c.lock("warm").lock().unwrap().unlock().unwrap();
    support::await_own_channel(&server, PREFIX, &c);
    let token = CancellationToken::new();
    token.cancel();
    let without_info = |mut stats: std::collections::HashMap<String, u64>| {
        stats.remove("info");
        stats
    };
    let before = without_info(server.command_calls());
    let far = Instant::now() + Duration::from_secs(60);
    let lock = c.lock("pre");
    assert!(matches!(
        lock.try_lock_with(redmutex::LockOptions::new().cancellable(&token))
            .map(Option::unwrap),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_until(far)
                .cancellable(&token)
        ),
        Err(Error::Cancelled { .. })
    ));
    let rw = c.read_write_lock("pre-rw");
    assert!(matches!(
        rw.read_lock()
            .try_lock_with(redmutex::LockOptions::new().cancellable(&token))
            .map(Option::unwrap),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        rw.write_lock()
            .try_lock_with(redmutex::LockOptions::new().cancellable(&token))
            .map(Option::unwrap),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        semaphore
            .try_acquire_with(redmutex::LockOptions::new().cancellable(&token))
            .map(Option::unwrap),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        semaphore.try_acquire_with(
            redmutex::LockOptions::new()
                .permits(1)
                .wait_until(far)
                .cancellable(&token)
        ),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        both.try_lock_with(redmutex::LockOptions::new().cancellable(&token))
            .map(Option::unwrap),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        both.try_lock_with(
            redmutex::LockOptions::new()
                .wait_until(far)
                .cancellable(&token)
        ),
        Err(Error::Cancelled { .. })
    ));
    assert_eq!(
        without_info(server.command_calls()),
        before,
        "a cancelled token's call sent commands"
    );
    // Bad input still reads as bad input, not as a cancel.
    assert!(matches!(
        c.lock("")
            .try_lock_with(redmutex::LockOptions::new().cancellable(&token))
            .map(Option::unwrap),
        Err(Error::InvalidName(_))
    ));
    // A token not cancelled changes nothing: a free lock is taken at once.
    let fresh = CancellationToken::new();
    c.lock("free")
        .try_lock_with(redmutex::LockOptions::new().cancellable(&fresh))
        .map(Option::unwrap)
        .unwrap()
        .unlock()
        .unwrap();
}

/// The lock is handed to the waiter (the release made it the holder) just as it is
/// cancelled, before its thread heard of the grant: the grant's message is held back by a
/// proxy, so the cancel is seen first. The call must neither return `Cancelled` holding
/// the lock nor strand it until its pickup window ends: the script that takes it out of
/// the queue gives the hold back and hands the lock on, and the next waiter holds it at
/// once.
#[test]
fn a_cancel_racing_a_grant_hands_the_lock_on() {
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let a = CLIENTS.at(&server.url());
    let b = CLIENTS.at(&proxy.url());
    let c = CLIENTS.at(&server.url());
    let name = "raced";
    let q = Keys::lock(PREFIX, name).queue();
    let mut con = server.connection();
    let token = CancellationToken::new();
    thread::scope(|s| {
        let held = a.fair_lock(name).lock().unwrap();
        let (result_tx, result_rx) = mpsc::channel();
        let t = token.clone();
        let b = &b;
        s.spawn(move || {
            let r = b
                .fair_lock(name)
                .try_lock_with(redmutex::LockOptions::new().cancellable(&t))
                .map(Option::unwrap)
                .map(drop);
            result_tx.send((r, Instant::now())).unwrap();
        });
        await_len(&mut con, &q, 1, "the cancellable waiter queued");
        let (got_tx, got_rx) = mpsc::channel();
        let c = &c;
        s.spawn(move || {
            let g = c.fair_lock(name).lock().unwrap();
            got_tx.send(Instant::now()).unwrap();
            drop(g);
        });
        await_len(&mut con, &q, 2, "the next waiter queued");
        // Messages on the lock's channel (the grant) reach the cancelled client late; its
        // own requests (the cancel script) do not.
        proxy.delay_replies_containing(name, Duration::from_millis(1_500));
        held.unlock().unwrap();
        let released = Instant::now();
        // The release made the cancellable waiter the holder.
        let holders: Vec<String> = redis::cmd("HKEYS")
            .arg(Keys::lock(PREFIX, name).key())
            .query(&mut con)
            .unwrap();
        assert_eq!(holders.iter().filter(|h| !h.starts_with('~')).count(), 1);
        assert_eq!(support::llen(&mut con, &q), 1, "handed to the first waiter");
        let cancelled = Instant::now();
        token.cancel();
        let (r, returned) = result_rx.recv_timeout(SETUP).expect("returned");
        assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
        let cancelled_in = returned - cancelled;
        assert!(
            cancelled_in <= CANCEL_BOUND,
            "returned after {cancelled_in:?}"
        );
        let got = got_rx.recv_timeout(SETUP).expect("the next waiter got it");
        let served_in = got - released;
        assert!(
            served_in <= SERVED_BOUND,
            "the next waiter got the lock {served_in:?} after the release: the grant to \
             the cancelled waiter was stranded"
        );
        eprintln!("raced grant: cancelled in {cancelled_in:?}, next served in {served_in:?}");
    });
    proxy.delay_replies_containing(name, Duration::ZERO);
    assert!(wait_until(SETUP, || support::llen(&mut con, &q) == 0));
    assert!(wait_until(SETUP, || !a
        .fair_lock(name)
        .is_locked()
        .unwrap()));
}

/// Cancels and releases at nearly the same moment, many times: whichever wins, the
/// cancelled call either holds the lock (`Ok`, the grant came first) or holds nothing,
/// never two hold it at once, and the next waiter always gets it promptly.
#[test]
fn cancels_racing_releases_never_strand_or_double_the_lock() {
    let server = RedisServer::new();
    let (a, b, c) = (
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
        CLIENTS.at(&server.url()),
    );
    let name = "race";
    let q = Keys::lock(PREFIX, name).queue();
    let mut con = server.connection();
    let inside = AtomicBool::new(false);
    let (mut won, mut lost) = (0, 0);
    for round in 0..20u64 {
        let token = CancellationToken::new();
        thread::scope(|s| {
            let held = a.fair_lock(name).lock().unwrap();
            let (result_tx, result_rx) = mpsc::channel();
            let (t, inside, b) = (token.clone(), &inside, &b);
            s.spawn(move || {
                let r = b
                    .fair_lock(name)
                    .try_lock_with(redmutex::LockOptions::new().cancellable(&t))
                    .map(Option::unwrap)
                    .map(|g| {
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                        thread::sleep(Duration::from_millis(2));
                        inside.store(false, Ordering::SeqCst);
                        g.unlock().unwrap();
                    });
                result_tx.send((r, Instant::now())).unwrap();
            });
            await_len(&mut con, &q, 1, "the cancellable waiter queued");
            let (got_tx, got_rx) = mpsc::channel();
            let c = &c;
            s.spawn(move || {
                let g = c.fair_lock(name).lock().unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                got_tx.send(Instant::now()).unwrap();
                inside.store(false, Ordering::SeqCst);
                drop(g);
            });
            await_len(&mut con, &q, 2, "the next waiter queued");
            // The release and the cancel from two threads, the cancel a little later
            // each round (0 to 1.9 ms), across the grant's arrival.
            let t = token.clone();
            let canceller = s.spawn(move || {
                let at = Instant::now() + Duration::from_micros(round * 100);
                while Instant::now() < at {
                    std::hint::spin_loop();
                }
                t.cancel();
            });
            held.unlock().unwrap();
            let released = Instant::now();
            canceller.join().unwrap();
            let (r, returned) = result_rx.recv_timeout(SETUP).expect("returned");
            match r {
                Ok(()) => won += 1,
                Err(Error::Cancelled { .. }) => lost += 1,
                Err(e) => panic!("{e}"),
            }
            let got = got_rx.recv_timeout(SETUP).expect("the next waiter got it");
            let from = returned.max(released);
            let served_in = got.saturating_duration_since(from);
            assert!(
                served_in <= SERVED_BOUND,
                "round {round}: the next waiter got the lock {served_in:?} late"
            );
        });
        assert!(
            wait_until(SETUP, || support::llen(&mut con, &q) == 0),
            "round {round}: entries left"
        );
    }
    eprintln!("cancel vs release: the grant won {won}, the cancel {lost} of 20");
}

/// The spread of cancel-to-return times on a plain lock (printed; each one bounded).
#[test]
fn cancel_latency_distribution() {
    let server = RedisServer::new();
    let (a, b) = (CLIENTS.at(&server.url()), CLIENTS.at(&server.url()));
    let name = "spread";
    let q = Keys::lock(PREFIX, name).queue();
    let mut con = server.connection();
    let _held = a.lock(name).lock().unwrap();
    let lock = b.lock(name);
    let mut times = Vec::new();
    for _ in 0..30 {
        let token = CancellationToken::new();
        thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let (t, lock) = (token.clone(), &lock);
            s.spawn(move || {
                let r = lock
                    .try_lock_with(redmutex::LockOptions::new().cancellable(&t))
                    .map(Option::unwrap)
                    .map(drop);
                tx.send((r, Instant::now())).unwrap();
            });
            await_len(&mut con, &q, 1, "the waiter queued");
            // Queued; the attempt's reply may still be on its way back. Not a
            // synchronisation (a cancel then is seen when the reply is in, and still
            // bounded): it lets most samples be of a thread asleep on its wait, the case
            // the figure is about.
            thread::sleep(Duration::from_millis(5));
            let cancelled = Instant::now();
            token.cancel();
            let (r, returned) = rx.recv_timeout(SETUP).expect("returned");
            assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
            times.push(returned - cancelled);
            assert_eq!(support::llen(&mut con, &q), 0, "a ghost entry");
        });
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "cancel to return over {} calls: min {:.2} ms, median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        times.len(),
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() * 9 / 10]),
        ms(times[times.len() - 1])
    );
    let worst = times[times.len() - 1];
    assert!(worst <= CANCEL_BOUND, "a cancel took {worst:?}");
}
