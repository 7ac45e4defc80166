//! A cluster node's socket, as the cluster connection uses it: a command that timed out is
//! not waited for again within the same call, nor a silent node's handshake by every
//! new connection.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionLike, IntoConnectionInfo, RedisError, RedisResult, Value};

/// Nodes that timed out lately (a command's reply, or a new connection), by address: until
/// when a new connection to each is refused at once, and the timeout that expired, which
/// bounds the next try. A node that made a caller wait that long for nothing is not waited
/// for again before as much time has passed.
///
/// Why: a command connection that timed out is made anew (the pool retires it: its slot
/// map may be stale, the node failed over), and redis-rs connects to every node of the
/// cluster for it, one after another. Without this, a node that accepts connections but
/// answers nothing (frozen), or a host gone without a reset, would hold each new
/// connection for a whole connect timeout, and with it every lock of the healthy nodes.
/// The refusal is one redis-rs and the executor know: redis-rs drops the node from the
/// new connection's map, and a call for that node's slots waits it out as it does a node
/// that is down (`Executor::is_node_down`), within its deadline; the command reached no
/// server. One record for the process: a node silent for one client is silent for all.
static SILENT: parking_lot::Mutex<BTreeMap<String, (Instant, Duration)>> =
    parking_lot::Mutex::new(BTreeMap::new());

/// The least a quiet time lasts.
const QUIET: Duration = Duration::from_millis(100);

/// `addr` timed out after waiting `waited` (the connect timeout if none was set).
fn went_silent(addr: &str, waited: Option<Duration>) {
    let waited = waited.unwrap_or(QUIET).max(QUIET);
    SILENT
        .lock()
        .insert(addr.to_owned(), (Instant::now() + waited, waited));
}

/// The bound of a new connection to `addr` (`timeout`, or what the node was waited for
/// last if it timed out lately), or a refusal while its quiet time lasts.
fn connect_bound(addr: &str, timeout: Option<Duration>) -> RedisResult<Option<Duration>> {
    match SILENT.lock().get(addr) {
        None => Ok(timeout),
        Some((until, _)) if Instant::now() < *until => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("cluster node {addr} timed out lately; not tried again yet"),
        ))),
        Some((_, waited)) => Ok(Some(timeout.map_or(*waited, |t| t.min(*waited)))),
    }
}

/// One node's connection inside a [`ClusterConnection`](redis::cluster::ClusterConnection).
///
/// redis-rs's cluster connection sends a command that timed out again at once, up to its
/// `retries` (8), each time waiting a whole read timeout: a call to a node that accepts
/// connections but answers nothing (frozen) would last nine times its bound, past its
/// deadline. Here the first timeout is kept, and every command sent on the socket after
/// it fails with it at once: the call ends with one timeout, as on one server. The socket
/// is not open from then on (a late reply would stand where the next command's is
/// awaited), so the pool retires the whole cluster connection when the call gives it back
/// (`Manager::has_broken`), and redis-rs, within the call, makes a new socket where it
/// needs the node again.
pub(crate) struct NodeCon {
    con: redis::Connection,
    timed_out: Option<RedisError>,
    // "host:port", for `SILENT`.
    addr: String,
    // The read timeout set last: what a timed-out read waited.
    read_timeout: Cell<Option<Duration>>,
}

impl NodeCon {
    fn check(&self) -> RedisResult<()> {
        self.timed_out.clone().map_or(Ok(()), Err)
    }

    fn keep<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        match &result {
            Err(e) if e.is_timeout() => {
                if self.timed_out.is_none() {
                    went_silent(&self.addr, self.read_timeout.get());
                }
                self.timed_out = Some(e.clone());
            }
            _ => {}
        }
        result
    }
}

impl redis::cluster::Connect for NodeCon {
    fn connect<T>(info: T, timeout: Option<Duration>) -> RedisResult<Self>
    where
        T: IntoConnectionInfo,
    {
        let info = info.into_connection_info()?;
        let addr = info.addr().to_string();
        let timeout = connect_bound(&addr, timeout)?;
        let con = match <redis::Connection as redis::cluster::Connect>::connect(info, timeout) {
            Ok(con) => con,
            Err(e) => {
                if e.is_timeout() {
                    went_silent(&addr, timeout);
                }
                return Err(e);
            }
        };
        SILENT.lock().remove(&addr);
        // redis-rs PINGs a new node connection before it sets the call's timeouts, and
        // `connect` leaves none: a node frozen after its handshake would hold the PING,
        // and the call, for ever.
        con.set_read_timeout(timeout)?;
        con.set_write_timeout(timeout)?;
        Ok(NodeCon {
            con,
            timed_out: None,
            addr,
            read_timeout: Cell::new(timeout),
        })
    }

    fn send_packed_command(&mut self, cmd: &[u8]) -> RedisResult<()> {
        self.check()?;
        let sent = self.con.send_packed_command(cmd);
        self.keep(sent)
    }

    fn set_write_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.con.set_write_timeout(dur)
    }

    fn set_read_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.read_timeout.set(dur);
        self.con.set_read_timeout(dur)
    }

    fn recv_response(&mut self) -> RedisResult<Value> {
        self.check()?;
        let reply = self.con.recv_response();
        self.keep(reply)
    }
}

impl ConnectionLike for NodeCon {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.check()?;
        let reply = self.con.req_packed_command(cmd);
        self.keep(reply)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.check()?;
        let replies = self.con.req_packed_commands(cmd, offset, count);
        self.keep(replies)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.check()?;
        let reply = self.con.req_command(cmd);
        self.keep(reply)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }

    // A connection that timed out is not PINGed (a frozen node would hold the PING for a
    // whole read timeout more): redis-rs makes a new one where it needs the node.
    fn check_connection(&mut self) -> bool {
        self.timed_out.is_none() && self.con.check_connection()
    }

    fn is_open(&self) -> bool {
        self.timed_out.is_none() && self.con.is_open()
    }
}
