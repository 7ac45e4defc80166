//! Locks on a Redis Cluster of three primaries (spawned per test): names spread over every
//! node, wake-ups from whichever node owns the lock to its waiters (listening on the
//! lock's own node with sharded pub/sub, Redis 7.0 and later; on any node before), wake-ups
//! that stay on the lock's shard, resharding a slot while its locks are held and waited
//! for, and a primary failover.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::Client;
use support::clients::Clients;
use support::keys::{Keys, DEFAULT_PREFIX};
use support::topology::{key_slot, tag_for_slot, Cluster, SlotMigration};
use support::wait_until;

const CLIENTS: Clients = Clients::DEFAULT
    .watchdog(WATCHDOG)
    .command(Duration::from_millis(1500))
    .connect(Duration::from_secs(10));

const WATCHDOG: Duration = Duration::from_secs(6);

/// What a cluster's ACL rule adds to the minimal one (docs/redis-layout.md).
const CLUSTER_ACL_ADDITIONS: &str = "+cluster|slots +asking +ssubscribe +sunsubscribe +spublish";

fn cluster_client(cluster: &Cluster) -> Client {
    CLIENTS.cluster_at(cluster.seed_urls())
}

/// A thread of `client` blocked in `lock()` on `name`; it sends when it got the lock,
/// then releases it.
fn waiter(client: Client, name: &str) -> (thread::JoinHandle<()>, mpsc::Receiver<Instant>) {
    let (tx, rx) = mpsc::channel();
    let name = name.to_owned();
    let t = thread::spawn(move || {
        let g = client.lock(&name).lock().unwrap();
        tx.send(Instant::now()).unwrap();
        g.unlock().unwrap();
    });
    (t, rx)
}

/// Counts the threads inside one lock's critical section, and the times a thread entered
/// it while another was inside: never two holders.
#[derive(Default)]
struct Witness {
    inside: AtomicUsize,
    overlaps: AtomicUsize,
}

/// A thread of each of `clients` blocked in `lock()` on `name`; each sends when it got the
/// lock, holds it a moment under `witness`, then releases it.
fn witnessed_waiters(
    clients: &[Client],
    name: &str,
    witness: &Arc<Witness>,
) -> Vec<(thread::JoinHandle<()>, mpsc::Receiver<Instant>)> {
    clients
        .iter()
        .map(|client| {
            let (tx, rx) = mpsc::channel();
            let (client, name, witness) = (client.clone(), name.to_owned(), witness.clone());
            let t = thread::spawn(move || {
                let g = client.lock(&name).lock().unwrap();
                let at = Instant::now();
                if witness.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    witness.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                thread::sleep(Duration::from_millis(5));
                witness.inside.fetch_sub(1, Ordering::SeqCst);
                tx.send(at).unwrap();
                g.unlock().unwrap();
            });
            (t, rx)
        })
        .collect()
}

/// How long after `since` each of `waiters` got its lock, each within `bound` of it (no
/// waiter stranded); `check` runs every few milliseconds meanwhile.
fn all_held_within(
    waiters: Vec<(thread::JoinHandle<()>, mpsc::Receiver<Instant>)>,
    since: Instant,
    bound: Duration,
    check: impl Fn(),
) -> Vec<Duration> {
    let mut took = Vec::new();
    for (t, rx) in waiters {
        let at = loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(at) => break at,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    check();
                    assert!(
                        since.elapsed() < bound,
                        "a waiter still waits {:?} on (held after {took:?})",
                        since.elapsed()
                    );
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("a waiter failed"),
            }
        };
        assert!(at >= since, "a waiter held before the lock was released");
        took.push(at - since);
        t.join().unwrap();
    }
    took
}

/// Runs `release` (of the lock `waiter` is queued on, alone) and asserts that the waiter
/// got the lock at once: well within a pickup window (1 s), which a lost wake-up would
/// have cost at least.
fn wakes_at_once(
    release: impl FnOnce(),
    waiter: (thread::JoinHandle<()>, mpsc::Receiver<Instant>),
) {
    let released = Instant::now();
    release();
    let took = all_held_within(vec![waiter], released, Duration::from_secs(5), || {});
    assert!(took[0] < Duration::from_millis(500), "{took:?}");
}

/// `slot` half moved from node `from` to node `to`: its keys moved and `to` owning it
/// (`SETSLOT NODE` there first, as redis-cli does), while `from` does not know yet, so a
/// call sent there is redirected with `ASK`. `finish` the migration returned.
fn half_moved(cluster: &Cluster, slot: u16, from: usize, to: usize) -> SlotMigration<'_> {
    let migration = cluster.begin_migration(slot, from, to);
    while migration.move_keys(10) > 0 {}
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("NODE")
        .arg(cluster.node(to).id())
        .exec(&mut cluster.node(to).connection())
        .unwrap();
    migration
}

/// How many holders `name`'s hash on the node that owns its slot names (its fields but
/// the `~` ones, which are no holders).
fn holder_count(cluster: &Cluster, name: &str) -> usize {
    holders(cluster, name)
        .iter()
        .filter(|(field, _)| !field.starts_with('~'))
        .count()
}

/// The holder ids in `name`'s hash on the node that owns its slot.
fn holders(cluster: &Cluster, name: &str) -> Vec<(String, i64)> {
    let key = Keys::lock(DEFAULT_PREFIX, name).key();
    let mut con = cluster.connection_for_key(&key);
    redis::cmd("HGETALL").arg(&key).query(&mut con).unwrap()
}

/// How many subscriptions of `name`'s queue channels (one per waiting client) there are on
/// every running node: classic ones and sharded ones.
fn listening(cluster: &Cluster, name: &str) -> i64 {
    let key = Keys::lock(DEFAULT_PREFIX, name).key();
    (0..cluster.nodes().len())
        .filter(|&i| cluster.node(i).is_running())
        .map(|i| {
            let mut con = cluster.node(i).connection();
            support::subscribers(&mut con, &key) + support::shard_subscribers(&mut con, &key)
        })
        .sum()
}

/// The running nodes with sharded subscriptions of `name`'s queue channels.
fn shard_listeners(cluster: &Cluster, name: &str) -> Vec<usize> {
    let key = Keys::lock(DEFAULT_PREFIX, name).key();
    (0..cluster.nodes().len())
        .filter(|&i| cluster.node(i).is_running())
        .filter(|&i| support::shard_subscribers(&mut cluster.node(i).connection(), &key) > 0)
        .collect()
}

/// Whether the servers have sharded pub/sub (Redis 7.0 and later, Valkey), which the
/// clients then listen with: the servers with functions.
fn sharded() -> bool {
    support::server_kind().has_functions()
}

/// The classic `PUBLISH` messages node `i` received over the cluster bus
/// (`cluster_stats_messages_publish_received` of `CLUSTER INFO`).
fn bus_publishes(cluster: &Cluster, i: usize) -> u64 {
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut cluster.node(i).connection())
        .expect("CLUSTER INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cluster_stats_messages_publish_received:"))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// The CPU time node `i` has used, in seconds (`INFO cpu`: system and user).
fn cpu_seconds(cluster: &Cluster, i: usize) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query(&mut cluster.node(i).connection())
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .map(|n| n.trim().parse::<f64>().expect("seconds"))
        .sum()
}

/// A lock name whose slot a node other than `not` owns.
fn name_on_other_node(cluster: &Cluster, not: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) != not)
        .unwrap()
}

#[test]
fn a_thousand_lock_names_spread_over_every_primary() {
    let cluster = Cluster::new(3, 0);
    let client = cluster_client(&cluster);
    let mut per_node = BTreeMap::new();
    let names: Vec<String> = (0..1000).map(|i| format!("job:{i}")).collect();
    for name in &names {
        let lock = client.lock(name);
        let outer = lock.lock().unwrap();
        let inner = lock.try_lock().unwrap().expect("re-entry");
        assert_eq!(lock.hold_count().unwrap(), 2);
        let on_node = holders(&cluster, name);
        assert_eq!(on_node.len(), 1, "{name} is on the node of its slot");
        assert_eq!(on_node[0].1, 2);
        *per_node
            .entry(cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, name).key()))
            .or_insert(0) += 1;
        drop(inner);
        outer.unlock().unwrap();
        assert!(holders(&cluster, name).is_empty());
    }
    println!("1000 names per node: {per_node:?}");
    assert_eq!(per_node.len(), 3, "every primary holds some");
    assert!(per_node.values().all(|&n| n > 200));

    // The watchdog renews holds on every node at once (its batches are per slot).
    let guards: Vec<_> = names[..30]
        .iter()
        .map(|n| client.lock(n).lock().unwrap())
        .collect();
    // Time is the subject: half a lease after the acquisition, more than two thirds of it
    // left on every node shows a renewal happened there.
    let taken = Instant::now();
    let renewed_past = WATCHDOG.as_millis() as i64 * 2 / 3 + 100;
    assert!(wait_until(WATCHDOG, || taken.elapsed() >= WATCHDOG / 2
        && names[..30].iter().all(|n| {
            let key = Keys::lock(DEFAULT_PREFIX, n).key();
            let mut con = cluster.connection_for_key(&key);
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
            pttl > renewed_past
        })));
    for g in guards {
        assert!(!g.is_lease_lost());
        g.unlock().unwrap();
    }
}

