//! A soak of every kind at once while every library connection is killed now and then:
//! locks (plain, fair, fenced, owned), a read-write lock's three sides, a semaphore, a
//! `MultiLock` and a count-down latch, each taken by threads of several clients. An
//! in-process witness checks every critical section (no two holders of a lock, no writer
//! beside anyone, never more permits than the semaphore has); errors are counted by kind,
//! and only those a dropped connection explains are expected. Afterwards every thread of
//! the clients ends within a second of the last one dropped, and no key is left without
//! an expiry.
//!
//! The suite runs it for 10 s; `cargo test --test soak -- --ignored` for 120 s.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, LockOptions, MultiLock};
use support::clients::Clients;
use support::RedisServer;

const PREFIX: &str = "soak:";
// Short leases, so that renewals run often and a dropped connection meets them too.
const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_millis(1_500))
    .command(Duration::from_millis(500));
const CLIENT_COUNT: usize = 3;
const THREADS_PER_CLIENT: usize = 4;
const PERMITS: i64 = 2;

/// What is inside one name's critical sections now: exclusive holders, readers, permits.
#[derive(Default)]
struct Inside {
    exclusive: AtomicI64,
    readers: AtomicI64,
    permits: AtomicI64,
}

#[derive(Default)]
struct Witness {
    names: Mutex<BTreeMap<String, Arc<Inside>>>,
    overlaps: AtomicI64,
    sections: AtomicI64,
    errors: Mutex<BTreeMap<String, u64>>,
    unexpected: Mutex<Vec<String>>,
}

