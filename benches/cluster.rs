//! `cargo bench --bench cluster`: redmutex on a Redis Cluster of 3 primaries (spawned
//! here, or the one at `REDIS_CLUSTER=url,url,…`), measured in one run as ratios to a
//! PING on the same topology, beside the same figures on a single server.
//!
//! - the uncontended `lock()` + drop pair, against a PING to the lock's node through the
//!   same kind of connection (a redis-rs `ClusterConnection`, routed by key), and against
//!   a PING on a plain connection to that node;
//! - wake-ups: the time from a holder's release to a blocked waiter's return from
//!   `lock()`, with the waiter's pub/sub connection on the lock's node and on another one;
//! - the floors those wake-ups stand on, and the choice of pub/sub they justify: the
//!   delivery time of a classic `PUBLISH` to a subscriber on the same node and on another
//!   node (the cluster bus forwards it), and of a sharded `SPUBLISH` to its subscriber on
//!   the shard's node.
//!
//! Medians over interleaved rounds, so a slow phase of a noisy machine hits every figure
//! alike. It prints tables and exits 0: it measures, it does not gate.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{connect, f1, f2, median, percentile, unique_prefix, Grid, Op};
use support::deployment::{deployment_or_spawn, Deployment, Shape};

const WARMUP: usize = 300;
const ROUNDS: usize = 6;
const OPS_PER_ROUND: usize = 400;
const WAKEUPS: usize = 200;
const DELIVERIES: usize = 500;

fn main() {
    let (deploy, embedded) = deployment_or_spawn(Shape::Cluster);
    let Deployment::Cluster(seeds) = &deploy else {
        unreachable!()
    };
    let single = support::RedisServer::new();
    println!("redmutex cluster bench: cluster {embedded}, and a single server for comparison");

    let prefix = unique_prefix("cluster", "pair");
    let client = deploy
        .builder()
        .key_prefix(prefix.as_str())
        .build()
        .expect("cluster client");
    let single_client = common::bench_client(&single.url(), &prefix);
    let name = "uncontended";
    let key = format!("{prefix}{{{name}}}");
    let node_url = node_of(seeds, &key);
    let mut cluster_con = redis::cluster::ClusterClient::new(seeds.clone())
        .and_then(|c| c.get_connection())
        .expect("cluster connection");
    let mut node_con = connect(&node_url);
    let mut single_con = connect(&single.url());
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key.as_bytes(),
        SlotAddr::Master,
    )));
    let ping = redis::cmd("PING");

    // Interleaved rounds of every operation: the figures share the machine's moods.
    let lock = client.lock(name);
    let single_lock = single_client.lock(name);
    let mut ops: Vec<(&str, Op)> = vec![
        (
            "cluster: PING to the lock's node (ClusterConnection)",
            Box::new(|| {
                cluster_con.route_command(&ping, route.clone()).unwrap();
            }),
        ),
        (
            "cluster: PING to the lock's node (plain connection)",
            Box::new(|| redis::cmd("PING").exec(&mut node_con).unwrap()),
        ),
        (
            "cluster: lock() + drop",
            Box::new(|| drop(lock.lock().unwrap())),
        ),
        (
            "single server: PING",
            Box::new(|| redis::cmd("PING").exec(&mut single_con).unwrap()),
        ),
        (
            "single server: lock() + drop",
            Box::new(|| drop(single_lock.lock().unwrap())),
        ),
    ];
    let samples = common::interleaved(&mut ops, WARMUP, ROUNDS, OPS_PER_ROUND);
    let medians: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    let names: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
    drop(ops);
    let mut grid = Grid::new(&["uncontended", "median µs", "p99 µs", "× its PING"]);
    for (i, n) in names.iter().enumerate() {
        let floor = match i {
            0..=2 => medians[0],
            _ => medians[3],
        };
        grid.row(
            n,
            vec![
                f1(medians[i]),
                f1(percentile(&samples[i], 0.99)),
                f2(medians[i] / floor),
            ],
        );
    }
    println!("\n{}", grid.render());
    println!(
        "  cluster pair / plain-connection PING to its node: {}",
        f2(medians[2] / medians[1])
    );

    // Wake-ups: a waiter blocked in lock() in another client, released by a holder.
    let mut wake = Grid::new(&[
        "wake-up (release → waiter's lock() returns)",
        "p50 µs",
        "p99 µs",
    ]);
    let lock_node = seeds
        .iter()
        .position(|s| *s == node_url)
        .expect("the lock's node is a seed");
    let other_node = (lock_node + 1) % seeds.len();
    for (label, listen_on) in [
        ("waiter listening on the lock's node", lock_node),
        ("waiter listening on another node", other_node),
    ] {
        let waiter = redmutex::Client::builder()
            .cluster([seeds[listen_on].as_str()])
            .key_prefix(prefix.as_str());
        let queued = queue_reader(&node_url, &prefix, name);
        let us = wakeups(&client, waiter, name, queued);
        wake.row(label, vec![f1(median(&us)), f1(percentile(&us, 0.99))]);
    }
    let waiter = redmutex::Client::builder()
        .url(single.url())
        .key_prefix(prefix.as_str());
    let queued = queue_reader(&single.url(), &prefix, name);
    let us = wakeups(&single_client, waiter, name, queued);
    wake.row(
        "single server",
        vec![f1(median(&us)), f1(percentile(&us, 0.99))],
    );
    println!("\n{}", wake.render());

    // The floors: message delivery alone.
    let mut floor = Grid::new(&[
        "delivery (publish sent → subscriber has it)",
        "p50 µs",
        "p99 µs",
    ]);
    for (i, (label, sub_url, sharded)) in [
        (
            "classic PUBLISH, subscriber on the same node",
            &node_url,
            false,
        ),
        (
            "classic PUBLISH, subscriber on another node",
            &seeds[other_node],
            false,
        ),
        (
            "sharded SPUBLISH, subscriber on the shard's node",
            &node_url,
            true,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        // A channel per case: a message of one case forwarded late by the cluster bus
        // must not reach the next case's subscriber.
        let channel = format!("{prefix}{{{name}}}:floor:{i}");
        let us = deliveries(&node_url, sub_url, &channel, sharded);
        floor.row(label, vec![f1(median(&us)), f1(percentile(&us, 0.99))]);
    }
    println!("\n{}", floor.render());
}

