//! One call to each of several clients at once: every command is written before
//! any reply is read, so N servers cost about one round trip, not N (`MultiLock`).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Cmd, FromRedisValue, Script};

use crate::runtime::client::{time_left as left, Inner};
use crate::runtime::pool::{self, Conn, Manager};
use crate::runtime::scripts;
use crate::Error;

/// One call, to the client that must run it: an `EVALSHA` of `script`, or a plain command.
pub(crate) struct Call<'a> {
    pub(crate) client: &'a Arc<Inner>,
    pub(crate) script: Option<&'a Script>,
    pub(crate) cmd: Cmd,
}

/// How long a client whose server failed a call is skipped by the next calls: they fail
/// at once instead of waiting for it, and after this it is tried again.
const SKIP_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The calls of one client that share a connection, written one after the other.
struct Lane {
    conn: r2d2::PooledConnection<Manager>,
    calls: Vec<usize>,
}

/// Runs every call and returns the outcomes in the order of `calls`. No call waits past
/// `until` for a connection or a reply, so a server that is down or frozen costs the
/// others nothing but that bound.
///
/// Calls to a client with an idle pooled connection are written to it at once, and the
/// replies read afterwards. The others (no idle connection: a cold pool, a server down; a
/// cluster; a connection that dropped; a script the server did not know) run through the
/// client's ordinary path, which reconnects and retries, each on a thread of its own when
/// there are several, so that they wait side by side. Every call sent here must be safe
/// to repeat, as the scripts told how many levels the caller holds are.
pub(crate) fn run<T: FromRedisValue + Send>(
    calls: &[Call<'_>],
    until: Instant,
) -> Vec<Result<T, Error>> {
    let mut results: Vec<Option<Result<T, Error>>> = calls.iter().map(|_| None).collect();
    let mut lanes: Vec<Lane> = Vec::new();
    let mut rest: Vec<usize> = Vec::new();
    let mut no_lane: Vec<*const Inner> = Vec::new();
    let now = Instant::now();
    for (i, call) in calls.iter().enumerate() {
        let client = Arc::as_ptr(call.client);
        if let Some((until, why)) = &*call.client.unreachable.lock() {
            if *until > now {
                results[i] = Some(Err(skipped(why)));
                continue;
            }
        }
        if let Some(lane) = lanes
            .iter_mut()
            .find(|l| Arc::as_ptr(calls[l.calls[0]].client) == client)
        {
            lane.calls.push(i);
        } else if no_lane.contains(&client) {
            rest.push(i);
        } else if let Some(conn) = call.client.idle_connection() {
            lanes.push(Lane {
                conn,
                calls: vec![i],
            });
        } else {
            no_lane.push(client);
            rest.push(i);
        }
    }
    // Every command first, on every connection...
    let mut sent: Vec<(Lane, usize)> = Vec::with_capacity(lanes.len());
    for mut lane in lanes {
        let conn: &mut Conn = &mut lane.conn;
        let mut written = 0;
        if conn.set_timeout(left(until)).is_ok() {
            for &i in &lane.calls {
                let c = conn.single().expect("lanes are single-server connections");
                match c.send_packed_command(&calls[i].cmd.get_packed_command()) {
                    Ok(()) => written += 1,
                    Err(e) => {
                        // Perhaps partly written: nothing more goes on this connection.
                        conn.failed(&e);
                        conn.mark_broken();
                        break;
                    }
                }
            }
        }
        rest.extend(&lane.calls[written..]);
        sent.push((lane, written));
    }
    // ... then every reply.
    for (mut lane, written) in sent {
        let conn: &mut Conn = &mut lane.conn;
        // The connection failed before these replies came: a timeout (the commands may
        // have run), or a close (they did not run; the ordinary path retries them).
        let mut broken: Option<redis::RedisError> = None;
        for &i in &lane.calls[..written] {
            if let Some(e) = &broken {
                if e.is_timeout() {
                    results[i] = Some(Err(clone_error(e)));
                } else {
                    rest.push(i);
                }
                continue;
            }
            let reply = conn
                .set_timeout(left(until))
                .and_then(|()| {
                    conn.single()
                        .expect("lanes are single-server connections")
                        .recv_response()
                })
                .and_then(|value| value.extract_error())
                .and_then(|value| Ok(redis::from_redis_value::<T>(value)?));
            match reply {
                Ok(value) => results[i] = Some(Ok(value)),
                // Refused before it ran: the ordinary path loads the script, or waits for
                // the deployment to settle, or finds the new primary.
                Err(e) if scripts::is_noscript(&e) || pool::is_settling(&e) => rest.push(i),
                Err(e) if pool::is_readonly(&e) => {
                    conn.failed(&e);
                    rest.push(i);
                }
                // The server closed the connection (a restart, a killed client): the
                // command may not have run; the ordinary path retries it on another.
                Err(e) if e.is_connection_dropped() && !e.is_timeout() => {
                    conn.failed(&e);
                    conn.mark_broken();
                    rest.push(i);
                    broken = Some(e);
                }
                Err(e) => {
                    conn.failed(&e);
                    if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() {
                        conn.mark_broken();
                        broken = Some(redis::RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            e.to_string(),
                        )));
                    }
                    results[i] = Some(Err(e.into()));
                }
            }
        }
    }
    let one = |i: usize| -> Result<T, Error> {
        let call = &calls[i];
        call.client.run_until(Some(until), |con| match call.script {
            Some(script) => scripts::eval(con, script, &call.cmd),
            None => call.cmd.query(con),
        })
    };
    match rest.len() {
        0 => {}
        1 => results[rest[0]] = Some(one(rest[0])),
        _ => thread::scope(|scope| {
            let running: Vec<_> = rest
                .iter()
                .map(|&i| (i, scope.spawn(move || one(i))))
                .collect();
            for (i, handle) in running {
                results[i] = Some(match handle.join() {
                    Ok(result) => result,
                    Err(panic) => std::panic::resume_unwind(panic),
                });
            }
        }),
    }
    let results: Vec<Result<T, Error>> = results
        .into_iter()
        .map(|r| r.expect("every call has an outcome"))
        .collect();
    for (call, result) in calls.iter().zip(&results) {
        let mut unreachable = call.client.unreachable.lock();
        match result {
            Ok(_) => *unreachable = None,
            Err(e) if is_unreachable(e) => {
                if unreachable.is_none() {
                    log::info!("redmutex: a server failed ({e}); skipping it for a while");
                }
                *unreachable = Some((Instant::now() + SKIP_AFTER_FAILURE, e.to_string()));
            }
            Err(_) => {}
        }
    }
    results
}

/// Whether `e` says the server could not be reached or did not answer in time.
fn is_unreachable(e: &Error) -> bool {
    match e {
        Error::Pool(_) | Error::Timeout(_) => true,
        Error::Redis(e) => {
            e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped()
        }
        _ => false,
    }
}

/// The failure of a call not sent because its server failed a moment ago. Nothing was
/// sent, so nothing can have happened.
fn skipped(why: &str) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "not sent: the server failed a moment ago",
        why.to_owned(),
    )))
}

/// The failure of a connection, for each call whose reply it lost: the call may have run.
fn clone_error(e: &redis::RedisError) -> Error {
    Error::from(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        e.to_string(),
    )))
}
