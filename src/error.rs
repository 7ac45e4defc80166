//! The one error type every fallible redmutex operation returns.

/// Everything that can go wrong talking to a lock.
///
/// "Not acquired" is not an error: `try_lock*` return `Ok(None)` for it.
///
/// ```no_run
/// # fn main() {
/// let client = redmutex::Client::open("redis://127.0.0.1/").unwrap();
/// match client.lock("jobs").lock() {
///     Ok(guard) => drop(guard),
///     Err(redmutex::Error::Timeout(e)) => eprintln!("Redis is slow: {e}"),
///     Err(e) => eprintln!("lock failed: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error, or the connection failed.
    #[error("redis error: {0}")]
    Redis(#[source] redis::RedisError),
    /// No pooled connection could be had within the connect timeout (Redis down or unreachable).
    #[error("no redis connection available: {0}")]
    Pool(#[source] r2d2::Error),
    /// Redis did not answer within the command timeout. The operation may or may not have
    /// taken effect on the server; a lock taken that way expires with its lease.
    #[error("redis did not answer in time: {0}")]
    Timeout(#[source] redis::RedisError),
    /// The calling thread does not hold the lock it tried to release: it never held it, its
    /// lease expired, or someone called `force_unlock`.
    #[error("the lock is not held by this thread")]
    NotHeld,
    /// The lock's lease was known lost before it was released (the guard's
    /// `is_lease_lost` was true: the watchdog found it gone or could not renew it in time,
    /// or a fixed lease ran out): another client may have held the lock since.
    #[error("the lock's lease was lost before it was released")]
    LeaseLost,
    /// Fewer replicas than [`sync_replicas`](crate::ClientBuilder::sync_replicas) asks for
    /// confirmed the write in time. After an acquisition the lock was given back (it is not
    /// held); after a release the lock is free on the primary, but a failover before the
    /// replicas catch up could bring it back until its lease ends.
    #[error("only {acked} of {required} replicas confirmed the write in time")]
    NotReplicated {
        /// Replicas that confirmed.
        acked: u32,
        /// Replicas required.
        required: u32,
    },
    /// The calling thread holds only the read side of a
    /// [`ReadWriteLock`](crate::ReadWriteLock) and asked for its write side or its
    /// upgradeable side: it would wait for its own read hold forever (an upgrade waits
    /// for the readers). Nothing was written; release the read hold first, or take the
    /// upgradeable side instead of the read side where a write may follow (taking the read
    /// side while writing, a downgrade, is allowed).
    #[error(
        "this thread holds the read lock: taking the write or upgradeable lock would wait for itself forever"
    )]
    WouldDeadlock,
    /// The lock name is not usable (it is empty).
    #[error("invalid lock name: {0}")]
    InvalidName(&'static str),
    /// The client was made in another process: this one is a `fork()` of it without `exec`.
    /// The child inherited the parent's client id and thread ids, so using the client here
    /// would re-enter and release the parent's locks as if they were its own. Build a new
    /// [`Client`](crate::Client) in the child instead.
    #[error("this client was created in process {created_in}; after fork() build a new Client in the child")]
    Forked {
        /// The process that created the client.
        created_in: u32,
    },
    /// A background thread (the watchdog or the pub/sub reader) could not be started, e.g.
    /// because the process is out of threads. Nothing was written.
    #[error("could not start a redmutex background thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A [`MultiLock`](crate::MultiLock) could not count on enough of its locks: more of
    /// their servers failed (down, unreachable, frozen, refusing) than its quorum allows.
    /// An acquisition that fails so holds nothing; a release that fails so could not
    /// confirm the lock free on a quorum, and what it could not free ends with its lease.
    #[error("only {reached} of {members} locks answered, {required} needed: {source}")]
    NoQuorum {
        /// The locks (servers) that answered.
        reached: usize,
        /// The locks of the `MultiLock`.
        members: usize,
        /// Its quorum.
        required: usize,
        /// The last failure of one of them.
        #[source]
        source: Box<Error>,
    },
    /// The wait was cancelled through its [`CancelToken`](crate::CancelToken) (before it
    /// began, or while it waited). The call holds nothing and has left the lock's queue:
    /// a hold handed to it as it was cancelled was given back and the lock handed on.
    #[error("the wait was cancelled")]
    Cancelled,
    /// A duration or a configuration value is out of range (zero or overflowing durations,
    /// unparsable URLs, bad prefixes).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// Whether a command may have run on the server although its caller got this error:
    /// its reply timed out or its connection failed after it was sent.
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            Error::Timeout(_) => true,
            Error::Redis(e) => e.is_io_error() || e.is_connection_dropped(),
            _ => false,
        }
    }
}

/// A redis-rs timeout error saying `what`: for a call this crate gave up on itself (its
/// outcome unknown, like a command that timed out), so that it reads and is handled as one.
pub(crate) fn timed_out(what: impl Into<String>) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        what.into(),
    ))
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            Error::Timeout(e)
        } else {
            Error::Redis(e)
        }
    }
}

impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        Error::Pool(e)
    }
}