#[test]
fn waiters_listening_on_one_node_wake_for_locks_on_the_others() {
    let cluster = Cluster::new(3, 0);
    let holder = cluster_client(&cluster);
    // Both waiters' pub/sub connections are to node 0; the locks live elsewhere.
    let name = name_on_other_node(&cluster, 0, "plain");
    let fair_name = name_on_other_node(&cluster, 0, "fair");

    let mut latencies = Vec::new();
    for _ in 0..5 {
        let held = holder.lock(&name).lock().unwrap();
        let (t, rx) = waiter(
            CLIENTS.cluster_at(vec![format!("redis://{}/", &cluster.node(0).addr())]),
            &name,
        );
        // Subscribed (classic: on node 0; sharded: on the lock's node) and queued before
        // the release.
        assert!(wait_until(Duration::from_secs(5), || listening(
            &cluster, &name
        ) > 0));
        if sharded() {
            assert_eq!(
                shard_listeners(&cluster, &name),
                vec![cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, &name).key())]
            );
        }
        let released = Instant::now();
        held.unlock().unwrap();
        let woke = rx.recv_timeout(Duration::from_secs(5)).expect("woken");
        latencies.push(woke - released);
        t.join().unwrap();
    }
    latencies.sort();
    println!("cross-node wake-ups (plain lock): {latencies:?}");
    assert!(latencies[2] < Duration::from_millis(500));

    // A fair lock's queue is served in order across nodes: each waiter is handed the
    // lock directly (its client listens on node 0, the lock lives on another node).
    let fair = holder.fair_lock(&fair_name).lock().unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let queued = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for i in 0..3 {
        let c = CLIENTS.cluster_at(vec![format!("redis://{}/", &cluster.node(0).addr())]);
        let (order, queued, n) = (order.clone(), queued.clone(), fair_name.clone());
        // Queue one after another, so the expected order is known.
        assert!(wait_until(Duration::from_secs(5), || queued
            .load(Ordering::SeqCst)
            == i));
        threads.push(thread::spawn(move || {
            let lock = c.fair_lock(&n);
            let started = Instant::now();
            queued.fetch_add(1, Ordering::SeqCst);
            let g = lock.lock().unwrap();
            order.lock().push((i, started.elapsed()));
            g.unlock().unwrap();
        }));
        assert!(wait_until(Duration::from_secs(5), || {
            let key = Keys::lock(DEFAULT_PREFIX, &fair_name).queue();
            let mut con = cluster.connection_for_key(&key);
            let len: usize = redis::cmd("LLEN").arg(&key).query(&mut con).unwrap();
            len == i + 1
        }));
    }
    fair.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let order = order.lock();
    println!("fair handoffs across nodes: {order:?}");
    assert_eq!(
        order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Handed on directly, not after a pickup window (1 s) per waiter.
    assert!(order[2].1 < Duration::from_millis(900), "{order:?}");
}

/// Issue 29: under contention on locks of one slot, the wake-ups stay on that slot's
/// shard: the releases `SPUBLISH` to waiters listening on the slot's primary, and the
/// primaries that own none of the locks receive next to no `PUBLISH` over the cluster bus
/// (a classic `PUBLISH` reaches every node: 0.64–0.70 bus messages per acquisition on each
/// of them were measured before). Before Redis 7.0 (no sharded pub/sub) the wake-ups are
/// classic, and only their working is checked.
#[test]
fn wake_ups_under_contention_stay_on_the_locks_shard() {
    const ACQUISITIONS: usize = 600;
    let cluster = Cluster::new(3, 0);
    let (first, second, slot) = two_names_in_one_slot();
    let owner = cluster.node_for_slot(slot);
    let others: Vec<usize> = cluster
        .primaries()
        .into_iter()
        .filter(|&i| i != owner)
        .collect();
    let before: Vec<u64> = others.iter().map(|&i| bus_publishes(&cluster, i)).collect();
    let cpu = || -> Vec<f64> {
        std::iter::once(owner)
            .chain(others.iter().copied())
            .map(|i| cpu_seconds(&cluster, i))
            .collect()
    };
    let cpu_before = cpu();
    let acquired = Arc::new(AtomicUsize::new(0));
    // Three clients on each lock, holding it a moment: each release hands it over.
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let client = cluster_client(&cluster);
            let name = (if i % 2 == 0 { &first } else { &second }).clone();
            let acquired = acquired.clone();
            thread::spawn(move || {
                let lock = client.lock(&name);
                while acquired.load(Ordering::SeqCst) < ACQUISITIONS {
                    let g = lock.lock().unwrap();
                    acquired.fetch_add(1, Ordering::SeqCst);
                    thread::sleep(Duration::from_micros(300));
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let n = acquired.load(Ordering::SeqCst);
    // Told, not asserted: CPU seconds include each node's own housekeeping.
    let spent: Vec<f64> = cpu().iter().zip(&cpu_before).map(|(a, b)| a - b).collect();
    println!(
        "CPU per acquisition, µs: owner {:.1}, the others {:?} ({:?} of the owner's)",
        spent[0] * 1e6 / n as f64,
        spent[1..]
            .iter()
            .map(|s| s * 1e6 / n as f64)
            .collect::<Vec<_>>(),
        spent[1..].iter().map(|s| s / spent[0]).collect::<Vec<_>>(),
    );
    let per: Vec<f64> = others
        .iter()
        .zip(&before)
        .map(|(&i, b)| (bus_publishes(&cluster, i) - b) as f64 / n as f64)
        .collect();
    println!(
        "bus PUBLISH messages per acquisition on the primaries that own none of the locks \
         (nodes {others:?}): {per:?}, over {n} acquisitions"
    );
    if sharded() {
        assert!(per.iter().all(|&p| p <= 0.05), "{per:?}");
    }
}

/// Issue 29: a handoff as a migrating slot is handed over, the importing node owning it
/// already (`SETSLOT NODE` there first, as redis-cli does) while the exporting node, where
/// the waiter's client listens, does not know yet: the release, sent there by `ASK`, finds
/// no sharded subscriber, so it publishes the classic way too, which the waiter's link also
/// listens for on the exporting node (or, if the news reached it first, the waiter's
/// subscription moves and its waiters look again). Either way the waiter is woken at
/// once, not after a pickup window or its timer.
#[test]
fn a_handoff_as_a_slot_is_handed_over_wakes_the_waiter_at_once() {
    let cluster = Cluster::new(3, 0);
    let name = "half-way";
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, name).key());
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    let holder = cluster_client(&cluster);
    let held = holder.lock(name).lock().unwrap();
    // Two waiting clients: the second is handed the lock by the first's release, which
    // meets the same half-moved slot.
    let witness = Arc::new(Witness::default());
    let waiters = witnessed_waiters(
        &[cluster_client(&cluster), cluster_client(&cluster)],
        name,
        &witness,
    );
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 2));
    if sharded() {
        assert_eq!(shard_listeners(&cluster, name), vec![from]);
    }
    let migration = half_moved(&cluster, slot, from, to);
    let released = Instant::now();
    held.unlock().unwrap();
    // Each well within a pickup window (1 s), which a lost grant would have cost at least.
    let mut took = all_held_within(waiters, released, Duration::from_secs(5), || {});
    println!("woken {took:?} after a release run on the importing node");
    took.sort();
    assert!(took[0] < Duration::from_millis(500), "{took:?}");
    assert!(took[1] < Duration::from_millis(1000), "{took:?}");
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0);
    migration.finish();
    if sharded() {
        assert!(
            wait_until(Duration::from_secs(5), || shard_listeners(&cluster, name)
                .is_empty()),
            "the waiter's client stops listening once it holds nothing: {:?}",
            shard_listeners(&cluster, name)
        );
    }
    // The lock works on its new node.
    let g = holder.lock(name).lock().unwrap();
    assert_eq!(holder_count(&cluster, name), 1);
    g.unlock().unwrap();
}

/// Node `.1` of a cluster frozen (SIGSTOP) until this is dropped: the node is thawed
/// even when the test fails.
struct Thaw<'a>(&'a Cluster, usize);

impl<'a> Thaw<'a> {
    fn freeze(cluster: &'a Cluster, node: usize) -> Thaw<'a> {
        cluster.node(node).server().freeze();
        Thaw(cluster, node)
    }
}

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.node(self.1).server().thaw();
    }
}

/// Three primaries whose nodes may be frozen for a few seconds, never taken for failed
/// meanwhile.
fn cluster_to_freeze() -> Cluster {
    Cluster::builder()
        .primaries(3)
        .node_timeout(Duration::from_secs(30))
        .start()
}

