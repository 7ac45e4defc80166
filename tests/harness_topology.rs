//! The multi-server harness itself (`tests/support/topology/`) against real servers:
//! a primary with replicas and sentinels that fail over, and a Redis Cluster that forms,
//! routes, reshards and fails over. Each test starts its own topology, so they run in
//! parallel; each prints what it measured (`cargo test --test harness_topology -- --nocapture`).

mod support;

use std::time::{Duration, Instant};

use support::keys::{Keys, DEFAULT_PREFIX};
use support::topology::{addr_of, crc16, key_slot, tag_for_slot, Cluster, Sentinels, SLOTS};

/// Upper bound on any failover here; the measured figures are printed.
const FAILOVER_BOUND: Duration = Duration::from_secs(15);

fn get(con: &mut redis::Connection, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query(con)
}

fn set(con: &mut redis::Connection, key: &str, value: &str) {
    redis::cmd("SET").arg(key).arg(value).exec(con).unwrap();
}

fn wait_replicas(con: &mut redis::Connection, n: usize) -> usize {
    redis::cmd("WAIT").arg(n).arg(5000).query(con).unwrap()
}

/// The redirection a cluster node answered with: (`MOVED`/`ASK`/..., target address).
fn redirect(result: redis::RedisResult<Option<String>>) -> (String, String) {
    let err = result.expect_err("expected a redirection");
    let code = err.code().unwrap_or("?").to_owned();
    let target = err
        .redirect_node()
        .map(|(addr, _)| addr.to_owned())
        .unwrap_or_default();
    (code, target)
}

/// A script that reads every key it is given, as the lock scripts do.
fn eval_over(con: &mut redis::Connection, keys: &[&str]) -> redis::RedisResult<redis::Value> {
    redis::cmd("EVAL")
        .arg("return redis.call('EXISTS', unpack(KEYS))")
        .arg(keys.len())
        .arg(keys)
        .query(con)
}

#[test]
fn key_slots_follow_the_cluster_spec() {
    // The CRC16 check value of XMODEM, and slots from the Redis Cluster specification.
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(key_slot("foo"), 12182);
    assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
    assert_eq!(key_slot("{user1000}.followers"), key_slot("user1000"));
    // An empty tag is no tag; only the first `{` and the first `}` after it count.
    assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
    assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
    assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
    assert_eq!(key_slot("no}tag{here"), crc16(b"no}tag{here") % SLOTS);
    for slot in 0..SLOTS {
        assert_eq!(key_slot(format!("lock:{{{}}}:x", tag_for_slot(slot))), slot);
    }
}

#[test]
fn sentinels_report_the_primary_and_writes_replicate() {
    let topo = Sentinels::new(2, 3);
    println!(
        "sentinel topology (1 primary, 2 replicas, 3 sentinels) ready in {:?}",
        topo.started_in()
    );
    let primary = topo.primary_addr();
    assert_eq!(primary, addr_of(topo.node(0)));
    assert_eq!(topo.primary_index(), 0);
    assert_eq!(topo.reported_primaries(), vec![Some(primary); 3]);
    assert_eq!(topo.sentinel_addrs().len(), 3);
    assert_eq!(topo.replica_indices(), vec![1, 2]);

    // Each sentinel watches this topology's service and nothing else, even with other
    // topologies running in parallel.
    for s in topo.sentinels() {
        let mut con = s.connection();
        let masters: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("MASTERS")
            .query(&mut con)
            .unwrap();
        assert_eq!(masters.len(), 1);
        assert_eq!(masters[0]["name"], topo.service_name());
    }

    let mut con = topo.primary().connection();
    set(&mut con, "replicated", "yes");
    assert_eq!(wait_replicas(&mut con, 2), 2);
    for i in topo.replica_indices() {
        let mut replica = topo.node(i).connection();
        assert_eq!(
            get(&mut replica, "replicated").unwrap().as_deref(),
            Some("yes")
        );
        let err = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .exec(&mut replica)
            .unwrap_err();
        assert_eq!(err.code(), Some("READONLY"));
    }
}

