//! Probing the processes of a topology: signals, connections, `INFO`, polling, replication.

use std::collections::HashMap;
use std::panic;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use super::{POLL, POLL_IO_TIMEOUT};
use redis::IntoConnectionInfo;

/// kill(2) on a live child of ours; panics when it was already killed.
pub(super) fn signal(child: Option<&Child>, sig: libc::c_int, name: &str, what: &str) {
    let child = child.unwrap_or_else(|| panic!("{name}: the {what} was already killed"));
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits in pid_t");
    // SAFETY: plain kill(2) on our own, not yet reaped, child.
    if unsafe { libc::kill(pid, sig) } != 0 {
        panic!(
            "{name} to {what} {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Whether the process `pid` itself answers INFO on `port` (not another test's server
/// that won the port).
pub(super) fn answers_as(port: u16, pid: u32) -> bool {
    let Ok(mut con) = connect(port, Duration::from_millis(500)) else {
        return false;
    };
    match info(&mut con, "server") {
        Ok(info) => info.get("process_id").and_then(|v| v.parse().ok()) == Some(pid),
        Err(_) => false,
    }
}

/// A connection to a loopback port with `io_timeout` for connecting, reading and
/// writing; no `CLIENT SETINFO` (sentinels and old servers lack it).
pub(super) fn connect(port: u16, io_timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let info = format!("redis://127.0.0.1:{port}/").into_connection_info()?;
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let con = client.get_connection_with_timeout(io_timeout)?;
    con.set_read_timeout(Some(io_timeout))?;
    con.set_write_timeout(Some(io_timeout))?;
    Ok(con)
}

/// A polling connection: errors become the reason the poll goes on.
pub(super) fn poll_connection(port: u16) -> Result<redis::Connection, String> {
    connect(port, POLL_IO_TIMEOUT).map_err(|e| format!("connect to {port}: {e}"))
}

/// `INFO <section>` (or `CLUSTER INFO` text) as `field → value`.
pub(super) fn info(
    con: &mut redis::Connection,
    section: &str,
) -> redis::RedisResult<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(con)?;
    Ok(parse_info(&text))
}

pub(super) fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `ip=127.0.0.1,port=6380,state=online,...` (a `slaveN` line of `INFO replication`).
pub(super) fn parse_fields(value: &str) -> HashMap<&str, &str> {
    value
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// Re-runs `check` every [`POLL`] until it succeeds or `timeout` passes; the error is
/// the last reason it gave.
pub(super) fn poll<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() >= deadline => return Err(why),
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// The last `n` lines of `text`, for failure messages.
pub(super) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Replication as one data node reports it.
pub(super) struct Replication {
    pub(super) is_primary: bool,
    /// A replica's primary port (none for a primary).
    pub(super) primary_port: Option<u16>,
    pub(super) link_up: bool,
    /// `master_repl_offset` of a primary; how far a replica has applied its stream.
    pub(super) offset: i64,
    /// A primary's replicas: port → state (`online` once usable).
    pub(super) replicas: HashMap<u16, String>,
}

pub(super) fn replication(port: u16) -> Result<Replication, String> {
    let mut con = poll_connection(port)?;
    let info = info(&mut con, "replication").map_err(|e| format!("INFO on {port}: {e}"))?;
    let get = |k: &str| info.get(k).map(String::as_str);
    let is_primary = get("role") == Some("master");
    let offset_field = if is_primary {
        "master_repl_offset"
    } else {
        "slave_repl_offset"
    };
    let replicas = info
        .iter()
        .filter(|(k, _)| {
            k.strip_prefix("slave")
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|(_, v)| {
            let f = parse_fields(v);
            Some((f.get("port")?.parse().ok()?, f.get("state")?.to_string()))
        })
        .collect();
    Ok(Replication {
        is_primary,
        primary_port: get("master_port").and_then(|p| p.parse().ok()),
        link_up: get("master_link_status") == Some("up"),
        offset: get(offset_field).and_then(|o| o.parse().ok()).unwrap_or(0),
        replicas,
    })
}

/// Whether every port in `replicas` follows the primary on `primary`, is online there
/// and has applied everything the primary had when the check began.
pub(super) fn replicas_in_sync(primary: u16, replicas: &[u16]) -> Result<(), String> {
    let p = replication(primary)?;
    if !p.is_primary {
        return Err(format!("{primary} is not a primary"));
    }
    for &port in replicas {
        match p.replicas.get(&port).map(String::as_str) {
            Some("online") => {}
            state => return Err(format!("replica {port} is {state:?} on primary {primary}")),
        }
        let r = replication(port)?;
        if r.is_primary || r.primary_port != Some(primary) || !r.link_up {
            return Err(format!("{port} does not follow {primary} with its link up"));
        }
        if r.offset < p.offset {
            return Err(format!(
                "replica {port} at offset {} of {}",
                r.offset, p.offset
            ));
        }
    }
    Ok(())
}