/// A waiter's first wait on a cluster reads the slot map (`CLUSTER SLOTS`, from a seed
/// node) to know where to listen: a waiter with a deadline gives up on it when its
/// deadline passes (and listens the classic way), rather than wait for a seed node that
/// accepts connections but answers nothing (frozen) for a connect or command timeout.
#[test]
fn a_waiter_gives_up_on_a_frozen_seed_nodes_slot_map_at_its_deadline() {
    const PATIENCE: Duration = Duration::from_millis(300);
    // Frozen past the deadline for a few seconds, never taken for failed meanwhile.
    let cluster = Cluster::builder()
        .primaries(3)
        .node_timeout(Duration::from_secs(15))
        .start();
    let seed = cluster.primaries()[0];
    let name = name_on_other_node(&cluster, seed, "deadline");
    let holder = cluster_client(&cluster);
    let held = holder.lock(&name).lock().unwrap();
    // Timeouts that dwarf the deadline, so that a wait for them shows.
    let waiter = CLIENTS
        .command(Duration::from_secs(5))
        .connect(Duration::from_secs(5))
        .cluster_at(vec![format!("redis://{}/", cluster.node(seed).addr())]);
    // Its command connection and pub/sub reader made before the freeze: a lock elsewhere
    // taken and given back (without a wait, so no slot map read yet).
    let elsewhere = name_on_other_node(&cluster, seed, "warm-up");
    waiter.lock(&elsewhere).lock().unwrap().unlock().unwrap();
    let thaw = Thaw::freeze(&cluster, seed);
    let started = Instant::now();
    let got = waiter.lock(&name).try_lock_for(PATIENCE);
    let took = started.elapsed();
    drop(thaw);
    println!("a wait of {PATIENCE:?} with the seed node frozen returned after {took:?}");
    assert!(matches!(got, Ok(None)), "{:?}", got.map(|g| g.is_some()));
    assert!(took >= PATIENCE, "{took:?}");
    // The deadline, the I/O grace (250 ms) and a wide margin; the 5 s timeouts otherwise.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    // Once thawed, a wait is woken by the release as ever.
    let (t, woke) = self::waiter(waiter.clone(), &name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, &name
    ) == 1));
    wakes_at_once(|| held.unlock().unwrap(), (t, woke));
}

/// A call to the node that owns the lock, when that node accepts connections but answers
/// nothing (frozen), ends at the call's own bound: its deadline, or `command_timeout` for
/// a call without one. redis-rs's cluster connection retries a timed-out command at once
/// (up to its `retries`, each waiting a whole read timeout), which alone would make such
/// a call last nine times its bound.
#[test]
fn a_call_to_a_frozen_lock_owner_ends_at_its_own_bound() {
    const COMMAND: Duration = Duration::from_millis(600);
    const PATIENCE: Duration = Duration::from_millis(300);
    let cluster = cluster_to_freeze();
    let owner = cluster.primaries()[0];
    let on_owner = |prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) == owner)
            .unwrap()
    };
    let name = on_owner("frozen-owner");
    let other = on_owner("frozen-other");
    let client = CLIENTS
        .command(COMMAND)
        .connect(Duration::from_secs(5))
        .cluster_at(cluster.seed_urls());
    // The command connection and its socket to the owner made before the freeze.
    client.lock(&name).lock().unwrap().unlock().unwrap();
    let thaw = Thaw::freeze(&cluster, owner);
    // Without a deadline, on the connection made before: one command timeout, not nine.
    let started = Instant::now();
    let got = client.lock(&name).lock();
    let took = started.elapsed();
    println!("lock() on a frozen owner returned after {took:?}");
    assert!(
        matches!(got, Err(redmutex::Error::Timeout { .. })),
        "{:?}",
        got.map(|_| ())
    );
    assert!(took >= COMMAND, "{took:?}");
    assert!(took < COMMAND * 3, "{took:?}");
    // With a deadline, on another name (the first one's timed-out attempt leaves a
    // clean-up there that a new call waits for first), with a new connection to make.
    let started = Instant::now();
    let got = client.lock(&other).try_lock_for(PATIENCE);
    let took = started.elapsed();
    println!(
        "try_lock_for({PATIENCE:?}) on a frozen owner returned after {took:?}: {:?}",
        got.as_ref().err()
    );
    assert!(
        matches!(
            got,
            Err(redmutex::Error::Timeout { .. } | redmutex::Error::Pool { .. })
        ),
        "{:?}",
        got.map(|g| g.is_some())
    );
    assert!(took >= PATIENCE, "{took:?}");
    // The deadline, the I/O grace (250 ms) and a wide margin.
    assert!(took < Duration::from_millis(1500), "{took:?}");
    drop(thaw);
    // Thawed, the lock works again through the same client.
    let g = client.lock(&name).lock().unwrap();
    assert_eq!(holder_count(&cluster, &name), 1);
    g.unlock().unwrap();
}

/// Locks on the other nodes stay at hand while one node is frozen, also after a call to
/// the frozen node timed out (a command connection that timed out on one node is not made
/// anew as a whole, which would wait for the frozen node's handshake first).
#[test]
fn locks_elsewhere_stay_at_hand_while_one_node_is_frozen() {
    const COMMAND: Duration = Duration::from_millis(600);
    let cluster = cluster_to_freeze();
    let frozen = cluster.primaries()[0];
    let on_frozen = (0..)
        .map(|i| format!("frozen-node{i}"))
        .find(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) == frozen)
        .unwrap();
    let elsewhere = name_on_other_node(&cluster, frozen, "healthy-node");
    let client = CLIENTS
        .command(COMMAND)
        .connect(Duration::from_secs(5))
        .cluster_at(cluster.seed_urls());
    client.lock(&on_frozen).lock().unwrap().unlock().unwrap();
    client.lock(&elsewhere).lock().unwrap().unlock().unwrap();
    let thaw = Thaw::freeze(&cluster, frozen);
    assert!(client.lock(&on_frozen).try_lock().is_err());
    for round in 0..3 {
        let started = Instant::now();
        let got = client.lock(&elsewhere).try_lock_for(Duration::from_secs(2));
        let took = started.elapsed();
        println!("round {round}: a lock on a healthy node took {took:?}");
        let g = got.unwrap().expect("free");
        // A few round trips and a new connection, which may try the frozen node once for
        // as long as it was waited for last (600 ms at most), on a loaded machine; a wait
        // for its handshake would take the connect timeout (5 s), past the deadline.
        assert!(took < Duration::from_millis(1500), "{took:?}");
        g.unlock().unwrap();
        assert!(client.lock(&on_frozen).try_lock().is_err());
    }
    drop(thaw);
}

/// A fair lock's queue is served in order through a half-moved slot (as in
/// `a_handoff_as_a_slot_is_handed_over_wakes_the_waiter_at_once`): each release runs on
/// the importing node, where neither `SPUBLISH` nor `PUBLISH` counts the next waiter
/// (its client listens on the exporting node), so only its entry's flag 8 ("listens
/// elsewhere") keeps it from being dropped as dead, every waiter then racing for the lock.
#[test]
fn a_fair_queue_is_served_in_order_through_a_half_moved_slot() {
    let cluster = Cluster::new(3, 0);
    let name = "half-way-fair";
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, name).key());
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    let holder = cluster_client(&cluster);
    let held = holder.fair_lock(name).lock().unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 0..3 {
        let (c, order) = (cluster_client(&cluster), order.clone());
        threads.push(thread::spawn(move || {
            let g = c.fair_lock(name).lock().unwrap();
            order.lock().push((i, Instant::now()));
            g.unlock().unwrap();
        }));
        // Queued one after another, so the expected order is known.
        assert!(wait_until(Duration::from_secs(5), || queued(
            &cluster, name
        ) == i as i64 + 1));
    }
    let migration = half_moved(&cluster, slot, from, to);
    let released = Instant::now();
    held.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    migration.finish();
    let order = order.lock();
    let took: Vec<_> = order.iter().map(|(i, at)| (*i, *at - released)).collect();
    println!("fair handoffs through a half-moved slot: {took:?}");
    assert_eq!(
        order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Handed on directly, not after a pickup window (1 s) per waiter.
    assert!(took[2].1 < Duration::from_millis(1500), "{took:?}");
}

/// The documented minimal ACL rule with its cluster additions (docs/redis-layout.md:
/// `+cluster|slots +asking`, and on 7.0 and later `+ssubscribe +sunsubscribe +spublish`) serves
/// a cluster: waits listen sharded where the servers have it, and are woken at once,
/// also by a release sent by `ASK` through a half-moved slot.
#[test]
fn the_documented_acl_rule_with_its_cluster_additions_serves_a_cluster() {
    let cluster = Cluster::new(3, 0);
    let rule = format!("{} {CLUSTER_ACL_ADDITIONS}", support::MINIMAL_ACL_RULE);
    for i in cluster.primaries() {
        support::set_acl_user(cluster.node(i).server(), "locker", &rule);
    }
    let confined = || {
        CLIENTS.cluster_at(
            cluster
                .seed_addrs()
                .iter()
                .map(|a| format!("redis://locker:s3cret-pw@{a}/"))
                .collect(),
        )
    };
    let (a, b) = (confined(), confined());
    let name = "acl-cluster";
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, name).key());
    let from = cluster.node_for_slot(slot);
    let held = a.lock(name).lock().unwrap();
    let queued_one = waiter(b.clone(), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 1));
    if sharded() {
        assert_eq!(shard_listeners(&cluster, name), vec![from]);
    }
    wakes_at_once(|| held.unlock().unwrap(), queued_one);

    let held = a.lock(name).lock().unwrap();
    let queued_one = waiter(b.clone(), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 1));
    let to = (from + 1) % 3;
    let migration = half_moved(&cluster, slot, from, to);
    wakes_at_once(|| held.unlock().unwrap(), queued_one);
    migration.finish();
}

