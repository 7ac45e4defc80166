//! `cargo bench --bench redlock`: a RedLock over 5 independent masters (spawned here, or
//! the ones at `REDIS_MASTERS=url,url,…`), measured in one run as ratios to PINGs on the
//! same masters.
//!
//! - the uncontended `lock()` + drop pair of a RedLock, against a PING to one master, a
//!   PING to each master in turn (what an acquisition that asked one master after the
//!   other would cost per round trip), and a PING to all five written at once and then
//!   read (the floor of a concurrent round trip, which a RedLock's acquire and its release
//!   each are); beside the pair of a plain lock on one master;
//! - the same with 1 ms added to every request by a proxy in front of each master (the
//!   embedded masters only): on loopback a round trip is mostly CPU, shared by five
//!   servers and the client on a small machine; with a network's latency the round trips
//!   an acquisition waits for show;
//! - wake-ups: the time from a holder's release to a blocked waiter's return from
//!   `lock()`, for the RedLock and for a plain lock on one master.
//!
//! - what an uncontended pair costs the Redis servers (CPU, executed commands, requests;
//!   summed over the masters), beside a naive RedLock (`SET NX PX` on each master, then a
//!   compare-and-delete on each) and, on one master, a plain lock beside the naive lock.
//!
//! Medians over interleaved rounds, so a slow phase of a noisy machine hits every figure
//! alike. It prints tables and exits 0: it measures, it does not gate.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, MultiLock};

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{connect, f1, f2, median, percentile, unique_prefix, Grid, Op};
use support::FaultProxy;

const MASTERS: usize = 5;
const WARMUP: usize = 300;
const ROUNDS: usize = 6;
const OPS_PER_ROUND: usize = 300;
const WAKEUPS: usize = 150;
/// The latency the proxies add to every request in the second table.
const LATENCY: Duration = Duration::from_millis(1);

fn main() {
    let (urls, servers) = masters();
    println!(
        "redmutex RedLock bench: {} masters ({})",
        urls.len(),
        if servers.is_empty() {
            "REDIS_MASTERS"
        } else {
            "embedded"
        }
    );
    pairs(
        &urls,
        "uncontended, loopback",
        (WARMUP, ROUNDS, OPS_PER_ROUND),
    );
    server_cost(&urls);
    if !servers.is_empty() {
        // On loopback a round trip is mostly the servers' CPU, which 5 servers share with
        // the client on a small machine: what concurrency saves there is hidden. With a
        // network's latency in front of each master it shows.
        let proxies: Vec<FaultProxy> = servers
            .iter()
            .map(|s| {
                let proxy = FaultProxy::new(s.port());
                proxy.delay_requests_containing("*", LATENCY);
                proxy
            })
            .collect();
        let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
        pairs(
            &urls,
            "uncontended, 1 ms added to each request (a proxy per master)",
            (20, 4, 30),
        );
    }

    // Wake-ups: a waiter blocked in lock() on other clients, released by a holder.
    let mut wake = Grid::new(&[
        "wake-up (release → waiter's lock() returns)",
        "p50 µs",
        "p99 µs",
    ]);
    let prefix = unique_prefix("redlock", "wake");
    let (holders, waiters) = (clients_of(&urls, &prefix), clients_of(&urls, &prefix));
    let us = wakeups(
        || MultiLock::red_lock(holders.iter().map(|c| c.lock("w"))).unwrap(),
        || MultiLock::red_lock(waiters.iter().map(|c| c.lock("w"))).unwrap(),
        &urls,
        &prefix,
    );
    wake.row(
        "RedLock, 5 masters",
        vec![f1(median(&us)), f1(percentile(&us, 0.99))],
    );
    let us = wakeups(
        || MultiLock::new([holders[0].lock("w1")]).unwrap(),
        || MultiLock::new([waiters[0].lock("w1")]).unwrap(),
        &urls[..1],
        &prefix,
    );
    wake.row(
        "one lock on one master (as a MultiLock of one)",
        vec![f1(median(&us)), f1(percentile(&us, 0.99))],
    );
    println!("\n{}", wake.render());
}

/// The uncontended table on `urls`: `(warm-up, rounds, operations per round)`.
/// Pairs per kind in the server-cost table, in alternating chunks.
const COST_CHUNKS: usize = 5;
const COST_PAIRS_PER_CHUNK: usize = 300;
const NAIVE_LEASE_MS: u64 = 30_000;

