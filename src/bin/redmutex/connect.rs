//! Where Redis is (the connection options every command takes), and the client made of
//! them: reached once first, and recording who holds what.

use std::time::Duration;

use clap::Args;
use redmutex::{Client, Error};

use crate::parse::connect_timeout;

/// The heading of the options every command takes.
const CONNECTION: &str = "Connection options";

/// Where Redis is. Passwords in URLs are never printed; no value from the environment is
/// shown in the help.
#[derive(Args)]
#[command(next_help_heading = CONNECTION)]
pub(crate) struct Connection {
    /// The Redis server: redis://[user:password@]host[:port][/db], or rediss:// for TLS
    /// [default: redis://127.0.0.1:6379/].
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    url: Option<String>,
    /// The namespace of every key and channel: the same as the programs that share the
    /// locks use [default: redmutex:].
    #[arg(long, env = "REDMUTEX_PREFIX", hide_env_values = true, global = true)]
    prefix: Option<String>,
    /// Sentinels (comma-separated redis:// URLs) to find the primary of --service
    /// through; --url then only gives the credentials, db and TLS.
    #[arg(
        long,
        env = "REDIS_SENTINELS",
        hide_env_values = true,
        value_delimiter = ',',
        requires = "service",
        conflicts_with = "cluster",
        global = true
    )]
    sentinel: Vec<String>,
    /// The Sentinel service name (with --sentinel).
    #[arg(
        long,
        env = "REDIS_SENTINEL_SERVICE",
        hide_env_values = true,
        global = true
    )]
    service: Option<String>,
    /// Redis Cluster nodes (comma-separated redis:// URLs), instead of --url.
    #[arg(
        long,
        env = "REDIS_CLUSTER",
        hide_env_values = true,
        value_delimiter = ',',
        global = true
    )]
    cluster: Vec<String>,
    /// How long to wait for Redis to answer a connection before failing (a refused
    /// connection fails at once).
    #[arg(long, value_parser = connect_timeout, default_value = "5s", global = true)]
    connect_timeout: Duration,
}

impl Connection {
    fn url(&self) -> &str {
        self.url.as_deref().unwrap_or(DEFAULT_URL)
    }

    fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX)
    }
}

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";
const DEFAULT_PREFIX: &str = "redmutex:";

/// A client for `connection`, with `lease` as its watchdog timeout when given (then it
/// takes holds, and records [`metadata`] with each).
///
/// Redis is reached once first, outside the client: the client's pool treats a refused
/// connection as a server that may come back (a restart) and tries again until the
/// connect timeout, which suits a program that runs for days, not a command an operator
/// waits for.
pub(crate) fn connect(connection: &Connection, lease: Option<Duration>) -> Result<Client, Error> {
    let mut builder = Client::builder()
        .url(connection.url())
        .key_prefix(connection.prefix())
        .connect_timeout(connection.connect_timeout);
    if let Some(service) = &connection.service {
        builder = builder.sentinel(&connection.sentinel, service.as_str());
    }
    if !connection.cluster.is_empty() {
        builder = builder.cluster(&connection.cluster);
    }
    if let Some(lease) = lease {
        // A renewal must be able to give up well within the lease.
        builder = builder
            .watchdog_timeout(lease)
            .command_timeout((lease / 3).min(Duration::from_secs(3)));
    }
    if lease.is_some() {
        builder = builder.metadata(metadata());
    }
    let client = builder.build()?;
    probe(connection)?;
    tracing::trace!(
        "connected to {} (keys under {:?})",
        where_to(connection),
        connection.prefix()
    );
    Ok(client)
}

/// Connects to the first of the servers `connection` names that answers (the sentinels,
/// the cluster's nodes, or --url) and has it answer a PING, all within the connect
/// timeout; the last failure when none does.
fn probe(connection: &Connection) -> Result<(), Error> {
    let urls: Vec<&str> = if !connection.cluster.is_empty() {
        connection.cluster.iter().map(String::as_str).collect()
    } else if connection.service.is_some() {
        connection.sentinel.iter().map(String::as_str).collect()
    } else {
        vec![connection.url()]
    };
    let mut last = None;
    for url in urls {
        match ping(url, connection.connect_timeout) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some((url, e)),
        }
    }
    match last {
        None => Ok(()),
        // The library's errors are its own to make: this one travels as the connection
        // failure it is, and `fail` knows it by its text.
        Some((url, e)) => Err(Error::from(redis::RedisError::from(std::io::Error::other(
            format!(
                "{UNREACHABLE}{}",
                explain(url, &e, connection.connect_timeout)
            ),
        )))),
    }
}

/// What a failed probe of `url` means and what to do, in the library's words for the same
/// failures (`Error::Auth`, `Error::Timeout`, `Error::Pool`): the server as host:port,
/// never the password, and not an OS error's text that reads as a local fault.
fn explain(url: &str, e: &redis::RedisError, timeout: Duration) -> String {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info().ok();
    let server = info.as_ref().map_or_else(
        || redact(url),
        |i| match i.addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        },
    );
    let auth = e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || e.detail().is_some_and(|d| d.starts_with("NOAUTH"));
    if auth {
        let settings = info.as_ref().map(|i| i.redis_settings());
        let user = settings
            .and_then(|s| s.username())
            .unwrap_or("default")
            .to_owned();
        let what = if settings.is_some_and(|s| s.password().is_some()) {
            "check the user and password in the URL (redis://user:password@host:port/) \
             against the server's ACL users or requirepass"
        } else {
            "the server requires a password: give it in the URL (redis://:password@host:port/, \
             or redis://user:password@host:port/ for an ACL user)"
        };
        return format!("{server}: authentication failed for user {user}: {what}");
    }
    if e.is_timeout() {
        return format!(
            "{server}: it did not answer within the connect timeout ({}): it may be \
             overloaded, paused or cut off; --connect-timeout waits longer",
            humantime::format_duration(timeout)
        );
    }
    if e.is_connection_refusal() {
        return format!(
            "{server}: connection refused: check that the server is running and listens there"
        );
    }
    format!("{server}: {e}")
}