/// Sharded pub/sub is the waiter's client's choice, and an ACL may refuse it: a client
/// whose user may not run `SSUBSCRIBE` listens the classic way, and a release by a user
/// who may not run `SPUBLISH` still tells a waiter listening sharded (its script falls
/// back to `PUBLISH`, which that waiter's link also hears). Nobody waits for a timer.
#[test]
fn a_user_refused_sharded_pub_sub_still_wakes_and_is_woken() {
    if !sharded() {
        return support::skip("a_user_refused_sharded_pub_sub", "sharded pub/sub");
    }
    let cluster = Cluster::new(3, 0);
    for i in cluster.primaries() {
        redis::cmd("ACL")
            .arg(&["SETUSER", "plain", "on", ">pw", "~*", "&*", "+@all"][..])
            .arg(&["-ssubscribe", "-spublish"][..])
            .exec(&mut cluster.node(i).connection())
            .unwrap();
    }
    let restricted = || {
        CLIENTS.cluster_at(
            cluster
                .seed_addrs()
                .iter()
                .map(|a| format!("redis://plain:pw@{a}/"))
                .collect(),
        )
    };
    let name = "acl-refused";
    let plain = restricted();
    let full = cluster_client(&cluster);

    // A sharded waiter, woken by a release whose user may not SPUBLISH.
    let held = plain.lock(name).lock().unwrap();
    let (waiter_a, woke) = waiter(full.clone(), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 1));
    assert_eq!(
        shard_listeners(&cluster, name),
        vec![cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, name).key())]
    );
    wakes_at_once(|| held.unlock().unwrap(), (waiter_a, woke));

    // A waiter whose user may not SSUBSCRIBE listens the classic way.
    let held = full.lock(name).lock().unwrap();
    let (waiter_b, woke) = waiter(restricted(), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 1));
    wakes_at_once(|| held.unlock().unwrap(), (waiter_b, woke));
}

#[test]
fn every_kind_of_primitive_works_on_a_cluster() {
    let cluster = Cluster::new(3, 0);
    let client = cluster_client(&cluster);
    let fenced = client.fenced_lock("t").lock().unwrap();
    assert!(fenced.token() > 0);
    let rw = client.read_write_lock("rw");
    let read = rw.read_lock().lock().unwrap();
    let read2 = rw.read_lock().lock().unwrap();
    let sem = client.semaphore("s", 2);
    let p1 = sem.acquire().unwrap();
    let p2 = sem.try_acquire().unwrap().expect("second permit");
    assert!(sem.try_acquire().unwrap().is_none());
    let latch = client.count_down_latch("l");
    assert!(latch.try_set_count(1).unwrap());
    latch.count_down().unwrap();
    assert!(latch.wait_for(Duration::from_secs(1)).unwrap());
    fenced.unlock().unwrap();
    drop(read2);
    read.unlock().unwrap();
    p1.release().unwrap();
    p2.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 2);
    let _ = (key_slot("x"), tag_for_slot(0));
}

/// Two lock names whose keys share one slot (found by brute force over the CRC16).
fn two_names_in_one_slot() -> (String, String, u16) {
    let first = "resharded".to_owned();
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, &first).key());
    let second = (0..)
        .map(|i| format!("same-slot-{i}"))
        .find(|n| key_slot(Keys::lock(DEFAULT_PREFIX, n).key()) == slot)
        .unwrap();
    (first, second, slot)
}

#[test]
fn resharding_a_slot_while_its_locks_are_held_and_waited_for() {
    let cluster = Cluster::new(3, 0);
    let (held_name, busy_name, slot) = two_names_in_one_slot();
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;

    let holder = cluster_client(&cluster);
    let held = holder.lock(&held_name).lock().unwrap();

    // Two waiters blocked on the held lock, of clients whose classic readers are on a
    // third node and on the node the slot leaves.
    let url = |i: usize| format!("redis://{}/", cluster.node(i).addr());
    let witness = Arc::new(Witness::default());
    let waiters = witnessed_waiters(
        &[
            CLIENTS.cluster_at(vec![url((from + 2) % 3)]),
            CLIENTS.cluster_at(vec![url(from)]),
        ],
        &held_name,
        &witness,
    );
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, &held_name
    ) == 2));

    // Two contenders take turns on the other lock of the slot throughout; a witness counts
    // overlaps and errors.
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let sections = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The contenders stop when the test ends, also when it fails.
    struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop_on_drop = StopOnDrop(stop.clone());
    let contenders: Vec<_> = (0..2)
        .map(|_| {
            let c = cluster_client(&cluster);
            let (inside, overlaps, sections, stop, n) = (
                inside.clone(),
                overlaps.clone(),
                sections.clone(),
                stop.clone(),
                busy_name.clone(),
            );
            thread::spawn(move || {
                let mut errors = Vec::new();
                // Each contender waits for the other's release, across the migration too.
                let mut longest = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let got = c.lock(&n).lock();
                    longest = longest.max(asked.elapsed());
                    match got {
                        Ok(g) => {
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            thread::yield_now();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            sections.fetch_add(1, Ordering::SeqCst);
                            if let Err(e) = g.unlock() {
                                errors.push(e.to_string());
                            }
                        }
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                (errors, longest)
            })
        })
        .collect();
    let progress = |at_least: usize, stage: &str| {
        let target = sections.load(Ordering::SeqCst) + at_least;
        assert!(
            wait_until(Duration::from_secs(10), || sections.load(Ordering::SeqCst)
                >= target),
            "the contenders are stuck {stage}"
        );
    };
    progress(20, "before the migration");

    // Move the slot's keys one at a time, letting the contenders run between the moves
    // (ASK redirections, TRYAGAIN for scripts whose keys are split), then hand the slot
    // over (MOVED from then on).
    let began = Instant::now();
    // Each step waits until the contenders' scripts were refused or redirected by the
    // split slot (INFO errorstats on both nodes), so every state of the migration is met.
    let refusals = || -> u64 {
        [from, to]
            .iter()
            .map(|&i| {
                let mut con = cluster.node(i).connection();
                let info: String = redis::cmd("INFO")
                    .arg("errorstats")
                    .query(&mut con)
                    .unwrap();
                info.lines()
                    .filter(|l| {
                        ["TRYAGAIN", "ASK", "MOVED"]
                            .iter()
                            .any(|e| l.starts_with(&format!("errorstat_{e}:")))
                    })
                    .filter_map(|l| {
                        l.split("count=")
                            .nth(1)?
                            .split(',')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    })
                    .sum::<u64>()
            })
            .sum()
    };
    let met = |stage: &str| {
        let before = refusals();
        assert!(
            wait_until(Duration::from_secs(5), || refusals() > before),
            "the contenders never met the migration {stage}"
        );
    };
    let migration = cluster.begin_migration(slot, from, to);
    let mut moved = 0;
    while migration.move_keys(1) > 0 {
        moved += 1;
        met(&format!("after {moved} keys moved"));
    }
    migration.finish();
    met("after the slot moved");
    progress(20, "after the migration");
    let migrated_in = began.elapsed();
    assert_eq!(cluster.node_for_slot(slot), to);

    if sharded() {
        // The waiter's subscription followed the slot (the source told it so).
        assert!(
            wait_until(Duration::from_secs(5), || shard_listeners(
                &cluster, &held_name
            ) == vec![to]),
            "listening on {:?}",
            shard_listeners(&cluster, &held_name)
        );
    }
    // The held lock moved with its hold and is still renewed and released normally.
    assert!(!held.is_lease_lost());
    assert_eq!(holder_count(&cluster, &held_name), 1);
    assert_eq!(
        witness.inside.load(Ordering::SeqCst),
        0,
        "a waiter holds the held lock"
    );
    let released = Instant::now();
    held.unlock().unwrap();
    // Two handoffs, each woken at once: far below a pickup window (1 s) per waiter.
    let took = all_held_within(waiters, released, Duration::from_secs(2), || {
        assert!(holder_count(&cluster, &held_name) <= 1, "two holders");
    });
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0);

    stop.store(true, Ordering::Relaxed);
    let (errors, longest): (Vec<Vec<String>>, Vec<Duration>) =
        contenders.into_iter().map(|t| t.join().unwrap()).unzip();
    let errors: Vec<String> = errors.concat();
    println!(
        "slot {slot} resharded from node {from} to {to} in {migrated_in:?} under {} sections; \
         the held lock's waiters held {took:?} after its release; the contenders' longest \
         waits {longest:?}",
        sections.load(Ordering::SeqCst),
    );
    assert!(errors.is_empty(), "errors surfaced to callers: {errors:?}");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    // No contender left to its timer: the lease it saw (6 s, held for a moment) is what a
    // wake-up lost in the migration would have cost; ~150 ms were seen.
    assert!(
        longest.iter().all(|&w| w < Duration::from_secs(5)),
        "{longest:?}"
    );
}

