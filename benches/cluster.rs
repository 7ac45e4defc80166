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
//! - contended locks on clusters of 3 and of 6 primaries (spawned here, whatever
//!   `REDIS_CLUSTER` says; issue 29, item 4): 12 locks, each taken in turn by 2 threads
//!   of 2 different clients (4 clients × 6 threads; lock → unlock, no hold; so each
//!   handoff crosses clients and its wake-up is a pub/sub message, sharded `SPUBLISH` on
//!   Redis 7.0+ and Valkey, classic `PUBLISH` on 6.2), `REDMUTEX_CLUSTER_SECS` seconds
//!   (default 3) per run, for `Lock` and `FairLock`, in two layouts: *spread* (the locks
//!   in equal shares on every primary: the total throughput per primaries count, and
//!   Redis CPU per acquisition per node and summed) and *one owner* (every lock on one
//!   primary: each other primary's `cluster_stats_messages_publish_received` per
//!   acquisition and CPU per acquisition against the owner's). Beside them, each node's
//!   CPU over an idle window as long as a run (its cluster bus housekeeping), per
//!   acquisition of the run, so what the locks cost a node can be told from what it
//!   costs anyway.
//!
//! Medians over interleaved rounds, so a slow phase of a noisy machine hits every figure
//! alike. It prints tables and exits 0: it measures, it does not gate.
//! `REDMUTEX_CLUSTER_PART=contended` runs only the contended part, `=latency` only the
//! rest.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{connect, f1, f2, f3, median, percentile, unique_prefix, Grid, Op};
use support::deployment::{deployment_or_spawn, Deployment, Shape};

const WARMUP: usize = 300;
const ROUNDS: usize = 6;
const OPS_PER_ROUND: usize = 400;
const WAKEUPS: usize = 200;
const DELIVERIES: usize = 500;

fn main() {
    let part = std::env::var("REDMUTEX_CLUSTER_PART").unwrap_or_default();
    if part != "contended" {
        latency();
    }
    if part != "latency" {
        contended_part();
    }
}

/// The uncontended pairs, wake-ups and delivery floors on a cluster of 3 primaries.
fn latency() {
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
        if sharded && !support::server_kind().has_functions() {
            // Sharded pub/sub came with Redis 7.0 (as functions did).
            floor.row(label, vec!["-".to_owned(), "(no SPUBLISH)".to_owned()]);
            continue;
        }
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

// ---------------------------------------------------------------------------------------
// Contended locks on 3 and 6 primaries (issue 29, item 4).

/// Seconds per contended run (a float); 3 unless set.
const SECS_ENV: &str = "REDMUTEX_CLUSTER_SECS";
const LOCKS: usize = 12;
const CLIENTS: usize = 4;
const THREADS_PER_CLIENT: usize = 6;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// The locks in equal shares on every primary.
    Spread,
    /// Every lock on the first primary.
    OneOwner,
}

/// What one node did during a run (or an idle window).
struct NodeCost {
    cost: common::ServerCost,
    /// `cluster_stats_messages_publish_received`: classic PUBLISHes forwarded to it.
    bus_publish: u64,
    /// `cluster_stats_messages_publishshard_received` (7.0+): SPUBLISHes forwarded to it
    /// (to a shard's replicas only).
    bus_publishshard: u64,
}

struct NodeSnapshot {
    info: common::ServerSnapshot,
    bus_publish: u64,
    bus_publishshard: u64,
}

impl NodeSnapshot {
    fn take(con: &mut redis::Connection) -> NodeSnapshot {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(con).unwrap();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map_or(0, |n| n.trim().parse().unwrap_or(0))
        };
        let (bus_publish, bus_publishshard) = (
            field("cluster_stats_messages_publish_received"),
            field("cluster_stats_messages_publishshard_received"),
        );
        NodeSnapshot {
            info: common::ServerSnapshot::take(con),
            bus_publish,
            bus_publishshard,
        }
    }

    fn since(&self, before: &NodeSnapshot) -> NodeCost {
        NodeCost {
            cost: self.info.since(&before.info),
            bus_publish: self.bus_publish - before.bus_publish,
            bus_publishshard: self.bus_publishshard - before.bus_publishshard,
        }
    }
}