/// The URL of the primary serving `key`'s slot, among the seeds.
fn node_of(seeds: &[String], key: &str) -> String {
    let mut con = connect(&seeds[0]);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut con)
        .unwrap();
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        let (redis::Value::Int(lo), redis::Value::Int(hi), redis::Value::Array(node)) =
            (&fields[0], &fields[1], &fields[2])
        else {
            continue;
        };
        if (*lo..=*hi).contains(&i64::from(slot)) {
            let host: String = redis::from_redis_value(node[0].clone()).unwrap();
            let port: u16 = redis::from_redis_value(node[1].clone()).unwrap();
            let url = format!("redis://{host}:{port}/");
            return seeds.iter().find(|s| **s == url).cloned().unwrap_or(url);
        }
    }
    panic!("no node serves slot {slot}")
}

/// Release-to-return times (µs) of a waiter of a client built by `waiter` (its pub/sub
/// connection goes where that client's only address points); `queue` reads the length of
/// the lock's wait queue, so each release comes once the waiter is queued.
fn wakeups(
    holder: &redmutex::Client,
    waiter: redmutex::ClientBuilder,
    name: &str,
    mut queued: impl FnMut() -> bool,
) -> Vec<f64> {
    let waiter = waiter.build().expect("waiter client");
    let lock = holder.lock(name);
    let (go_tx, go) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel::<Instant>();
    let n = name.to_owned();
    let t = thread::spawn(move || {
        let lock = waiter.lock(&n);
        while go.recv().is_ok() {
            let g = lock.lock().unwrap();
            done_tx.send(Instant::now()).unwrap();
            drop(g);
        }
    });
    let mut us = Vec::new();
    for i in 0..WAKEUPS + 20 {
        let g = lock.lock().unwrap();
        go_tx.send(()).unwrap();
        while !queued() {
            thread::yield_now();
        }
        let released = Instant::now();
        drop(g);
        let woke = done.recv().unwrap();
        if i >= 20 {
            us.push((woke - released).as_secs_f64() * 1e6);
        }
    }
    drop(go_tx);
    t.join().unwrap();
    us
}

/// A closure telling whether the lock `name`'s wait queue, on the node at `url`, is not
/// empty.
fn queue_reader(url: &str, prefix: &str, name: &str) -> impl FnMut() -> bool {
    let mut con = connect(url);
    let key = format!("{prefix}!queue:{{{name}}}");
    move || redis::cmd("LLEN").arg(&key).query::<u64>(&mut con).unwrap() > 0
}

/// Publish-to-receipt times (µs): publishes on `pub_url`, subscribed on `sub_url`.
fn deliveries(pub_url: &str, sub_url: &str, channel: &str, sharded: bool) -> Vec<f64> {
    let (subscribe, publish) = if sharded {
        ("SSUBSCRIBE", "SPUBLISH")
    } else {
        ("SUBSCRIBE", "PUBLISH")
    };
    let mut sub = connect(sub_url);
    sub.send_packed_command(&redis::cmd(subscribe).arg(channel).get_packed_command())
        .unwrap();
    let _confirmed = sub.recv_response().unwrap();
    let (got_tx, got) = mpsc::channel::<Instant>();
    let reader = thread::spawn(move || {
        sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        loop {
            let msg = match sub.recv_response() {
                Ok(msg) => msg,
                Err(e) => {
                    eprintln!("subscriber: {e}");
                    return;
                }
            };
            if let redis::Value::Array(parts) = &msg {
                if matches!(parts.last(), Some(redis::Value::BulkString(b)) if b == b"stop") {
                    return;
                }
            }
            if got_tx.send(Instant::now()).is_err() {
                return;
            }
        }
    });
    let mut con = connect(pub_url);
    let mut us = Vec::new();
    for i in 0..DELIVERIES + 50 {
        let sent = Instant::now();
        redis::cmd(publish)
            .arg(channel)
            .arg("x")
            .exec(&mut con)
            .unwrap();
        let at = got.recv_timeout(Duration::from_secs(5)).expect("delivered");
        if i >= 50 {
            us.push((at - sent).as_secs_f64() * 1e6);
        }
    }
    redis::cmd(publish)
        .arg(channel)
        .arg("stop")
        .exec(&mut con)
        .unwrap();
    reader.join().unwrap();
    us
}
