//! Multi-process Redis deployments for the tests: a primary with replicas watched by
//! sentinels ([`Sentinels`]) and a Redis Cluster ([`Cluster`]).
//!
//! Everything is built from the Debian `redis-server` binary (or `REDIS_SERVER_BIN`):
//! data nodes are ordinary [`RedisServer`]s (free loopback port, no persistence, own
//! temporary directory, SIGKILLed on drop), sentinels are `redis-server <conf>
//! --sentinel` processes owned the same way ([`Sentinel`]). Every topology picks its own
//! ports and, for Sentinel, its own service name, so any number of them can run at once
//! in one test binary.
//!
//! Waiting: a Sentinel failover is awaited on the sentinels' own `+switch-master`
//! events (a listener per sentinel, subscribed before the topology is handed out). What
//! Redis announces nowhere (replicas in sync, a cluster agreeing on its slots, a cluster
//! replica promoted) is polled every [`POLL`] against a deadline.
//!
//! Timing knobs, chosen so that a failover takes a few seconds (measured figures are
//! printed by `tests/topology.rs`):
//! - sentinels: `down-after-milliseconds` 1000 (2000 before Redis 7.0) and
//!   `failover-timeout` 3000 by default ([`SentinelsBuilder`]), and `SENTINEL DEBUG
//!   info-period 100 publish-period 200 ask-period 100` (Redis 7's test knobs: faster
//!   discovery of replicas and of the other sentinels, and faster agreement that the
//!   primary is down), and `ping-period` half of down-after, within 300–1000 ms. Why
//!   that: a sentinel reconnects a link at most once per ping period, so with the
//!   default 1 s it calls a just-promoted primary down for a moment after switching to
//!   it (its new link is not up within down-after); but it only promotes a replica it
//!   heard from within 5 ping periods, and during a failover it asks replicas for INFO
//!   only once a second (hard-coded), so a ping period much under 300 ms would leave it
//!   no replica good enough. Hence keep down-after at 600 ms or more.
//! - cluster: `cluster-node-timeout` 1000 ms by default ([`ClusterBuilder`]),
//!   `cluster-replica-validity-factor 0` (a replica may always take over),
//!   `cluster-allow-replica-migration no` (replicas stay where they were put).
//! - replication: `repl-diskless-sync-delay 0` (Redis 7 otherwise waits 5 s for more
//!   replicas before a full sync).
//!
//! A cluster may be reached through a [`FaultProxy`] per node
//! ([`ClusterBuilder::through_proxies`]): each node announces its proxy's port, so that
//! the slot map and the redirections a client is given name the proxies, and every
//! client connection goes through them (the harness's own connections and the bus do
//! not).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::{Deref, DerefMut};
use std::panic;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;

use super::{free_port, FaultProxy, RedisServer};

/// Pause between checks of state that no event announces.
pub const POLL: Duration = Duration::from_millis(10);
/// How long a topology may take to form before the test fails (it takes 0.5–3 s).
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// I/O timeouts of the connections the harness polls with, so a frozen node costs a
/// poll this long instead of hanging it.
const POLL_IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// Arguments of every data node.
const DATA_ARGS: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// The address of a server the harness started (always loopback).
pub fn addr_of(server: &RedisServer) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()))
}

/// `<prefix>-<pid>-<n>`, unique among every topology of every test process running.
fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

// ------------------------------------------------------------------------------------
// Sentinel processes
// ------------------------------------------------------------------------------------

/// A `redis-server <conf> --sentinel` child process owned by one topology.
///
/// Dropping it SIGKILLs and reaps the process and then removes its directory (config
/// file, which the sentinel rewrites as it learns, and log).
#[derive(Debug)]
pub struct Sentinel {
    /// `None` once killed, so a reaped pid is never signalled.
    child: Option<Child>,
    pid: u32,
    port: u16,
    /// Declared last: removed after the process is dead.
    dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a sentinel whose config is the harness's lines plus `body` (the
    /// `sentinel monitor ...` lines); retries on another port when a parallel test took
    /// the one probed free.
    fn spawn(body: &str) -> Sentinel {
        let dir = super::temp_dir("sentinel");
        let mut sentinel = Sentinel {
            child: None,
            pid: 0,
            port: 0,
            dir,
        };
        let mut failures = Vec::new();
        for attempt in 1..=super::START_ATTEMPTS {
            sentinel.port = free_port();
            match sentinel.launch(body) {
                Ok(child) => {
                    sentinel.pid = child.id();
                    sentinel.child = Some(child);
                    return sentinel;
                }
                Err((retryable, reason)) => {
                    failures.push(format!(
                        "attempt {attempt} (port {}): {reason}",
                        sentinel.port
                    ));
                    if !retryable {
                        break;
                    }
                }
            }
        }
        panic!(
            "sentinel could not start:\n  {}\n--- log ---\n{}",
            failures.join("\n  "),
            sentinel.log_contents()
        )
    }

