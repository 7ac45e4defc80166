//! Pooled command connections: r2d2 over redis, with timeouts and no PING per checkout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::ConnectionLike;

use crate::runtime::con::Con;
use crate::runtime::target::{Target, Topology};

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
    // The last refusal of a new connection's credentials, and when: r2d2 retries a failed
    // connect until the checkout times out and then reports only a timeout, so a checkout
    // looks here to report a wrong password at once, as what it is.
    pub(crate) refused: Arc<parking_lot::Mutex<Option<(Instant, redis::RedisError)>>>,
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
            .connect_commands(self.connect_timeout, self.command_timeout)
            .inspect_err(|e| {
                if crate::error::is_auth_failure(e) {
                    *self.refused.lock() = Some((Instant::now(), e.clone()));
                }
            })?;
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

/// `EINTR` on Linux, the BSDs and macOS (the unit test checks it is `Interrupted` here).
pub(crate) const EINTR: i32 = 4;

/// Whether `e` is a read (or write) interrupted by a signal before it completed: on Linux
/// a process stopped and continued (Ctrl-Z and `fg`, a debugger, a frozen container) gets
/// it from a socket read with a timeout even without a signal handler (signal(7)).
/// Nothing is wrong with the server or the network. redis-rs does not expose the I/O
/// error's kind, only its text, which is the `io::Error`'s own.
pub(crate) fn is_interrupted(e: &redis::RedisError) -> bool {
    if !e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return false;
    }
    let text = e.to_string();
    text == std::io::Error::from_raw_os_error(EINTR).to_string()
        || text == std::io::Error::from(std::io::ErrorKind::Interrupted).to_string()
}

/// Whether `e` says the node is a replica now: a failover demoted the primary this
/// connection was made to. The write was refused, so nothing of it happened.
pub(crate) fn is_readonly(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY") || e.detail().is_some_and(|d| d.contains("READONLY"))
}
