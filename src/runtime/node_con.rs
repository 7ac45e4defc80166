//! A cluster node's socket, as the cluster connection uses it: a command that timed out is
//! not waited for again within the same call.

use std::time::Duration;

use redis::{Cmd, ConnectionLike, IntoConnectionInfo, RedisError, RedisResult, Value};

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
}

impl NodeCon {
    fn check(&self) -> RedisResult<()> {
        self.timed_out.clone().map_or(Ok(()), Err)
    }

    fn keep<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        match &result {
            Err(e) if e.is_timeout() => self.timed_out = Some(e.clone()),
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
        let con = <redis::Connection as redis::cluster::Connect>::connect(info, timeout)?;
        // redis-rs PINGs a new node connection before it sets the call's timeouts, and
        // `connect` leaves none: a node frozen after its handshake would hold the PING,
        // and the call, for ever.
        con.set_read_timeout(timeout)?;
        con.set_write_timeout(timeout)?;
        Ok(NodeCon {
            con,
            timed_out: None,
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
