//! Pooled command connections: r2d2 over redis, with timeouts and no PING per checkout.

use std::sync::Arc;
use std::time::Duration;

use redis::ConnectionLike;

use crate::runtime::target::Target;

/// A command connection that remembers when a failure left it unusable.
pub(crate) struct Conn {
    pub(crate) con: redis::Connection,
    // The read/write timeout now set on the socket: the command timeout, or less for a
    // call bounded by a deadline. Changed only when a call needs another (two syscalls).
    timeout: Duration,
    // A timed-out or failed reply may still be in flight; such a connection must never be
    // handed to another caller, whose reply would then be someone else's.
    broken: bool,
    // The primary it reached (see `Target::generation`).
    pub(crate) generation: u64,
}

pub(crate) struct Manager {
    pub(crate) target: Arc<Target>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

impl Manager {
    /// A new connection with the configured timeouts, for the pool and the subscriber, and
    /// the generation of the primary it reached.
    pub(crate) fn connect(&self) -> redis::RedisResult<(redis::Connection, u64)> {
        self.target
            .connect(self.connect_timeout, self.command_timeout)
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<Conn, redis::RedisError> {
        let (con, generation) = Manager::connect(self)?;
        Ok(Conn {
            con,
            timeout: self.command_timeout,
            broken: false,
            generation,
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
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        if timeout != self.timeout {
            let set = self
                .con
                .set_read_timeout(Some(timeout))
                .and_then(|()| self.con.set_write_timeout(Some(timeout)));
            if let Err(e) = set {
                self.broken = true;
                return Err(e);
            }
            self.timeout = timeout;
        }
        let result = f(&mut self.con);
        if let Err(e) = &result {
            if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() || is_readonly(e) {
                self.broken = true;
            }
        }
        result
    }
}

/// Whether `e` says the node is a replica now: a failover demoted the primary this
/// connection was made to. The write was refused, so nothing of it happened.
pub(crate) fn is_readonly(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY") || e.detail().is_some_and(|d| d.contains("READONLY"))
}
