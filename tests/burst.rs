//! Bursts of one client's threads (issue 38, "10,000 waiters of one client no longer
//! queue"): many threads waiting on one held lock at once each cost one script call to
//! queue and hold no pooled connection while they wait; a call that finds every pooled
//! connection in use waits for one within its own deadline, not the connect timeout, and
//! one that cannot get one says the pool was exhausted and which setting to raise.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::Error;
use support::clients::{self, Clients};
use support::keys::Keys;
use support::{FaultProxy, RedisServer};

const PREFIX: &str = "burst:";

const CLIENTS: Clients = Clients::new(PREFIX);

/// Waiters of the suite's burst: enough that the pool (32) is many times oversubscribed
/// and that a cost per waiter above one shows, few enough for a loaded 2-core machine.
const BURST: usize = 2_000;

/// The pool of the client.
const POOL: u32 = 32;

/// The waiting client's watchdog timeout: a renewal round, which keeps the queue entries
/// alive, every third of it.
const WATCHDOG: Duration = Duration::from_secs(6);

/// The commands the test's own connections send, left out of the counts.
fn own(command: &str) -> bool {
    matches!(command, "info" | "llen" | "lrange" | "hkeys" | "ping")
}

/// What one burst measured.
struct Burst {
    queued: usize,
    queue_s: f64,
    script_calls: u64,
    commands: u64,
    by_command: HashMap<String, u64>,
    errors: Vec<String>,
    pool_errors: usize,
    drain_s: f64,
    round: Round,
    in_order: bool,
    overlaps: usize,
    acquired: usize,
}

/// `n` threads of one client (`pool_size(32)`) wait on one `FairLock` another client holds;
/// once all have queued (or failed) the holder releases and each takes the lock once.
/// Counted while they queue: the script calls and commands Redis ran.
fn burst(n: usize) -> Burst {
    const LOCK: &str = "one";
    let server = RedisServer::new();
    let keys = Keys::lock(PREFIX, LOCK);
    let holder = CLIENTS.at(&server);
    let waiters = clients::build(
        CLIENTS
            .watchdog(WATCHDOG)
            .builder_at(&server)
            .pool_size(POOL),
    );
    // The scripts loaded, the watchdog and pub/sub threads started, the client's own
    // channel subscribed: what is counted below is the waiting alone.
    waiters
        .fair_lock("warm-up")
        .lock()
        .expect("warm-up lock")
        .unlock()
        .expect("warm-up unlock");
    let guard = holder.fair_lock(LOCK).lock().expect("holder lock");
    let admin = Arc::new(Mutex::new(server.connection()));
    let before = server.command_calls();

    let go = Arc::new(Barrier::new(n + 1));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let pool_errors = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let lock = waiters.fair_lock(LOCK);
            let (go, inside, overlaps, done) =
                (go.clone(), inside.clone(), overlaps.clone(), done.clone());
            let (order, errors, pool_errors, admin) = (
                order.clone(),
                errors.clone(),
                pool_errors.clone(),
                admin.clone(),
            );
            let key = keys.key();
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    go.wait();
                    match lock.lock() {
                        Ok(g) => {
                            if inside.swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            // The holder id the server gave the hold, to set against the
                            // queue's order.
                            let fields: Vec<String> = redis::cmd("HKEYS")
                                .arg(&key)
                                .query(&mut *admin.lock().unwrap())
                                .expect("HKEYS");
                            let id = fields.into_iter().find(|f| !f.starts_with('~'));
                            order.lock().unwrap().push(id.unwrap_or_default());
                            inside.store(false, Ordering::SeqCst);
                            if let Err(e) = g.unlock() {
                                errors.lock().unwrap().push(format!("unlock: {e}"));
                            }
                        }
                        Err(e) => {
                            if matches!(e, Error::Pool { .. }) {
                                pool_errors.fetch_add(1, Ordering::SeqCst);
                            }
                            errors.lock().unwrap().push(format!("lock: {e} ({e:?})"));
                        }
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                })
                .expect("spawn a waiting thread")
        })
        .collect();
    let started = Instant::now();
    go.wait();
    let mut queued = 0;
    // Every thread queued, or the ones not queued failed: either way the burst is over.
    let settled = support::wait_until(Duration::from_secs(120), || {
        queued = support::llen(&mut admin.lock().unwrap(), &keys.queue()) as usize;
        queued + errors.lock().unwrap().len() >= n
    });
    let queue_s = started.elapsed().as_secs_f64();
    let delta = server.calls_since(&before, own);
    let queue: Vec<String> = redis::cmd("LRANGE")
        .arg(keys.queue())
        .arg(0)
        .arg(-1)
        .query(&mut *admin.lock().unwrap())
        .expect("LRANGE");
    assert!(
        settled,
        "after 120 s {queued} of {n} queued, the others neither"
    );
    let round = renewal_round(&server, &mut admin.lock().unwrap());

    let drained = Instant::now();
    guard.unlock().expect("holder unlock");
    for t in threads {
        t.join().expect("waiting thread");
    }
    let drain_s = drained.elapsed().as_secs_f64();
    let order = order.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    Burst {
        queued,
        queue_s,
        script_calls: support::script_calls(&delta),
        commands: delta.values().sum(),
        by_command: delta,
        pool_errors: pool_errors.load(Ordering::SeqCst),
        errors,
        drain_s,
        round,
        in_order: order == queue,
        overlaps: overlaps.load(Ordering::SeqCst),
        acquired: order.len(),
    }
}