struct Contended {
    primaries: usize,
    layout: Layout,
    kind: &'static str,
    acquisitions: u64,
    secs: f64,
    /// Per primary, the owner of the one-owner layout first.
    nodes: Vec<NodeCost>,
    /// Per primary, an idle window as long as the run.
    idle: Vec<NodeCost>,
    least_most: f64,
    /// Acquisitions per primary (of the locks it owns), in the order of `nodes`.
    served: Vec<u64>,
}

impl Contended {
    fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.secs
    }

    /// Node `i`'s CPU busy fraction (cores) during the run.
    fn busy(&self, i: usize) -> f64 {
        self.nodes[i].cost.cpu_us / 1e6 / self.secs
    }

    /// The busiest node's CPU busy fraction.
    fn busiest(&self) -> f64 {
        (0..self.nodes.len())
            .map(|i| self.busy(i))
            .fold(0.0, f64::max)
    }

    /// Wake-up messages sent (PUBLISH and SPUBLISH executed, script-internal ones
    /// included) per acquisition, all nodes.
    fn wakeups_per(&self) -> f64 {
        let sent: u64 = self
            .nodes
            .iter()
            .flat_map(|n| ["publish", "spublish"].map(|c| n.cost.executed.get(c).copied()))
            .flatten()
            .sum();
        sent as f64 / self.acquisitions.max(1) as f64
    }
}

fn contended_part() {
    let secs = common::env_f64(SECS_ENV, 3.0);
    let mut results = Vec::new();
    let mut version = String::new();
    for primaries in [3, 6] {
        eprintln!("[contended] starting a cluster of {primaries} primaries ...");
        let cluster = support::topology::Cluster::new(primaries, 0);
        let nodes = cluster.primaries();
        assert_eq!(nodes.len(), primaries);
        let mut cons: Vec<redis::Connection> = nodes
            .iter()
            .map(|&i| connect(&cluster.node(i).url()))
            .collect();
        version = support::redis_version(&mut cons[0]);
        let seeds = cluster.seed_urls();
        for layout in [Layout::Spread, Layout::OneOwner] {
            for kind in ["Lock", "FairLock"] {
                let prefix = unique_prefix("cluster", &format!("{kind}-{primaries}"));
                let names = lock_names(&cluster, &nodes, &prefix, layout);
                eprintln!(
                    "[contended] {primaries} primaries, {}, {kind}, {secs} s ...",
                    layout_name(layout)
                );
                let (idle, ()) =
                    node_costs(&mut cons, || thread::sleep(Duration::from_secs_f64(secs)));
                let (counts, per_lock, took, nodes_cost) =
                    run_contended(&seeds, &prefix, &names, kind, secs, &mut cons);
                let acquisitions = counts.iter().sum();
                let mut served = vec![0u64; primaries];
                for (l, n) in per_lock.iter().enumerate() {
                    served[owner_position(layout, l, primaries)] += n;
                }
                results.push(Contended {
                    primaries,
                    layout,
                    kind,
                    acquisitions,
                    secs: took,
                    nodes: nodes_cost,
                    idle,
                    least_most: common::least_most(&counts),
                    served,
                });
            }
        }
    }
    report_contended(&results, &version);
}

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Spread => "spread over every primary",
        Layout::OneOwner => "all on one primary",
    }
}

/// The position (in the primaries list) of the primary owning lock `l` of `layout`.
fn owner_position(layout: Layout, l: usize, primaries: usize) -> usize {
    match layout {
        Layout::Spread => l % primaries,
        Layout::OneOwner => 0,
    }
}