impl Witness {
    fn inside(&self, name: &str) -> Arc<Inside> {
        self.names
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Stays inside a moment (so others may overlap), then leaves the section counted by
    /// `count`.
    fn leave(&self, count: &AtomicI64) {
        thread::yield_now();
        count.fetch_sub(1, Ordering::SeqCst);
        self.sections.fetch_add(1, Ordering::Relaxed);
    }

    /// A section held alone (a lock, a write): nobody else may be inside.
    fn exclusive(&self, name: &str) {
        let inside = self.inside(name);
        if inside.exclusive.fetch_add(1, Ordering::SeqCst) != 0
            || inside.readers.load(Ordering::SeqCst) != 0
        {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.leave(&inside.exclusive);
    }

    /// A shared section (a read, the upgradeable side): no writer may be inside.
    fn shared(&self, name: &str) {
        let inside = self.inside(name);
        inside.readers.fetch_add(1, Ordering::SeqCst);
        if inside.exclusive.load(Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.leave(&inside.readers);
    }

    /// A permit's section: never more than the semaphore has.
    fn permit(&self, name: &str) {
        let inside = self.inside(name);
        if inside.permits.fetch_add(1, Ordering::SeqCst) >= PERMITS {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.leave(&inside.permits);
    }

    /// Counts `e`; one a dropped connection does not explain is kept, to fail the test.
    fn error(&self, what: &str, e: &Error) {
        let kind = format!("{e:?}");
        let kind = kind.split([' ', '{', '(']).next().unwrap_or("").to_owned();
        *self.errors.lock().unwrap().entry(kind.clone()).or_default() += 1;
        let expected = matches!(
            e,
            // A call whose connection was killed: timed out, dropped, or not answered.
            Error::Timeout { .. }
                | Error::Redis { .. }
                // A MultiLock whose member's call failed so.
                | Error::NoQuorum { .. }
                // A release repeated after a reply lost with its connection: the first
                // run freed it, which the repeat cannot vouch for.
                | Error::NotHeld { .. }
                // A hold whose renewals failed for a whole lease (its connection killed
                // again and again), told so.
                | Error::LeaseLost { .. }
        );
        if !expected {
            self.unexpected.lock().unwrap().push(format!("{what}: {e}"));
        }
    }
}

/// One worker thread: takes one kind after another until `stop`, checking each section.
fn work(client: &Client, w: &Witness, stop: &AtomicBool, seed: u64) {
    let mut rng = seed | 1;
    let wait = || LockOptions::new().wait_for(Duration::from_millis(500));
    while !stop.load(Ordering::Relaxed) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let rw = client.read_write_lock("rw");
        let outcome: Result<(), (&str, Error)> = match rng % 10 {
            0 => client.lock("plain").try_lock_with(wait()).map(|g| {
                if let Some(g) = g {
                    // Re-entered, as nested sections do.
                    let inner = client.lock("plain").lock();
                    w.exclusive("plain");
                    drop(inner);
                    let _ = g.unlock();
                }
            }),
            1 => client.fair_lock("fair").try_lock_with(wait()).map(|g| {
                if g.is_some() {
                    w.exclusive("fair");
                }
            }),
            2 => client.fenced_lock("fenced").try_lock_with(wait()).map(|g| {
                if g.is_some() {
                    w.exclusive("fenced");
                }
            }),
            3 => client.lock("owned").owned().try_lock_with(wait()).map(|g| {
                if let Some(g) = g {
                    // Released on another thread, as owned holds may be.
                    w.exclusive("owned");
                    let _ = thread::spawn(move || g.unlock()).join();
                }
            }),
            4 => rw.write_lock().try_lock_with(wait()).map(|g| {
                if g.is_some() {
                    w.exclusive("rw");
                }
            }),
            5 => rw.read_lock().try_lock_with(wait()).map(|g| {
                if g.is_some() {
                    w.shared("rw");
                }
            }),
            6 => rw.upgradeable_lock().try_lock_with(wait()).map(|g| {
                if g.is_some() {
                    w.shared("rw");
                }
            }),
            7 => client
                .semaphore("sem", PERMITS as u32)
                .try_acquire_with(wait())
                .map(|p| {
                    if p.is_some() {
                        w.permit("sem");
                    }
                }),
            8 => MultiLock::new([client.lock("multi:a"), client.lock("multi:b")]).and_then(|m| {
                m.try_lock_with(wait()).map(|g| {
                    if g.is_some() {
                        w.exclusive("multi:a");
                        w.exclusive("multi:b");
                    }
                })
            }),
            _ => {
                let latch = client.count_down_latch(format!("latch:{}", rng % 4));
                latch
                    .try_set_count(1)
                    .and_then(|_| latch.count_down())
                    .map(drop)
            }
        }
        .map_err(|e| ("acquisition", e));
        if let Err((what, e)) = outcome {
            w.error(what, &e);
        }
    }
}

/// The `redmutex-*` threads of this process.
fn library_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim_end().to_owned())
        .filter(|c| c.starts_with("redmutex-"))
        .collect()
}

fn soak(run_for: Duration) {
    let server = RedisServer::new();
    let witness = Witness::default();
    let stop = AtomicBool::new(false);
    let clients: Vec<Client> = (0..CLIENT_COUNT).map(|_| CLIENTS.at(&server)).collect();
    let mut cuts = 0;
    let mut killed = 0;
    thread::scope(|s| {
        for (c, client) in clients.iter().enumerate() {
            for t in 0..THREADS_PER_CLIENT {
                let (w, stop) = (&witness, &stop);
                s.spawn(move || work(client, w, stop, 0x9e37_79b9 * (c * 16 + t + 1) as u64));
            }
        }
        let mut chaos = server.connection();
        let started = Instant::now();
        while started.elapsed() < run_for {
            thread::sleep(Duration::from_millis(700));
            killed += support::kill_connections(&mut chaos, None);
            cuts += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    let errors = witness.errors.lock().unwrap().clone();
    let sections = witness.sections.load(Ordering::Relaxed);
    println!(
        "soak {run_for:?}: {sections} critical sections, {cuts} cuts ({killed} connections \
         killed), errors {errors:?}, overlaps {}",
        witness.overlaps.load(Ordering::SeqCst)
    );
    assert_eq!(
        witness.overlaps.load(Ordering::SeqCst),
        0,
        "two holders overlapped"
    );
    let unexpected = witness.unexpected.lock().unwrap().clone();
    assert!(unexpected.is_empty(), "unexpected errors: {unexpected:#?}");
    assert!(
        sections > 0 && cuts >= 5,
        "{sections} sections, {cuts} cuts"
    );

    // Every thread of the clients ends within a second of the last one dropped.
    assert!(!library_threads().is_empty());
    drop(clients);
    let dropped = Instant::now();
    while !library_threads().is_empty() && dropped.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(10));
    }
    let took = dropped.elapsed();
    let left = library_threads();
    println!("threads gone {took:?} after the clients were dropped");
    assert!(
        left.is_empty() && took < Duration::from_secs(1),
        "threads left {took:?} after the last client was dropped: {left:?}"
    );

    // And no key lives forever.
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let forever: Vec<&String> = keys
        .iter()
        .filter(|k| redis::cmd("PTTL").arg(k).query::<i64>(&mut con).unwrap() == -1)
        .collect();
    assert!(forever.is_empty(), "keys without an expiry: {forever:?}");
}

#[test]
fn every_kind_holds_while_connections_are_killed() {
    soak(Duration::from_secs(10));
}

#[test]
#[ignore = "two minutes: run with --ignored"]
fn every_kind_holds_while_connections_are_killed_for_two_minutes() {
    soak(Duration::from_secs(120));
}