#[test]
fn killing_the_sentinel_primary_fails_over_to_a_replica() {
    let mut topo = Sentinels::new(2, 3);
    let old = topo.primary_addr();
    let mut con = topo.primary().connection();
    set(&mut con, "witness", "before");
    assert_eq!(wait_replicas(&mut con, 2), 2);

    let killed_at = Instant::now();
    let killed = topo.kill_primary();
    let new = topo.wait_for_failover(FAILOVER_BOUND);
    let failover = killed_at.elapsed();

    assert_ne!(new, old);
    let promoted = topo
        .node_index(new)
        .expect("the new primary is a data node");
    assert_ne!(promoted, killed);
    assert_eq!(topo.primary_addr(), new);
    assert_eq!(
        topo.reported_primaries(),
        vec![Some(new); 3],
        "every sentinel moved on"
    );

    // The other replica follows the new primary as soon as the leader tells it to
    // (+slave-reconf-sent); the leader notices about a second later (+failover-end).
    topo.wait_replicas_synced(Duration::from_secs(10));
    let synced = killed_at.elapsed();
    let end = topo
        .wait_event(Duration::from_secs(10), |e| e.channel == "+failover-end")
        .expect("the leader ends its failover");

    // The timeline, from the sentinels' own events.
    let events = topo.events();
    let first = |channel: &str| {
        events
            .iter()
            .filter(|e| e.channel == channel && e.at >= killed_at)
            .map(|e| e.at - killed_at)
            .min()
            .unwrap_or_else(|| panic!("no {channel} event"))
    };
    println!(
        "sentinel failover (down-after {:?}, failover-timeout {:?}) after the SIGKILL: \
         +sdown {:?}, +odown {:?}, +elected-leader {:?}, +promoted-slave {:?}, \
         every sentinel reports the new primary {failover:?}, \
         other replica in sync {synced:?}, leader's +failover-end {:?}",
        topo.down_after(),
        topo.failover_timeout(),
        first("+sdown"),
        first("+odown"),
        first("+elected-leader"),
        first("+promoted-slave"),
        end.at - killed_at,
    );
    let mut con = topo.primary().connection();
    assert_eq!(get(&mut con, "witness").unwrap().as_deref(), Some("before"));
    set(&mut con, "witness", "after");
    assert_eq!(wait_replicas(&mut con, 1), 1);
    assert!(failover < FAILOVER_BOUND);
}

#[test]
fn a_frozen_sentinel_primary_is_failed_over_and_rejoins_as_a_replica() {
    let topo = Sentinels::new(1, 3);
    let old = topo.primary_index();
    let frozen_at = Instant::now();
    topo.node(old).freeze();
    let new = topo.wait_for_failover(FAILOVER_BOUND);
    let failover = frozen_at.elapsed();
    assert_eq!(topo.node_index(new), Some(1));

    // Thawed, the old primary still says master until a sentinel turns it into a
    // replica of the new one (+convert-to-slave).
    let thawed_at = Instant::now();
    topo.node(old).thaw();
    topo.wait_replicas_synced(Duration::from_secs(10) + topo.info_period());
    println!(
        "sentinel failover of a frozen primary {failover:?}; thawed, it follows the new \
         primary {:?} later",
        thawed_at.elapsed()
    );
    // Waited for, not looked up: the node can follow before the event log's listener has
    // read the sentinel's message (seen under load).
    let converted = topo.wait_event(Duration::from_secs(5), |e| {
        e.channel == "+convert-to-slave" && e.at >= thawed_at
    });
    assert!(
        converted.is_some(),
        "no +convert-to-slave after the thaw; events (ms from the thaw): {:?}",
        topo.events()
            .iter()
            .map(|e| {
                let ms = if e.at >= thawed_at {
                    (e.at - thawed_at).as_millis() as i64
                } else {
                    -((thawed_at - e.at).as_millis() as i64)
                };
                (ms, e.sentinel, e.channel.clone())
            })
            .collect::<Vec<_>>()
    );
}