/// `LOCKS` lock names: in equal shares on the primaries `nodes` (spread), or all on
/// `nodes[0]` (one owner).
fn lock_names(
    cluster: &support::topology::Cluster,
    nodes: &[usize],
    prefix: &str,
    layout: Layout,
) -> Vec<String> {
    let wanted: Vec<usize> = (0..LOCKS)
        .map(|l| nodes[owner_position(layout, l, nodes.len())])
        .collect();
    let mut left = wanted;
    let mut names = vec![String::new(); LOCKS];
    let slots = support::topology::key_slot;
    // A slot's owner asked once (CLUSTER NODES), not once per candidate name.
    let mut owners: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    for i in 0.. {
        if left.iter().all(|&n| n == usize::MAX) {
            break;
        }
        let name = format!("hot:{i}");
        let slot = slots(support::Keys::lock(prefix, &name).key());
        let owner = *owners
            .entry(slot)
            .or_insert_with(|| cluster.node_for_slot(slot));
        if let Some(at) = left.iter().position(|&n| n == owner) {
            left[at] = usize::MAX;
            names[at] = name;
        }
    }
    names
}

/// CPU, commands and bus messages of every node in `cons` while `f` runs.
fn node_costs<T>(cons: &mut [redis::Connection], f: impl FnOnce() -> T) -> (Vec<NodeCost>, T) {
    let before: Vec<NodeSnapshot> = cons.iter_mut().map(NodeSnapshot::take).collect();
    let out = f();
    let costs = cons
        .iter_mut()
        .zip(&before)
        .map(|(con, b)| NodeSnapshot::take(con).since(b))
        .collect();
    (costs, out)
}

/// `CLIENTS` clients × `THREADS_PER_CLIENT` threads loop lock → unlock on `names` for
/// `secs`: thread `t` of client `c` on lock `(c * THREADS_PER_CLIENT + t) % LOCKS`, so
/// each lock has two threads of two different clients. Acquisitions per client and per
/// lock, the seconds from the start to the last release, and what the nodes of `cons` did in
/// that window (the clients built and warmed up before it: connections, script loads
/// and subscriptions are no part of it).
fn run_contended(
    seeds: &[String],
    prefix: &str,
    names: &[String],
    kind: &str,
    secs: f64,
    cons: &mut [redis::Connection],
) -> (Vec<u64>, Vec<u64>, f64, Vec<NodeCost>) {
    let clients: Vec<redmutex::Client> = (0..CLIENTS)
        .map(|_| {
            redmutex::Client::builder()
                .cluster(seeds.iter().map(String::as_str))
                .key_prefix(prefix)
                .use_functions(common::use_functions())
                .build()
                .expect("cluster client")
        })
        .collect();
    let n_threads = CLIENTS * THREADS_PER_CLIENT;
    let (warm, go) = (
        std::sync::Arc::new(std::sync::Barrier::new(n_threads + 1)),
        std::sync::Arc::new(std::sync::Barrier::new(n_threads + 1)),
    );
    let window = std::sync::Arc::new(std::sync::Mutex::new(None::<(Instant, Instant)>));
    let threads: Vec<_> = (0..n_threads)
        .map(|i| {
            let client = clients[i / THREADS_PER_CLIENT].clone();
            let name = names[i % LOCKS].clone();
            let fair = kind == "FairLock";
            let (warm, go, window) = (warm.clone(), go.clone(), window.clone());
            thread::spawn(move || {
                let (plain, fair_lock) = (client.lock(&name), client.fair_lock(&name));
                let once = || {
                    if fair {
                        fair_lock.lock().unwrap().unlock().unwrap();
                    } else {
                        plain.lock().unwrap().unlock().unwrap();
                    }
                };
                // Warm up: connections open, scripts loaded, subscriptions made.
                once();
                warm.wait();
                go.wait();
                let (start, end) = window.lock().unwrap().expect("the window");
                thread::sleep(start.saturating_duration_since(Instant::now()));
                let mut n = 0u64;
                while Instant::now() < end {
                    once();
                    n += 1;
                }
                (i / THREADS_PER_CLIENT, i % LOCKS, n, Instant::now())
            })
        })
        .collect();
    warm.wait();
    let before: Vec<NodeSnapshot> = cons.iter_mut().map(NodeSnapshot::take).collect();
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + Duration::from_secs_f64(secs);
    *window.lock().unwrap() = Some((start, end));
    go.wait();
    let mut counts = vec![0u64; CLIENTS];
    let mut per_lock = vec![0u64; LOCKS];
    let mut last = end;
    for t in threads {
        let (c, l, n, at) = t.join().expect("a contending thread");
        counts[c] += n;
        per_lock[l] += n;
        last = last.max(at);
    }
    let costs = cons
        .iter_mut()
        .zip(&before)
        .map(|(con, b)| NodeSnapshot::take(con).since(b))
        .collect();
    (counts, per_lock, (last - start).as_secs_f64(), costs)
}