/// A primary fails over while its locks are held and waited for: the holds and their
/// renewals carry over to the promoted replica, the waiters' subscriptions follow the
/// slots (sharded: to the promoted node; classic: a reader on the killed node reconnects
/// elsewhere), and every waiter holds within a bounded time of its lock's release, one at
/// a time: a lock released as soon as the failover is seen (its waiters may still be
/// listening on the dead node: a grant published in that gap is recovered), and one
/// released once the subscriptions have followed (woken at once).
#[test]
fn a_primary_failover_is_survived() {
    let mut cluster = Cluster::new(3, 1);
    let primary = cluster.primaries()[1];
    let on_primary = |prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) == primary)
            .unwrap()
    };
    let (name, gap_name) = (on_primary("failover"), on_primary("gap"));
    let holder = cluster_client(&cluster);
    let held = holder.lock(&name).lock().unwrap();
    let gap_held = holder.lock(&gap_name).lock().unwrap();
    let listen_on = cluster.primaries()[0];
    let url = |i: usize| format!("redis://{}/", cluster.node(i).addr());
    // Two waiting clients on each lock: one whose classic reader is on a node that stays
    // up, one whose reader is on the node killed.
    let clients = [
        CLIENTS.cluster_at(vec![url(listen_on)]),
        CLIENTS.cluster_at(vec![url(primary), url(listen_on)]),
    ];
    let (witness, gap_witness) = (Arc::new(Witness::default()), Arc::new(Witness::default()));
    let waiters = witnessed_waiters(&clients, &name, &witness);
    let gap_waiters = witnessed_waiters(&clients, &gap_name, &gap_witness);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, &name
    ) == 2
        && queued(&cluster, &gap_name) == 2));
    if sharded() {
        assert_eq!(shard_listeners(&cluster, &name), vec![primary]);
        assert_eq!(shard_listeners(&cluster, &gap_name), vec![primary]);
    }
    cluster.wait_replicas_synced(Duration::from_secs(5));

    let killed_at = Instant::now();
    cluster.kill_primary(primary);
    let promoted = cluster.wait_for_failover(primary, Duration::from_secs(20));
    println!(
        "node {primary} failed over to {promoted} in {:?}",
        killed_at.elapsed()
    );
    // At once: the waiters' subscriptions may not have followed the slots yet.
    assert_eq!(holder_count(&cluster, &gap_name), 1);
    let gap_released = Instant::now();
    gap_held.unlock().unwrap();
    let one_holder = || {
        for n in [&name, &gap_name] {
            assert!(holder_count(&cluster, n) <= 1, "two holders of {n}");
        }
    };
    // Within the pickup window a grant in the gap may cost, the waiters' links'
    // reconnect backoff (1 s) and wide margins; under the 6 s lease a waiter left to its
    // timer would wait for.
    let gap_took = all_held_within(
        gap_waiters,
        gap_released,
        Duration::from_secs(5),
        one_holder,
    );
    println!("released as the failover was seen, its waiters held after {gap_took:?}");
    assert_eq!(gap_witness.overlaps.load(Ordering::SeqCst), 0);

    // The same client takes new locks in the failed-over slots and keeps renewing.
    let other = (0..)
        .map(|i| format!("after-{i}"))
        .find(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) == promoted)
        .unwrap();
    let g = holder.lock(&other).lock().unwrap();
    assert_eq!(holder_count(&cluster, &other), 1);
    g.unlock().unwrap();
    let taken = Instant::now();
    assert!(wait_until(WATCHDOG, || {
        let mut con = cluster.node(promoted).connection();
        let pttl: i64 =
            support::query_key(&mut con, "PTTL", Keys::lock(DEFAULT_PREFIX, &name).key());
        taken.elapsed() >= WATCHDOG / 3 && pttl > WATCHDOG.as_millis() as i64 * 2 / 3
    }));
    assert!(!held.is_lease_lost());
    assert_eq!(holder_count(&cluster, &name), 1);
    assert_eq!(
        witness.inside.load(Ordering::SeqCst),
        0,
        "a waiter holds a held lock"
    );
    if sharded() {
        // The waiters' subscriptions followed the slots to the promoted replica.
        assert!(
            wait_until(Duration::from_secs(10), || shard_listeners(&cluster, &name)
                == vec![promoted]),
            "listening on {:?}",
            shard_listeners(&cluster, &name)
        );
    }
    let released = Instant::now();
    held.unlock().unwrap();
    // Two handoffs, each woken at once: far below a pickup window (1 s) per waiter.
    let took = all_held_within(waiters, released, Duration::from_secs(2), one_holder);
    println!("released once the subscriptions followed, its waiters held after {took:?}");
    assert_eq!(witness.overlaps.load(Ordering::SeqCst), 0);
}

/// What one call of a thread in `calls_on_a_failing_over_primary_wait_it_out` returned.
struct Call {
    what: &'static str,
    started: Instant,
    ended: Instant,
    outcome: Result<(), String>,
}

/// An unlock's outcome: a hold the failover lost (taken on the old primary and not yet
/// replicated) is reported, and that is no failure.
fn unlocked(r: Result<(), redmutex::Error>) -> Result<(), String> {
    match r {
        Err(redmutex::Error::NotHeld { .. } | redmutex::Error::LeaseLost { .. }) => Ok(()),
        r => r.map_err(|e| e.to_string()),
    }
}

/// Issue 17, item 11: between a primary's death and its replica's promotion, calls on its
/// slots wait the failover out instead of failing with "Connection refused": `lock()` and
/// `unlock()` return once the replica serves the slots, a `try_lock_for` returns
/// `None` or `Timeout` only past its deadline, and every thread proceeds after.
#[test]
fn calls_on_a_failing_over_primary_wait_it_out() {
    const TRY_WAIT: Duration = Duration::from_millis(300);
    // A bounded call returns by its deadline plus 250 ms; the rest is room for a loaded
    // machine.
    const TRY_BOUND: Duration = Duration::from_millis(300 + 250 + 700);
    let mut cluster = Cluster::new(3, 1);
    let primary = cluster.primaries()[1];
    let mut names = (0..)
        .map(|i| format!("settle-{i}"))
        .filter(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) == primary);
    let client = cluster_client(&cluster);
    // A hold taken (and replicated) before the kill, released during the failover.
    let across_name = names.next().unwrap();
    let across = client.lock(&across_name);
    let (taken_tx, taken) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let unlocker = thread::spawn(move || {
        let held = across.lock().unwrap();
        taken_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        let r = held.unlock();
        (r.map_err(|e| e.to_string()), Instant::now())
    });
    taken.recv().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, calls) = mpsc::channel::<(usize, Call)>();
    let mut threads = Vec::new();
    // Threads 0-1 lock() and unlock() names of their own; 2-3 try_lock_for() a new name
    // each time (an attempt that timed out leaves a doubt that the next attempt of the
    // same thread on the same name waits for); 4-5 try_lock_for() the name held across
    // the kill: they are in bounded calls throughout the failover.
    for t in 0..6 {
        let own: Vec<String> = match t {
            0 | 1 => vec![names.next().unwrap()],
            2 | 3 => names.by_ref().take(300).collect(),
            _ => vec![across_name.clone()],
        };
        let (stop, tx, client) = (stop.clone(), tx.clone(), client.clone());
        threads.push(thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let lock = client.lock(&own[i % own.len()]);
                i += 1;
                let started = Instant::now();
                let (what, outcome) = if t < 2 {
                    match lock.lock() {
                        Ok(g) => {
                            let locked = Instant::now();
                            let call = Call {
                                what: "lock",
                                started,
                                ended: locked,
                                outcome: Ok(()),
                            };
                            tx.send((t, call)).unwrap();
                            let r = unlocked(g.unlock());
                            let call = Call {
                                what: "unlock",
                                started: locked,
                                ended: Instant::now(),
                                outcome: r,
                            };
                            tx.send((t, call)).unwrap();
                            continue;
                        }
                        Err(e) => ("lock", Err(e.to_string())),
                    }
                } else {
                    match lock.try_lock_for(TRY_WAIT) {
                        Ok(Some(g)) => {
                            let locked = Instant::now();
                            let call = Call {
                                what: "try_lock_for",
                                started,
                                ended: locked,
                                outcome: Ok(()),
                            };
                            tx.send((t, call)).unwrap();
                            let call = Call {
                                what: "unlock",
                                started: locked,
                                outcome: unlocked(g.unlock()),
                                ended: Instant::now(),
                            };
                            tx.send((t, call)).unwrap();
                            continue;
                        }
                        Ok(None) => ("try_lock_for", Err("none".to_owned())),
                        // What a bounded call may say once its deadline passed.
                        Err(redmutex::Error::Timeout { .. } | redmutex::Error::Pool { .. }) => {
                            ("try_lock_for", Err("timeout".to_owned()))
                        }
                        Err(e) => ("try_lock_for", Err(e.to_string())),
                    }
                };
                let call = Call {
                    what,
                    started,
                    ended: Instant::now(),
                    outcome,
                };
                tx.send((t, call)).unwrap();
            }
        }));
    }
    drop(tx);
    cluster.wait_replicas_synced(Duration::from_secs(5));
    thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    cluster.kill_primary(primary);
    thread::sleep(Duration::from_millis(100));
    go.send(()).unwrap();
    let promoted = cluster.wait_for_failover(primary, Duration::from_secs(20));
    let promoted_at = Instant::now();
    println!(
        "node {primary} failed over to {promoted} in {:?}",
        promoted_at - killed_at
    );
    // Time for every thread to go on, past the clean-up of a doubtful attempt of its own
    // (a watchdog round away).
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let (unlocked, unlocked_at) = unlocker.join().unwrap();
    println!(
        "the hold taken before the kill was released {:?} after it",
        unlocked_at - killed_at
    );

    let mut failures = Vec::new();
    if let Err(e) = unlocked {
        failures.push(format!(
            "unlock of the hold taken before the kill failed: {e}"
        ));
    }
    let mut after_promotion = [0; 6];
    let mut in_window = 0;
    let mut longest = Duration::ZERO;
    let mut longest_try = [Duration::ZERO; 2];
    for (t, call) in calls.iter() {
        let took = call.ended - call.started;
        if call.ended > killed_at && call.started < promoted_at {
            in_window += 1;
            longest = longest.max(took);
            if call.what == "try_lock_for" {
                longest_try[usize::from(t >= 4)] = longest_try[usize::from(t >= 4)].max(took);
            }
        }
        // However it ended, a bounded call ends by its deadline plus the grace, also on
        // the held name, where the clean-up of the thread's previous doubtful attempt
        // may still be waiting for the failover.
        if call.what == "try_lock_for" && took > TRY_BOUND {
            failures.push(format!("try_lock_for({TRY_WAIT:?}) took {took:?}"));
        }
        match &call.outcome {
            Ok(()) => {
                if call.started > promoted_at {
                    after_promotion[t] += 1;
                }
            }
            // A bounded call may give up, but only once its deadline passed, and
            // within the grace.
            Err(e) if (e == "none" || e == "timeout") && call.what == "try_lock_for" => {
                if took < TRY_WAIT {
                    failures.push(format!("{} {e} after {took:?}", call.what));
                }
            }
            Err(e) => failures.push(format!(
                "{} failed {:?} after the kill: {e}",
                call.what,
                call.ended.saturating_duration_since(killed_at)
            )),
        }
    }
    println!(
        "{in_window} calls overlapped the failover, the longest took {longest:?}, the \
         longest try_lock_for({TRY_WAIT:?}) {:?} (on the held name {:?})",
        longest_try[0], longest_try[1]
    );
    assert!(
        failures.is_empty(),
        "{} failures: {failures:?}",
        failures.len()
    );
    assert!(
        after_promotion.iter().all(|&n| n > 0),
        "every thread proceeds after the promotion: {after_promotion:?}"
    );
}

