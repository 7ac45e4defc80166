//! Forming a Redis Cluster ([`ClusterBuilder`]), and its `CLUSTER NODES` lines.

use super::{poll, spawn_all, Cluster, ClusterNode, READY_TIMEOUT, SLOTS};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The primary's id, for a replica.
    pub primary: Option<String>,
    /// Slot ranges it serves (inclusive); migration markers left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeEntry {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn is_primary(&self) -> bool {
        self.has_flag("master")
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

pub(super) fn parse_cluster_nodes(text: &str) -> Vec<NodeEntry> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let host_port = f[1].split(['@', ',']).next()?;
            let port = host_port.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeEntry {
                id: f[0].to_owned(),
                port,
                flags: f[2].split(',').map(str::to_owned).collect(),
                primary: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// Shape and timing of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    primaries: usize,
    replicas: usize,
    node_timeout: Duration,
    through_proxies: bool,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            primaries: 3,
            replicas: 0,
            node_timeout: Duration::from_millis(1000),
            through_proxies: false,
        }
    }
}

impl ClusterBuilder {
    /// Primaries, sharing the 16384 slots in equal ranges (default 3).
    pub fn primaries(mut self, n: usize) -> Self {
        assert!(n > 0, "a cluster needs a primary");
        self.primaries = n;
        self
    }

    /// Replicas per primary (default 0).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// `cluster-node-timeout` (default 1 s): silence before a node is suspected down.
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d;
        self
    }

    /// A [`FaultProxy`] in front of each node ([`Cluster::proxy`]), which the node
    /// announces as its address (`cluster-announce-ip`/`-port`; the bus stays direct,
    /// `cluster-announce-bus-port`): `CLUSTER SLOTS`/`SHARDS`/`NODES`, `MOVED` and `ASK`
    /// name the proxies, so a client seeded with [`Cluster::proxy_urls`] reaches every
    /// node through them, redirections and slot map refreshes included, and a test can
    /// delay or lose what it sends to any node. Set at start (Redis 6.2 takes no
    /// `cluster-announce-port` change at run time for its own view), so a restarted node
    /// announces its proxy again.
    pub fn through_proxies(mut self) -> Self {
        self.through_proxies = true;
        self
    }

    /// Starts the nodes and forms the cluster by hand (what `redis-cli --cluster
    /// create` does, minus its one-second sleeps): distinct config epochs, slot ranges,
    /// a MEET between every pair, then CLUSTER REPLICATE. Returns once every node says
    /// `cluster_state:ok` with all slots served, all nodes agree on the slot map and
    /// roles, and every replica is in sync.
    pub fn start(self) -> Cluster {
        let began = Instant::now();
        let total = self.primaries * (1 + self.replicas);
        let timeout = self.node_timeout;
        let proxied = self.through_proxies;
        let nodes = spawn_all(total, || ClusterNode::spawn(timeout, proxied));
        let mut cluster = Cluster {
            nodes,
            killed_slots: HashMap::new(),
            node_timeout: self.node_timeout,
            started_in: Duration::ZERO,
        };
        for node in &mut cluster.nodes {
            let mut con = node.connection();
            node.id = redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut con)
                .expect("CLUSTER MYID");
        }
        let run = |i: usize, cmd: &mut redis::Cmd| {
            let mut con = cluster.nodes[i].connection();
            cmd.exec(&mut con)
                .unwrap_or_else(|e| cluster.fail(&format!("node {i}: {cmd:?}: {e}")));
        };
        for i in 0..total {
            // Distinct epochs up front, as redis-cli does: no collision to resolve.
            run(i, redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1));
        }
        let per = usize::from(SLOTS) / self.primaries;
        for p in 0..self.primaries {
            let first = p * per;
            let last = if p + 1 == self.primaries {
                usize::from(SLOTS) - 1
            } else {
                first + per - 1
            };
            if super::super::server_kind().has_slot_ranges() {
                run(
                    p,
                    redis::cmd("CLUSTER")
                        .arg("ADDSLOTSRANGE")
                        .arg(first)
                        .arg(last),
                );
            } else {
                // Before Redis 7.0 there is no ADDSLOTSRANGE: every slot is named.
                run(
                    p,
                    redis::cmd("CLUSTER")
                        .arg("ADDSLOTS")
                        .arg((first..=last).collect::<Vec<_>>()),
                );
            }
        }
        for i in 0..total {
            for j in i + 1..total {
                let other = &cluster.nodes[j];
                run(
                    i,
                    redis::cmd("CLUSTER")
                        .arg("MEET")
                        .arg("127.0.0.1")
                        .arg(other.port())
                        .arg(other.bus_port),
                );
            }
        }
        let everyone = poll(READY_TIMEOUT, || {
            for i in 0..total {
                let view = cluster.view(i)?;
                let known = view
                    .iter()
                    .filter(|e| !e.has_flag("handshake") && !e.has_flag("noaddr"))
                    .count();
                if known != total {
                    return Err(format!("node {i} knows {known} of {total} nodes"));
                }
            }
            Ok(())
        });
        if let Err(why) = everyone {
            cluster.fail(&format!("nodes did not meet: {why}"));
        }
        for p in 0..self.primaries {
            for r in 0..self.replicas {
                let replica = self.primaries + p * self.replicas + r;
                let primary_id = cluster.nodes[p].id.clone();
                run(
                    replica,
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(primary_id),
                );
            }
        }
        cluster.wait_ok(READY_TIMEOUT);
        cluster.wait_replicas_synced(READY_TIMEOUT);
        cluster.started_in = began.elapsed();
        cluster
    }
}