    /// One start attempt on `self.port`: `Err((retryable, why))` when it failed.
    fn launch(&self, body: &str) -> Result<Child, (bool, String)> {
        let conf = self.dir.path().join("sentinel.conf");
        let log = self.log_path();
        fs::write(
            &conf,
            format!(
                "port {}\nbind 127.0.0.1\ndaemonize no\nprotected-mode no\n\
                 dir \"{}\"\nlogfile \"{}\"\n{body}",
                self.port,
                self.dir.path().display(),
                log.display()
            ),
        )
        .expect("write sentinel.conf");
        let log_start = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let mut child = super::spawn_server(
            Command::new(super::server_binary())
                .arg(&conf)
                .arg("--sentinel"),
            &self.dir.path().join("stderr.log"),
        );
        let deadline = Instant::now() + super::STARTUP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let tail = super::read_from(&log, log_start);
                    return Err((
                        tail.contains("Address already in use"),
                        format!("exited early with {status}"),
                    ));
                }
                Ok(None) => {}
                Err(e) => panic!("try_wait on sentinel: {e}"),
            }
            if answers_as(self.port, child.id()) {
                return Ok(child);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err((
                    true,
                    format!("no answer within {:?}", super::STARTUP_TIMEOUT),
                ));
            }
            thread::sleep(super::PROBE_INTERVAL);
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>/`: what a sentinel client is given per sentinel.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has not been killed through this handle.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A fresh connection with 5 s I/O timeouts; panics (with the log) on failure.
    pub fn connection(&self) -> redis::Connection {
        connect(self.port, super::ADMIN_IO_TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "connection to sentinel {}: {e}\n--- log ---\n{}",
                self.port,
                self.log_contents()
            )
        })
    }

    /// SIGKILLs and reaps the sentinel; a no-op when already killed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOPs the sentinel. Beware: a sentinel whose timer is late by more than 2 s
    /// enters TILT mode and does nothing for 30 s after it is thawed.
    pub fn freeze(&self) {
        signal(self.child.as_ref(), libc::SIGSTOP, "SIGSTOP", "sentinel");
    }

    pub fn thaw(&self) {
        signal(self.child.as_ref(), libc::SIGCONT, "SIGCONT", "sentinel");
    }

    /// The sentinel's log, and its stderr when it wrote any.
    pub fn log_contents(&self) -> String {
        let mut text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let stderr = fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        if !stderr.trim().is_empty() {
            text.push_str("\n--- stderr ---\n");
            text.push_str(&stderr);
        }
        text
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("sentinel.log")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
    }
}

/// kill(2) on a live child of ours; panics when it was already killed.
fn signal(child: Option<&Child>, sig: libc::c_int, name: &str, what: &str) {
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
fn answers_as(port: u16, pid: u32) -> bool {
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
fn connect(port: u16, io_timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let info = format!("redis://127.0.0.1:{port}/").into_connection_info()?;
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let con = client.get_connection_with_timeout(io_timeout)?;
    con.set_read_timeout(Some(io_timeout))?;
    con.set_write_timeout(Some(io_timeout))?;
    Ok(con)
}

/// A polling connection: errors become the reason the poll goes on.
fn poll_connection(port: u16) -> Result<redis::Connection, String> {
    connect(port, POLL_IO_TIMEOUT).map_err(|e| format!("connect to {port}: {e}"))
}

/// `INFO <section>` (or `CLUSTER INFO` text) as `field → value`.
fn info(con: &mut redis::Connection, section: &str) -> redis::RedisResult<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(con)?;
    Ok(parse_info(&text))
}

fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `ip=127.0.0.1,port=6380,state=online,...` (a `slaveN` line of `INFO replication`).
fn parse_fields(value: &str) -> HashMap<&str, &str> {
    value
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// Re-runs `check` every [`POLL`] until it succeeds or `timeout` passes; the error is
/// the last reason it gave.
fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
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
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Replication as one data node reports it.
struct Replication {
    is_primary: bool,
    /// A replica's primary port (none for a primary).
    primary_port: Option<u16>,
    link_up: bool,
    /// `master_repl_offset` of a primary; how far a replica has applied its stream.
    offset: i64,
    /// A primary's replicas: port → state (`online` once usable).
    replicas: HashMap<u16, String>,
}

fn replication(port: u16) -> Result<Replication, String> {
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
fn replicas_in_sync(primary: u16, replicas: &[u16]) -> Result<(), String> {
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

// ------------------------------------------------------------------------------------
// Sentinel topology
// ------------------------------------------------------------------------------------

/// One message a sentinel published about its service (`+sdown`, `+odown`,
/// `+try-failover`, `+elected-leader`, `+promoted-slave`, `+switch-master`, ...).
#[derive(Debug, Clone)]
pub struct SentinelEvent {
    /// When the harness received it.
    pub at: Instant,
    /// Which sentinel ([`Sentinels::sentinels`] index) published it.
    pub sentinel: usize,
    /// The event's name, e.g. `+switch-master`.
    pub channel: String,
    /// e.g. `<service> <old ip> <old port> <new ip> <new port>` for `+switch-master`.
    pub payload: String,
}

impl SentinelEvent {
    /// `(service, old primary, new primary)` of a `+switch-master` event.
    pub fn switch_master(&self) -> Option<(&str, SocketAddr, SocketAddr)> {
        if self.channel != "+switch-master" {
            return None;
        }
        let f: Vec<&str> = self.payload.split(' ').collect();
        let [name, old_ip, old_port, new_ip, new_port] = f[..] else {
            return None;
        };
        Some((
            name,
            format!("{old_ip}:{old_port}").parse().ok()?,
            format!("{new_ip}:{new_port}").parse().ok()?,
        ))
    }
}

/// Every event of every sentinel of one topology, in arrival order.
#[derive(Default)]
struct EventLog {
    events: Mutex<Vec<SentinelEvent>>,
    changed: Condvar,
}

impl EventLog {
    fn push(&self, event: SentinelEvent) {
        self.events.lock().unwrap().push(event);
        self.changed.notify_all();
    }

    /// Waits (on the events, no polling) until `found` returns something or `deadline`.
    fn wait_for<T>(
        &self,
        deadline: Instant,
        mut found: impl FnMut(&[SentinelEvent]) -> Option<T>,
    ) -> Option<T> {
        let mut events = self.events.lock().unwrap();
        loop {
            if let Some(value) = found(&events) {
                return Some(value);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            events = self.changed.wait_timeout(events, deadline - now).unwrap().0;
        }
    }

    /// Waits until there are more than `seen` events or `deadline`; returns how many
    /// there are.
    fn wait_past(&self, seen: usize, deadline: Instant) -> usize {
        self.wait_for(deadline, |events| {
            (events.len() > seen).then_some(events.len())
        })
        .unwrap_or_else(|| self.events.lock().unwrap().len())
    }
}

/// Shape and timing of a [`Sentinels`] topology.
#[derive(Debug, Clone)]
pub struct SentinelsBuilder {
    replicas: usize,
    sentinels: usize,
    quorum: Option<usize>,
    down_after: Duration,
    failover_timeout: Duration,
}

impl Default for SentinelsBuilder {
    fn default() -> Self {
        SentinelsBuilder {
            replicas: 2,
            sentinels: 3,
            quorum: None,
            // Before Redis 7.0 the ping period is a fixed 1 s: a sentinel's first PONG on
            // its fresh link to a just-switched-to primary came ≈ 1.1 s after the switch
            // (seen under load), so a 1 s down-after there called the new primary down
            // and failed over a second time (see `Sentinels::wait_for_failover`).
            down_after: if super::server_kind().has_sentinel_debug() {
                Duration::from_millis(1000)
            } else {
                Duration::from_millis(2000)
            },
            failover_timeout: Duration::from_millis(3000),
        }
    }
}

impl SentinelsBuilder {
    /// Replicas of the primary (default 2).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Sentinels (default 3).
    pub fn sentinels(mut self, n: usize) -> Self {
        assert!(n > 0, "a sentinel topology needs a sentinel");
        self.sentinels = n;
        self
    }

    /// Sentinels that must agree the primary is down (default: a majority).
    pub fn quorum(mut self, n: usize) -> Self {
        self.quorum = Some(n);
        self
    }

    /// `down-after-milliseconds` (default 1 s, 2 s before Redis 7.0): silence before a
    /// sentinel calls a node down.
    pub fn down_after(mut self, d: Duration) -> Self {
        self.down_after = d;
        self
    }

    /// `failover-timeout` (default 3 s): bounds an election, a replica reconfiguration
    /// phase, and, doubled, the wait before a failed failover is tried again.
    pub fn failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = d;
        self
    }

    /// Starts the primary, its replicas (in sync before the sentinels start, so the
    /// sentinels' first INFO finds them all), then the sentinels; returns once every
    /// sentinel knows every replica and every other sentinel and `SENTINEL CKQUORUM`
    /// passes.
    pub fn start(self) -> Sentinels {
        let began = Instant::now();
        let name = unique_name("redmutex");
        let primary = RedisServer::with_args(&DATA_ARGS);
        let primary_port = primary.port().to_string();
        let mut replica_args = DATA_ARGS.to_vec();
        replica_args.extend(["--replicaof", "127.0.0.1", &primary_port]);
        let replicas = spawn_all(self.replicas, || RedisServer::with_args(&replica_args));
        let mut nodes = vec![primary];
        nodes.extend(replicas);

        let (done_tx, done_rx) = mpsc::channel();
        let mut topology = Sentinels {
            last_primary: Mutex::new(addr_of(&nodes[0])),
            name,
            nodes,
            sentinels: Vec::new(),
            events: Arc::new(EventLog::default()),
            listeners_done: Some(done_rx),
            started_in: Duration::ZERO,
            down_after: self.down_after,
            failover_timeout: self.failover_timeout,
        };
        topology.wait_replicas_synced(READY_TIMEOUT);

        let quorum = self.quorum.unwrap_or(self.sentinels / 2 + 1);
        let name = &topology.name;
        let body = format!(
            "sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {name} {}\n\
             sentinel failover-timeout {name} {}\n\
             sentinel parallel-syncs {name} {}\n",
            self.down_after.as_millis(),
            self.failover_timeout.as_millis(),
            self.replicas.max(1),
        );
        topology.sentinels = spawn_all(self.sentinels, || Sentinel::spawn(&body));
        // A sentinel reconnects a link at most once per ping period, and after a switch
        // it links to the new primary afresh: with a ping period as long as
        // down-after, it calls the new primary down for a moment. At least 300 ms, as a
        // replica is only promoted if the sentinels heard from it (INFO, once a second
        // during a failover) within 5 ping periods.
        let ping_period =
            (self.down_after / 2).clamp(Duration::from_millis(300), Duration::from_secs(1));
        for (index, sentinel) in topology.sentinels.iter().enumerate() {
            let mut con = sentinel.connection();
            // Before Redis 7.0 the periods are fixed (ping 1 s, INFO 10 s but 1 s around
            // a failover): slower to notice, which the tests' bounds allow.
            if super::server_kind().has_sentinel_debug() {
                redis::cmd("SENTINEL")
                    .arg("DEBUG")
                    .arg("info-period")
                    .arg(100)
                    .arg("publish-period")
                    .arg(200)
                    .arg("ask-period")
                    .arg(100)
                    .arg("ping-period")
                    .arg(ping_period.as_millis())
                    .exec(&mut con)
                    .unwrap_or_else(|e| panic!("SENTINEL DEBUG on {}: {e}", sentinel.port));
            }
            listen(index, sentinel.port, &topology.events, done_tx.clone());
        }
        drop(done_tx);
        if let Err(why) = poll(READY_TIMEOUT, || topology.sentinels_ready()) {
            topology.fail(&format!("sentinels not ready: {why}"));
        }
        topology.started_in = began.elapsed();
        topology
    }
}

/// Starts `n` of something at once (each `RedisServer` start is a process spawn and a
/// few probes); the first panic is passed on, the servers started meanwhile dropped.
fn spawn_all<T: Send>(n: usize, make: impl Fn() -> T + Sync) -> Vec<T> {
    thread::scope(|scope| {
        let handles: Vec<_> = (0..n).map(|_| scope.spawn(&make)).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| panic::resume_unwind(e)))
            .collect()
    })
}

/// Subscribes to every event of the sentinel on `port` from a thread of its own, and
/// returns once the subscription is confirmed. The thread ends when the sentinel's
/// connection closes (the sentinel was killed); dropping `done` tells the topology so.
fn listen(index: usize, port: u16, log: &Arc<EventLog>, done: mpsc::Sender<()>) {
    let log = Arc::clone(log);
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    thread::Builder::new()
        .name(format!("sentinel-{port}-events"))
        .spawn(move || {
            let _done = done;
            let subscribed = connect(port, super::ADMIN_IO_TIMEOUT).and_then(|con| {
                con.set_read_timeout(None)?;
                Ok(con)
            });
            let mut con = match subscribed {
                Ok(con) => con,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let mut pubsub = con.as_pubsub();
            if let Err(e) = pubsub.psubscribe("*") {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
            let _ = ready_tx.send(Ok(()));
            while let Ok(msg) = pubsub.get_message() {
                log.push(SentinelEvent {
                    at: Instant::now(),
                    sentinel: index,
                    channel: msg.get_channel_name().to_owned(),
                    payload: msg.get_payload().unwrap_or_default(),
                });
            }
        })
        .expect("spawn a sentinel event listener");
    match ready_rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("subscribing to sentinel {port}'s events: {e}"),
        Err(e) => panic!("subscribing to sentinel {port}'s events: {e}"),
    }
}

/// A primary, its replicas and the sentinels watching them, all on loopback.
///
/// Data nodes are [`RedisServer`]s ([`nodes`](Self::nodes); index 0 is the first
/// primary, the replicas follow), so tests kill, freeze and restart them as they do a
/// lone server. Dropping the topology kills the sentinels first, then the data nodes.
pub struct Sentinels {
    name: String,
    nodes: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    events: Arc<EventLog>,
    /// Disconnected once every listener thread has ended.
    listeners_done: Option<mpsc::Receiver<()>>,
    /// The primary as of the start or the last [`wait_for_failover`](Self::wait_for_failover).
    last_primary: Mutex<SocketAddr>,
    started_in: Duration,
    down_after: Duration,
    failover_timeout: Duration,
}

impl Sentinels {
    /// A primary, `replicas` replicas and `sentinels` sentinels with the default timing.
    pub fn new(replicas: usize, sentinels: usize) -> Sentinels {
        Sentinels::builder()
            .replicas(replicas)
            .sentinels(sentinels)
            .start()
    }

    pub fn builder() -> SentinelsBuilder {
        SentinelsBuilder::default()
    }

    /// The service (master) name the sentinels monitor; unique per topology.
    pub fn service_name(&self) -> &str {
        &self.name
    }

    /// How long [`SentinelsBuilder::start`] took, until the sentinels were ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    pub fn down_after(&self) -> Duration {
        self.down_after
    }

    /// How often a sentinel asks a replica (or a primary it does not see failing) for
    /// `INFO`, and so how late it may notice a thawed old primary still saying `master`:
    /// 100 ms as set by `SENTINEL DEBUG`, the fixed 10 s before Redis 7.0.
    pub fn info_period(&self) -> Duration {
        if super::server_kind().has_sentinel_debug() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(10)
        }
    }

    pub fn failover_timeout(&self) -> Duration {
        self.failover_timeout
    }

    pub fn sentinels(&self) -> &[Sentinel] {
        &self.sentinels
    }

    pub fn sentinel_mut(&mut self, i: usize) -> &mut Sentinel {
        &mut self.sentinels[i]
    }

    /// Addresses of the sentinels not killed: what a sentinel client is configured with.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .map(Sentinel::addr)
            .collect()
    }

    /// `redis://127.0.0.1:<port>/` of each sentinel not killed.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .map(Sentinel::url)
            .collect()
    }

    /// The data nodes: index 0 started as the primary, the others as its replicas.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The index of the data node listening on `addr`.
    pub fn node_index(&self, addr: SocketAddr) -> Option<usize> {
        self.nodes.iter().position(|n| addr_of(n) == addr)
    }

    /// The primary as the first sentinel that answers reports it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn primary_addr(&self) -> SocketAddr {
        self.reported_primaries()
            .into_iter()
            .flatten()
            .next()
            .unwrap_or_else(|| self.fail("no sentinel reports a primary"))
    }

    /// What each sentinel reports as the primary (`None`: killed, unreachable, or no
    /// answer), in [`sentinels`](Self::sentinels) order.
    pub fn reported_primaries(&self) -> Vec<Option<SocketAddr>> {
        self.sentinels
            .iter()
            .map(|s| {
                if !s.is_running() {
                    return None;
                }
                let mut con = poll_connection(s.port).ok()?;
                self.reported_by(&mut con).ok()
            })
            .collect()
    }

    fn reported_by(&self, con: &mut redis::Connection) -> Result<SocketAddr, String> {
        let reply: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.name)
            .query(con)
            .map_err(|e| e.to_string())?;
        let (ip, port) = reply.ok_or("unknown service")?;
        format!("{ip}:{port}").parse().map_err(|e| format!("{e}"))
    }

    /// Index of the data node the sentinels report as the primary.
    pub fn primary_index(&self) -> usize {
        let addr = self.primary_addr();
        self.node_index(addr)
            .unwrap_or_else(|| self.fail(&format!("primary {addr} is none of the data nodes")))
    }

    pub fn primary(&self) -> &RedisServer {
        &self.nodes[self.primary_index()]
    }

    /// Indices of the data nodes other than the primary.
    pub fn replica_indices(&self) -> Vec<usize> {
        let primary = self.primary_index();
        (0..self.nodes.len()).filter(|&i| i != primary).collect()
    }

    /// SIGKILLs the current primary; returns its index. Follow with
    /// [`wait_for_failover`](Self::wait_for_failover).
    pub fn kill_primary(&mut self) -> usize {
        let i = self.primary_index();
        *self.last_primary.lock().unwrap() = addr_of(&self.nodes[i]);
        self.nodes[i].kill();
        i
    }

    /// Waits until the failover away from the primary of the start or of the last one
    /// (so it works after [`kill_primary`](Self::kill_primary) as after a freeze) is over
    /// and the sentinels settled on its result; returns the new primary's address.
    /// Settled: every running sentinel reports (`SENTINEL GET-MASTER-ADDR-BY-NAME`) the
    /// same new primary, that node says `role:master`, and every running sentinel
    /// monitors it as a plain `master` (`SENTINEL MASTER`: its address, no `s_down`,
    /// `o_down`, `failover_in_progress` or `disconnected` flag, so the leader's
    /// `+failover-end` is past) and has had a PING answered on its link to it
    /// (`last-ping-sent` 0). Why the last two: a sentinel links to the new primary afresh
    /// when it switches, and before Redis 7.0 (fixed 1 s ping period, as long as
    /// down-after) it may call it down about a second later, before its first PONG;
    /// the other sentinels' "down" answers about the old primary still count then, so
    /// that is an instant `+odown` and, the switch having reset the failover delay, a
    /// second failover at once, to the other replica. The first new primary then says
    /// `master` until a sentinel demotes it (SLAVEOF, `CLIENT KILL TYPE normal`), seen
    /// ≈ 10 s later, resetting every connection a test took to it meanwhile.
    /// Re-checked on every sentinel event and at least every 250 ms. Panics with the
    /// events and logs when `timeout` passes first.
    pub fn wait_for_failover(&self, timeout: Duration) -> SocketAddr {
        let deadline = Instant::now() + timeout;
        let from = *self.last_primary.lock().unwrap();
        let mut seen = 0;
        let to = loop {
            let why = match self.failed_over(from) {
                Ok(to) => break to,
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "no failover away from {from} within {timeout:?}: {why}"
                ));
            }
            let until = deadline.min(Instant::now() + Duration::from_millis(250));
            seen = self.events.wait_past(seen, until);
        };
        *self.last_primary.lock().unwrap() = to;
        to
    }

    /// The new primary when every running sentinel reports the same one, not `from`,
    /// it says `role:master`, and every running sentinel monitors it settled (see
    /// [`wait_for_failover`](Self::wait_for_failover)).
    fn failed_over(&self, from: SocketAddr) -> Result<SocketAddr, String> {
        let mut to = None;
        for (i, s) in self.sentinels.iter().enumerate() {
            if !s.is_running() {
                continue;
            }
            let mut con = poll_connection(s.port)?;
            let reported = self.reported_by(&mut con)?;
            if reported == from || to.is_some_and(|to| to != reported) {
                return Err(format!("sentinel {i} reports {reported}"));
            }
            to = Some(reported);
        }
        let to = to.ok_or("every sentinel was killed")?;
        if !replication(to.port())?.is_primary {
            return Err(format!("{to} is not role:master"));
        }
        for (i, s) in self.sentinels.iter().enumerate() {
            if !s.is_running() {
                continue;
            }
            let mut con = poll_connection(s.port)?;
            let master: HashMap<String, String> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.name)
                .query(&mut con)
                .map_err(|e| format!("sentinel {i}: {e}"))?;
            let field = |k: &str| master.get(k).map(String::as_str).unwrap_or("?");
            let monitored = format!("{}:{}", field("ip"), field("port"));
            if monitored != to.to_string() || field("flags") != "master" {
                return Err(format!(
                    "sentinel {i} monitors {monitored} flagged {}",
                    field("flags")
                ));
            }
            if field("last-ping-sent") != "0" {
                return Err(format!(
                    "sentinel {i} awaits a PONG from {to} for {} ms",
                    field("last-ping-sent")
                ));
            }
        }
        Ok(to)
    }

    /// Waits until every data node still running follows the primary the sentinels
    /// report, is `online` there and has applied all of its stream (`INFO replication`
    /// on both sides; read-only, so no key or command is added).
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        let check = || {
            let primary = if self.sentinels.is_empty() {
                *self.last_primary.lock().unwrap()
            } else {
                self.primary_addr()
            };
            let replicas: Vec<u16> = self
                .nodes
                .iter()
                .filter(|n| n.is_running() && addr_of(n) != primary)
                .map(RedisServer::port)
                .collect();
            replicas_in_sync(primary.port(), &replicas)
        };
        if let Err(why) = poll(timeout, check) {
            self.fail(&format!("replicas not in sync within {timeout:?}: {why}"));
        }
    }

    /// Every event received so far, in arrival order.
    pub fn events(&self) -> Vec<SentinelEvent> {
        self.events.events.lock().unwrap().clone()
    }

    /// Waits (on the events) for one matching `wanted`, past or future.
    pub fn wait_event(
        &self,
        timeout: Duration,
        mut wanted: impl FnMut(&SentinelEvent) -> bool,
    ) -> Option<SentinelEvent> {
        self.events.wait_for(Instant::now() + timeout, |events| {
            events.iter().find(|e| wanted(e)).cloned()
        })
    }

    /// Readiness: each running sentinel sees the primary as such, every other data node
    /// as a healthy replica and every other running sentinel, and passes CKQUORUM.
    fn sentinels_ready(&self) -> Result<(), String> {
        let primary = *self.last_primary.lock().unwrap();
        let mut replicas: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.is_running() && addr_of(n) != primary)
            .map(RedisServer::port)
            .collect();
        replicas.sort_unstable();
        for (i, s) in self.sentinels.iter().enumerate() {
            if !s.is_running() {
                continue;
            }
            let mut others: Vec<u16> = self
                .sentinels
                .iter()
                .filter(|o| o.is_running() && o.port != s.port)
                .map(Sentinel::port)
                .collect();
            others.sort_unstable();
            let mut con = poll_connection(s.port)?;
            let err = |e: redis::RedisError| format!("sentinel {i}: {e}");
            let master: HashMap<String, String> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.name)
                .query(&mut con)
                .map_err(err)?;
            if master.get("flags").map(String::as_str) != Some("master") {
                return Err(format!(
                    "sentinel {i} sees the primary as {:?}",
                    master.get("flags")
                ));
            }
            let listed = |kind: &str, con: &mut redis::Connection, healthy: &str| {
                let entries: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                    .arg(kind)
                    .arg(&self.name)
                    .query(con)
                    .map_err(err)?;
                let mut ports = Vec::new();
                for e in &entries {
                    let flags = e.get("flags").map(String::as_str).unwrap_or("?");
                    if flags != healthy {
                        return Err(format!("sentinel {i}: {kind} entry flagged {flags}"));
                    }
                    if e.get("master-link-status").is_some_and(|s| s != "ok") {
                        return Err(format!("sentinel {i}: a replica's link is not ok"));
                    }
                    ports.push(
                        e.get("port")
                            .and_then(|p| p.parse::<u16>().ok())
                            .unwrap_or(0),
                    );
                }
                ports.sort_unstable();
                Ok(ports)
            };
            let seen = listed("REPLICAS", &mut con, "slave")?;
            if seen != replicas {
                return Err(format!(
                    "sentinel {i} knows replicas {seen:?}, not {replicas:?}"
                ));
            }
            let seen = listed("SENTINELS", &mut con, "sentinel")?;
            if seen != others {
                return Err(format!(
                    "sentinel {i} knows sentinels {seen:?}, not {others:?}"
                ));
            }
            let _: String = redis::cmd("SENTINEL")
                .arg("CKQUORUM")
                .arg(&self.name)
                .query(&mut con)
                .map_err(err)?;
        }
        Ok(())
    }

    /// Panics with the events and the tail of every log.
    fn fail(&self, what: &str) -> ! {
        let mut report = format!("sentinel topology {}: {what}\n--- events ---\n", self.name);
        for e in self.events() {
            report.push_str(&format!("[{}] {} {}\n", e.sentinel, e.channel, e.payload));
        }
        for (i, s) in self.sentinels.iter().enumerate() {
            report.push_str(&format!(
                "--- sentinel {i} (port {}) ---\n{}\n",
                s.port,
                tail(&s.log_contents(), 40)
            ));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            report.push_str(&format!(
                "--- data node {i} (port {}) ---\n{}\n",
                n.port(),
                tail(&n.log_contents(), 25)
            ));
        }
        panic!("{report}")
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        // Sentinels first, so none reacts to the data nodes going away; their listener
        // threads then see the connection close and end.
        for s in &mut self.sentinels {
            s.kill();
        }
        if let Some(done) = self.listeners_done.take() {
            // Disconnected once every listener has ended; bounded so a drop never hangs.
            let _ = done.recv_timeout(Duration::from_secs(2));
        }
    }
}

