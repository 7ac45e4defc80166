//! Where a client's connections go: one server, or the primary the sentinels name.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ConnectionAddr, ConnectionInfo, RedisResult};

use crate::runtime::connection::con::{Con, NodeAddr};
use crate::runtime::connection::node_con::NodeCon;

/// What a client's connection layer saw of the deployment changing under it: a connection
/// retired after an I/O failure or a timeout (the next one is a reconnect, perhaps to
/// another server behind the same address), the pub/sub connection lost and made anew,
/// a demoted primary's `READONLY`, and a cluster's or a failover's refusals (`MOVED`,
/// `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`). Each bumps the count; with
/// the Sentinel generation ([`Target::generation`]) it makes the client's topology epoch
/// (`Inner::topology_epoch`). A wait that began under an older epoch may have been queued
/// by one server and granted by another, whose clock the grant's time is from: such a
/// grant is confirmed with the server before it is returned (`Wait::take_handoff`).
#[derive(Debug, Default)]
pub(crate) struct Topology {
    changes: AtomicU64,
}

impl Topology {
    /// Records a sign of the deployment changing.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// How many signs were recorded so far.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }
}

/// The deployment a client talks to.
pub(crate) enum Target {
    /// One server at a fixed address.
    Server(redis::Client),
    /// The primary of a Sentinel-monitored service, found anew for every connection.
    Sentinel(Sentinel),
    /// A Redis Cluster: command connections route each script to its lock's slot.
    Cluster(Cluster),
}

/// A Redis Cluster, reached through any of its nodes.
pub(crate) struct Cluster {
    pub(crate) client: redis::cluster::ClusterClient,
    // The nodes given, for the classic pub/sub connection (classic PUBLISH reaches
    // subscribers on every node, so any node will do; a failed one passes the turn to
    // the next) and to ask for the slot map; their settings (credentials, TLS) are those
    // of the sharded pub/sub links to the primaries.
    nodes: Vec<ConnectionInfo>,
    next: AtomicUsize,
}

impl Cluster {
    pub(crate) fn new(
        client: redis::cluster::ClusterClient,
        nodes: Vec<ConnectionInfo>,
    ) -> Cluster {
        Cluster {
            client,
            nodes,
            next: AtomicUsize::new(0),
        }
    }

    fn connect(&self, connect: Duration) -> RedisResult<redis::Connection> {
        self.connect_by(connect, None)
    }

    /// A connection to the first node given that answers, each tried with `connect` at
    /// most; with `until`, none tried once it has passed, each given what is left of it,
    /// and without `CLIENT SETINFO`, whose two replies redis-rs would wait for with that
    /// timeout in full each: a node that accepts connections but answers nothing (frozen)
    /// costs what is left of `until` per node, never more.
    fn connect_by(
        &self,
        connect: Duration,
        until: Option<Instant>,
    ) -> RedisResult<redis::Connection> {
        let mut last = None;
        for _ in 0..self.nodes.len() {
            let i = self.next.load(Ordering::Relaxed) % self.nodes.len();
            let mut info = self.nodes[i].clone();
            let mut timeout = connect;
            if let Some(until) = until {
                let left = until.saturating_duration_since(Instant::now());
                if left < MIN_IO {
                    last = Some(deadline_passed());
                    break;
                }
                timeout = timeout.min(left);
                let settings = info.redis_settings().clone().set_skip_set_lib_name();
                info = info.set_redis_settings(settings);
            }
            match redis::Client::open(info).and_then(|c| c.get_connection_with_timeout(timeout)) {
                Ok(con) => return Ok(con),
                Err(e) => {
                    self.next.fetch_add(1, Ordering::Relaxed);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "no cluster node addresses"))
        }))
    }
}

/// The least time worth giving a connect or a read: a zero timeout means none to the
/// socket, and less than this would fail anyway.
const MIN_IO: Duration = Duration::from_millis(1);

/// The error of a call given up before it was made: the deadline it had to keep passed.
fn deadline_passed() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "the caller's deadline passed before a node answered",
    ))
}

/// How long a sentinel may take to connect and name the primary before the next one is
/// asked: a sentinel answers in a millisecond or two, and one that is frozen (or whose
/// host is cut off) would otherwise cost a whole connect timeout.
const ASK_FIRST: Duration = Duration::from_millis(300);

/// A service's primary as Redis Sentinel reports it.
///
/// Resolved here rather than with redis-rs's `SentinelClient`, whose sync connections to
/// the sentinels have no read timeout: one frozen sentinel would hang every connect.
pub(crate) struct Sentinel {
    // Tried in order; the one that answered moves to the front (the order the Sentinel
    // client guidelines recommend), so a dead sentinel costs one connect timeout once.
    sentinels: Mutex<Vec<ConnectionInfo>>,
    service: String,
    // Credentials, database and TLS settings for the primary; its address is replaced.
    node: ConnectionInfo,
    primary: Mutex<Option<ConnectionAddr>>,
    // Bumped whenever the primary named changes: connections made before are to a node
    // that may now be a replica (or gone) and are retired.
    generation: AtomicU64,
}

