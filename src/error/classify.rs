//! How an error from Redis or the pool becomes an [`Error`]: what a server's reply means
//! (credentials, an ACL, a key of another type) and which server it came from.

use super::Error;

/// or redis-rs's own check of the `AUTH` reply), or none given to a server that needs one
/// (`NOAUTH`; a script too long for an unauthenticated client gets "Protocol error:
/// unauthenticated bulk length" instead).
pub(crate) fn is_auth_failure(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || e.detail().is_some_and(|d| {
            d.starts_with("NOAUTH") || d.contains("Protocol error: unauthenticated")
        })
}

/// Whether the server's ACL refused a command, key or channel (`NOPERM`; Redis 6.2 wraps
/// a script's in "Error running script"; a command a script runs, e.g. a release's
/// PUBLISH to a waiter's channel, is refused as "The user executing the script can't ...").
pub(crate) fn is_no_permission(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM")
        || e.detail().is_some_and(|d| {
            d.contains("NOPERM") || d.contains("The user executing the script can't")
        })
}

/// Whether a key held another type than the script expected (`WRONGTYPE`: Redis 7 gives a
/// script's its own code; Redis 6.2 wraps it in "Error running script ...").
fn is_wrong_type(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
        || e.detail().is_some_and(|d| {
            d.contains("WRONGTYPE Operation against a key holding the wrong kind of value")
        })
}

impl Error {
    /// This error with the server named (`server`, as `host:port`, and the client's
    /// `user`), and a refusal that has a way out of its own (credentials, ACL, a key of
    /// another type) made its own variant.
    pub(crate) fn at_server(
        self,
        server: impl FnOnce() -> String,
        user: impl FnOnce() -> Option<String>,
        password_given: bool,
    ) -> Error {
        let boxed = |s: String| s.into_boxed_str();
        match self {
            Error::Redis { source, lock, .. } if is_auth_failure(&source) => Error::Auth {
                user: user().map(boxed),
                password_given,
                server: boxed(server()),
                source,
                lock,
            },
            Error::Redis { source, lock, .. } if is_no_permission(&source) => Error::NoPermission {
                user: user().map(boxed),
                server: boxed(server()),
                source,
                lock,
            },
            Error::Redis { source, lock, .. } if is_wrong_type(&source) => Error::NotALock {
                server: boxed(server()),
                source,
                lock,
            },
            mut other => {
                if let Error::Redis { server: at, .. }
                | Error::Pool { server: at, .. }
                | Error::PoolExhausted { server: at, .. }
                | Error::Timeout { server: at, .. } = &mut other
                {
                    if at.is_none() {
                        *at = Some(boxed(server()));
                    }
                }
                other
            }
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
            Error::timeout(e)
        } else {
            Error::redis(e)
        }
    }
}

impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        Error::pool(e)
    }
}