fn report_contended(results: &[Contended], version: &str) {
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\ncontended locks on a cluster, redis {version}, {cpus} CPUs shared by every node and \
         the {} client threads: {LOCKS} locks, each taken in turn by 2 threads of 2 clients \
         ({CLIENTS} clients x {THREADS_PER_CLIENT} threads, lock -> unlock, no hold); wake-ups by {}",
        CLIENTS * THREADS_PER_CLIENT,
        if version.starts_with('6') {
            "classic PUBLISH (no sharded pub/sub before 7.0)"
        } else {
            "sharded SPUBLISH on the lock's shard"
        }
    );
    let mut targets = common::Targets::default();
    let per = |r: &Contended, x: f64| x / r.acquisitions.max(1) as f64;
    let cpu = |n: &NodeCost| n.cost.cpu_us;
    let base = |r: &Contended| {
        results
            .iter()
            .find(|b| b.layout == r.layout && b.kind == r.kind && b.primaries == 3)
            .map_or(f64::NAN, Contended::rate)
    };
    for layout in [Layout::Spread, Layout::OneOwner] {
        let these: Vec<&Contended> = results.iter().filter(|r| r.layout == layout).collect();
        println!("\n{LOCKS} locks {}", layout_name(layout));
        let header: Vec<String> = std::iter::once(String::new())
            .chain(
                these
                    .iter()
                    .map(|r| format!("{} x{} primaries", r.kind, r.primaries)),
            )
            .collect();
        let mut t = Grid::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
        let col = |f: &dyn Fn(&Contended) -> String| -> Vec<String> {
            these.iter().map(|r| f(r)).collect()
        };
        let total_cpu = |r: &Contended| r.nodes.iter().map(cpu).sum::<f64>();
        let idle_cpu = |r: &Contended| r.idle.iter().map(cpu).sum::<f64>();
        t.row(
            "acquisitions/s (total)",
            col(&|r| format!("{:.0}", r.rate())),
        );
        t.row(
            "  x the same kind on 3 primaries",
            col(&|r| format!("{:.2}x", r.rate() / base(r))),
        );
        t.row("least/most per client", col(&|r| f2(r.least_most)));
        t.row(
            "wake-ups sent/acq (PUBLISH + SPUBLISH)",
            col(&|r| f2(r.wakeups_per())),
        );
        t.row(
            "Redis CPU µs/acq, all nodes",
            col(&|r| f1(per(r, total_cpu(r)))),
        );
        t.row(
            "  of which idle housekeeping (equal window)",
            col(&|r| f1(per(r, idle_cpu(r)))),
        );
        t.row(
            "Redis CPU busy, all nodes (cores)",
            col(&|r| f2(total_cpu(r) / 1e6 / r.secs)),
        );
        let most = these.iter().map(|r| r.primaries).max().unwrap_or(0);
        match layout {
            Layout::Spread => {
                t.row("busiest node busy (cores)", col(&|r| f2(r.busiest())));
                t.row(
                    "ceiling, a core per node (acq/s / busiest)",
                    col(&|r| format!("{:.0}", r.rate() / r.busiest())),
                );
                for i in 0..most {
                    t.row(
                        &format!("primary {i}: share served / per acq served: CPU µs, commands"),
                        col(&|r| match r.nodes.get(i) {
                            Some(n) => format!(
                                "{} / {}, {}",
                                f2(r.served[i] as f64 / r.acquisitions.max(1) as f64),
                                f1(cpu(n) / r.served[i].max(1) as f64),
                                f1(n.cost.executed_per(r.served[i]))
                            ),
                            None => String::new(),
                        }),
                    );
                }
                t.row(
                    "bus PUBLISH received/acq, most of any node",
                    col(&|r| {
                        f3(r.nodes
                            .iter()
                            .map(|n| per(r, n.bus_publish as f64))
                            .fold(0.0, f64::max))
                    }),
                );
            }
            Layout::OneOwner => {
                t.row(
                    "owner: CPU µs/acq (idle window µs/acq)",
                    col(&|r| {
                        format!(
                            "{} ({})",
                            f1(per(r, cpu(&r.nodes[0]))),
                            f1(per(r, cpu(&r.idle[0])))
                        )
                    }),
                );
                for i in 1..most {
                    t.row(
                        &format!("non-owner {i}: bus PUBLISH/acq; CPU x owner's"),
                        col(&|r| match r.nodes.get(i) {
                            Some(n) => format!(
                                "{}; {}",
                                f3(per(r, n.bus_publish as f64)),
                                f2(cpu(n) / cpu(&r.nodes[0]))
                            ),
                            None => String::new(),
                        }),
                    );
                }
            }
        }
        print!("{}", t.render());
        let shard: u64 = these
            .iter()
            .flat_map(|r| &r.nodes)
            .map(|n| n.bus_publishshard)
            .sum();
        println!(
            "  bus SPUBLISH (publishshard) messages received, all these runs and nodes: {shard} \
             (only a shard's replicas get them; these clusters have none)"
        );
        for r in &these {
            match layout {
                Layout::Spread => {
                    let own: Vec<String> = (0..r.nodes.len())
                        .map(|i| f1(cpu(&r.nodes[i]) / r.served[i].max(1) as f64))
                        .collect();
                    targets.info(
                        &format!("spread, {} x{}: acquisitions/s", r.kind, r.primaries),
                        format!("{:.0}", r.rate()),
                        &format!(
                            "{:.2}x 3 primaries; CPU µs per acquisition served, per node: {}; \
                             ceiling with a core per node {:.0}/s",
                            r.rate() / base(r),
                            own.join(" "),
                            r.rate() / r.busiest()
                        ),
                    );
                }
                Layout::OneOwner => {
                    let owner = cpu(&r.nodes[0]) - cpu(&r.idle[0]);
                    let (mut pubs, mut share, mut raw) = (0.0f64, 0.0f64, 0.0f64);
                    for i in 1..r.nodes.len() {
                        pubs = pubs.max(per(r, r.nodes[i].bus_publish as f64));
                        share = share.max((cpu(&r.nodes[i]) - cpu(&r.idle[i])) / owner);
                        raw = raw.max(cpu(&r.nodes[i]) / cpu(&r.nodes[0]));
                    }
                    targets.check(
                        &format!(
                            "one owner, {} x{}: bus PUBLISH/acq, worst non-owner",
                            r.kind, r.primaries
                        ),
                        f3(pubs),
                        "<= 0.05",
                        pubs <= 0.05,
                        &format!("item 4; wake-ups sent {}/acq", f2(r.wakeups_per())),
                    );
                    targets.check(
                        &format!(
                            "one owner, {} x{}: CPU x owner's, worst non-owner",
                            r.kind, r.primaries
                        ),
                        f2(share),
                        "<= 0.10",
                        share <= 0.10,
                        &format!(
                            "item 4; both less their idle window's CPU; {} with it",
                            f2(raw)
                        ),
                    );
                }
            }
        }
    }
    let rises = ["Lock", "FairLock"].iter().all(|k| {
        let of = |p: usize| {
            results
                .iter()
                .find(|r| r.layout == Layout::Spread && r.kind == *k && r.primaries == p)
                .map_or(0.0, Contended::rate)
        };
        of(6) > of(3)
    });
    targets.check(
        "spread: throughput rises from 3 to 6 primaries",
        if rises { "yes" } else { "no" }.to_owned(),
        "rises",
        rises,
        &format!(
            "item 4; with {cpus} CPUs for all nodes and clients it cannot: then the CPU \
             per acquisition each node serves, and the ceiling, are what scale"
        ),
    );
    println!("\n{}", targets.render());
}
