//! A primary, its replicas and the sentinels watching them ([`Sentinels`]), and its builder.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::panic;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::super::RedisServer;
use super::{
    addr_of, listen, poll, poll_connection, replicas_in_sync, replication, tail, unique_name,
    EventLog, Sentinel, SentinelEvent, DATA_ARGS, READY_TIMEOUT,
};

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
            down_after: if super::super::server_kind().has_sentinel_debug() {
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
            if super::super::server_kind().has_sentinel_debug() {
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
pub(super) fn spawn_all<T: Send>(n: usize, make: impl Fn() -> T + Sync) -> Vec<T> {
    thread::scope(|scope| {
        let handles: Vec<_> = (0..n).map(|_| scope.spawn(&make)).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| panic::resume_unwind(e)))
            .collect()
    })
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
        if super::super::server_kind().has_sentinel_debug() {
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
        self.running_sentinels().map(Sentinel::addr).collect()
    }

    /// `redis://127.0.0.1:<port>/` of each sentinel not killed.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.running_sentinels().map(Sentinel::url).collect()
    }

    /// The sentinels not killed.
    fn running_sentinels(&self) -> impl Iterator<Item = &Sentinel> {
        self.sentinels.iter().filter(|s| s.is_running())
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