/// The servers `connection` names, passwords left out: for -vv.
fn where_to(connection: &Connection) -> String {
    let redacted = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
    if !connection.cluster.is_empty() {
        format!("the cluster of {}", redacted(&connection.cluster))
    } else if let Some(service) = &connection.service {
        format!(
            "{service:?} through the sentinels {}",
            redacted(&connection.sentinel)
        )
    } else {
        redact(connection.url())
    }
}

/// How an error of [`probe`] begins: [`fail`](crate::output::fail) knows it by this.
pub(crate) const UNREACHABLE: &str = "cannot reach redis at ";

fn ping(url: &str, timeout: Duration) -> redis::RedisResult<()> {
    use redis::IntoConnectionInfo;
    let started = std::time::Instant::now();
    let info = url.into_connection_info()?;
    // Without CLIENT SETINFO, whose replies redis-rs would wait for with the whole
    // timeout each.
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let info = info.set_redis_settings(settings);
    let mut con = redis::Client::open(info)?.get_connection_with_timeout(timeout)?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    con.set_read_timeout(Some(left))?;
    con.set_write_timeout(Some(left))?;
    redis::cmd("PING").query::<()>(&mut con)
}

/// `url` with its password (if any) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

/// The most the library records beside a hold.
const METADATA_MAX: usize = 1024;

/// The most of the host or the user a record keeps, in bytes: a field from the
/// environment may be any length, and the command line must keep room.
const FIELD_MAX: usize = 128;

/// What redmutex records beside each hold it takes, for `status` and `list` (and anyone's
/// `Client::inspect`): a JSON object with the host, the pid, the user and the command line
/// (its last arguments cut, and "…" added, to stay within the library's 1 KiB).
pub(crate) fn metadata() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    // Passwords in URLs (--url, --sentinel and --cluster lists) are not recorded.
    let cmd: Vec<String> = std::env::args_os()
        .map(|a| {
            let a = a.to_string_lossy();
            if a.contains("://") {
                a.split(',').map(redact).collect::<Vec<_>>().join(",")
            } else {
                a.into_owned()
            }
        })
        .collect();
    let user = std::env::var("USER").ok();
    record(host, user, cmd)
}

/// [`metadata`]'s JSON of these fields, within [`METADATA_MAX`] bytes: the host and the
/// user cut to [`FIELD_MAX`] bytes each, then the command line's last arguments replaced
/// by "…", then (escapes can make a short field long) the host and the user halved until
/// it fits. Every round makes something shorter, so it ends.
fn record(mut host: String, mut user: Option<String>, mut cmd: Vec<String>) -> String {
    host = cut(&host, FIELD_MAX);
    user = user.map(|u| cut(&u, FIELD_MAX));
    loop {
        let text = serde_json::json!({
            "host": host,
            "pid": std::process::id(),
            "user": user,
            "cmd": cmd,
        })
        .to_string();
        if text.len() <= METADATA_MAX {
            return text;
        }
        // Cut from the end: the program and the lock name come first.
        if cmd.last().is_some_and(|a| a == "…") {
            cmd.pop();
        }
        if cmd.pop().is_some() {
            cmd.push("…".to_owned());
            continue;
        }
        let longest = match &mut user {
            Some(user) if user.len() > host.len() => user,
            _ => &mut host,
        };
        if longest.is_empty() {
            // Nothing left to cut (not reached: the rest is a few dozen bytes).
            return text;
        }
        if longest.len() <= 16 {
            longest.clear();
        } else {
            let whole = longest.trim_end_matches('…');
            *longest = cut(whole, whole.len() / 2);
        }
    }
}

/// `s` if it is at most `max` bytes, else its longest start of at most `max` bytes that
/// ends between characters, and "…".
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_any_fields_fit_and_cut_between_characters() {
        let args = |n: usize| -> Vec<String> {
            ["redmutex", "run", "name"]
                .iter()
                .map(|s| s.to_string())
                .chain((0..n).map(|i| format!("arg{i}")))
                .collect()
        };
        for (host, user, cmd) in [
            ("h".to_owned(), Some("u".repeat(2100)), args(3)),
            ("h".to_owned(), Some("é".repeat(1500)), args(3)),
            ("h".to_owned(), Some("\u{1}".repeat(5000)), args(500)),
            ("\u{1}".repeat(5000), Some("\u{1}".repeat(5000)), args(0)),
            ("h".repeat(100_000), None, vec!["x".repeat(5000)]),
            ("h".to_owned(), Some(String::new()), args(1000)),
        ] {
            let text = record(host, user, cmd);
            assert!(text.len() <= METADATA_MAX, "{}", text.len());
            serde_json::from_str::<serde_json::Value>(&text).unwrap();
        }
        let text = record("h".into(), Some("é".repeat(1500)), args(1));
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["user"], format!("{}…", "é".repeat(FIELD_MAX / 2)));
        assert_eq!(doc["cmd"][2], "name");
        assert_eq!(cut("aé", 2), "a…");
        assert_eq!(cut("abc", 3), "abc");
    }
}