impl Target {
    /// A new connection with `connect` as the connect timeout and `io` for reads and
    /// writes, and the generation of the primary it reached (0 for a fixed server).
    pub(crate) fn connect(
        &self,
        connect: Duration,
        io: Duration,
    ) -> RedisResult<(redis::Connection, u64)> {
        let (con, generation) = match self {
            Target::Server(client) => (client.get_connection_with_timeout(connect)?, 0),
            Target::Sentinel(sentinel) => sentinel.connect(connect, io)?,
            Target::Cluster(cluster) => (cluster.connect(connect)?, 0),
        };
        con.set_read_timeout(Some(io))?;
        con.set_write_timeout(Some(io))?;
        Ok((con, generation))
    }

    /// A new command connection (see [`connect`](Target::connect)).
    pub(crate) fn connect_commands(
        &self,
        connect: Duration,
        io: Duration,
    ) -> RedisResult<(Con, u64)> {
        match self {
            Target::Cluster(cluster) => {
                // Node sockets that end a call at its first timeout (see `NodeCon`).
                let con = cluster.client.get_generic_connection::<NodeCon>()?;
                con.set_read_timeout(Some(io))?;
                con.set_write_timeout(Some(io))?;
                Ok((Con::Cluster(Box::new(con)), 0))
            }
            _ => {
                let (con, generation) = self.connect(connect, io)?;
                Ok((Con::Single(con), generation))
            }
        }
    }

    /// The generation of the primary last named: a connection of another generation is
    /// stale.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Target::Server(_) | Target::Cluster(_) => 0,
            Target::Sentinel(sentinel) => sentinel.generation.load(Ordering::Acquire),
        }
    }

    /// Asks the sentinels for the primary again, so that a failover that broke no
    /// connection of ours (the old primary is still up, demoted or cut off) is noticed.
    pub(crate) fn refresh(&self, timeout: Duration) {
        if let Target::Sentinel(sentinel) = self {
            if let Err(e) = sentinel.resolve(timeout) {
                tracing::debug!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: could not ask the sentinels for the primary"
                );
            }
        }
    }

    /// The server commands go to, for messages: `host:port` (a Sentinel service's primary
    /// as last named, a cluster's nodes), never with a password.
    pub(crate) fn server(&self) -> String {
        match self {
            Target::Server(client) => client.get_connection_info().addr().to_string(),
            Target::Sentinel(sentinel) => match &*sentinel.primary.lock() {
                Some(addr) => format!("{addr} (primary of {:?})", sentinel.service),
                None => format!("the primary of sentinel service {:?}", sentinel.service),
            },
            Target::Cluster(cluster) => cluster
                .nodes
                .iter()
                .map(|node| node.addr().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The user the client authenticates as (`None`: the default user).
    pub(crate) fn user(&self) -> Option<String> {
        let info = match self {
            Target::Server(client) => client.get_connection_info(),
            Target::Sentinel(sentinel) => &sentinel.node,
            Target::Cluster(cluster) => cluster.nodes.first()?,
        };
        info.redis_settings().username().map(str::to_owned)
    }

    /// Whether the client has a password to give.
    pub(crate) fn has_password(&self) -> bool {
        let info = match self {
            Target::Server(client) => client.get_connection_info(),
            Target::Sentinel(sentinel) => &sentinel.node,
            Target::Cluster(cluster) => match cluster.nodes.first() {
                Some(node) => node,
                None => return false,
            },
        };
        info.redis_settings().password().is_some()
    }

    /// The slot ranges each primary of a cluster serves, as a node given reports them
    /// (`CLUSTER SLOTS`); none for one server. With `until` (a waiter's deadline, when it
    /// is the one asking) the answer is given up for when it passes: the waiter then
    /// listens the classic way rather than wait longer than it may.
    pub(crate) fn cluster_slots(
        &self,
        connect: Duration,
        io: Duration,
        until: Option<Instant>,
    ) -> RedisResult<Vec<(u16, u16, NodeAddr)>> {
        let Target::Cluster(cluster) = self else {
            return Ok(Vec::new());
        };
        let con = &mut cluster.connect_by(connect, until)?;
        let io = match until {
            None => io,
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                if left < MIN_IO {
                    return Err(deadline_passed());
                }
                io.min(left)
            }
        };
        con.set_read_timeout(Some(io))?;
        con.set_write_timeout(Some(io))?;
        // Each range: [start, end, [host, port, id, ...], replicas...].
        let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER").arg("SLOTS").query(con)?;
        let mut owners = Vec::new();
        for range in ranges {
            let (Some(start), Some(end), Some(primary)) =
                (range.first(), range.get(1), range.get(2))
            else {
                continue;
            };
            let node: Vec<redis::Value> = redis::from_redis_value(primary.clone())?;
            if let (Some(host), Some(port)) = (node.first(), node.get(1)) {
                owners.push((
                    redis::from_redis_value(start.clone())?,
                    redis::from_redis_value(end.clone())?,
                    (
                        redis::from_redis_value(host.clone())?,
                        redis::from_redis_value(port.clone())?,
                    ),
                ));
            }
        }
        Ok(owners)
    }

    /// A RESP3 connection to the cluster node at `node`, with the settings of the nodes
    /// given: a sharded pub/sub link (under RESP3 every message and `sunsubscribe` of a
    /// shard channel reaches redis-rs's push channel).
    pub(crate) fn connect_node(
        &self,
        (host, port): &NodeAddr,
        connect: Duration,
        io: Duration,
    ) -> RedisResult<redis::Connection> {
        let seed = match self {
            Target::Cluster(cluster) => cluster.nodes.first(),
            _ => None,
        };
        let Some(seed) = seed else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "no cluster node addresses",
            )));
        };
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.clone(), *port),
        };
        let settings = seed
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let info = seed.clone().set_addr(addr).set_redis_settings(settings);
        let con = redis::Client::open(info)?.get_connection_with_timeout(connect)?;
        con.set_read_timeout(Some(io))?;
        con.set_write_timeout(Some(io))?;
        Ok(con)
    }

    pub(crate) fn is_sentinel(&self) -> bool {
        matches!(self, Target::Sentinel(_))
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }
}

