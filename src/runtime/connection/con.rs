//! The wire of a command connection, to one server or to a cluster, as the deployment's
//! target opens it; the pool keeps each in a `pool::PoolConn` (which adds the socket
//! timeout set and whether it is retired).

use std::time::Duration;

use redis::ConnectionLike;

use crate::runtime::connection::node_con::NodeCon;

/// A command connection: to one server, or to a cluster (a socket per node, following
/// `MOVED`/`ASK` redirections and slot-map changes by itself).
pub(crate) enum Con {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection<NodeCon>>),
}

impl Con {
    pub(crate) fn set_timeouts(&self, timeout: Duration) -> redis::RedisResult<()> {
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
        self.query_at(&wait, key)
    }

    /// Runs `cmd` on the primary that owns `key`'s slot (a cluster's), or on the server.
    /// For a command a cluster would send to every primary or to one picked at random: a
    /// random one may be a node that accepts connections but answers nothing (frozen),
    /// where redis-rs's reconnection inside the call waits out its connect timeout
    /// whatever the call's deadline; `key`'s owner is the node the caller's work is on.
    pub(crate) fn query_at<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
        key: &[u8],
    ) -> redis::RedisResult<T> {
        match self {
            Con::Single(c) => cmd.query(c),
            Con::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::with_key(key, SlotAddr::Master);
                let value = c.route_command(
                    cmd,
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
