//! Locks on a Sentinel-monitored primary with two replicas and three sentinels, through a
//! SIGKILL of the primary and the failover that follows: clients move to the new primary
//! by themselves, waiters wake there, `sync_replicas` keeps every acquired lock, and a
//! hold the failover lost is reported.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error};
use support::topology::{addr_of, Sentinels};
use support::wait_until;

/// Bounds a failover (measured ≈ 2.3 s with the harness's 1 s down-after).
const FAILOVER_BOUND: Duration = Duration::from_secs(15);
const WATCHDOG: Duration = Duration::from_secs(6);

fn sentinel_client(topo: &Sentinels) -> redmutex::ClientBuilder {
    Client::builder()
        .sentinel(topo.sentinel_urls(), topo.service_name())
        .watchdog_timeout(WATCHDOG)
        .command_timeout(Duration::from_millis(1500))
        // Long enough to ride through the failover: operations wait for the new primary.
        .connect_timeout(Duration::from_secs(10))
}

fn lock_key(name: &str) -> String {
    format!("redmutex:{{{name}}}")
}

/// The holder ids in `name`'s hash on the node `con`, with their counts.
fn holders(con: &mut redis::Connection, name: &str) -> Vec<(String, i64)> {
    redis::cmd("HGETALL")
        .arg(lock_key(name))
        .query(con)
        .expect("HGETALL")
}

fn primary_connection(topo: &Sentinels) -> redis::Connection {
    topo.primary().connection()
}

#[test]
fn the_client_finds_the_primary_and_follows_a_failover() {
    let mut topo = Sentinels::new(2, 3);
    let client = sentinel_client(&topo).build().unwrap();
    let waiter_client = sentinel_client(&topo).build().unwrap();

    let held = client.lock("held").lock().unwrap();
    let mut primary = primary_connection(&topo);
    assert_eq!(
        holders(&mut primary, "held").len(),
        1,
        "written to the primary"
    );

    // A waiter blocked on the held lock, in another client (its own pub/sub connection).
    let (acquired_tx, acquired) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let guard = waiter_client.lock("held").lock().expect("waiter acquires");
        acquired_tx.send(Instant::now()).unwrap();
        guard.unlock().expect("waiter unlocks");
    });
    assert!(
        wait_until(Duration::from_secs(5), || support::subscribers(
            &mut primary,
            "redmutex:{held}"
        ) > 0),
        "the waiter subscribes on the primary"
    );
    topo.wait_replicas_synced(Duration::from_secs(5));

    let killed = topo.kill_primary();
    let killed_at = Instant::now();
    let new = topo.wait_for_failover(FAILOVER_BOUND);
    println!(
        "failover from node {killed} to {new} in {:?}",
        killed_at.elapsed()
    );
    assert_ne!(new, addr_of(topo.node(killed)));

    // The same client, not rebuilt, takes a new lock there.
    let other = client.lock("after-failover").lock().unwrap();
    let mut primary = primary_connection(&topo);
    assert_eq!(addr_of(topo.primary()), new);
    assert_eq!(holders(&mut primary, "after-failover").len(), 1);
    // The replicated hold survived and is still renewed by the watchdog there.
    assert_eq!(holders(&mut primary, "held").len(), 1);
    let renewed_past = WATCHDOG.as_millis() as i64 * 2 / 3 + 100;
    assert!(
        wait_until(WATCHDOG, || {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(lock_key("held"))
                .query(&mut primary)
                .unwrap();
            pttl > renewed_past
        }),
        "the watchdog renews on the new primary"
    );
    assert!(!held.is_lease_lost());
    assert!(acquired.try_recv().is_err(), "no second holder meanwhile");

    // The release on the new primary wakes the waiter, whose subscription moved there.
    let released_at = Instant::now();
    held.unlock().expect("unlock on the new primary");
    let woke_at = acquired
        .recv_timeout(Duration::from_secs(5))
        .expect("the waiter wakes after the failover");
    assert!(woke_at >= released_at);
    println!(
        "waiter acquired {:?} after the release",
        woke_at - released_at
    );
    assert!(woke_at - released_at < Duration::from_secs(3));
    waiter.join().unwrap();
    other.unlock().unwrap();
    assert!(holders(&mut primary, "held").is_empty());
}