#[test]
fn cluster_forms_and_routes_keys() {
    let cluster = Cluster::new(3, 0);
    println!("cluster (3 primaries) ready in {:?}", cluster.started_in());
    assert_eq!(cluster.primaries(), vec![0, 1, 2]);
    assert_eq!(cluster.seed_addrs().len(), 3);

    // Every node covers all 16384 slots, each range served by one of the three.
    for node in cluster.nodes() {
        let mut con = node.connection();
        let slots: Vec<(u16, u16, Vec<redis::Value>)> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<redis::Value>>(&mut con)
            .unwrap()
            .into_iter()
            .map(|range| {
                let redis::Value::Array(fields) = range else {
                    panic!("CLUSTER SLOTS entry {range:?}")
                };
                let n = |v: &redis::Value| match v {
                    redis::Value::Int(n) => u16::try_from(*n).unwrap(),
                    other => panic!("slot {other:?}"),
                };
                (n(&fields[0]), n(&fields[1]), fields[2..].to_vec())
            })
            .collect();
        let covered: u32 = slots.iter().map(|(a, b, _)| u32::from(b - a) + 1).sum();
        assert_eq!(covered, u32::from(SLOTS));
    }

    // node_for_key agrees with the server's CLUSTER KEYSLOT, and keys spread over all.
    let keys: Vec<String> = (0..1000)
        .map(|n| match n % 4 {
            0 => format!("key:{n}"),
            1 => Keys::lock(DEFAULT_PREFIX, &format!("lock{n}")).key(),
            2 => Keys::lock(DEFAULT_PREFIX, &format!("lock{n}")).queue(),
            _ => format!("x{{}}{n}{{y}}"),
        })
        .collect();
    let mut con = cluster.node(0).connection();
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("CLUSTER").arg("KEYSLOT").arg(key);
    }
    let server_slots: Vec<u16> = pipe.query(&mut con).unwrap();
    let mut per_node = [0usize; 3];
    for (key, &slot) in keys.iter().zip(&server_slots) {
        assert_eq!(key_slot(key), slot, "slot of {key}");
        per_node[cluster.node_for_key(key)] += 1;
    }
    assert!(per_node.iter().all(|&n| n > 200), "{per_node:?}");

    // Written through its slot's owner, read back there; any other node says MOVED.
    for n in 0..30 {
        let key = format!("routed:{n}");
        let owner = cluster.node_for_key(&key);
        let mut con = cluster.connection_for_key(&key);
        set(&mut con, &key, "v");
        assert_eq!(get(&mut con, &key).unwrap().as_deref(), Some("v"));
        let other = (owner + 1) % 3;
        let (code, target) = redirect(get(&mut cluster.node(other).connection(), &key));
        assert_eq!(code, "MOVED");
        assert_eq!(target, cluster.node(owner).addr().to_string());
    }
}

