//! A running Redis Cluster ([`Cluster`]) and its nodes ([`ClusterNode`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::{Deref, DerefMut};
use std::panic;
use std::time::{Duration, Instant};

use super::super::{free_port, FaultProxy, RedisServer};
use super::{
    addr_of, key_slot, parse_cluster_nodes, parse_info, poll, poll_connection, replicas_in_sync,
    tail, ClusterBuilder, NodeEntry, SlotMigration, DATA_ARGS,
};

/// One cluster node: a [`RedisServer`] (through `Deref`: port, url, connection, kill,
/// freeze, thaw, restart, which keeps its `nodes.conf` and so its identity) with its
/// cluster id and bus port, and the proxy in front of it if the cluster has them.
#[derive(Debug)]
pub struct ClusterNode {
    pub(super) server: RedisServer,
    pub(super) id: String,
    pub(super) bus_port: u16,
    pub(super) proxy: Option<FaultProxy>,
}

impl ClusterNode {
    /// Starts a cluster-enabled server; the bus port is given explicitly
    /// (`cluster-port`, since port + 10000 may be taken or past 65535), and another is
    /// tried when a parallel test took it. A server without `cluster-port` (before Redis
    /// 7.0) has its bus on port + 10000, so both are picked together. With `proxied`, a
    /// [`FaultProxy`] is bound first and the node announces its port (see
    /// [`ClusterBuilder::through_proxies`]).
    pub(super) fn spawn(node_timeout: Duration, proxied: bool) -> ClusterNode {
        const ATTEMPTS: usize = 5;
        let timeout = node_timeout.as_millis().to_string();
        let own_bus = super::super::server_kind().has_cluster_port();
        let proxy = proxied.then(FaultProxy::reserve);
        let announced = proxy.as_ref().map(|p| p.port().to_string());
        for attempt in 1..=ATTEMPTS {
            let (port, bus_port) = if own_bus {
                (None, free_port())
            } else {
                let port = free_port_pair();
                (Some(port), port + 10_000)
            };
            let bus = bus_port.to_string();
            let port = port.map(|p| p.to_string());
            let mut args = DATA_ARGS.to_vec();
            args.extend([
                "--cluster-enabled",
                "yes",
                // Relative: inside the server's own directory, kept across restarts.
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                "--cluster-replica-validity-factor",
                "0",
                "--cluster-allow-replica-migration",
                "no",
            ]);
            match &port {
                Some(port) => args.extend(["--port", port]),
                None => args.extend(["--cluster-port", &bus]),
            }
            if let Some(announced) = &announced {
                args.extend([
                    "--cluster-announce-ip",
                    "127.0.0.1",
                    "--cluster-announce-port",
                    announced,
                    // Else derived from the announced port (before 7.0): the bus is direct.
                    "--cluster-announce-bus-port",
                    &bus,
                ]);
            }
            match panic::catch_unwind(|| RedisServer::with_args(&args)) {
                Ok(server) => {
                    if let Some(proxy) = &proxy {
                        proxy.forward_to(server.port());
                    }
                    return ClusterNode {
                        server,
                        id: String::new(),
                        bus_port,
                        proxy,
                    };
                }
                Err(e) if attempt == ATTEMPTS => panic::resume_unwind(e),
                Err(_) => {}
            }
        }
        unreachable!()
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn bus_port(&self) -> u16 {
        self.bus_port
    }

    pub fn addr(&self) -> SocketAddr {
        addr_of(&self.server)
    }

    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// The proxy in front of the node; panics unless the cluster was started
    /// [`through_proxies`](ClusterBuilder::through_proxies).
    pub fn proxy(&self) -> &FaultProxy {
        self.proxy
            .as_ref()
            .expect("a cluster started through_proxies() has proxies")
    }
}

impl Deref for ClusterNode {
    type Target = RedisServer;