// ------------------------------------------------------------------------------------
// Cluster
// ------------------------------------------------------------------------------------

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`: CRC16 of its hash tag (what is between the first `{` and
/// the first `}` after it, when that is not empty) or of the whole key, mod 16384.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            match rest.iter().position(|&b| b == b'}') {
                Some(0) | None => None,
                Some(close) => Some(&rest[..close]),
            }
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// A short hash tag for `slot`: every key containing `{<tag>}` lands there.
pub fn tag_for_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut n = 0u64;
        while missing > 0 {
            let tag = n.to_string();
            let entry = &mut tags[usize::from(key_slot(&tag))];
            if entry.is_empty() {
                *entry = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot)]
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The primary's id, for a replica.
    pub primary: Option<String>,
    /// Slot ranges it serves (inclusive); migration markers left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeEntry {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn is_primary(&self) -> bool {
        self.has_flag("master")
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

fn parse_cluster_nodes(text: &str) -> Vec<NodeEntry> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let host_port = f[1].split(['@', ',']).next()?;
            let port = host_port.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeEntry {
                id: f[0].to_owned(),
                port,
                flags: f[2].split(',').map(str::to_owned).collect(),
                primary: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// Shape and timing of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    primaries: usize,
    replicas: usize,
    node_timeout: Duration,
    through_proxies: bool,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            primaries: 3,
            replicas: 0,
            node_timeout: Duration::from_millis(1000),
            through_proxies: false,
        }
    }
}

impl ClusterBuilder {
    /// Primaries, sharing the 16384 slots in equal ranges (default 3).
    pub fn primaries(mut self, n: usize) -> Self {
        assert!(n > 0, "a cluster needs a primary");
        self.primaries = n;
        self
    }

    /// Replicas per primary (default 0).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// `cluster-node-timeout` (default 1 s): silence before a node is suspected down.
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d;
        self
    }

    /// A [`FaultProxy`] in front of each node ([`Cluster::proxy`]), which the node
    /// announces as its address (`cluster-announce-ip`/`-port`; the bus stays direct,
    /// `cluster-announce-bus-port`): `CLUSTER SLOTS`/`SHARDS`/`NODES`, `MOVED` and `ASK`
    /// name the proxies, so a client seeded with [`Cluster::proxy_urls`] reaches every
    /// node through them, redirections and slot map refreshes included, and a test can
    /// delay or lose what it sends to any node. Set at start (Redis 6.2 takes no
    /// `cluster-announce-port` change at run time for its own view), so a restarted node
    /// announces its proxy again.
    pub fn through_proxies(mut self) -> Self {
        self.through_proxies = true;
        self
    }

    /// Starts the nodes and forms the cluster by hand (what `redis-cli --cluster
    /// create` does, minus its one-second sleeps): distinct config epochs, slot ranges,
    /// a MEET between every pair, then CLUSTER REPLICATE. Returns once every node says
    /// `cluster_state:ok` with all slots served, all nodes agree on the slot map and
    /// roles, and every replica is in sync.
    pub fn start(self) -> Cluster {
        let began = Instant::now();
        let total = self.primaries * (1 + self.replicas);
        let timeout = self.node_timeout;
        let proxied = self.through_proxies;
        let nodes = spawn_all(total, || ClusterNode::spawn(timeout, proxied));
        let mut cluster = Cluster {
            nodes,
            killed_slots: HashMap::new(),
            node_timeout: self.node_timeout,
            started_in: Duration::ZERO,
        };
        for node in &mut cluster.nodes {
            let mut con = node.connection();
            node.id = redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut con)
                .expect("CLUSTER MYID");
        }
        let run = |i: usize, cmd: &mut redis::Cmd| {
            let mut con = cluster.nodes[i].connection();
            cmd.exec(&mut con)
                .unwrap_or_else(|e| cluster.fail(&format!("node {i}: {cmd:?}: {e}")));
        };
        for i in 0..total {
            // Distinct epochs up front, as redis-cli does: no collision to resolve.
            run(i, redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1));
        }
        let per = usize::from(SLOTS) / self.primaries;
        for p in 0..self.primaries {
            let first = p * per;
            let last = if p + 1 == self.primaries {
                usize::from(SLOTS) - 1
            } else {
                first + per - 1
            };
            if super::server_kind().has_slot_ranges() {
                run(
                    p,
                    redis::cmd("CLUSTER")
                        .arg("ADDSLOTSRANGE")
                        .arg(first)
                        .arg(last),
                );
            } else {
                // Before Redis 7.0 there is no ADDSLOTSRANGE: every slot is named.
                run(
                    p,
                    redis::cmd("CLUSTER")
                        .arg("ADDSLOTS")
                        .arg((first..=last).collect::<Vec<_>>()),
                );
            }
        }
        for i in 0..total {
            for j in i + 1..total {
                let other = &cluster.nodes[j];
                run(
                    i,
                    redis::cmd("CLUSTER")
                        .arg("MEET")
                        .arg("127.0.0.1")
                        .arg(other.port())
                        .arg(other.bus_port),
                );
            }
        }
        let everyone = poll(READY_TIMEOUT, || {
            for i in 0..total {
                let view = cluster.view(i)?;
                let known = view
                    .iter()
                    .filter(|e| !e.has_flag("handshake") && !e.has_flag("noaddr"))
                    .count();
                if known != total {
                    return Err(format!("node {i} knows {known} of {total} nodes"));
                }
            }
            Ok(())
        });
        if let Err(why) = everyone {
            cluster.fail(&format!("nodes did not meet: {why}"));
        }
        for p in 0..self.primaries {
            for r in 0..self.replicas {
                let replica = self.primaries + p * self.replicas + r;
                let primary_id = cluster.nodes[p].id.clone();
                run(
                    replica,
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(primary_id),
                );
            }
        }
        cluster.wait_ok(READY_TIMEOUT);
        cluster.wait_replicas_synced(READY_TIMEOUT);
        cluster.started_in = began.elapsed();
        cluster
    }
}

