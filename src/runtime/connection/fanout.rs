//! One call to each of several clients at once: every command is written before
//! any reply is read, so N servers cost about one round trip, not N (`MultiLock`).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Cmd, FromRedisValue, Value};

use crate::runtime::connection::con::Con;
use crate::runtime::connection::executor::time_left as left;
use crate::runtime::connection::pool::{self, PoolConn, Pooled};
use crate::runtime::inner::Inner;
use crate::runtime::scripting::scripts::{self, Recovered, ScriptCall};
use crate::Error;

/// One call, to the client that must run it: a bundled script's, or a plain command.
pub(crate) struct Call<'a> {
    pub(crate) client: &'a Arc<Inner>,
    what: What,
}

enum What {
    Script(ScriptCall),
    Plain(Cmd),
}

impl<'a> Call<'a> {
    /// A call of a bundled script, sent as `client` sends scripts (`Scripting`).
    pub(crate) fn script(client: &'a Arc<Inner>, call: ScriptCall) -> Call<'a> {
        Call {
            client,
            what: What::Script(call),
        }
    }

    /// A plain command.
    pub(crate) fn plain(client: &'a Arc<Inner>, cmd: Cmd) -> Call<'a> {
        Call {
            client,
            what: What::Plain(cmd),
        }
    }

    /// The command, packed for its client.
    fn packed(&self) -> Vec<u8> {
        match &self.what {
            What::Script(call) => self
                .client
                .exec
                .scripting
                .command(call)
                .get_packed_command(),
            What::Plain(cmd) => cmd.get_packed_command(),
        }
    }

    fn script_call(&self) -> Option<&ScriptCall> {
        match &self.what {
            What::Script(call) => Some(call),
            What::Plain(_) => None,
        }
    }
}

/// How long a client whose server failed a call is skipped by the next acquisitions and
/// reads: they fail at once instead of waiting for it, and after this it is tried again.
/// Releases and queue-leaving are never skipped (see [`run_always`]).
const SKIP_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The calls of one client that share a connection, written together.
struct Lane {
    conn: Pooled,
    calls: Vec<usize>,
}

/// What became of one reply.
enum Outcome<T> {
    Done(Result<T, Error>),
    /// Refused before it ran (or perhaps not run at all): the client's ordinary path runs
    /// it again.
    Again,
}

/// Runs every call and returns the outcomes in the order of `calls`: for acquisitions and
/// reads, which skip a server that failed a call a moment ago (see `SKIP_AFTER_FAILURE`)
/// rather than wait for it again.
pub(crate) fn run<T: FromRedisValue + Send>(
    calls: &[Call<'_>],
    until: Instant,
) -> Vec<Result<T, Error>> {
    run_calls(calls, until, true)
}

/// As [`run`], but every call is sent, whatever its server did a moment ago: releases,
/// queue-leaving and force-unlocks, whose skipping would leave a level held (and no longer
/// renewed) until its lease ends although the server may well be back.
pub(crate) fn run_always<T: FromRedisValue + Send>(
    calls: &[Call<'_>],
    until: Instant,
) -> Vec<Result<T, Error>> {
    run_calls(calls, until, false)
}

/// No call waits past `until` for a connection or a reply, so a server that is down or
/// frozen costs the others nothing but that bound.
///
/// Calls to a client with an idle pooled connection are written to it at once, and the
/// replies read afterwards. The others (no idle connection: a cold pool, a server down; a
/// cluster; a connection that dropped; a script the server did not know) run through the
/// client's ordinary path, which reconnects and retries, each client's on a thread of its
/// own when there are several, so that they wait side by side. Several calls to one
/// server run as one `MULTI`/`EXEC` transaction: other callers' calls on the same locks
/// cannot interleave with them, so that of several callers sending the same calls at the
/// same moment one gets them all, instead of each some (a `MultiLock` of several locks on
/// one server would then have no winner). Every call sent here must be safe to repeat,
/// as the scripts told how many levels the caller holds are.
fn run_calls<T: FromRedisValue + Send>(
    calls: &[Call<'_>],
    until: Instant,
    skip_failed: bool,
) -> Vec<Result<T, Error>> {
    let mut results: Vec<Option<Result<T, Error>>> = calls.iter().map(|_| None).collect();
    let (lanes, mut rest) = sort_into_lanes(calls, skip_failed, &mut results);
    // Every command first, on every connection (one write each)...
    let sent = write_lanes(calls, lanes, until, &mut rest);
    // ... then every reply.
    read_lanes(sent, until, &mut results, &mut rest);
    run_jobs(calls, &jobs_of(calls, &rest), until, &mut results);
    conclude(calls, results)
}

/// Decides where each call goes: failed at once (its server failed a moment ago and
/// `skip_failed`), on a lane (its client had an idle connection: one lane per client), or
/// to the rest, for the client's ordinary path. Returns the lanes and the rest.
fn sort_into_lanes<T>(
    calls: &[Call<'_>],
    skip_failed: bool,
    results: &mut [Option<Result<T, Error>>],
) -> (Vec<Lane>, Vec<usize>) {
    let mut lanes: Vec<Lane> = Vec::new();
    let mut rest: Vec<usize> = Vec::new();
    let mut no_lane: Vec<*const Inner> = Vec::new();
    let now = Instant::now();
    for (i, call) in calls.iter().enumerate() {
        let client = Arc::as_ptr(call.client);
        if skip_failed {
            if let Some((until, why)) = &*call.client.exec.unreachable.lock() {
                if *until > now {
                    results[i] = Some(Err(skipped(why)));
                    continue;
                }
            }
        }
        if let Some(lane) = lanes
            .iter_mut()
            .find(|l| Arc::as_ptr(calls[l.calls[0]].client) == client)
        {
            lane.calls.push(i);
        } else if no_lane.contains(&client) {
            rest.push(i);
        } else if let Some(conn) = call.client.exec.idle_connection() {
            lanes.push(Lane {
                conn,
                calls: vec![i],
            });
        } else {
            no_lane.push(client);
            rest.push(i);
        }
    }
    (lanes, rest)
}

/// Writes each lane's command (its calls in a transaction when several) without reading
/// any reply; returns the lanes written, and puts the calls of a lane whose write failed
/// in `rest`.
fn write_lanes(
    calls: &[Call<'_>],
    lanes: Vec<Lane>,
    until: Instant,
    rest: &mut Vec<usize>,
) -> Vec<Lane> {
    let mut sent: Vec<Lane> = Vec::with_capacity(lanes.len());
    for mut lane in lanes {
        let conn: &mut PoolConn = &mut lane.conn;
        let packed = match lane.calls[..] {
            [i] => calls[i].packed(),
            _ => transaction(lane.calls.iter().map(|&i| &calls[i])),
        };
        let written = conn.set_timeout(left(until)).is_ok()
            && match conn
                .single()
                .expect("lanes are single-server connections")
                .send_packed_command(&packed)
            {
                Ok(()) => true,
                Err(e) => {
                    // Perhaps partly written, so not run (a transaction without its EXEC
                    // runs nothing): nothing more goes on this connection.
                    conn.failed(&e);
                    conn.mark_broken();
                    false
                }
            };
        if written {
            sent.push(lane);
        } else {
            rest.extend(&lane.calls);
        }
    }
    sent
}

/// Reads each written lane's replies and settles them: a lane whose calls were refused
/// before they ran (or whose connection failed before a reply) goes to `rest`, all its
/// calls together; a timeout fails all its calls (they may have run, all or none).
fn read_lanes<T: FromRedisValue>(
    sent: Vec<Lane>,
    until: Instant,
    results: &mut [Option<Result<T, Error>>],
    rest: &mut Vec<usize>,
) {
    for mut lane in sent {
        let conn: &mut PoolConn = &mut lane.conn;
        let n = lane.calls.len();
        let reply = conn.set_timeout(left(until)).and_then(|()| {
            let c = conn.single().expect("lanes are single-server connections");
            if n == 1 {
                c.recv_response().map(|value| vec![value])
            } else {
                recv_transaction(c, n)
            }
        });
        let values = match reply {
            Ok(values) => values,
            Err(e) => match settle::<T>(conn, Err(e)) {
                Outcome::Again => {
                    rest.extend(&lane.calls);
                    continue;
                }
                Outcome::Done(Ok(_)) => unreachable!("settled an error"),
                Outcome::Done(Err(e)) => {
                    // A timeout: the calls may have run (all of them or none).
                    for &i in &lane.calls {
                        results[i] = Some(Err(copy_error(&e)));
                    }
                    continue;
                }
            },
        };
        let outcomes: Vec<Outcome<T>> = values
            .into_iter()
            .map(|value| settle(conn, value.extract_error()))
            .collect();
        if outcomes.iter().any(|o| matches!(o, Outcome::Again)) {
            // Run again, all together: those that ran repeat harmlessly.
            rest.extend(&lane.calls);
            continue;
        }
        for (&i, outcome) in lane.calls.iter().zip(outcomes) {
            if let Outcome::Done(result) = outcome {
                results[i] = Some(result);
            }
        }
    }
}

/// Groups the calls left for the ordinary path: one job per client (one per call on a
/// cluster, whose keys are on different nodes and so cannot share a transaction).
fn jobs_of(calls: &[Call<'_>], rest: &[usize]) -> Vec<Vec<usize>> {
    let mut jobs: Vec<Vec<usize>> = Vec::new();
    for &i in rest {
        let client = calls[i].client;
        let shared = (!client.exec.is_cluster())
            .then(|| {
                jobs.iter_mut()
                    .find(|j| Arc::ptr_eq(calls[j[0]].client, client))
            })
            .flatten();
        match shared {
            Some(job) => job.push(i),
            None => jobs.push(vec![i]),
        }
    }
    jobs
}

/// Runs one job on its client's ordinary path (which reconnects and retries): one call
/// alone, several in one transaction; a failure of the transaction fails each call.
fn run_job<T: FromRedisValue>(
    calls: &[Call<'_>],
    job: &[usize],
    until: Instant,
) -> Vec<Result<T, Error>> {
    let client = calls[job[0]].client;
    if let [i] = job {
        let call = &calls[*i];
        return vec![client.exec.run_until(Some(until), |con| match &call.what {
            What::Script(script) => client.exec.eval(con, script),
            What::Plain(cmd) => cmd.query(con),
        })];
    }
    match client
        .exec
        .run_until(Some(until), |con| together(con, calls, job))
    {
        Ok(values) => values
            .into_iter()
            .map(|value| Ok(parse::<T>(value.extract_error()?)?))
            .collect(),
        Err(e) => {
            let mut errors: Vec<Result<T, Error>> =
                job[1..].iter().map(|_| Err(copy_error(&e))).collect();
            errors.insert(0, Err(e));
            errors
        }
    }
}

/// Runs the jobs, each client's on a thread of its own when there are several, so that
/// they wait side by side.
fn run_jobs<T: FromRedisValue + Send>(
    calls: &[Call<'_>],
    jobs: &[Vec<usize>],
    until: Instant,
    results: &mut [Option<Result<T, Error>>],
) {
    let job = |job: &[usize]| -> Vec<Result<T, Error>> { run_job(calls, job, until) };
    match jobs.len() {
        0 => {}
        1 => {
            for (&i, result) in jobs[0].iter().zip(job(&jobs[0])) {
                results[i] = Some(result);
            }
        }
        _ => thread::scope(|scope| {
            let running: Vec<_> = jobs
                .iter()
                .map(|j| (j, scope.spawn(move || job(j))))
                .collect();
            for (j, handle) in running {
                let outcomes = match handle.join() {
                    Ok(outcomes) => outcomes,
                    Err(panic) => std::panic::resume_unwind(panic),
                };
                for (&i, result) in j.iter().zip(outcomes) {
                    results[i] = Some(result);
                }
            }
        }),
    }
}

/// Names each failure's own server (and types a refusal with a way out), as the ordinary
/// path does: the lanes' replies are settled here, not by the executor. Then marks each
/// client whose server could not be reached as to be skipped for a while, and each that
/// answered as reachable.
fn conclude<T>(
    calls: &[Call<'_>],
    results: Vec<Option<Result<T, Error>>>,
) -> Vec<Result<T, Error>> {
    let results: Vec<Result<T, Error>> = results
        .into_iter()
        .zip(calls)
        .map(|(r, call)| {
            r.expect("every call has an outcome")
                .map_err(|e| call.client.exec.explain(e))
        })
        .collect();
    for (call, result) in calls.iter().zip(&results) {
        let mut unreachable = call.client.exec.unreachable.lock();
        match result {
            Ok(_) => *unreachable = None,
            Err(e) if is_unreachable(e) => {
                if unreachable.is_none() {
                    tracing::info!(
                        target: "redmutex",
                        error = %e,
                        "redmutex: a server failed; skipping it for a while"
                    );
                }
                *unreachable = Some((Instant::now() + SKIP_AFTER_FAILURE, e.to_string()));
            }
            Err(_) => {}
        }
    }
    results
}

/// What one reply read from a lane's connection means, retiring the connection when it
/// may be out of step with the server.
fn settle<T: FromRedisValue>(conn: &mut PoolConn, reply: redis::RedisResult<Value>) -> Outcome<T> {
    match reply {
        Ok(value) => Outcome::Done(parse(value).map_err(Error::from)),
        // Refused before it ran: the ordinary path loads the script or the library (or
        // sends the script with EVALSHA from then on), or waits for the deployment to
        // settle, or finds the new primary.
        Err(e) if scripts::is_setup_refusal(&e) || pool::is_settling(&e) => {
            // A settling deployment is a sign of its topology changing.
            conn.failed(&e);
            Outcome::Again
        }
        Err(e) if pool::is_readonly(&e) => {
            conn.failed(&e);
            Outcome::Again
        }
        // The server closed the connection (a restart, a killed client), or a signal
        // interrupted the read (the process was stopped and continued): the command may
        // not have run; the ordinary path runs it again on another.
        Err(e) if (e.is_connection_dropped() || pool::is_interrupted(&e)) && !e.is_timeout() => {
            conn.failed(&e);
            conn.mark_broken();
            Outcome::Again
        }
        Err(e) => {
            conn.failed(&e);
            if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() {
                conn.mark_broken();
                // The call may have run: a timeout, whatever the I/O failure was.
                return Outcome::Done(Err(clone_error(&e)));
            }
            Outcome::Done(Err(e.into()))
        }
    }
}

fn parse<T: FromRedisValue>(value: Value) -> redis::RedisResult<T> {
    Ok(redis::from_redis_value::<T>(value)?)
}

/// `calls` in one `MULTI`/`EXEC` transaction, packed for one write.
fn transaction<'a, 'b: 'a>(calls: impl Iterator<Item = &'a Call<'b>>) -> Vec<u8> {
    let mut packed = redis::cmd("MULTI").get_packed_command();
    for call in calls {
        packed.extend(call.packed());
    }
    packed.extend(redis::cmd("EXEC").get_packed_command());
    packed
}

/// Reads the replies to a `transaction` of `n` commands: the reply of each (a server's
/// refusal of one as a `Value::ServerError`), or the error that refused them all.
fn recv_transaction(c: &mut redis::Connection, n: usize) -> redis::RedisResult<Vec<Value>> {
    let multi = c.recv_response()?.extract_error();
    let mut queued = Vec::with_capacity(n);
    for _ in 0..n {
        queued.push(c.recv_response()?);
    }
    let exec = c.recv_response()?;
    if multi.is_err() {
        // No transaction was opened (hardly possible): each command ran on its own, and
        // its reply is its outcome; EXEC was refused.
        return Ok(queued);
    }
    match exec {
        Value::Array(values) if values.len() == n => Ok(values),
        exec => {
            // Refused as a whole (EXECABORT): nothing ran. The refusal of a command when
            // it was queued says why.
            let why = queued
                .into_iter()
                .find_map(|q| q.extract_error().err())
                .or_else(|| exec.extract_error().err());
            Err(why.unwrap_or_else(|| {
                redis::RedisError::from((redis::ErrorKind::Parse, "unexpected reply to EXEC"))
            }))
        }
    }
}

/// Runs the calls `job` of one client on one connection as one transaction, getting over
/// a refusal of its scripts (`Scripting::recover`: a script or the library the server
/// lacks, a server without functions) and running it again (the calls repeat
/// harmlessly). A refusal the client's retries wait out (settling, a demoted primary)
/// fails it all.
fn together(con: &mut Con, calls: &[Call<'_>], job: &[usize]) -> redis::RedisResult<Vec<Value>> {
    let client = calls[job[0]].client;
    let scripts: Vec<&ScriptCall> = job.iter().filter_map(|&i| calls[i].script_call()).collect();
    let mut recovered = Recovered::default();
    loop {
        let Con::Single(c) = &mut *con else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a transaction over a cluster's calls",
            )));
        };
        // Packed anew each round: a fall-back to EVALSHA changes the commands.
        c.send_packed_command(&transaction(job.iter().map(|&i| &calls[i])))?;
        let (values, refusals) = match recv_transaction(c, job.len()) {
            Ok(values) => {
                let refusals: Vec<redis::RedisError> = values
                    .iter()
                    .filter_map(|v| v.clone().extract_error().err())
                    .collect();
                (values, refusals)
            }
            // Refused as a whole: nothing ran (a command unknown to the server).
            Err(e) if scripts::is_setup_refusal(&e) => (Vec::new(), vec![e]),
            Err(e) => return Err(e),
        };
        let mut again = false;
        for e in refusals.iter().filter(|e| scripts::is_setup_refusal(e)) {
            if client
                .exec
                .scripting
                .recover(con, e, &scripts, &mut recovered)?
            {
                again = true;
                break;
            }
        }
        if again {
            continue;
        }
        if values.is_empty() {
            return Err(refusals.into_iter().next().expect("a refusal"));
        }
        if let Some(e) = refusals
            .into_iter()
            .find(|e| pool::is_settling(e) || pool::is_readonly(e))
        {
            return Err(e);
        }
        return Ok(values);
    }
}

/// Whether `e` says the server could not be reached or did not answer in time.
fn is_unreachable(e: &Error) -> bool {
    match e {
        Error::Pool { .. } | Error::Timeout { .. } => true,
        Error::Redis { source: e, .. } => {
            e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped()
        }
        _ => false,
    }
}

/// The failure of a call not sent because its server failed a moment ago. Nothing was
/// sent, so nothing can have happened.
fn skipped(why: &str) -> Error {
    Error::redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "not sent: the server failed a moment ago",
        why.to_owned(),
    )))
}

/// The failure of a connection, for each call whose reply it lost: the call may have run.
fn clone_error(e: &redis::RedisError) -> Error {
    Error::from(crate::error::timed_out(e.to_string()))
}

/// The same failure for another call of the same transaction: unreachable stays
/// unreachable (the call may have run), anything else is told as it was.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Timeout { source: r, .. } => clone_error(r),
        Error::Redis { source: r, .. } if r.is_io_error() || r.is_timeout() => clone_error(r),
        Error::Pool { source: p, .. } => clone_error(&crate::error::timed_out(p.to_string())),
        other => Error::redis(redis::RedisError::from((
            redis::ErrorKind::Client,
            "failed with the other calls of its transaction",
            other.to_string(),
        ))),
    }
}
