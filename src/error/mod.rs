//! The one error type every fallible redmutex operation returns.

mod classify;
mod display;
#[cfg(test)]
mod tests;

pub(crate) use classify::{is_auth_failure, is_no_permission, timed_out};
use display::{printable, Why};

/// Everything that can go wrong talking to a lock.
///
/// "Not acquired" is not an error: `try_lock*` return `Ok(None)` for it.
///
/// ```no_run
/// # fn main() {
/// let client = redmutex::Client::open("redis://127.0.0.1/").unwrap();
/// match client.lock("jobs").lock() {
///     Ok(guard) => drop(guard),
///     Err(e @ redmutex::Error::Timeout { .. }) => eprintln!("Redis is slow: {e}"),
///     Err(e) => eprintln!("lock failed: {e}"),
/// }
/// # }
/// ```
///
/// An error from an operation on a named lock (acquiring, releasing, extending or asking
/// about it, a bad argument to it, a cancelled wait for it) says which lock: [`lock_name`](Error::lock_name) returns the name and the
/// message begins with it, e.g. `lock "orders:42": the lock's lease was lost before it was
/// released`. The variants that can carry the name have a `lock` field and are
/// `#[non_exhaustive]`: match them as `Error::LeaseLost { .. }`.
///
/// An error about the server says which one (`host:port`, never the password) and what to
/// do: [`Error::Pool`] (none reachable), [`Error::PoolExhausted`] (every pooled
/// connection in use until the call's deadline), [`Error::Timeout`] (no answer), [`Error::Auth`]
/// (credentials refused: reported at once, not retried), [`Error::NoPermission`] (an ACL
/// refusal), [`Error::NotALock`] (a key holding other data) and [`Error::InvalidUrl`]
/// (which part of a URL is wrong).
///
/// The variants a caller usually acts on:
///
/// ```no_run
/// use std::time::Duration;
/// use redmutex::{Error, LockOptions};
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// # let token = redmutex::CancellationToken::new();
/// let options = LockOptions::new().wait_for(Duration::from_secs(5)).cancellable(&token);
/// match client.lock("jobs").try_lock_with(options) {
///     Ok(Some(guard)) => guard.unlock()?,
///     Ok(None) => println!("busy: not acquired in 5 s"), // not an error
///     Err(Error::Cancelled { .. }) => println!("shutting down"),
///     Err(e @ Error::WrongKind { .. }) => eprintln!("the name is in use as another kind: {e}"),
///     Err(e @ (Error::Pool { .. } | Error::Timeout { .. })) => eprintln!("Redis is unwell: {e}"),
///     // Final: the same URL or ACL user cannot succeed later; the message says what to fix.
///     Err(e @ (Error::Auth { .. } | Error::NoPermission { .. })) => return Err(e),
///     Err(e @ Error::NotALock { .. }) => eprintln!("someone else's data: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error, or the connection failed.
    #[error("{}redis error{}: {source}", On(.lock), At(.server))]
    #[non_exhaustive]
    Redis {
        /// What redis-rs reported.
        source: redis::RedisError,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
        /// The server that answered or failed, as `host:port` (never with a password),
        /// when known.
        server: Option<Box<str>>,
    },
    /// No pooled connection could be made within the connect timeout (Redis down or
    /// unreachable). A pool whose connections are all in use is [`Error::PoolExhausted`].
    #[error(
        "{}no redis connection{} within the connect timeout: {source}; \
         check that the server is running and reachable there",
        On(.lock), At(.server)
    )]
    #[non_exhaustive]
    Pool {
        /// What the pool reported.
        source: r2d2::Error,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
        /// The server tried, as `host:port` (never with a password), when known.
        server: Option<Box<str>>,
    },
    /// Every connection of the client's pool stayed in use by its other calls for as long
    /// as this call could wait for one (until its deadline): the call did not run. Calls with
    /// no deadline wait for a connection as long as it takes, so only bounded calls get
    /// this. More threads call at once than the pool has connections for: raise
    /// [`ClientBuilder::pool_size`](crate::ClientBuilder::pool_size), or bound fewer calls
    /// at once. (A pool that cannot make a connection at all is [`Error::Pool`].)
    #[error(
        "{}the client's connection pool{} was exhausted: all {pool_size} of its connections \
         stayed in use by the client's other calls for {waited:.1?}, until this call's \
         deadline, so nothing was done; raise ClientBuilder::pool_size, or make fewer \
         calls at once",
        On(.lock), At(.server)
    )]
    #[non_exhaustive]
    PoolExhausted {
        /// The pool's size, [`ClientBuilder::pool_size`](crate::ClientBuilder::pool_size).
        pool_size: u32,
        /// How long the call waited for a connection.
        waited: std::time::Duration,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
        /// The server the pool connects to, as `host:port`, when known.
        server: Option<Box<str>>,
    },
    /// Redis did not answer within the command timeout. The operation may or may not have
    /// taken effect on the server; a lock taken that way expires with its lease.
    // A source that is an OS error (a read that timed out is "Resource temporarily
    // unavailable") is left to `source()`: printed, it reads as a local fault, not a
    // silent server. redmutex's own reasons (a reply lost too long ago...) are printed.
    #[error(
        "{}redis{} did not answer in time: it may be overloaded, paused or cut off \
         (the operation may or may not have taken effect; a lock taken so ends with its \
         lease){}",
        On(.lock), At(.server), Why(.source)
    )]
    #[non_exhaustive]
    Timeout {
        /// The timeout as redis-rs reported it.
        source: redis::RedisError,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
        /// The server that did not answer, as `host:port`, when known.
        server: Option<Box<str>>,
    },
    /// The server refused the client's credentials: a wrong user or password, or none given
    /// to a server that requires one. Final: retrying with the same URL cannot succeed.
    #[error(
        "{}authentication failed for user {} at {server}: {}",
        On(.lock), .user.as_deref().unwrap_or("default"),
        if *.password_given {
            "check the user and password in the URL (redis://user:password@host:port/) \
             against the server's ACL users or requirepass"
        } else {
            "the server requires a password: give it in the URL \
             (redis://:password@host:port/, or redis://user:password@host:port/ for an ACL user)"
        }
    )]
    #[non_exhaustive]
    Auth {
        /// The user the client authenticated as (`None`: the default user).
        user: Option<Box<str>>,
        /// Whether the client gave a password (none given: the server requires one).
        password_given: bool,
        /// The server, as `host:port` (never with a password).
        server: Box<str>,
        /// What Redis answered.
        source: redis::RedisError,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// The server's ACL does not let the client's user run a command or touch a key or
    /// channel redmutex needs. Nothing was changed by the refused command.
    #[error(
        "{}user {} at {server} lacks a permission redmutex needs ({source}): \
         give it the ACL rule in docs/redis-layout.md",
        On(.lock), .user.as_deref().unwrap_or("default")
    )]
    #[non_exhaustive]
    NoPermission {
        /// The user the client authenticated as (`None`: the default user).
        user: Option<Box<str>>,
        /// The server, as `host:port`.
        server: Box<str>,
        /// What Redis answered (it names the command, key or channel).
        source: redis::RedisError,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// A key the lock uses holds data of another type (written by something else than
    /// redmutex under its prefix): the operation was refused and changed nothing.
    #[error(
        "{}a key of this name at {server} holds data that is not a redmutex lock: \
         nothing was changed; use another lock name or key prefix, or remove that data"
        , On(.lock)
    )]
    #[non_exhaustive]
    NotALock {
        /// The server, as `host:port`.
        server: Box<str>,
        /// What Redis answered (`WRONGTYPE`).
        source: redis::RedisError,
        /// The lock the operation was on, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// A Redis URL given to the client could not be used: `part` says which part is wrong.
    #[error("bad redis url {url}: the {part} {reason}")]
    #[non_exhaustive]
    InvalidUrl {
        /// The URL, its password replaced by `***`.
        url: Box<str>,
        /// The part that is wrong: `"scheme"`, `"host"`, `"port"`, `"database"`,
        /// `"path"` (of a Unix socket) or `"password"`. A URL redis-rs refuses for no part
        /// that can be told is an [`Error::InvalidArgument`].
        part: &'static str,
        /// What is wrong with it and what it should be.
        reason: Box<str>,
    },
    /// The calling thread does not hold the lock it tried to release, and cannot tell
    /// whether it lost it: a release whose reply was lost found nothing when repeated (the
    /// first run may have released it). A hold the release finds gone otherwise (expired,
    /// `force_unlock`, lost by the server) is [`Error::LeaseLost`].
    #[error("{}the lock is not held by this thread", On(.lock))]
    #[non_exhaustive]
    NotHeld {
        /// The lock, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// The lock's lease was lost before it was released (the guard's `is_lease_lost` was
    /// true: the watchdog found it gone or could not renew it in time, a `force_unlock`
    /// freed it, or a fixed lease ran out), or the release itself found it gone on the
    /// server: another client may have held the lock since.
    #[error("{}the lock's lease was lost before it was released", On(.lock))]
    #[non_exhaustive]
    LeaseLost {
        /// The lock, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// Fewer replicas than [`sync_replicas`](crate::ClientBuilder::sync_replicas) asks for
    /// confirmed the write in time. After an acquisition the lock was given back (it is not
    /// held); after a release the lock is free on the primary, but a failover before the
    /// replicas catch up could bring it back until its lease ends.
    #[error("{}only {acked} of {required} replicas confirmed the write in time", On(.lock))]
    #[non_exhaustive]
    NotReplicated {
        /// Replicas that confirmed.
        acked: u32,
        /// Replicas required.
        required: u32,
        /// The lock, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// The calling thread holds only the read side of a
    /// [`ReadWriteLock`](crate::ReadWriteLock) and asked for its write side or its
    /// upgradeable side: it would wait for its own read hold forever (an upgrade waits
    /// for the readers). Nothing was written; release the read hold first, or take the
    /// upgradeable side instead of the read side where a write may follow (taking the read
    /// side while writing, a downgrade, is allowed).
    #[error(
        "{}this thread holds the read lock: taking the write or upgradeable lock would wait for itself forever",
        On(.lock)
    )]
    #[non_exhaustive]
    WouldDeadlock {
        /// The lock, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// An earlier call of this thread's hold on this side of a read-write lock timed out
    /// (an upgrade's cancel, an acquisition) while the hold's other side stays held: that
    /// call may still reach Redis, and would undo a hold of this side taken now under the
    /// same hold. Nothing was written. Release every side of the lock this thread holds,
    /// then take it again: a new hold is never touched by an earlier one's calls.
    #[error(
        "{}an earlier call of this thread's hold on the lock timed out and may still reach \
         redis: release the lock (every side this thread holds) and take it again",
        On(.lock)
    )]
    #[non_exhaustive]
    InDoubt {
        /// The lock, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// The name is in use as another kind of object: a name is one kind at a time, so a
    /// [`Lock`](crate::Lock) (plain, fair and fenced locks are one object), a
    /// [`ReadWriteLock`](crate::ReadWriteLock), a [`Semaphore`](crate::Semaphore) and a
    /// counting [`CountDownLatch`](crate::CountDownLatch) never hold one name side by
    /// side. The acquisition (or the latch's `try_set_count`) was refused atomically and
    /// wrote nothing; a waiter refused so has left the queue. The name is free for another
    /// kind once the kind in use has no holder left (the latch: once it opens or expires).
    #[error(
        "{}the name is in use as a {in_use}; it cannot be taken as another kind meanwhile",
        On(.lock)
    )]
    #[non_exhaustive]
    WrongKind {
        /// The kind that holds the name: `"lock"`, `"read-write lock"`, `"semaphore"` or
        /// `"count-down latch"`, as [`LockInfo::kind`](crate::LockInfo::kind) says.
        in_use: &'static str,
        /// The lock, printable (see [`Error::lock_name`]).
        lock: Option<Box<str>>,
    },
    /// The lock name is not usable: it is empty, or longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
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
    /// The wait was cancelled through its [`CancellationToken`](crate::CancellationToken) (before it
    /// began, or while it waited). The call holds nothing and has left the lock's queue:
    /// a hold handed to it as it was cancelled was given back and the lock handed on.
    #[error("{}the wait was cancelled", On(.lock))]
    #[non_exhaustive]
    Cancelled {
        /// The lock waited for, printable (see [`Error::lock_name`]); `None` for a
        /// [`MultiLock`](crate::MultiLock)'s wait, which is on several.
        lock: Option<Box<str>>,
    },
    /// A duration, a count or a configuration value is out of range (zero or overflowing
    /// durations, zero permits, bad prefixes, a URL at odds with the TLS settings; a URL
    /// with a wrong part is [`Error::InvalidUrl`]). Nothing was sent for a value refused
    /// before the call.
    #[error("{}invalid argument: {reason}", On(.lock))]
    #[non_exhaustive]
    InvalidArgument {
        /// What is wrong and what a valid value is, e.g. "a lease must be longer than zero".
        reason: String,
        /// The lock the call was on, printable (see [`Error::lock_name`]); `None` for a
        /// setting of the client or of a [`MultiLock`](crate::MultiLock).
        lock: Option<Box<str>>,
    },
}