/// One cluster node: a [`RedisServer`] (through `Deref`: port, url, connection, kill,
/// freeze, thaw, restart, which keeps its `nodes.conf` and so its identity) with its
/// cluster id and bus port, and the proxy in front of it if the cluster has them.
#[derive(Debug)]
pub struct ClusterNode {
    server: RedisServer,
    id: String,
    bus_port: u16,
    proxy: Option<FaultProxy>,
}

impl ClusterNode {
    /// Starts a cluster-enabled server; the bus port is given explicitly
    /// (`cluster-port`, since port + 10000 may be taken or past 65535), and another is
    /// tried when a parallel test took it. A server without `cluster-port` (before Redis
    /// 7.0) has its bus on port + 10000, so both are picked together. With `proxied`, a
    /// [`FaultProxy`] is bound first and the node announces its port (see
    /// [`ClusterBuilder::through_proxies`]).
    fn spawn(node_timeout: Duration, proxied: bool) -> ClusterNode {
        const ATTEMPTS: usize = 5;
        let timeout = node_timeout.as_millis().to_string();
        let own_bus = super::server_kind().has_cluster_port();
        let proxy = proxied.then(FaultProxy::reserve);
        let announced = proxy.as_ref().map(|p| p.port().to_string());
        for attempt in 1..=ATTEMPTS {
            let (port, bus_port) = if own_bus {
                (None, free_port())
            } else {
                let port = free_port_pair();
                (Some(port), port + 10_000)
            };
            let bus = bus_port.to_string();
            let port = port.map(|p| p.to_string());
            let mut args = DATA_ARGS.to_vec();
            args.extend([
                "--cluster-enabled",
                "yes",
                // Relative: inside the server's own directory, kept across restarts.
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                "--cluster-replica-validity-factor",
                "0",
                "--cluster-allow-replica-migration",
                "no",
            ]);
            match &port {
                Some(port) => args.extend(["--port", port]),
                None => args.extend(["--cluster-port", &bus]),
            }
            if let Some(announced) = &announced {
                args.extend([
                    "--cluster-announce-ip",
                    "127.0.0.1",
                    "--cluster-announce-port",
                    announced,
                    // Else derived from the announced port (before 7.0): the bus is direct.
                    "--cluster-announce-bus-port",
                    &bus,
                ]);
            }
            match panic::catch_unwind(|| RedisServer::with_args(&args)) {
                Ok(server) => {
                    if let Some(proxy) = &proxy {
                        proxy.forward_to(server.port());
                    }
                    return ClusterNode {
                        server,
                        id: String::new(),
                        bus_port,
                        proxy,
                    };
                }
                Err(e) if attempt == ATTEMPTS => panic::resume_unwind(e),
                Err(_) => {}
            }
        }
        unreachable!()
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn bus_port(&self) -> u16 {
        self.bus_port
    }

    pub fn addr(&self) -> SocketAddr {
        addr_of(&self.server)
    }

    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// The proxy in front of the node; panics unless the cluster was started
    /// [`through_proxies`](ClusterBuilder::through_proxies).
    pub fn proxy(&self) -> &FaultProxy {
        self.proxy
            .as_ref()
            .expect("a cluster started through_proxies() has proxies")
    }
}

impl Deref for ClusterNode {
    type Target = RedisServer;