    fn deref(&self) -> &RedisServer {
        &self.server
    }
}

impl DerefMut for ClusterNode {
    fn deref_mut(&mut self) -> &mut RedisServer {
        &mut self.server
    }
}

/// A Redis Cluster on loopback: nodes `0..primaries` start as the primaries (equal
/// slot ranges in order), then each primary's replicas in turn. Dropping it kills
/// every node.
pub struct Cluster {
    pub(super) nodes: Vec<ClusterNode>,
    /// Slot ranges of each primary killed by [`kill_primary`](Self::kill_primary).
    pub(super) killed_slots: HashMap<usize, Vec<(u16, u16)>>,
    pub(super) node_timeout: Duration,
    pub(super) started_in: Duration,
}

impl Cluster {
    /// `primaries` primaries with `replicas` replicas each, default timing.
    pub fn new(primaries: usize, replicas: usize) -> Cluster {
        Cluster::builder()
            .primaries(primaries)
            .replicas(replicas)
            .start()
    }

    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// How long [`ClusterBuilder::start`] took, until the cluster was ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &ClusterNode {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut ClusterNode {
        &mut self.nodes[i]
    }

    /// Addresses of the nodes not killed: a cluster client's seed list.
    pub fn seed_addrs(&self) -> Vec<SocketAddr> {
        self.running().map(|i| self.nodes[i].addr()).collect()
    }

    /// `redis://127.0.0.1:<port>/` of each node not killed.
    pub fn seed_urls(&self) -> Vec<String> {
        self.running().map(|i| self.nodes[i].url()).collect()
    }

    /// The URL of the proxy of each node not killed: the seeds of a client that reaches
    /// the cluster only through them ([`ClusterBuilder::through_proxies`]).
    pub fn proxy_urls(&self) -> Vec<String> {
        self.running()
            .map(|i| self.nodes[i].proxy().url())
            .collect()
    }

    /// The proxy of every node, in node order ([`ClusterBuilder::through_proxies`]).
    pub fn proxies(&self) -> Vec<&FaultProxy> {
        self.nodes.iter().map(ClusterNode::proxy).collect()
    }

    pub fn index_of_id(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The node listening on `port`, or whose proxy does (the port the cluster names
    /// it by when it has proxies).
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.port() == port || n.proxy.as_ref().is_some_and(|p| p.port() == port))
    }