/// Issue 17, item 11 (the other side): calls wait a dead node out, but not one by one: a
/// primary killed for good (no replica, and a cluster that serves its other slots) must
/// not make the watchdog's round, which renews lock after lock, wait for each of the dead
/// node's locks in turn while the leases of locks elsewhere run out.
#[test]
fn a_primary_down_for_good_does_not_starve_renewals_elsewhere() {
    const WATCHDOG: Duration = Duration::from_secs(6);
    let mut cluster = Cluster::new(3, 0);
    for i in 0..3 {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query(&mut cluster.node(i).connection())
            .unwrap();
    }
    let (dead, alive) = (cluster.primaries()[1], cluster.primaries()[2]);
    let on = |cluster: &Cluster, node: usize, prefix: &str| -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) == node)
            .take(4)
            .collect()
    };
    let (doomed_names, names) = (on(&cluster, dead, "doomed"), on(&cluster, alive, "kept"));
    let client = CLIENTS
        .command(Duration::from_secs(1))
        .connect(Duration::from_millis(1500))
        .cluster_at(cluster.seed_urls());
    let doomed: Vec<_> = doomed_names
        .iter()
        .map(|n| client.lock(n).lock().unwrap())
        .collect();
    let kept: Vec<_> = names
        .iter()
        .map(|n| client.lock(n).lock().unwrap())
        .collect();
    cluster.kill_primary(dead);
    let killed = Instant::now();
    let mut con = cluster.node(alive).connection();
    let mut lowest = i64::MAX;
    while killed.elapsed() < WATCHDOG * 2 {
        for n in &names {
            let pttl: i64 =
                support::query_key(&mut con, "PTTL", Keys::lock(DEFAULT_PREFIX, n).key());
            lowest = lowest.min(pttl);
        }
        thread::sleep(Duration::from_millis(100));
    }
    println!("the lowest lease left on the live node: {lowest} ms");
    assert!(
        kept.iter().all(|g| !g.is_lease_lost()),
        "a hold on the live node was lost"
    );
    // Renewed every 2 s: a lease of 6 s never falls under 2 s with room to spare.
    assert!(
        lowest > 1_000,
        "renewals on the live node starved: {lowest} ms left"
    );
    for g in kept {
        g.unlock().unwrap();
    }
    drop(doomed);
}