    fn deref(&self) -> &RedisServer {
        &self.server
    }
}

impl DerefMut for ClusterNode {
    fn deref_mut(&mut self) -> &mut RedisServer {
        &mut self.server
    }
}

/// A Redis Cluster on loopback: nodes `0..primaries` start as the primaries (equal
/// slot ranges in order), then each primary's replicas in turn. Dropping it kills
/// every node.
pub struct Cluster {
    nodes: Vec<ClusterNode>,
    /// Slot ranges of each primary killed by [`kill_primary`](Self::kill_primary).
    killed_slots: HashMap<usize, Vec<(u16, u16)>>,
    node_timeout: Duration,
    started_in: Duration,
}

impl Cluster {
    /// `primaries` primaries with `replicas` replicas each, default timing.
    pub fn new(primaries: usize, replicas: usize) -> Cluster {
        Cluster::builder()
            .primaries(primaries)
            .replicas(replicas)
            .start()
    }

    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// How long [`ClusterBuilder::start`] took, until the cluster was ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &ClusterNode {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut ClusterNode {
        &mut self.nodes[i]
    }

    /// Addresses of the nodes not killed: a cluster client's seed list.
    pub fn seed_addrs(&self) -> Vec<SocketAddr> {
        self.running().map(|i| self.nodes[i].addr()).collect()
    }