    /// `CLUSTER NODES` as node `i` sees the cluster.
    pub fn view(&self, i: usize) -> Result<Vec<NodeEntry>, String> {
        let mut con = poll_connection(self.nodes[i].port())?;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut con)
            .map_err(|e| format!("CLUSTER NODES on node {i}: {e}"))?;
        Ok(parse_cluster_nodes(&text))
    }

    /// Node `i`'s own line of its view: its role as it knows it.
    fn own_entry(&self, i: usize) -> Result<NodeEntry, String> {
        self.view(i)?
            .into_iter()
            .find(|e| e.has_flag("myself"))
            .ok_or_else(|| format!("node {i} has no myself line"))
    }

    /// Running nodes that are primaries by their own account.
    pub fn primaries(&self) -> Vec<usize> {
        self.running()
            .filter(|&i| self.own_entry(i).is_ok_and(|e| e.is_primary()))
            .collect()
    }

    /// Running nodes that replicate `primary` by their own account.
    pub fn replicas_of(&self, primary: usize) -> Vec<usize> {
        let id = &self.nodes[primary].id;
        self.running()
            .filter(|&i| {
                self.own_entry(i)
                    .is_ok_and(|e| e.primary.as_deref() == Some(id.as_str()))
            })
            .collect()
    }

    /// The primary serving `slot`, as the first running node sees the cluster (during
    /// a migration: the node migrating it away, until [`SlotMigration::finish`]).
    pub fn node_for_slot(&self, slot: u16) -> usize {
        let first = self
            .running()
            .next()
            .unwrap_or_else(|| self.fail("every node was killed"));
        let view = self.view(first).unwrap_or_else(|e| self.fail(&e));
        view.iter()
            .find(|e| e.is_primary() && e.serves(slot))
            .and_then(|e| self.index_of_id(&e.id))
            .unwrap_or_else(|| self.fail(&format!("node {first} sees no owner of slot {slot}")))
    }

    /// The primary serving `key`'s slot.
    pub fn node_for_key(&self, key: impl AsRef<[u8]>) -> usize {
        self.node_for_slot(key_slot(key))
    }

    /// A connection to the primary serving `key`'s slot.
    pub fn connection_for_key(&self, key: impl AsRef<[u8]>) -> redis::Connection {
        self.nodes[self.node_for_key(key)].connection()
    }

    /// Starts moving `slot` from primary `from` to primary `to` (IMPORTING on `to`,
    /// then MIGRATING on `from`) and returns the migration half-way: `from` still
    /// serves the keys it has and answers ASK for the others, `to` serves them to
    /// clients that send ASKING. Move keys and finish through the returned handle.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) -> SlotMigration<'_> {
        assert_ne!(from, to, "a slot migrates between two nodes");
        let owner = self.node_for_slot(slot);
        assert_eq!(
            owner, from,
            "slot {slot} is served by node {owner}, not {from}"
        );
        self.setslot(to, slot, "IMPORTING", from);
        self.setslot(from, slot, "MIGRATING", to);
        SlotMigration {
            cluster: self,
            slot,
            from,
            to,
        }
    }

    /// Moves `slot` from `from` to `to` in one go (begin, every key, finish).
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        self.begin_migration(slot, from, to).finish();
    }

    fn setslot(&self, node: usize, slot: u16, state: &str, other: usize) {
        let mut con = self.nodes[node].connection();
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(&self.nodes[other].id)
            .exec(&mut con)
            .unwrap_or_else(|e| {
                self.fail(&format!("node {node}: CLUSTER SETSLOT {slot} {state}: {e}"))
            });
    }

    /// SIGKILLs node `i`, which must be a primary serving slots; follow with
    /// [`wait_for_failover`](Self::wait_for_failover). A replica is only promoted by the
    /// votes of a majority of all primaries, so that takes 3 primaries or more.
    pub fn kill_primary(&mut self, i: usize) {
        let own = self.own_entry(i).unwrap_or_else(|e| self.fail(&e));
        if !own.is_primary() || own.slots.is_empty() {
            self.fail(&format!("node {i} is not a primary serving slots: {own:?}"));
        }
        self.killed_slots.insert(i, own.slots);
        self.nodes[i].kill();
    }

    /// Waits until a replica of `failed` (killed or frozen) has taken over all its
    /// slots and the cluster is whole again without it (see [`wait_ok`](Self::wait_ok));
    /// returns the promoted node. Polled: the cluster announces nothing.
    pub fn wait_for_failover(&self, failed: usize, timeout: Duration) -> usize {
        let slots = match self.killed_slots.get(&failed) {
            Some(slots) => slots.clone(),
            None => {
                let first = self.running().find(|&i| i != failed).unwrap_or(failed);
                let view = self.view(first).unwrap_or_else(|e| self.fail(&e));
                view.into_iter()
                    .find(|e| e.id == self.nodes[failed].id)
                    .map(|e| e.slots)
                    .unwrap_or_default()
            }
        };
        if slots.is_empty() {
            self.fail(&format!("node {failed} served no slots to take over"));
        }
        let promoted = poll(timeout, || {
            let taker = self
                .running()
                .filter(|&i| i != failed)
                .find(|&i| {
                    self.own_entry(i).is_ok_and(|e| {
                        e.is_primary() && slots.iter().all(|&(a, b)| e.serves(a) && e.serves(b))
                    })
                })
                .ok_or_else(|| format!("no node has taken over {slots:?} yet"))?;
            self.health(&[failed])?;
            Ok(taker)
        });
        promoted.unwrap_or_else(|why| {
            self.fail(&format!(
                "no failover of node {failed} within {timeout:?}: {why}"
            ))
        })
    }

    /// Waits until every running node says `cluster_state:ok` with all 16384 slots
    /// served, knows every node, and all of them agree on roles and the slot map,
    /// whose owners are all running.
    pub fn wait_ok(&self, timeout: Duration) {
        if let Err(why) = poll(timeout, || self.health(&[])) {
            self.fail(&format!("cluster not ok within {timeout:?}: {why}"));
        }
    }

    /// Waits until every running replica (by its own account) has its link to its
    /// primary up, is `online` there, and has applied all of the primary's stream.
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        let check = || {
            let mut followers: BTreeMap<usize, Vec<u16>> = BTreeMap::new();
            for i in self.running() {
                let own = self.own_entry(i)?;
                if let Some(primary) = own.primary {
                    let p = self
                        .index_of_id(&primary)
                        .ok_or_else(|| format!("node {i} follows unknown {primary}"))?;
                    followers.entry(p).or_default().push(self.nodes[i].port());
                }
            }
            for (p, replicas) in followers {
                replicas_in_sync(self.nodes[p].port(), &replicas)?;
            }
            Ok(())
        };
        if let Err(why) = poll(timeout, check) {
            self.fail(&format!("replicas not in sync within {timeout:?}: {why}"));
        }
    }

    pub(super) fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_running())
    }

    /// Whether the cluster is whole as seen by every running node but `skip`.
    fn health(&self, skip: &[usize]) -> Result<(), String> {
        // (node, its view without the flags, which differ from node to node).
        let mut agreed: Option<(usize, Vec<NodeEntry>)> = None;
        for i in self.running().filter(|i| !skip.contains(i)) {
            let mut con = poll_connection(self.nodes[i].port())?;
            let text: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .map_err(|e| format!("CLUSTER INFO on node {i}: {e}"))?;
            let info = parse_info(&text);
            let field = |k: &str| info.get(k).map(String::as_str).unwrap_or("?");
            if field("cluster_state") != "ok"
                || field("cluster_slots_assigned") != "16384"
                || field("cluster_slots_ok") != "16384"
            {
                return Err(format!(
                    "node {i}: cluster_state:{} slots assigned {} ok {}",
                    field("cluster_state"),
                    field("cluster_slots_assigned"),
                    field("cluster_slots_ok")
                ));
            }
            let view = self.view(i)?;
            if view.len() != self.nodes.len() || view.iter().any(|e| e.has_flag("handshake")) {
                return Err(format!("node {i} does not know every node yet"));
            }
            let mut map: Vec<NodeEntry> = view
                .into_iter()
                .map(|e| NodeEntry {
                    flags: Vec::new(),
                    ..e
                })
                .collect();
            map.sort_by(|a, b| a.id.cmp(&b.id));
            match &agreed {
                None => agreed = Some((i, map)),
                Some((first, seen)) if *seen != map => {
                    return Err(format!("nodes {first} and {i} see different clusters"));
                }
                Some(_) => {}
            }
        }
        let (_, map) = agreed.ok_or("no running node")?;
        for entry in map.iter().filter(|e| !e.slots.is_empty()) {
            let owner = self
                .index_of_id(&entry.id)
                .ok_or_else(|| format!("unknown node {}", entry.id))?;
            if !self.nodes[owner].is_running() || skip.contains(&owner) {
                return Err(format!("node {owner} still serves {:?}", entry.slots));
            }
        }
        Ok(())
    }

    /// Panics with every running node's view and the tail of every log.
    pub(super) fn fail(&self, what: &str) -> ! {
        let mut report = format!("cluster: {what}\n");
        for (i, n) in self.nodes.iter().enumerate() {
            let view = if n.is_running() {
                let mut con = poll_connection(n.port()).ok();
                con.as_mut()
                    .and_then(|c| redis::cmd("CLUSTER").arg("NODES").query::<String>(c).ok())
                    .unwrap_or_else(|| "<no answer>".into())
            } else {
                "<killed>".into()
            };
            report.push_str(&format!(
                "--- node {i} (port {}, id {}) ---\n{view}\n{}\n",
                n.port(),
                n.id,
                tail(&n.log_contents(), 25)
            ));
        }
        panic!("{report}")
    }
}

/// A port P below the kernel's ephemeral range (so no outgoing connection takes it or
/// P + 10000 meanwhile) with P and P + 10000 both free a moment ago: a cluster node's
/// port and bus port on servers without `cluster-port`. Picked at random, so parallel
/// tests seldom try the same one; a lost race costs the caller one start attempt.
fn free_port_pair() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    use std::net::TcpListener;
    let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
    for i in 0u32..1_000 {
        let random = RandomState::new().hash_one((std::process::id(), i, Instant::now()));
        let port = 10_000 + (random % 12_000) as u16;
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port P with P + 10000 free between 10000 and 32000")
}