/// Script calls (EVALSHA and FCALL) the node at `con` has run so far.
fn script_calls(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_fcall:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Issue 18: a script may touch the keys of one slot only, so the watchdog's renewals go
/// one call per slot per round, not one per lock: three held locks whose keys share a
/// slot are renewed together.
#[test]
fn held_locks_in_one_slot_are_renewed_in_one_call_per_round() {
    const WATCHDOG: Duration = Duration::from_millis(1500);
    let cluster = Cluster::new(3, 0);
    let (first, second, slot) = two_names_in_one_slot();
    let third = (0..)
        .map(|i| format!("also-same-slot-{i}"))
        .find(|n| key_slot(Keys::lock(DEFAULT_PREFIX, n).key()) == slot)
        .unwrap();
    let client = Clients::DEFAULT
        .watchdog(WATCHDOG)
        .command(Duration::from_millis(400))
        .cluster_at(cluster.seed_urls());
    let guards: Vec<_> = [&first, &second, &third]
        .iter()
        .map(|n| client.lock(n.as_str()).lock().unwrap())
        .collect();
    let mut con = cluster.connection_for_key(Keys::lock(DEFAULT_PREFIX, &first).key());
    let before = script_calls(&mut con);
    let started = Instant::now();
    thread::sleep(Duration::from_millis(2_500));
    let calls = script_calls(&mut con) - before;
    let elapsed = started.elapsed();
    // A round every 500 ms: about elapsed / 500 ms + 1 rounds fell in the window; one
    // more for a round run late and the next on time. One call per lock would be three.
    let rounds = elapsed.as_millis() as u64 / 500 + 2;
    println!("{calls} script calls in {elapsed:?} (at most {rounds} rounds)");
    assert!(calls >= 1, "nothing was renewed in {elapsed:?}");
    assert!(
        calls <= rounds,
        "{calls} renewal calls for three locks of one slot in at most {rounds} rounds"
    );
    assert!(guards.iter().all(|g| !g.is_lease_lost()));
    for g in guards {
        g.unlock().unwrap();
    }
}

/// Issue 18 (the function library): a node that never ran a script lacks the library.
/// A call sent there by an ASK redirection (its slot half-way through a migration, every
/// key of the lock already moved) must find it loaded, not fail with "Function not found"
/// because the library went to the node that still owns the slot in the client's map
/// (seen in the resharding test under load). Every key the acquire touches includes the
/// main keys of the name's other kinds (a name is one kind at a time): with them on the
/// target too (a target missing any of a call's keys refuses it with `TRYAGAIN` for as
/// long as the migration lasts), the script runs there and refuses the name as another
/// kind's, which shows it ran.
#[test]
fn a_call_redirected_to_a_node_without_the_library_gets_it_loaded() {
    let cluster = Cluster::new(3, 0);
    let (warm, fresh, slot) = two_names_in_one_slot();
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    let client = cluster_client(&cluster);
    // The library reaches `from` (and only the nodes this client called).
    client.lock(&warm).lock().unwrap().unlock().unwrap();
    let mut con = cluster.node(to).connection();
    // Before Redis 7.0 the client runs the scripts with EVALSHA: they are what `to` lacks.
    let flush = if support::server_kind().has_functions() {
        "FUNCTION"
    } else {
        "SCRIPT"
    };
    let _: () = redis::cmd(flush).arg("FLUSH").query(&mut con).unwrap();
    let migration = cluster.begin_migration(slot, from, to);
    // Every key of `fresh` already on `to` (held by someone else, one waiter queued):
    // `from` answers ASK, and `to` runs the call.
    let keys = Keys::lock(DEFAULT_PREFIX, &fresh);
    let mut pipe = redis::pipe();
    for cmd in [
        redis::cmd("HSET")
            .arg(keys.key())
            .arg("other:1")
            .arg(1)
            .clone(),
        redis::cmd("PEXPIRE").arg(keys.key()).arg(30_000).clone(),
        redis::cmd("SET").arg(keys.fence()).arg(7).clone(),
        redis::cmd("RPUSH").arg(keys.queue()).arg("gone:1").clone(),
        redis::cmd("HSET")
            .arg(keys.waiters())
            .arg("x")
            .arg("1")
            .clone(),
        // The name's other kinds: a read-write lock's and a semaphore's holds, a latch.
        redis::cmd("HSET")
            .arg(Keys::rw(DEFAULT_PREFIX, &fresh).key())
            .arg("other:1")
            .arg(1)
            .clone(),
        redis::cmd("HSET")
            .arg(Keys::sem(DEFAULT_PREFIX, &fresh).key())
            .arg("other:1")
            .arg(1)
            .clone(),
        redis::cmd("SET").arg(keys.latch()).arg(1).clone(),
    ] {
        pipe.cmd("ASKING").ignore().add_command(cmd).ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    let tried = client.lock(&fresh).try_lock();
    migration.finish();
    match tried {
        Err(redmutex::Error::WrongKind { .. }) => {}
        Ok(Some(_)) => panic!("a lock held by someone else was granted"),
        other => panic!("try_lock on a node without the library: {other:?}"),
    }
}

/// The refusals of scripts whose keys were split by a migration, counted on node `i`
/// (`INFO errorstats`): `TRYAGAIN`, or the `ASK` that sends such a call from the source
/// to the target.
fn refused_as_split(cluster: &Cluster, i: usize, code: &str) -> u64 {
    let mut con = cluster.node(i).connection();
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut con)
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with(&format!("errorstat_{code}:")))
        .filter_map(|l| {
            l.split("count=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The length of `name`'s queue on the node that owns its slot.
fn queued(cluster: &Cluster, name: &str) -> i64 {
    let queue = Keys::lock(DEFAULT_PREFIX, name).queue();
    let mut con = cluster.connection_for_key(&queue);
    redis::cmd("LLEN").arg(&queue).query(&mut con).unwrap()
}

/// What [`holder_on_cue`] returns when it is done: whether its guard said it was lost just
/// before its unlock, and how the unlock went.
type Unlocked = thread::JoinHandle<(bool, Result<(), redmutex::Error>)>;

/// A thread of `client` blocked in `lock()` on `name`; it sends when it got the lock, then
/// unlocks when told to (see [`Unlocked`]).
fn holder_on_cue(
    client: Client,
    name: &str,
) -> (mpsc::Receiver<Instant>, mpsc::Sender<()>, Unlocked) {
    let (got_tx, got) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let name = name.to_owned();
    let t = thread::spawn(move || {
        let g = client.lock(&name).lock().unwrap();
        got_tx.send(Instant::now()).unwrap();
        go_rx.recv().unwrap();
        (g.is_lease_lost(), g.unlock())
    });
    (got, go, t)
}

/// Issue 26: a hold handed over by a release just before its slot starts migrating. Its
/// lease is the one-second pickup window until the new holder's client extends it, and
/// that client's watchdog also has a check of a lock it handed on before due in the
/// window (every contender of a busy lock both hands on and picks up): a multi-key script
/// that the split slot refuses for as long as the split lasts, longer than the window.
/// The hold must be kept meanwhile (an extension touches only the lock's hash, which the
/// split cannot refuse), so that the release succeeds once the slot has moved: a slower
/// call, not an error. Here the holder unlocks at once: its release, refused by the split
/// slot too, waits it out.
#[test]
fn a_hold_handed_over_as_its_slot_splits_outlives_the_migration() {
    handed_over_as_the_slot_splits(true);
}

/// [`a_hold_handed_over_as_its_slot_splits_outlives_the_migration`], the holder unlocking
/// only after the migration: its watchdog kept the hold through the split.
#[test]
fn a_hold_handed_over_as_its_slot_splits_is_extended_through_the_split() {
    handed_over_as_the_slot_splits(false);
}

fn handed_over_as_the_slot_splits(unlock_at_once: bool) {
    let cluster = Cluster::new(3, 0);
    let name = "handed-over";
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, name).key());
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    let contender = cluster_client(&cluster);
    let held = contender.lock(name).lock().unwrap();

    // Another contender waits; the first one hands the lock to it (and its client checks
    // that handoff a little over a second later), then waits in turn; a third waits after
    // it, so that the queue's keys stay beside the lock's hash.
    let (a_got, a_go, a) = holder_on_cue(cluster_client(&cluster), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 1));
    held.unlock().unwrap();
    let handed_on = Instant::now();
    a_got
        .recv_timeout(Duration::from_secs(5))
        .expect("the handoff");
    let (b_got, b_go, b) = holder_on_cue(contender.clone(), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 1));
    let (c_got, c_go, c) = holder_on_cue(cluster_client(&cluster), name);
    assert!(wait_until(Duration::from_secs(5), || queued(
        &cluster, name
    ) == 2));

    // The lock comes back to the first contender 0.85 s after it handed it on: its check
    // of that handoff (1.05 s after) falls due early in the new hold's pickup window,
    // before the hold's extension (a third of the way in).
    thread::sleep(Duration::from_millis(850).saturating_sub(handed_on.elapsed()));
    let refused_before = (
        refused_as_split(&cluster, from, "TRYAGAIN"),
        refused_as_split(&cluster, from, "ASK"),
        refused_as_split(&cluster, to, "TRYAGAIN"),
    );
    a_go.send(()).unwrap();
    let (lost, released) = a.join().unwrap();
    assert!(
        !lost && released.is_ok(),
        "the second contender: {released:?}"
    );
    let handed_back = Instant::now();
    // The slot splits: its queue moves, the lock's hash and the waiters stay.
    let migration = cluster.begin_migration(slot, from, to);
    assert!(migration.move_key(Keys::lock(DEFAULT_PREFIX, name).queue()));
    b_got
        .recv_timeout(Duration::from_secs(5))
        .expect("the lock handed back");
    if unlock_at_once {
        b_go.send(()).unwrap();
    }
    // Split for 1.5 s from the handoff: half a window longer than the window.
    let split_for = Duration::from_millis(1500);
    thread::sleep(split_for.saturating_sub(handed_back.elapsed()));
    if b.is_finished() {
        panic!(
            "the release went through a split slot: {:?}",
            b.join().unwrap()
        );
    }
    migration.finish();
    if !unlock_at_once {
        b_go.send(()).unwrap();
    }
    let (lost, released) = b.join().unwrap();
    let released_in = handed_back.elapsed();

    // Each server's own refusal of the split slot was met.
    let refused = |(i, code): (usize, &str)| refused_as_split(&cluster, i, code);
    let refused_now = (
        refused((from, "TRYAGAIN")),
        refused((from, "ASK")),
        refused((to, "TRYAGAIN")),
    );
    if support::server_kind().tries_again_when_some_keys_are_here() {
        assert!(
            refused_now.0 > refused_before.0,
            "the source refused with TRYAGAIN: {refused_before:?} -> {refused_now:?}"
        );
    } else {
        assert!(
            refused_now.1 > refused_before.1 && refused_now.2 > refused_before.2,
            "the source sent the calls on with ASK, the target refused them with \
             TRYAGAIN: {refused_before:?} -> {refused_now:?}"
        );
    }
    println!("released {released_in:?} after the handoff (split for {split_for:?}): {released:?}");
    assert!(!lost, "the guard said lost before its unlock");
    released.expect("the unlock of the hold handed over as the slot split");
    assert!(
        released_in >= split_for,
        "released only once the slot moved"
    );

    // The lock goes on to the third contender, on the slot's new owner.
    c_got
        .recv_timeout(Duration::from_secs(5))
        .expect("the third contender got the lock");
    assert_eq!(cluster.node_for_slot(slot), to);
    c_go.send(()).unwrap();
    let (lost, released) = c.join().unwrap();
    assert!(
        !lost && released.is_ok(),
        "the third contender: {released:?}"
    );
}

/// Issue 26: a hold that cannot be kept across a migration is reported lost when its
/// lease passes, not when it is released. A read-write lock's write hold lives in two keys
/// (its holds and their leases), which its renewal touches together; a migration that
/// splits them refuses the renewal for as long as the split lasts, here much longer than
/// the lease of the hold handed over just before. (On a cluster a handed-over hold is
/// confirmed with the server before `lock()` returns, which extends it to its full lease
/// at once: the guard never relies on the pickup window alone, so the lease that passes
/// in the split is the waiting client's watchdog lease, kept short here.) The guard's
/// `lost()` and the client's hook fire when the lease ends, and its unlock says
/// `LeaseLost`.
#[test]
fn a_hold_handed_over_that_a_split_slot_cannot_extend_is_lost_when_its_lease_ends() {
    split_write_hold(false);
}

/// [`a_hold_handed_over_that_a_split_slot_cannot_extend_is_lost_when_its_lease_ends`],
/// the holder unlocking at once: its release waits out the split, the hook is told when
/// the lease ends meanwhile (nothing renews or watches the hold then but the release),
/// and the unlock says `LeaseLost`, not that the lock is not held.
#[test]
fn the_release_of_a_hold_whose_lease_passed_in_a_split_slot_says_lease_lost() {
    split_write_hold(true);
}