    /// `redis://127.0.0.1:<port>/` of each node not killed.
    pub fn seed_urls(&self) -> Vec<String> {
        self.running().map(|i| self.nodes[i].url()).collect()
    }

    /// The URL of the proxy of each node not killed: the seeds of a client that reaches
    /// the cluster only through them ([`ClusterBuilder::through_proxies`]).
    pub fn proxy_urls(&self) -> Vec<String> {
        self.running()
            .map(|i| self.nodes[i].proxy().url())
            .collect()
    }

    /// The proxy of every node, in node order ([`ClusterBuilder::through_proxies`]).
    pub fn proxies(&self) -> Vec<&FaultProxy> {
        self.nodes.iter().map(ClusterNode::proxy).collect()
    }

    pub fn index_of_id(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The node listening on `port`, or whose proxy does (the port the cluster names
    /// it by when it has proxies).
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.port() == port || n.proxy.as_ref().is_some_and(|p| p.port() == port))
    }

    /// `CLUSTER NODES` as node `i` sees the cluster.
    pub fn view(&self, i: usize) -> Result<Vec<NodeEntry>, String> {
        let mut con = poll_connection(self.nodes[i].port())?;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut con)
            .map_err(|e| format!("CLUSTER NODES on node {i}: {e}"))?;
        Ok(parse_cluster_nodes(&text))
    }

    /// Node `i`'s own line of its view: its role as it knows it.
    fn own_entry(&self, i: usize) -> Result<NodeEntry, String> {
        self.view(i)?
            .into_iter()
            .find(|e| e.has_flag("myself"))
            .ok_or_else(|| format!("node {i} has no myself line"))
    }

    /// Running nodes that are primaries by their own account.
    pub fn primaries(&self) -> Vec<usize> {
        self.running()
            .filter(|&i| self.own_entry(i).is_ok_and(|e| e.is_primary()))
            .collect()
    }

    /// Running nodes that replicate `primary` by their own account.
    pub fn replicas_of(&self, primary: usize) -> Vec<usize> {
        let id = &self.nodes[primary].id;
        self.running()
            .filter(|&i| {
                self.own_entry(i)
                    .is_ok_and(|e| e.primary.as_deref() == Some(id.as_str()))
            })
            .collect()
    }

    /// The primary serving `slot`, as the first running node sees the cluster (during
    /// a migration: the node migrating it away, until [`SlotMigration::finish`]).
    pub fn node_for_slot(&self, slot: u16) -> usize {
        let first = self
            .running()
            .next()
            .unwrap_or_else(|| self.fail("every node was killed"));
        let view = self.view(first).unwrap_or_else(|e| self.fail(&e));
        view.iter()
            .find(|e| e.is_primary() && e.serves(slot))
            .and_then(|e| self.index_of_id(&e.id))
            .unwrap_or_else(|| self.fail(&format!("node {first} sees no owner of slot {slot}")))
    }

    /// The primary serving `key`'s slot.
    pub fn node_for_key(&self, key: impl AsRef<[u8]>) -> usize {
        self.node_for_slot(key_slot(key))
    }

    /// A connection to the primary serving `key`'s slot.
    pub fn connection_for_key(&self, key: impl AsRef<[u8]>) -> redis::Connection {
        self.nodes[self.node_for_key(key)].connection()
    }

    /// Starts moving `slot` from primary `from` to primary `to` (IMPORTING on `to`,
    /// then MIGRATING on `from`) and returns the migration half-way: `from` still
    /// serves the keys it has and answers ASK for the others, `to` serves them to
    /// clients that send ASKING. Move keys and finish through the returned handle.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) -> SlotMigration<'_> {
        assert_ne!(from, to, "a slot migrates between two nodes");
        let owner = self.node_for_slot(slot);
        assert_eq!(
            owner, from,
            "slot {slot} is served by node {owner}, not {from}"
        );
        self.setslot(to, slot, "IMPORTING", from);
        self.setslot(from, slot, "MIGRATING", to);
        SlotMigration {
            cluster: self,
            slot,
            from,
            to,
        }
    }

    /// Moves `slot` from `from` to `to` in one go (begin, every key, finish).
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        self.begin_migration(slot, from, to).finish();
    }

    fn setslot(&self, node: usize, slot: u16, state: &str, other: usize) {
        let mut con = self.nodes[node].connection();
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(&self.nodes[other].id)
            .exec(&mut con)
            .unwrap_or_else(|e| {
                self.fail(&format!("node {node}: CLUSTER SETSLOT {slot} {state}: {e}"))
            });
    }

    /// SIGKILLs node `i`, which must be a primary serving slots; follow with
    /// [`wait_for_failover`](Self::wait_for_failover). A replica is only promoted by the
    /// votes of a majority of all primaries, so that takes 3 primaries or more.
    pub fn kill_primary(&mut self, i: usize) {
        let own = self.own_entry(i).unwrap_or_else(|e| self.fail(&e));
        if !own.is_primary() || own.slots.is_empty() {
            self.fail(&format!("node {i} is not a primary serving slots: {own:?}"));
        }
        self.killed_slots.insert(i, own.slots);
        self.nodes[i].kill();
    }

    /// Waits until a replica of `failed` (killed or frozen) has taken over all its
    /// slots and the cluster is whole again without it (see [`wait_ok`](Self::wait_ok));
    /// returns the promoted node. Polled: the cluster announces nothing.
    pub fn wait_for_failover(&self, failed: usize, timeout: Duration) -> usize {
        let slots = match self.killed_slots.get(&failed) {
            Some(slots) => slots.clone(),
            None => {
                let first = self.running().find(|&i| i != failed).unwrap_or(failed);
                let view = self.view(first).unwrap_or_else(|e| self.fail(&e));
                view.into_iter()
                    .find(|e| e.id == self.nodes[failed].id)
                    .map(|e| e.slots)
                    .unwrap_or_default()
            }
        };
        if slots.is_empty() {
            self.fail(&format!("node {failed} served no slots to take over"));
        }
        let promoted = poll(timeout, || {
            let taker = self
                .running()
                .filter(|&i| i != failed)
                .find(|&i| {
                    self.own_entry(i).is_ok_and(|e| {
                        e.is_primary() && slots.iter().all(|&(a, b)| e.serves(a) && e.serves(b))
                    })
                })
                .ok_or_else(|| format!("no node has taken over {slots:?} yet"))?;
            self.health(&[failed])?;
            Ok(taker)
        });
        promoted.unwrap_or_else(|why| {
            self.fail(&format!(
                "no failover of node {failed} within {timeout:?}: {why}"
            ))
        })
    }

    /// Waits until every running node says `cluster_state:ok` with all 16384 slots
    /// served, knows every node, and all of them agree on roles and the slot map,
    /// whose owners are all running.
    pub fn wait_ok(&self, timeout: Duration) {
        if let Err(why) = poll(timeout, || self.health(&[])) {
            self.fail(&format!("cluster not ok within {timeout:?}: {why}"));
        }
    }

    /// Waits until every running replica (by its own account) has its link to its
    /// primary up, is `online` there, and has applied all of the primary's stream.
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        let check = || {
            let mut followers: BTreeMap<usize, Vec<u16>> = BTreeMap::new();
            for i in self.running() {
                let own = self.own_entry(i)?;
                if let Some(primary) = own.primary {
                    let p = self
                        .index_of_id(&primary)
                        .ok_or_else(|| format!("node {i} follows unknown {primary}"))?;
                    followers.entry(p).or_default().push(self.nodes[i].port());
                }
            }
            for (p, replicas) in followers {
                replicas_in_sync(self.nodes[p].port(), &replicas)?;
            }
            Ok(())
        };
        if let Err(why) = poll(timeout, check) {
            self.fail(&format!("replicas not in sync within {timeout:?}: {why}"));
        }
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_running())
    }

    /// Whether the cluster is whole as seen by every running node but `skip`.
    fn health(&self, skip: &[usize]) -> Result<(), String> {
        // (node, its view without the flags, which differ from node to node).
        let mut agreed: Option<(usize, Vec<NodeEntry>)> = None;
        for i in self.running().filter(|i| !skip.contains(i)) {
            let mut con = poll_connection(self.nodes[i].port())?;
            let text: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .map_err(|e| format!("CLUSTER INFO on node {i}: {e}"))?;
            let info = parse_info(&text);
            let field = |k: &str| info.get(k).map(String::as_str).unwrap_or("?");
            if field("cluster_state") != "ok"
                || field("cluster_slots_assigned") != "16384"
                || field("cluster_slots_ok") != "16384"
            {
                return Err(format!(
                    "node {i}: cluster_state:{} slots assigned {} ok {}",
                    field("cluster_state"),
                    field("cluster_slots_assigned"),
                    field("cluster_slots_ok")
                ));
            }
            let view = self.view(i)?;
            if view.len() != self.nodes.len() || view.iter().any(|e| e.has_flag("handshake")) {
                return Err(format!("node {i} does not know every node yet"));
            }
            let mut map: Vec<NodeEntry> = view
                .into_iter()
                .map(|e| NodeEntry {
                    flags: Vec::new(),
                    ..e
                })
                .collect();
            map.sort_by(|a, b| a.id.cmp(&b.id));
            match &agreed {
                None => agreed = Some((i, map)),
                Some((first, seen)) if *seen != map => {
                    return Err(format!("nodes {first} and {i} see different clusters"));
                }
                Some(_) => {}
            }
        }
        let (_, map) = agreed.ok_or("no running node")?;
        for entry in map.iter().filter(|e| !e.slots.is_empty()) {
            let owner = self
                .index_of_id(&entry.id)
                .ok_or_else(|| format!("unknown node {}", entry.id))?;
            if !self.nodes[owner].is_running() || skip.contains(&owner) {
                return Err(format!("node {owner} still serves {:?}", entry.slots));
            }
        }
        Ok(())
    }

    /// Panics with every running node's view and the tail of every log.
    fn fail(&self, what: &str) -> ! {
        let mut report = format!("cluster: {what}\n");
        for (i, n) in self.nodes.iter().enumerate() {
            let view = if n.is_running() {
                let mut con = poll_connection(n.port()).ok();
                con.as_mut()
                    .and_then(|c| redis::cmd("CLUSTER").arg("NODES").query::<String>(c).ok())
                    .unwrap_or_else(|| "<no answer>".into())
            } else {
                "<killed>".into()
            };
            report.push_str(&format!(
                "--- node {i} (port {}, id {}) ---\n{view}\n{}\n",
                n.port(),
                n.id,
                tail(&n.log_contents(), 25)
            ));
        }
        panic!("{report}")
    }
}