/// A cluster started through proxies names them, never its nodes' own ports: in its slot
/// map and its redirections; and a client seeded with them reaches each node through its
/// proxy (what the late-call tests on a cluster rely on to slow any call).
#[test]
fn a_cluster_through_proxies_is_reached_through_them() {
    let cluster = Cluster::builder().through_proxies().start();
    println!(
        "cluster (3 primaries, proxies) ready in {:?}",
        cluster.started_in()
    );
    let proxy_addr = |i: usize| format!("127.0.0.1:{}", cluster.node(i).proxy().port());

    for node in cluster.nodes() {
        let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut node.connection())
            .unwrap();
        for range in ranges {
            let owner = match &range[2] {
                redis::Value::Array(fields) => fields[1].clone(),
                other => panic!("CLUSTER SLOTS node {other:?}"),
            };
            let redis::Value::Int(port) = owner else {
                panic!("CLUSTER SLOTS port {owner:?}")
            };
            let port = u16::try_from(port).unwrap();
            let i = cluster.index_of_port(port).expect("a node of the cluster");
            assert_eq!(port, cluster.node(i).proxy().port(), "{range:?}");
        }
    }

    let client = support::Clients::DEFAULT.cluster_at(cluster.proxy_urls());
    for owner in 0..3 {
        let (first, _) = cluster.view(0).unwrap()[..]
            .iter()
            .find(|e| e.id == cluster.node(owner).id())
            .map(|e| e.slots[0])
            .unwrap();
        let name = format!("{{{}}}:through-proxy", tag_for_slot(first));
        let key = Keys::lock(DEFAULT_PREFIX, &name).key();
        assert_eq!(cluster.node_for_key(&key), owner);
        let (code, target) = redirect(get(&mut cluster.node((owner + 1) % 3).connection(), &key));
        assert_eq!((code.as_str(), target), ("MOVED", proxy_addr(owner)));

        for proxy in cluster.proxies() {
            proxy.watch(&name);
        }
        client.lock(&name).lock().unwrap().unlock().unwrap();
        let seen: Vec<usize> = cluster.proxies().iter().map(|p| p.seen(&name)).collect();
        assert!(
            seen[owner] >= 2,
            "{name} on node {owner}: seen by the proxies {seen:?}"
        );
    }
}

#[test]
fn cluster_slot_migration_answers_ask_then_moved() {
    let cluster = Cluster::new(3, 0);
    let slot = 100;
    let tag = tag_for_slot(slot);
    let key = |name: &str| format!("redmutex:{name}{{{tag}}}");
    let (moved, stays, fresh, absent) = (key("a"), key("b"), key("c"), key("!queue:"));
    let from = cluster.node_for_slot(slot);
    let to = (from + 1) % 3;
    let (from_addr, to_addr) = (
        cluster.node(from).addr().to_string(),
        cluster.node(to).addr().to_string(),
    );
    let mut src = cluster.node(from).connection();
    set(&mut src, &moved, "a");
    set(&mut src, &stays, "b");

    let started = Instant::now();
    let migration = cluster.begin_migration(slot, from, to);
    assert!(migration.move_key(&moved));
    assert_eq!(migration.keys_left(), 1);
    let mut dst = cluster.node(to).connection();

    // Mid-migration: the source serves what it still has and sends the rest (and new
    // keys) to the target with ASK; the target serves them only after ASKING.
    assert_eq!(get(&mut src, &stays).unwrap().as_deref(), Some("b"));
    assert_eq!(
        redirect(get(&mut src, &moved)),
        ("ASK".into(), to_addr.clone())
    );
    assert_eq!(
        redirect(get(&mut src, &fresh)),
        ("ASK".into(), to_addr.clone())
    );
    assert_eq!(
        redirect(get(&mut dst, &moved)),
        ("MOVED".into(), from_addr.clone())
    );
    redis::cmd("ASKING").exec(&mut dst).unwrap();
    assert_eq!(get(&mut dst, &moved).unwrap().as_deref(), Some("a"));
    assert_eq!(
        cluster.node_for_slot(slot),
        from,
        "the source owns it until finish"
    );

    // A script over several keys of the slot, some here and some not: TRYAGAIN on the
    // source (Redis 7.0 and later; before, the source sends every call missing a key to
    // the target with ASK), and on the target even after ASKING. The lock scripts are
    // such scripts whenever an optional key (the queue) does not exist.
    let some_here = if support::server_kind().tries_again_when_some_keys_are_here() {
        "TRYAGAIN"
    } else {
        "ASK"
    };
    let err = eval_over(&mut src, &[&stays, &absent]).unwrap_err();
    assert_eq!(err.code(), Some(some_here), "{err}");
    let err = eval_over(&mut src, &[&moved, &stays]).unwrap_err();
    assert_eq!(err.code(), Some(some_here), "{err}");
    redis::cmd("ASKING").exec(&mut dst).unwrap();
    let err = eval_over(&mut dst, &[&moved, &stays]).unwrap_err();
    assert_eq!(err.code(), Some("TRYAGAIN"), "{err}");
    // None of them on the source: ASK; on the target, all there or a single key: fine.
    let err = eval_over(&mut src, &[&moved, &absent]).unwrap_err();
    assert_eq!(err.code(), Some("ASK"), "{err}");
    redis::cmd("ASKING").exec(&mut dst).unwrap();
    let err = eval_over(&mut dst, &[&moved, &absent]).unwrap_err();
    assert_eq!(err.code(), Some("TRYAGAIN"), "{err}");
    redis::cmd("ASKING").exec(&mut dst).unwrap();
    assert_eq!(
        eval_over(&mut dst, &[&moved]).unwrap(),
        redis::Value::Int(1)
    );

    migration.finish();
    println!(
        "cluster slot migration (2 keys, with the checks between) took {:?}",
        started.elapsed()
    );
    assert_eq!(cluster.node_for_slot(slot), to);
    assert_eq!(
        redirect(get(&mut src, &stays)),
        ("MOVED".into(), to_addr.clone())
    );
    assert_eq!(redirect(get(&mut src, &fresh)), ("MOVED".into(), to_addr));
    let mut dst = cluster.node(to).connection();
    assert_eq!(get(&mut dst, &moved).unwrap().as_deref(), Some("a"));
    assert_eq!(get(&mut dst, &stays).unwrap().as_deref(), Some("b"));
    assert_eq!(
        eval_over(&mut dst, &[&moved, &stays, &absent]).unwrap(),
        redis::Value::Int(2)
    );

    // And back again in one call.
    cluster.migrate_slot(slot, to, from);
    assert_eq!(cluster.node_for_slot(slot), from);
    assert_eq!(
        get(&mut cluster.node(from).connection(), &moved)
            .unwrap()
            .as_deref(),
        Some("a")
    );
}