impl Sentinel {
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        service: String,
        node: ConnectionInfo,
    ) -> Sentinel {
        Sentinel {
            sentinels: Mutex::new(sentinels),
            service,
            node,
            primary: Mutex::new(None),
            generation: AtomicU64::new(1),
        }
    }

    fn connect(&self, connect: Duration, io: Duration) -> RedisResult<(redis::Connection, u64)> {
        let (addr, generation) = self.resolve(connect.min(io))?;
        let info = self.node.clone().set_addr(addr);
        let mut con = redis::Client::open(info)?.get_connection_with_timeout(connect)?;
        con.set_read_timeout(Some(io))?;
        // The sentinels may still name a primary that was demoted (or is mid-promotion):
        // writing to a replica would fail anyway, so such a node is refused here.
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut con)?;
        match role.first() {
            Some(redis::Value::BulkString(r)) if r == b"master" => Ok((con, generation)),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the node the sentinels name is not (yet) a primary",
            ))),
        }
    }

    /// The primary's address as the first answering sentinel names it, and its generation.
    /// Each sentinel is given [`ASK_FIRST`] before the next is asked, so one frozen or
    /// unreachable sentinel costs that, not `timeout` (the pub/sub reader asks every few
    /// seconds, and reads no grant meanwhile); only when none answered so quickly are
    /// they asked again with `timeout` each.
    fn resolve(&self, timeout: Duration) -> RedisResult<(ConnectionAddr, u64)> {
        let quick = timeout.min(ASK_FIRST);
        match self.resolve_within(quick) {
            Err(e) if quick < timeout => {
                tracing::debug!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: no sentinel named the primary within {quick:?}"
                );
                self.resolve_within(timeout)
            }
            named => named,
        }
    }

    /// [`resolve`](Sentinel::resolve) with `timeout` for each sentinel.
    fn resolve_within(&self, timeout: Duration) -> RedisResult<(ConnectionAddr, u64)> {
        let sentinels = self.sentinels.lock().clone();
        let mut last = None;
        for (i, info) in sentinels.iter().enumerate() {
            match self.ask(info, timeout) {
                Ok(Some(addr)) => {
                    if i > 0 {
                        let mut order = self.sentinels.lock();
                        if let Some(at) = order.iter().position(|s| s.addr() == info.addr()) {
                            let first = order.remove(at);
                            order.insert(0, first);
                        }
                    }
                    return Ok((addr.clone(), self.saw(addr)));
                }
                Ok(None) => {
                    last = Some(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "the sentinel does not know the service",
                        self.service.clone(),
                    )))
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "no sentinel addresses"))
        }))
    }

    fn ask(
        &self,
        sentinel: &ConnectionInfo,
        timeout: Duration,
    ) -> RedisResult<Option<ConnectionAddr>> {
        // `timeout` is for the whole question. redis-rs waits for CLIENT SETINFO's two
        // replies when connecting, each with the timeout in full: a frozen sentinel cost
        // twice that before the question was even asked. A sentinel has no use for it.
        let started = Instant::now();
        let settings = sentinel.redis_settings().clone().set_skip_set_lib_name();
        let info = sentinel.clone().set_redis_settings(settings);
        let mut con = redis::Client::open(info)?.get_connection_with_timeout(timeout)?;
        let left = timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        con.set_read_timeout(Some(left))?;
        con.set_write_timeout(Some(left))?;
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.service)
            .query(&mut con)?;
        Ok(named.map(|(host, port)| match self.node.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        }))
    }

    /// Records the primary named now; returns its generation.
    fn saw(&self, addr: ConnectionAddr) -> u64 {
        let mut primary = self.primary.lock();
        if primary.as_ref().is_some_and(|p| *p != addr) {
            tracing::info!(
                target: "redmutex",
                primary = %addr,
                "redmutex: the sentinels name a new primary"
            );
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        *primary = Some(addr);
        self.generation.load(Ordering::Acquire)
    }
}