/// A slot half-way between two primaries ([`Cluster::begin_migration`]): keys move with
/// [`move_keys`](Self::move_keys)/[`move_key`](Self::move_key), and
/// [`finish`](Self::finish) hands the slot over. Dropping it unfinished leaves the slot
/// migrating.
#[must_use = "the slot stays MIGRATING/IMPORTING until finish()"]
pub struct SlotMigration<'a> {
    cluster: &'a Cluster,
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration<'_> {
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Keys of the slot still on the source (`CLUSTER COUNTKEYSINSLOT`).
    pub fn keys_left(&self) -> usize {
        let mut con = self.cluster.nodes[self.from].connection();
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(self.slot)
            .query(&mut con)
            .unwrap_or_else(|e| self.cluster.fail(&format!("COUNTKEYSINSLOT: {e}")))
    }

    /// MIGRATEs up to `max` of the slot's keys to the target (TTLs kept); returns how
    /// many moved.
    pub fn move_keys(&self, max: usize) -> usize {
        let mut con = self.cluster.nodes[self.from].connection();
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(max)
            .query(&mut con)
            .unwrap_or_else(|e| self.cluster.fail(&format!("GETKEYSINSLOT: {e}")));
        if keys.is_empty() {
            return 0;
        }
        self.migrate(&mut con, &keys);
        keys.len()
    }

    /// MIGRATEs one key (of this slot) to the target; false when the source did not
    /// have it.
    pub fn move_key(&self, key: impl AsRef<[u8]>) -> bool {
        let key = key.as_ref();
        assert_eq!(
            key_slot(key),
            self.slot,
            "the key is not in slot {}",
            self.slot
        );
        let mut con = self.cluster.nodes[self.from].connection();
        self.migrate(&mut con, &[key.to_vec()])
    }

    fn migrate(&self, con: &mut redis::Connection, keys: &[Vec<u8>]) -> bool {
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.cluster.nodes[self.to].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(con)
            .unwrap_or_else(|e| self.cluster.fail(&format!("MIGRATE: {e}")));
        reply == "OK"
    }

    /// Moves the remaining keys, then assigns the slot to the target (`SETSLOT NODE` on
    /// the target, the source, then every other running primary, as redis-cli does)
    /// and waits until every running node sees the new owner. Afterwards the source
    /// answers MOVED for the slot.
    pub fn finish(self) {
        while self.move_keys(100) > 0 {}
        let cluster = self.cluster;
        let order = [self.to, self.from].into_iter().chain(
            cluster
                .primaries()
                .into_iter()
                .filter(|&p| p != self.to && p != self.from),
        );
        for node in order {
            let mut con = cluster.nodes[node].connection();
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(self.slot)
                .arg("NODE")
                .arg(&cluster.nodes[self.to].id)
                .exec(&mut con)
                .unwrap_or_else(|e| {
                    cluster.fail(&format!("node {node}: SETSLOT {} NODE: {e}", self.slot))
                });
        }
        let target = cluster.nodes[self.to].id.clone();
        let agreed = poll(READY_TIMEOUT, || {
            for i in cluster.running() {
                let view = cluster.view(i)?;
                let owner = view.iter().find(|e| e.is_primary() && e.serves(self.slot));
                if owner.map(|e| &e.id) != Some(&target) {
                    return Err(format!("node {i} does not see the new owner yet"));
                }
            }
            Ok(())
        });
        if let Err(why) = agreed {
            cluster.fail(&format!("slot {} migration: {why}", self.slot));
        }
    }
}

/// A port P below the kernel's ephemeral range (so no outgoing connection takes it or
/// P + 10000 meanwhile) with P and P + 10000 both free a moment ago: a cluster node's
/// port and bus port on servers without `cluster-port`. Picked at random, so parallel
/// tests seldom try the same one; a lost race costs the caller one start attempt.
fn free_port_pair() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    use std::net::TcpListener;
    let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
    for i in 0u32..1_000 {
        let random = RandomState::new().hash_one((std::process::id(), i, Instant::now()));
        let port = 10_000 + (random % 12_000) as u16;
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port P with P + 10000 free between 10000 and 32000")
}