#[test]
fn killing_a_cluster_primary_promotes_its_replica() {
    let mut cluster = Cluster::new(3, 1);
    println!(
        "cluster (3 primaries + 1 replica each) ready in {:?}",
        cluster.started_in()
    );
    let key = "redmutex:{failover}";
    let victim = cluster.node_for_key(key);
    let replicas = cluster.replicas_of(victim);
    assert_eq!(replicas.len(), 1);
    let mut con = cluster.node(victim).connection();
    set(&mut con, key, "before");
    assert_eq!(wait_replicas(&mut con, 1), 1);

    let killed_at = Instant::now();
    cluster.kill_primary(victim);
    let promoted = cluster.wait_for_failover(victim, FAILOVER_BOUND);
    let failover = killed_at.elapsed();
    println!(
        "cluster failover (node timeout {:?}): replica promoted and every node ok in {failover:?}",
        cluster.node_timeout()
    );

    assert_eq!(promoted, replicas[0]);
    assert_eq!(cluster.node_for_key(key), promoted);
    assert!(cluster.primaries().contains(&promoted));
    assert!(!cluster.seed_addrs().contains(&cluster.node(victim).addr()));
    let mut con = cluster.node(promoted).connection();
    assert_eq!(get(&mut con, key).unwrap().as_deref(), Some("before"));
    set(&mut con, key, "after");
    assert!(failover < FAILOVER_BOUND);

    // Restarted (same port and nodes.conf, so same id), the old primary rejoins as a
    // replica of the node that took its slots.
    let restarted_at = Instant::now();
    cluster.node_mut(victim).restart();
    cluster.wait_ok(Duration::from_secs(10));
    cluster.wait_replicas_synced(Duration::from_secs(10));
    println!(
        "cluster: the restarted old primary follows the promoted node {:?} later",
        restarted_at.elapsed()
    );
    assert_eq!(cluster.replicas_of(promoted), vec![victim]);
    let mut con = cluster.node(victim).connection();
    redis::cmd("READONLY").exec(&mut con).unwrap();
    assert_eq!(get(&mut con, key).unwrap().as_deref(), Some("after"));
}