/// What one renewal round of the waiting client cost Redis.
struct Round {
    script_calls: u64,
    commands: u64,
    by_command: HashMap<String, u64>,
    script_usec: u64,
}

/// The microseconds Redis spent in script calls so far (`INFO commandstats`).
fn script_usec(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            if !matches!(name, "fcall" | "evalsha" | "eval") {
                return None;
            }
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("usec="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The next renewal round of the waiting client, while its threads only wait: from the
/// first script call after a quiet spell to the last before the next (a round takes far
/// less than the quiet spell of a third of the lease between two).
fn renewal_round(server: &RedisServer, con: &mut redis::Connection) -> Round {
    const QUIET: Duration = Duration::from_millis(300);
    let calls = |con: &mut redis::Connection| support::script_calls(&support::commandstats(con));
    // Between two rounds: no call for a while.
    let mut last = calls(con);
    let mut since = Instant::now();
    assert!(
        support::wait_until(WATCHDOG, || {
            let now = calls(con);
            if now != last {
                (last, since) = (now, Instant::now());
            }
            since.elapsed() >= QUIET
        }),
        "no quiet spell between renewal rounds"
    );
    let before = server.command_calls();
    let usec = script_usec(con);
    let start = support::script_calls(&before);
    assert!(
        support::wait_until(WATCHDOG, || calls(con) > start),
        "no renewal round within a watchdog timeout"
    );
    let (mut last, mut since) = (calls(con), Instant::now());
    support::wait_until(WATCHDOG, || {
        let now = calls(con);
        if now != last {
            (last, since) = (now, Instant::now());
        }
        since.elapsed() >= QUIET
    });
    let delta = server.calls_since(&before, own);
    Round {
        script_calls: support::script_calls(&delta),
        commands: delta.values().sum(),
        by_command: delta,
        script_usec: script_usec(con) - usec,
    }
}

/// Runs a burst of `n` and checks it: every thread queued at one script call, and each
/// then held the lock once, in the queue's order.
fn burst_of(n: usize) {
    let b = burst(n);
    let per = |v: u64| v as f64 / b.queued.max(1) as f64;
    let mut by: Vec<_> = b.by_command.iter().collect();
    by.sort();
    let mut round_by: Vec<_> = b.round.by_command.iter().collect();
    round_by.sort();
    eprintln!(
        "burst of {n}: {} queued in {:.2} s; {} script calls ({:.2}/waiter), {} commands \
         ({:.2}/waiter) while queuing: {by:?}; {} errors ({} Pool); drained in {:.2} s, {} \
         acquired, in queue order: {}; a renewal round: {} script calls, {} commands ({:?}), \
         {} µs of Redis script time",
        b.queued,
        b.queue_s,
        b.script_calls,
        per(b.script_calls),
        b.commands,
        per(b.commands),
        b.errors.len(),
        b.pool_errors,
        b.drain_s,
        b.acquired,
        b.in_order,
        b.round.script_calls,
        b.round.commands,
        round_by,
        b.round.script_usec,
    );
    assert!(
        b.errors.is_empty(),
        "{} of {n} threads failed ({} with Error::Pool), e.g. {:?}",
        b.errors.len(),
        b.pool_errors,
        &b.errors[..b.errors.len().min(3)]
    );
    assert_eq!(b.queued, n, "not every waiting thread queued");
    // One script call each to queue; the watchdog's refresh of their entries, at most a
    // round or two while they queue, costs a call per 500 of them.
    // (The first of them, one pool's worth or two, find nothing subscribed yet: they
    // cost two, one that cannot queue and one that does.)
    let bound = n as u64 + 2 * u64::from(POOL) + 2 * (n as u64).div_ceil(500) + 10;
    assert!(
        b.script_calls <= bound,
        "{} script calls to queue {n} waiters ({:.2} each), more than {bound}: {by:?}",
        b.script_calls,
        per(b.script_calls)
    );
    // The watchdog keeps the entries alive in a call per 1,000 of them, with a few
    // commands each (before issue 38: a call per 500, four commands per entry).
    let calls = (n as u64).div_ceil(1_000);
    assert!(
        b.round.script_calls <= calls && b.round.commands <= 12 * calls,
        "a renewal round of {n} queue entries took {} script calls and {} commands, more \
         than {calls} and {}: {:?}",
        b.round.script_calls,
        b.round.commands,
        12 * calls,
        b.round.by_command
    );
    assert_eq!(b.overlaps, 0, "two threads held the lock at once");
    assert_eq!(b.acquired, n, "not every queued thread got the lock");
    assert!(
        b.in_order,
        "the lock was not handed on in the queue's order"
    );
}

/// Issue 38: 2,000 threads of one client (`pool_size(32)`) wait on one held `FairLock`
/// at once. Every one queues, at one script call each (the watchdog's refresh aside), none
/// fails for want of a pooled connection; released, each takes the lock once, in the
/// queue's order.
#[test]
fn a_burst_of_one_clients_waiters_queues_at_one_script_call_each() {
    burst_of(BURST);
}

/// The same with the 10,000 threads: a measurement, run by hand
/// (`cargo test --test burst -- --ignored --nocapture`).
#[test]
#[ignore = "10,000 threads: a measurement, run by hand"]
fn ten_thousand_waiters_of_one_client_all_queue() {
    burst_of(10_000);
}

/// A call that finds every pooled connection in use waits for one for as long as its own
/// deadline allows, not the connect timeout: with `pool_size(1)` and the one connection
/// held 1.5 s by a slow call, a `lock()` (no deadline) with a 300 ms connect timeout gets
/// the lock once the connection is back; a `try_lock_for(400 ms)` fails at its deadline
/// (plus the I/O grace) with `Error::PoolExhausted`, which names the pool's size and
/// `ClientBuilder::pool_size`.
#[test]
fn a_call_waits_for_a_busy_pool_within_its_own_deadline() {
    const SLOW: &str = "slow-marker";
    const HELD_FOR: Duration = Duration::from_millis(1_500);
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let c = clients::build(
        CLIENTS
            .builder_at(&proxy.url())
            .pool_size(1)
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_secs(5)),
    );
    c.lock("warm-up")
        .lock()
        .expect("warm-up lock")
        .unlock()
        .expect("warm-up unlock");
    proxy.delay_requests_containing(SLOW, HELD_FOR);
    let slow = {
        let c = c.clone();
        thread::spawn(move || c.lock(SLOW).lock().expect("slow lock").unlock())
    };
    assert!(
        proxy.wait_seen(SLOW, 1, Duration::from_secs(5)),
        "the slow call was never sent"
    );
    // Only the acquisition is slow.
    proxy.delay_requests_containing(SLOW, Duration::ZERO);
    let held_since = Instant::now();

    let (tx, rx) = mpsc::channel();
    let unbounded = {
        let (c, tx) = (c.clone(), tx.clone());
        thread::spawn(move || {
            let r = c.lock("patient").lock().map(drop);
            tx.send(()).unwrap();
            r
        })
    };
    let t = Instant::now();
    let err = c
        .lock("bounded")
        .try_lock_for(Duration::from_millis(400))
        .expect_err("no connection for the bounded call");
    let took = t.elapsed();
    assert!(
        matches!(err, Error::PoolExhausted { pool_size: 1, .. }),
        "not PoolExhausted: {err:?}"
    );
    let text = err.to_string();
    eprintln!("the bounded call after {took:?}: {text}");
    assert!(
        text.contains("pool")
            && text.contains("exhausted")
            && text.contains("ClientBuilder::pool_size"),
        "the error does not say the pool was exhausted, and which setting to raise: {text}"
    );
    assert_eq!(err.lock_name(), Some("bounded"), "{text}");
    assert!(format!("{err:?}").find("Error(None)").is_none(), "{err:?}");
    // The deadline and the I/O grace (250 ms), with room for a loaded machine; never the
    // connect timeout alone.
    assert!(
        took >= Duration::from_millis(390) && took < Duration::from_millis(1_200),
        "the bounded call gave up after {took:?}"
    );
    // The unbounded call still waits, past its connect timeout, while the slow call holds
    // the connection.
    assert!(
        rx.try_recv().is_err(),
        "the unbounded call returned while the pool's one connection was in use"
    );
    slow.join()
        .expect("slow thread")
        .expect("the slow lock's release");
    unbounded
        .join()
        .expect("unbounded thread")
        .expect("the unbounded call failed instead of waiting for the connection");
    assert!(
        held_since.elapsed() >= HELD_FOR - Duration::from_millis(100),
        "the connection came back early"
    );
    drop(tx);
}