#[test]
fn with_sync_replicas_no_acquired_lock_is_lost_in_a_failover() {
    let mut topo = Sentinels::new(2, 3);
    let client = sentinel_client(&topo)
        .sync_replicas(1, Duration::from_millis(1000))
        .build()
        .unwrap();

    // One thread acquires lock after lock, right through the kill of the primary; every
    // acquisition that returned must be on the new primary afterwards.
    let stop = Arc::new(AtomicBool::new(false));
    let (took_some, took_some_rx) = mpsc::channel();
    let (failed_over, failed_over_rx) = mpsc::channel::<()>();
    let acquirer = {
        let client = client.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut guards = Vec::new();
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let name = format!("n{}", guards.len());
                match client.lock(&name).lock() {
                    Ok(guard) => guards.push((name, guard)),
                    // Reported, not silent: an acquisition in flight at the kill may fail.
                    Err(e) => errors.push(e.to_string()),
                }
                if guards.len() == 20 {
                    took_some.send(()).unwrap();
                }
            }
            failed_over_rx.recv().unwrap();
            let names: Vec<String> = guards.iter().map(|(n, _)| n.clone()).collect();
            // Time is the subject: past a renewal round on the new primary, which would have
            // found any missing hold.
            thread::sleep(WATCHDOG / 3 + Duration::from_millis(500));
            for (name, guard) in &guards {
                assert!(!guard.is_lease_lost(), "{name} lost");
            }
            let mut results = Vec::new();
            for (_, guard) in guards {
                results.push(guard.unlock().map_err(|e| e.to_string()));
            }
            (names, results, errors)
        })
    };
    took_some_rx.recv().unwrap();
    topo.kill_primary();
    let new = topo.wait_for_failover(FAILOVER_BOUND);
    // Let acquisitions run on the new primary too, then stop.
    let mut con = primary_connection(&topo);
    assert_eq!(addr_of(topo.primary()), new);
    stop.store(true, Ordering::Relaxed);
    failed_over.send(()).unwrap();
    // A release that finds its hold on the new primary is the witness that it was kept.
    let (names, results, errors) = acquirer.join().unwrap();
    println!(
        "{} locks acquired across the failover, {} acquisitions failed: {errors:?}",
        names.len(),
        errors.len()
    );
    assert!(names.len() > 20);
    let lost: Vec<_> = names
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_err())
        .collect();
    assert!(lost.is_empty(), "holds lost in the failover: {lost:?}");
    for name in &names {
        assert!(holders(&mut con, name).is_empty(), "{name} still held");
    }
}

#[test]
fn without_sync_replicas_a_hold_the_failover_lost_is_reported() {
    let mut topo = Sentinels::new(2, 3);
    let client = sentinel_client(&topo).build().unwrap();
    let mut primary = primary_connection(&topo);

    // Cut replication deterministically: the replicas may no longer resynchronise, so
    // what is written from now on lives on the primary alone.
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-psync")
        .arg("-sync")
        .arg("-replconf")
        .exec(&mut primary)
        .unwrap();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .exec(&mut primary)
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut primary)
            .unwrap();
        info.contains("connected_slaves:0")
    }));

    let watched = client.lock("watched").lock().unwrap();
    let leased = client
        .lock("leased")
        .lock_with_lease(Duration::from_secs(30))
        .unwrap();
    topo.kill_primary();
    topo.wait_for_failover(FAILOVER_BOUND);
    let mut primary = primary_connection(&topo);
    assert!(holders(&mut primary, "watched").is_empty(), "really lost");

    // The watchdog's next renewal finds the hold gone and says so.
    let began = Instant::now();
    assert!(
        wait_until(WATCHDOG, || watched.is_lease_lost()),
        "the lost watchdog hold is reported"
    );
    println!("loss reported {:?} after the failover", began.elapsed());
    assert!(matches!(watched.unlock(), Err(Error::LeaseLost)));
    let leased = leased.unlock();
    assert!(matches!(leased, Err(Error::LeaseLost)), "{leased:?}");
    // And the lock is free for others on the new primary.
    let again = client.lock("watched").try_lock().unwrap();
    assert!(again.is_some());
}

#[test]
fn every_kind_of_primitive_works_on_a_sentinel_primary() {
    let topo = Sentinels::new(1, 3);
    let client = sentinel_client(&topo).build().unwrap();
    let fair = client.fair_lock("f").lock().unwrap();
    let fenced = client.fenced_lock("t").lock().unwrap();
    assert!(fenced.token() > 0);
    let rw = client.read_write_lock("rw");
    let read = rw.read().lock().unwrap();
    let permit = client.semaphore("s", 2).acquire().unwrap();
    let latch = client.count_down_latch("l");
    assert!(latch.try_set_count(1, Duration::from_secs(10)).unwrap());
    latch.count_down().unwrap();
    assert!(latch.wait_for(Duration::from_secs(1)).unwrap());
    let mut primary = primary_connection(&topo);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redmutex:*")
        .query(&mut primary)
        .unwrap();
    assert!(keys.len() >= 4, "{keys:?}");
    fair.unlock().unwrap();
    fenced.unlock().unwrap();
    read.unlock().unwrap();
    permit.release().unwrap();
}