/// A client of each master, all with `prefix`.
fn clients_of(urls: &[String], prefix: &str) -> Vec<Client> {
    urls.iter()
        .map(|u| common::bench_client(u, prefix))
        .collect()
}

/// What an uncontended pair costs the Redis servers, summed over the masters (issue 18):
/// the RedLock and a naive RedLock (`SET NX PX` on each master in turn, then a
/// compare-and-delete on each), and on one master a plain lock and the naive lock.
fn server_cost(urls: &[String]) {
    let prefix = unique_prefix("redlock", "cost");
    let clients = clients_of(urls, &prefix);
    let red = MultiLock::red_lock(clients.iter().map(|c| c.lock("cost"))).unwrap();
    let single = clients[0].lock("cost-single");
    let mut cons: Vec<redis::Connection> = urls.iter().map(|u| connect(u)).collect();
    let mut admins: Vec<redis::Connection> = urls.iter().map(|u| connect(u)).collect();
    let lock = common::NaiveLock::new();
    let key = format!("{prefix}naive");
    let mut token = 0u64;
    let mut naive = |cons: &mut [redis::Connection]| {
        token += 1;
        for con in cons.iter_mut() {
            assert!(
                lock.try_lock(con, &key, token, NAIVE_LEASE_MS),
                "the uncontended naive lock was taken"
            );
        }
        for con in cons.iter_mut() {
            lock.unlock(con, &key, token);
        }
    };
    let red_pair = || red.lock().unwrap().unlock().unwrap();
    let single_pair = || single.lock().unwrap().unlock().unwrap();
    for _ in 0..WARMUP {
        red_pair();
        single_pair();
        naive(&mut cons);
        naive(&mut cons[..1]);
    }
    let mut costs = vec![common::ServerCost::default(); 4];
    for _ in 0..COST_CHUNKS {
        for (i, cost) in costs.iter_mut().enumerate() {
            let (c, ()) = common::ServerCost::measure_all(&mut admins, || {
                for _ in 0..COST_PAIRS_PER_CHUNK {
                    match i {
                        0 => red_pair(),
                        1 => naive(&mut cons),
                        2 => single_pair(),
                        _ => naive(&mut cons[..1]),
                    }
                }
            });
            cost.add(&c);
        }
    }
    let n = (COST_CHUNKS * COST_PAIRS_PER_CHUNK) as u64;
    let mut grid = Grid::new(&[
        "",
        "RedLock",
        "naive RedLock",
        "Lock, 1 master",
        "naive, 1 master",
    ]);
    let columns: Vec<(&common::ServerCost, u64)> = costs.iter().map(|c| (c, n)).collect();
    common::server_cost_rows(&mut grid, &columns, None);
    grid.row(
        "  x its naive (Redis CPU)",
        vec![
            format!("{:.2}x", costs[0].cpu_per(n) / costs[1].cpu_per(n)),
            "1.00x".to_owned(),
            format!("{:.2}x", costs[2].cpu_per(n) / costs[3].cpu_per(n)),
            "1.00x".to_owned(),
        ],
    );
    println!(
        "\nserver cost of an uncontended lock + unlock pair, summed over the {} masters \
         ({n} pairs per kind in {COST_CHUNKS} alternating chunks; INFO snapshots):",
        urls.len()
    );
    print!("{}", grid.render());
    for (name, c) in ["RedLock", "naive RedLock"].iter().zip(&costs) {
        println!("  {name:<13} executed per pair: {}", c.breakdown(n));
    }
}

