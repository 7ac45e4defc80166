//! Pooled command connections: r2d2 over redis, with timeouts and no PING per checkout.

use std::sync::Arc;
use std::time::Duration;

use redis::ConnectionLike;

use crate::runtime::target::{Target, Topology};

/// A command connection: to one server, or to a cluster (a socket per node, following
/// `MOVED`/`ASK` redirections and slot-map changes by itself).
pub(crate) enum Con {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Con {
    fn set_timeouts(&self, timeout: Duration) -> redis::RedisResult<()> {
        match self {
            Con::Single(c) => {
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))
            }
            Con::Cluster(c) => {
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))
            }
        }
    }

    /// `WAIT replicas timeout_ms` on the node that owns `key`: the one that just ran this
    /// connection's write (a cluster would otherwise send `WAIT` to every primary).
    pub(crate) fn wait_replicas(
        &mut self,
        key: &[u8],
        replicas: u32,
        timeout_ms: u64,
    ) -> redis::RedisResult<u32> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout_ms);
        match self {
            Con::Single(c) => wait.query(c),
            Con::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::with_key(key, SlotAddr::Master);
                let value = c.route_command(
                    &wait,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

/// A cluster primary's address, as `CLUSTER SLOTS` names it.
pub(crate) type NodeAddr = (String, u16);

impl Con {
    /// The primaries of a cluster, each once (`[None]`, "this server", for one server).
    pub(crate) fn primaries(&mut self) -> redis::RedisResult<Vec<Option<NodeAddr>>> {
        let Con::Cluster(c) = self else {
            return Ok(vec![None]);
        };
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let slots = c.route_command(
            &redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )?;
        // Each range: [start, end, [host, port, id, ...], replicas...].
        let ranges: Vec<Vec<redis::Value>> = redis::from_redis_value(slots)?;
        let mut primaries: Vec<Option<NodeAddr>> = Vec::new();
        for range in ranges {
            let Some(primary) = range.get(2) else {
                continue;
            };
            let node: Vec<redis::Value> = redis::from_redis_value(primary.clone())?;
            if let (Some(host), Some(port)) = (node.first(), node.get(1)) {
                let addr = Some((
                    redis::from_redis_value::<String>(host.clone())?,
                    redis::from_redis_value::<u16>(port.clone())?,
                ));
                if !primaries.contains(&addr) {
                    primaries.push(addr);
                }
            }
        }
        Ok(primaries)
    }

    /// Runs `cmd` on the node at `node` (a cluster's), or where it would go by itself.
    pub(crate) fn query_on<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
        node: Option<&NodeAddr>,
    ) -> redis::RedisResult<T> {
        match (self, node) {
            (Con::Cluster(c), Some((host, port))) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let value = c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    }),
                )?;
                Ok(redis::from_redis_value(value)?)
            }
            (con, _) => cmd.query(con),
        }
    }
}

impl ConnectionLike for Con {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        match self {
            Con::Single(c) => c.req_packed_command(cmd),
            Con::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            Con::Single(c) => c.req_packed_commands(cmd, offset, count),
            Con::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            Con::Single(c) => c.req_command(cmd),
            Con::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Single(c) => c.get_db(),
            Con::Cluster(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Con::Single(c) => c.check_connection(),
            Con::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Con::Single(c) => c.is_open(),
            Con::Cluster(c) => c.is_open(),
        }
    }
}

/// A command connection that remembers when a failure left it unusable.
pub(crate) struct Conn {
    pub(crate) con: Con,
    // The read/write timeout now set on the socket: the command timeout, or less for a
    // call bounded by a deadline. Changed only when a call needs another (two syscalls).
    timeout: Duration,
    // A timed-out or failed reply may still be in flight; such a connection must never be
    // handed to another caller, whose reply would then be someone else's.
    broken: bool,
    // The primary it reached (see `Target::generation`).
    pub(crate) generation: u64,
    // Told when a failure here is a sign of the deployment changing.
    topology: Arc<Topology>,
}

pub(crate) struct Manager {
    pub(crate) target: Arc<Target>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    // The client's count of signs of the deployment changing (see `Topology`).
    pub(crate) topology: Arc<Topology>,
}

impl Manager {
    /// A new connection with the configured timeouts, for the subscriber (to any node of
    /// a cluster), and the generation of the primary it reached.
    pub(crate) fn connect(&self) -> redis::RedisResult<(redis::Connection, u64)> {
        self.target
            .connect(self.connect_timeout, self.command_timeout)
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<Conn, redis::RedisError> {
        let (con, generation) = self
            .target
            .connect_commands(self.connect_timeout, self.command_timeout)?;
        Ok(Conn {
            con,
            timeout: self.command_timeout,
            broken: false,
            generation,
            topology: self.topology.clone(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), redis::RedisError> {
        redis::cmd("PING").query::<()>(&mut conn.con)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || !conn.con.is_open() || conn.generation != self.target.generation()
    }
}

impl Conn {
    /// Retires the connection: the pool drops it when it comes back.
    pub(crate) fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Runs `f` on the connection with `timeout` for each read and write; any I/O failure
    /// or timeout retires the connection.
    pub(crate) fn run<T>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&mut Con) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.set_timeout(timeout)?;
        let result = f(&mut self.con);
        if let Err(e) = &result {
            self.failed(e);
        }
        result
    }

    /// Sets `timeout` for each read and write (when it is not set already).
    pub(crate) fn set_timeout(&mut self, timeout: Duration) -> redis::RedisResult<()> {
        if timeout != self.timeout {
            if let Err(e) = self.con.set_timeouts(timeout) {
                self.broken = true;
                self.topology.changed();
                return Err(e);
            }
            self.timeout = timeout;
        }
        Ok(())
    }

    /// Retires the connection if `e` may have left it out of step with the server; tells
    /// the client's [`Topology`] when that, or a refusal of a settling deployment, may
    /// mean the deployment changed.
    pub(crate) fn failed(&mut self, e: &redis::RedisError) {
        let retire =
            e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() || is_readonly(e);
        if retire {
            self.broken = true;
        }
        if retire || is_settling(e) {
            self.topology.changed();
        }
    }

    /// The connection to one server (`None` for a cluster's), to write commands to and
    /// read their replies separately.
    pub(crate) fn single(&mut self) -> Option<&mut redis::Connection> {
        match &mut self.con {
            Con::Single(c) => Some(c),
            Con::Cluster(_) => None,
        }
    }
}

/// Whether `e` is a refusal of a cluster (or a server) that is settling: a slot migrating
/// with the lock's keys split between two nodes (`TRYAGAIN`), slots unserved mid-failover
/// (`CLUSTERDOWN`), a replica not yet in sync (`MASTERDOWN`), a dataset loading
/// (`LOADING`), or redirections (`ASK`, `MOVED`) still bouncing when redis-rs's own
/// retries ran out. The command did not run; it may be sent again after a pause.
pub(crate) fn is_settling(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some("TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "LOADING" | "ASK" | "MOVED")
    ) || e.redirect_node().is_some()
}

/// Whether `e` says the node is a replica now: a failover demoted the primary this
/// connection was made to. The write was refused, so nothing of it happened.
pub(crate) fn is_readonly(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY") || e.detail().is_some_and(|d| d.contains("READONLY"))
}