fn split_write_hold(unlock_at_once: bool) {
    let cluster = Cluster::new(3, 0);
    let name = "split-write";
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, name).key());
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    // The write lock's keys: its holds, their leases, its queue.
    let holds = Keys::rw(DEFAULT_PREFIX, name).key();
    let leases = Keys::rw(DEFAULT_PREFIX, name).leases();
    let queue = Keys::rw(DEFAULT_PREFIX, name).queue();
    assert_eq!(key_slot(&leases), slot);
    let writer = cluster_client(&cluster);
    let held = writer.read_write_lock(name).write_lock().lock().unwrap();

    let hooked: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let hook_at = hooked.clone();
    let hook_calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calls = hook_calls.clone();
    // The waiting client's lease: much shorter than the split.
    const LEASE: Duration = Duration::from_millis(1200);
    let waiting = Client::builder()
        .cluster(cluster.seed_urls())
        .watchdog_timeout(LEASE)
        .command_timeout(Duration::from_millis(400))
        .connect_timeout(Duration::from_secs(10))
        .on_lease_lost(move |_| {
            hook_at.lock().unwrap().get_or_insert(Instant::now());
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .build()
        .expect("cluster client");
    let (got_tx, got) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let n = name.to_owned();
    let waiter = thread::spawn(move || {
        let g = waiting.read_write_lock(&n).write_lock().lock().unwrap();
        got_tx.send(()).unwrap();
        if unlock_at_once {
            go_rx.recv().unwrap();
            let lost = g.is_lease_lost();
            let unlocked = g.unlock();
            return (Some(Instant::now()), lost, unlocked);
        }
        let lost = g.lost();
        let lost_at = lost
            .recv_timeout(Duration::from_secs(10))
            .ok()
            .map(|_| Instant::now());
        (lost_at, g.is_lease_lost(), g.unlock())
    });
    assert!(wait_until(Duration::from_secs(5), || {
        let mut con = cluster.connection_for_key(&queue);
        redis::cmd("LLEN")
            .arg(&queue)
            .query::<i64>(&mut con)
            .unwrap()
            == 1
    }));
    let refused_before = (
        refused_as_split(&cluster, from, "TRYAGAIN"),
        refused_as_split(&cluster, from, "ASK"),
        refused_as_split(&cluster, to, "TRYAGAIN"),
    );
    let releasing = Instant::now();
    held.unlock().unwrap();
    let released = Instant::now();
    // The hold handed over is confirmed (and so extended to its lease) before the guard
    // is returned; the slot splits right after: the leases move, the holds stay.
    got.recv_timeout(Duration::from_secs(5))
        .expect("the write lock handed over");
    let got_at = Instant::now();
    let migration = cluster.begin_migration(slot, from, to);
    assert!(migration.move_key(&leases));
    let mut source = cluster.node(from).connection();
    assert!(redis::cmd("EXISTS")
        .arg(&holds)
        .query::<bool>(&mut source)
        .unwrap());
    assert!(
        got_at.elapsed() < LEASE / 3,
        "split {:?} after the handoff, not before the first renewal",
        got_at.elapsed()
    );
    // (Told at once, or never: the other waits for its loss.)
    let _ = go.send(());
    // Split for 3 s: the whole lease, and margins on both sides.
    thread::sleep(Duration::from_secs(3).saturating_sub(released.elapsed()));
    let split_over = Instant::now();
    let refused = |(i, code): (usize, &str)| refused_as_split(&cluster, i, code);
    let refused_now = (
        refused((from, "TRYAGAIN")),
        refused((from, "ASK")),
        refused((to, "TRYAGAIN")),
    );
    migration.finish();
    let (lost_at, lost, unlocked) = waiter.join().unwrap();
    // (The hook is called on a thread of its own.)
    wait_until(Duration::from_secs(2), || hooked.lock().unwrap().is_some());
    let hooked_at = *hooked.lock().unwrap();

    if support::server_kind().tries_again_when_some_keys_are_here() {
        assert!(
            refused_now.0 > refused_before.0,
            "the source refused the renewal with TRYAGAIN: {refused_before:?} -> \
             {refused_now:?}"
        );
    } else {
        assert!(
            refused_now.1 > refused_before.1 && refused_now.2 > refused_before.2,
            "the source sent the renewal on with ASK, the target refused it with \
             TRYAGAIN: {refused_before:?} -> {refused_now:?}"
        );
    }
    let hooked_at = hooked_at.expect("the hook was called");
    assert_eq!(
        hook_calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the hook was called once"
    );
    // The lease counts from the confirmation's send time, between the release and the
    // guard's return: the loss is told then (margins for clock rounding below, a loaded
    // machine above), long before the split ends.
    let told_in_time = |what: &str, at: Instant| {
        assert!(
            at + Duration::from_millis(50) >= releasing + LEASE,
            "{what} fired {:?} after the release began, before the lease ended",
            at - releasing
        );
        assert!(
            at <= got_at + LEASE + Duration::from_millis(700) && at < split_over,
            "{what} fired {:?} after the guard was returned, not when its lease ended",
            at - got_at
        );
    };
    if unlock_at_once {
        let unlocked_at = lost_at.expect("the time of the unlock");
        assert!(!lost, "not lost before the unlock");
        assert!(
            matches!(unlocked, Err(redmutex::Error::LeaseLost { .. })),
            "{unlocked:?}"
        );
        println!(
            "unlocked {:?} after the release began; hook {:?}",
            unlocked_at - releasing,
            hooked_at - releasing
        );
        told_in_time("the hook", hooked_at);
        return;
    }
    let lost_at = lost_at.expect("the guard's lost() fired");
    println!(
        "guard {:?} after the release began; lost() {:?}, hook {:?} after it",
        got_at - releasing,
        lost_at - got_at,
        hooked_at - got_at
    );
    told_in_time("lost()", lost_at);
    told_in_time("the hook", hooked_at);
    assert!(lost, "is_lease_lost() agrees");
    assert!(
        matches!(unlocked, Err(redmutex::Error::LeaseLost { .. })),
        "{unlocked:?}"
    );
}

/// Issue 26: scripts sent with `EVALSHA` (Redis 6.2, or `use_functions(false)` anywhere)
/// touch no key but their own, so the watchdog's renewal of a lock (its hash alone) goes
/// through on a slot half-way through a migration, the hash still on the source, and the
/// hold outlives a split longer than its lease. The prelude that lets those scripts run at
/// the memory limit once wrote a marker key of its own, which never exists: a slot in
/// migration refused every call carrying it (`TRYAGAIN`, or `ASK` and then `TRYAGAIN`)
/// until the migration ended, and the hold lapsed.
#[test]
fn an_evalsha_renewal_goes_through_a_slot_half_way_through_a_migration() {
    // Renewed every 0.5 s; split for 4 s, well past the 1.5 s lease.
    const LEASE: Duration = Duration::from_millis(1500);
    const SPLIT: Duration = Duration::from_secs(4);
    let cluster = Cluster::new(3, 0);
    let name = "evalsha-split";
    let slot = key_slot(Keys::lock(DEFAULT_PREFIX, name).key());
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    let client = CLIENTS
        .watchdog(LEASE)
        .command(Duration::from_millis(500))
        .functions(false)
        .cluster_at(cluster.seed_urls());
    let guard = client.lock(name).lock().unwrap();
    let migration = cluster.begin_migration(slot, from, to);
    let split = Instant::now();
    let lost = guard.lost();
    let lost_in_split = lost.recv_timeout(SPLIT).is_ok();
    let lost_after = split.elapsed();
    migration.finish();
    assert!(
        !lost_in_split && !guard.is_lease_lost(),
        "the hold lapsed {lost_after:?} into a split of its slot ({LEASE:?} lease)"
    );
    guard.unlock().expect("released after the migration");
}

/// Issue 38: a `MultiLock` of one name through two clients of one cluster is the same lock
/// twice: its first acquisition refuses it (the check's keys are in the name's slot, so
/// both clients look on the node that has the lock), for names on every node; names on
/// two clients that are not one key are taken.
#[test]
fn a_multilock_of_one_name_through_two_cluster_clients_is_refused() {
    let cluster = Cluster::new(3, 0);
    let (a, b) = (cluster_client(&cluster), cluster_client(&cluster));
    let mut nodes = std::collections::BTreeSet::new();
    for i in 0..6 {
        let name = format!("twice-{i}");
        nodes.insert(cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, &name).key()));
        let twice = redmutex::MultiLock::new([a.lock(name.as_str()), b.lock(name.as_str())])
            .expect("not known to be one key yet");
        let err = twice
            .try_lock()
            .map(|_| ())
            .expect_err("one key of one cluster");
        assert!(
            matches!(err, redmutex::Error::InvalidArgument { .. }),
            "{name}: {err:?}"
        );
        let other = format!("other-{i}");
        let two =
            redmutex::MultiLock::new([a.lock(name.as_str()), b.lock(other.as_str())]).unwrap();
        two.try_lock().unwrap().expect("free").unlock().unwrap();
    }
    assert!(nodes.len() > 1, "the names spread over nodes: {nodes:?}");
}