fn pairs(urls: &[String], title: &str, (warmup, rounds, per_round): (usize, usize, usize)) {
    let prefix = unique_prefix("redlock", "pair");
    let clients = clients_of(urls, &prefix);
    let red = MultiLock::red_lock(clients.iter().map(|c| c.lock("uncontended"))).unwrap();
    let single = clients[0].lock("uncontended-single");
    let ping = redis::cmd("PING").get_packed_command();
    // The three PING floors share the connections (each op runs alone).
    let cons = Rc::new(RefCell::new(
        urls.iter().map(|u| connect(u)).collect::<Vec<_>>(),
    ));
    let (c1, c2, c3) = (cons.clone(), cons.clone(), cons);
    let ping = &ping;
    let mut ops: Vec<(&str, Op)> = vec![
        (
            "PING to one master",
            Box::new(move || redis::cmd("PING").exec(&mut c1.borrow_mut()[0]).unwrap()),
        ),
        (
            "PING to each master in turn",
            Box::new(move || {
                for c in c2.borrow_mut().iter_mut() {
                    redis::cmd("PING").exec(c).unwrap();
                }
            }),
        ),
        (
            "PING to every master at once (all sent, then all read)",
            Box::new(move || {
                let mut all = c3.borrow_mut();
                for c in all.iter_mut() {
                    c.send_packed_command(ping).unwrap();
                }
                for c in all.iter_mut() {
                    c.recv_response().unwrap();
                }
            }),
        ),
        (
            "plain lock() + drop on one master",
            Box::new(|| drop(single.lock().unwrap())),
        ),
        (
            "RedLock lock() + drop on every master",
            Box::new(|| drop(red.lock().unwrap())),
        ),
    ];
    let samples = common::interleaved(&mut ops, warmup, rounds, per_round);
    let medians: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    let names: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
    drop(ops);
    let mut grid = Grid::new(&[
        title,
        "median µs",
        "p99 µs",
        "× PING one",
        "× PING all at once",
    ]);
    for (i, n) in names.iter().enumerate() {
        grid.row(
            n,
            vec![
                f1(medians[i]),
                f1(percentile(&samples[i], 0.99)),
                f2(medians[i] / medians[0]),
                f2(medians[i] / medians[2]),
            ],
        );
    }
    println!("\n{}", grid.render());
    println!(
        "  RedLock pair / plain pair: {}   RedLock pair / (2 × PING all at once): {}   \
         RedLock pair / (2 × PING each in turn): {}\n  RedLock pair / (5 × plain pair), \
         the work of five locks where the servers' CPU, not latency, sets the pace: {}",
        f2(medians[4] / medians[3]),
        f2(medians[4] / (2.0 * medians[2])),
        f2(medians[4] / (2.0 * medians[1])),
        f2(medians[4] / (urls.len() as f64 * medians[3])),
    );
}

/// `WAKEUPS` times: a holder takes the lock, a waiter thread blocks in `lock()`, and once
/// it is queued on every master the holder releases. Microseconds from the release's
/// start to the waiter's return.
fn wakeups(
    holder: impl Fn() -> MultiLock,
    waiter: impl Fn() -> MultiLock + Sync,
    urls: &[String],
    prefix: &str,
) -> Vec<f64> {
    let holder = holder();
    let name = if urls.len() == 1 { "w1" } else { "w" };
    let queue = format!("{prefix}!queue:{{{name}}}");
    let mut cons: Vec<redis::Connection> = urls.iter().map(|u| connect(u)).collect();
    let mut out = Vec::with_capacity(WAKEUPS);
    thread::scope(|scope| {
        let (go, start) = mpsc::channel::<()>();
        let (done, returned) = mpsc::channel::<Instant>();
        let waiter = &waiter;
        scope.spawn(move || {
            let lock = waiter();
            while start.recv().is_ok() {
                let guard = lock.lock().unwrap();
                let at = Instant::now();
                drop(guard);
                done.send(at).unwrap();
            }
        });
        for _ in 0..WAKEUPS {
            let guard = holder.lock().unwrap();
            go.send(()).unwrap();
            // Queued on every master: only then is the wake-up the one measured.
            while !cons
                .iter_mut()
                .all(|c| redis::cmd("LLEN").arg(&queue).query::<i64>(c).unwrap_or(0) == 1)
            {
                thread::sleep(Duration::from_micros(200));
            }
            let t = Instant::now();
            drop(guard);
            let at = returned.recv().unwrap();
            out.push(at.saturating_duration_since(t).as_secs_f64() * 1e6);
        }
        drop(go);
    });
    out
}

/// Five embedded masters, or those of `REDIS_MASTERS`.
fn masters() -> (Vec<String>, Vec<support::RedisServer>) {
    if let Ok(list) = std::env::var("REDIS_MASTERS") {
        let urls: Vec<String> = list.split(',').map(str::to_owned).collect();
        assert!(urls.len() >= 3, "REDIS_MASTERS needs at least three URLs");
        return (urls, Vec::new());
    }
    let servers: Vec<support::RedisServer> =
        (0..MASTERS).map(|_| support::RedisServer::new()).collect();
    (servers.iter().map(|s| s.url()).collect(), servers)
}