impl Error {
    /// The name of the lock whose operation failed, for the errors that carry one (see
    /// the variants with a `lock` field); `None` for the others and for errors not tied
    /// to one lock (a [`MultiLock`](crate::MultiLock)'s quorum or cancelled wait, a bad
    /// client setting).
    ///
    /// The name is printable: valid UTF-8 without control characters comes back as it is;
    /// control characters, `"` and `\` are escaped as in Rust string literals, bytes that
    /// are not UTF-8 as `\xNN`, and a name longer than 256 bytes is cut there and ends
    /// with `…`.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if let Err(e) = client.lock("orders:42").force_unlock() {
    ///     // Some("orders:42") for a Redis error; None for one not tied to a lock.
    ///     eprintln!("failed on {:?}: {e}", e.lock_name());
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            Error::Redis { lock, .. }
            | Error::Pool { lock, .. }
            | Error::PoolExhausted { lock, .. }
            | Error::Timeout { lock, .. }
            | Error::NotHeld { lock }
            | Error::LeaseLost { lock }
            | Error::NotReplicated { lock, .. }
            | Error::WouldDeadlock { lock }
            | Error::InDoubt { lock }
            | Error::WrongKind { lock, .. }
            | Error::Auth { lock, .. }
            | Error::NoPermission { lock, .. }
            | Error::NotALock { lock, .. }
            | Error::Cancelled { lock }
            | Error::InvalidArgument { lock, .. } => lock.as_deref(),
            _ => None,
        }
    }

    /// This error, saying it happened on the lock `name` unless it names one already (the
    /// innermost operation knows best).
    pub(crate) fn on_lock(mut self, name: &[u8]) -> Error {
        match &mut self {
            Error::Redis { lock, .. }
            | Error::Pool { lock, .. }
            | Error::PoolExhausted { lock, .. }
            | Error::Timeout { lock, .. }
            | Error::NotHeld { lock }
            | Error::LeaseLost { lock }
            | Error::NotReplicated { lock, .. }
            | Error::WouldDeadlock { lock }
            | Error::InDoubt { lock }
            | Error::WrongKind { lock, .. }
            | Error::Auth { lock, .. }
            | Error::NoPermission { lock, .. }
            | Error::NotALock { lock, .. }
            | Error::Cancelled { lock }
            | Error::InvalidArgument { lock, .. }
                if lock.is_none() =>
            {
                *lock = Some(printable(name));
            }
            _ => {}
        }
        self
    }

    /// [`Error::Redis`] not (yet) tied to a lock.
    pub(crate) fn redis(source: redis::RedisError) -> Error {
        Error::Redis {
            source,
            lock: None,
            server: None,
        }
    }

    /// [`Error::Timeout`] not (yet) tied to a lock.
    pub(crate) fn timeout(source: redis::RedisError) -> Error {
        Error::Timeout {
            source,
            lock: None,
            server: None,
        }
    }

    /// [`Error::Pool`] not (yet) tied to a lock.
    pub(crate) fn pool(source: r2d2::Error) -> Error {
        Error::Pool {
            source,
            lock: None,
            server: None,
        }
    }

    /// [`Error::PoolExhausted`] not (yet) tied to a lock: all `pool_size` connections stayed
    /// in use for `waited`.
    pub(crate) fn pool_exhausted(pool_size: u32, waited: std::time::Duration) -> Error {
        Error::PoolExhausted {
            pool_size,
            waited,
            lock: None,
            server: None,
        }
    }

    /// [`Error::NotHeld`] not (yet) tied to a lock.
    pub(crate) const NOT_HELD: Error = Error::NotHeld { lock: None };

    /// [`Error::LeaseLost`] not (yet) tied to a lock.
    pub(crate) const LEASE_LOST: Error = Error::LeaseLost { lock: None };

    /// [`Error::WouldDeadlock`] not (yet) tied to a lock.
    pub(crate) const WOULD_DEADLOCK: Error = Error::WouldDeadlock { lock: None };
    /// [`Error::InDoubt`] not (yet) tied to a lock.
    pub(crate) const IN_DOUBT: Error = Error::InDoubt { lock: None };

    /// [`Error::Cancelled`] not (yet) tied to a lock.
    pub(crate) const CANCELLED: Error = Error::Cancelled { lock: None };

    /// [`Error::InvalidArgument`] not (yet) tied to a lock: `reason` says what is wrong
    /// and what a valid value is.
    pub(crate) fn invalid(reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            reason: reason.into(),
            lock: None,
        }
    }

    /// [`Error::WrongKind`] not (yet) tied to a lock: the name is held as `in_use`.
    pub(crate) fn wrong_kind(in_use: &'static str) -> Error {
        Error::WrongKind { in_use, lock: None }
    }

    /// Whether a command may have run on the server although its caller got this error:
    /// its reply timed out or its connection failed after it was sent.
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Redis { source: e, .. } => e.is_io_error() || e.is_connection_dropped(),
            _ => false,
        }
    }
}

/// Displays ` at <host:port>` after a word about the server, nothing for no server.
struct At<'a>(&'a Option<Box<str>>);

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0
            .as_deref()
            .map_or(Ok(()), |server| write!(f, " at {server}"))
    }
}

/// Displays `lock "<name>": ` before a message about that lock, nothing for no lock.
struct On<'a>(&'a Option<Box<str>>);

impl std::fmt::Display for On<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0
            .as_deref()
            .map_or(Ok(()), |name| write!(f, "lock \"{name}\": "))
    }
}
