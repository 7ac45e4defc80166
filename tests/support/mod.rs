//! Test harness that runs real `redis-server` processes.
//!
//! Every server gets its own loopback port and temporary directory, so tests
//! can run in parallel and kill, restart or freeze "their" Redis without
//! disturbing anyone else. Shared by the integration tests (`mod support;`),
//! the benches and the examples (`#[path = "../tests/support/mod.rs"]`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;

pub mod child;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clients;
pub mod deployment;
pub mod keys;
/// Which files of `lua/` make up each bundled script: the library's own list.
#[path = "../../src/runtime/scripting/manifest.rs"]
pub mod manifest;
mod proxy;
pub mod topology;
// Not every test binary that includes the harness injects faults.
#[allow(unused_imports)]
pub use clients::{build, Clients};
#[allow(unused_imports)]
pub use keys::Keys;
#[allow(unused_imports)]
pub use proxy::FaultProxy;

/// How long one start attempt may take before the server counts as hung.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between readiness probes; only process startup is being waited on.
const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// Start attempts before giving up; a port lost to a parallel test costs one.
const START_ATTEMPTS: usize = 5;
/// Read/write timeout of admin connections, so a frozen server fails a test
/// instead of hanging it.
const ADMIN_IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A `redis-server` child process owned by one test.
///
/// Dropping it SIGKILLs and reaps the process (also when the test panicked
/// or froze it) and then removes its temporary directory.
#[derive(Debug)]
pub struct RedisServer {
    /// `None` once killed, so a reaped pid (maybe reused by now) is never signalled.
    child: Option<Child>,
    /// Pid of the most recent process, kept after `kill` for diagnostics.
    pid: u32,
    /// Plain-text port; 0 when the server only listens on its TLS port.
    port: u16,
    /// TLS port given through `--tls-port`, probed when there is no plain port.
    tls_port: Option<u16>,
    /// Password from `--requirepass`, so admin connections can authenticate.
    password: Option<String>,
    /// The caller's extra arguments, replayed by `restart`.
    extra: Vec<String>,
    /// The binary, when not the default one (see `server_binary`).
    bin: Option<String>,
    /// Holds the log; declared last so it is removed after the process is dead.
    dir: tempfile::TempDir,
}

/// Why one start attempt failed.
struct StartFailure {
    /// Another attempt (possibly on another port) may succeed.
    retryable: bool,
    reason: String,
}

/// What a readiness probe learned about the port.
enum Probe {
    /// Our process answered.
    Up,
    /// Nothing (or someone else's server) answers yet.
    NotYet,
}

impl RedisServer {
    /// Spawns a server with the harness defaults (no persistence, loopback only).
    pub fn new() -> RedisServer {
        RedisServer::with_args(&[])
    }

    /// Spawns a server with `extra` appended to the default arguments, e.g.
    /// `["--requirepass", "x"]`.
    ///
    /// Later arguments win in Redis, so `extra` can override defaults. Passing
    /// `--port` pins the port (`--port 0` with `--tls-port P` gives a TLS-only
    /// server, probed by a bare TCP connect since the harness speaks no TLS).
    pub fn with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_binary(None, extra)
    }

    /// Spawns the server binary `bin` (another version than the default one) with the
    /// harness defaults and `extra`, as [`with_args`](RedisServer::with_args) does.
    pub fn with_binary(bin: &str, extra: &[&str]) -> RedisServer {
        RedisServer::start_binary(Some(bin.to_owned()), extra)
    }

    fn start_binary(bin: Option<String>, extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let fixed_port = arg_value(&extra, "--port").map(|v| parse_port("--port", v));
        let tls_port = arg_value(&extra, "--tls-port")
            .map(|v| parse_port("--tls-port", v))
            .filter(|&p| p != 0);
        let password = arg_value(&extra, "--requirepass").map(str::to_string);
        let dir = temp_dir("redis");

        let mut server = RedisServer {
            child: None,
            pid: 0,
            port: fixed_port.unwrap_or(0),
            tls_port,
            password,
            extra,
            bin,
            dir,
        };
        // A caller-chosen port is part of the test's setup, so never swap it.
        server.start(fixed_port.is_some());
        server
    }

    /// Plain-text port the server listens on (0 for a TLS-only server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// TLS port, if one was configured with `--tls-port`.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// URL without credentials, so auth tests can see the server refuse it.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A fresh admin connection with 5 s I/O timeouts; authenticated when the
    /// server was started with `--requirepass`. Panics on failure because no
    /// test can go on without it. Without a password, connecting needs no
    /// reply, so it also works while the server is frozen.
    pub fn connection(&self) -> redis::Connection {
        let con = self
            .admin_client()
            .get_connection_with_timeout(ADMIN_IO_TIMEOUT)
            .unwrap_or_else(|e| self.fail(&format!("admin connection to {}: {e}", self.url())));
        con.set_read_timeout(Some(ADMIN_IO_TIMEOUT))
            .expect("set read timeout");
        con.set_write_timeout(Some(ADMIN_IO_TIMEOUT))
            .expect("set write timeout");
        con
    }

    /// Pid of the current (or, after `kill`, the last) server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has not been killed through this handle.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the server and reaps it; a no-op when already killed. SIGKILL
    /// (not SHUTDOWN) so tests see an abrupt crash, and it works on a frozen
    /// process too.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Fails only if the child was already reaped, which `take` rules out,
            // or already exited, which is fine: wait() still reaps it.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts a fresh one on the same port with the same
    /// arguments (all data is lost); returns once it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.start(true);
    }

    /// SIGSTOPs the server: connections stay open but nothing is answered,
    /// like a long GC pause or a partitioned node.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP, "SIGSTOP");
    }

    /// SIGCONTs a frozen server; it then serves the requests queued meanwhile.
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT, "SIGCONT");
    }

    /// Per-command call counts from `INFO commandstats`, keyed by lowercase
    /// command name without the `cmdstat_` prefix (`"evalsha"`, `"ping"`,
    /// subcommands as `"client|setinfo"`). Tests compare snapshots, since the
    /// harness itself issues a few commands.
    pub fn command_calls(&self) -> HashMap<String, u64> {
        let mut con = self.connection();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut con)
            .unwrap_or_else(|e| self.fail(&format!("INFO commandstats: {e}")));
        parse_commandstats(&info)
    }

    /// The calls per command since `before` (a [`command_calls`](Self::command_calls)),
    /// commands `skip` names (the test's own, say) left out, and those not called since.
    pub fn calls_since(
        &self,
        before: &HashMap<String, u64>,
        skip: impl Fn(&str) -> bool,
    ) -> HashMap<String, u64> {
        self.command_calls()
            .into_iter()
            .filter(|(c, _)| !skip(c))
            .filter_map(|(c, v)| {
                let d = v - before.get(&c).copied().unwrap_or(0);
                (d > 0).then_some((c, d))
            })
            .collect()
    }

    /// Sum of all command calls, for "no traffic happened" assertions.
    pub fn total_calls(&self) -> u64 {
        self.command_calls().values().sum()
    }

    /// The server log (all starts of this handle), for failure messages.
    /// Includes stderr when non-empty: Redis reports bad arguments there,
    /// before it opens the log file.
    pub fn log_contents(&self) -> String {
        let path = self.log_path();
        let mut text = fs::read_to_string(&path)
            .unwrap_or_else(|e| format!("<cannot read {}: {e}>", path.display()));
        let stderr = fs::read_to_string(self.stderr_path()).unwrap_or_default();
        if !stderr.trim().is_empty() {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("--- stderr ---\n");
            text.push_str(&stderr);
        }
        text
    }

    /// Client for harness-internal connections: skips `CLIENT SETINFO` so
    /// connecting costs no round trip and adds nothing to `command_calls`.
    fn admin_client(&self) -> redis::Client {
        let info = self.url().into_connection_info().expect("valid redis url");
        let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        redis::Client::open(info.set_redis_settings(settings)).expect("valid connection info")
    }

    /// Kept across restarts, so one file tells the whole story of a test.
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Where Redis's early (pre-log-file) complaints end up.
    fn stderr_path(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// Signals the live child only: a killed one's pid may belong to anyone now.
    fn signal(&self, sig: libc::c_int, name: &str) {
        let child = self
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: redis-server {} was already killed", self.pid));
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits in pid_t");
        // SAFETY: plain kill(2) on our own, not yet reaped, child.
        if unsafe { libc::kill(pid, sig) } != 0 {
            panic!(
                "{name} to redis-server {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    /// Panics with the server log attached, the first thing needed to debug.
    fn fail(&self, what: &str) -> ! {
        panic!(
            "redis-server on port {}: {what}\n--- {} ---\n{}",
            self.port,
            self.log_path().display(),
            self.log_contents()
        )
    }

    /// Starts the process, retrying when a parallel test grabbed the port
    /// between probing it free and redis binding it: on a fresh port unless
    /// `keep_port` (caller-chosen port, or a restart that must keep its URL).
    fn start(&mut self, keep_port: bool) {
        let mut failures = Vec::new();
        for attempt in 0..START_ATTEMPTS {
            if !keep_port && (attempt > 0 || self.port == 0) {
                self.port = free_port();
            }
            match self.launch() {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(f) => {
                    failures.push(format!(
                        "attempt {} (port {}): {}",
                        attempt + 1,
                        self.port,
                        f.reason
                    ));
                    if !f.retryable {
                        break;
                    }
                    if keep_port {
                        // Same port again: give its current holder a moment.
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
        self.fail(&format!("could not start:\n  {}", failures.join("\n  ")));
    }

    /// One start attempt on `self.port`; returns the child once it answers.
    fn launch(&self) -> Result<Child, StartFailure> {
        let log = self.log_path();
        let log_start = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let bin = self.bin.clone().unwrap_or_else(server_binary);
        let mut child = spawn_server(
            Command::new(&bin)
                .arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .arg("--logfile")
                .arg(&log)
                .args(["--daemonize", "no"])
                .args(["--protected-mode", "no"])
                .args(&self.extra),
            &self.stderr_path(),
        );

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let tail = read_from(&log, log_start);
                    return Err(StartFailure {
                        retryable: tail.contains("Address already in use"),
                        reason: format!("exited early with {status}"),
                    });
                }
                Ok(None) => {}
                Err(e) => panic!("try_wait on redis-server: {e}"),
            }
            if let Probe::Up = self.probe(child.id()) {
                return Ok(child);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartFailure {
                    retryable: true,
                    reason: format!("no answer within {STARTUP_TIMEOUT:?}"),
                });
            }
            thread::sleep(PROBE_INTERVAL);
        }
    }

    /// Checks that the process `pid` itself answers: after a lost port race,
    /// another test's server answers PING on "our" port.
    fn probe(&self, pid: u32) -> Probe {
        if self.port == 0 {
            return match self.tls_port {
                Some(tls) => {
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, tls));
                    match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                        Ok(_) => Probe::Up,
                        Err(_) => Probe::NotYet,
                    }
                }
                // Redis refuses to run without listeners; the exit is caught by try_wait.
                None => Probe::NotYet,
            };
        }
        // With a password set, a foreign server fails the AUTH handshake here.
        let Ok(mut con) = self
            .admin_client()
            .get_connection_with_timeout(Duration::from_millis(200))
        else {
            return Probe::NotYet;
        };
        let _ = con.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = con.set_write_timeout(Some(Duration::from_millis(500)));
        match redis::cmd("INFO").arg("server").query::<String>(&mut con) {
            Ok(info) => {
                let answered_pid = info
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|v| v.trim().parse::<u32>().ok());
                if answered_pid == Some(pid) {
                    Probe::Up
                } else {
                    Probe::NotYet
                }
            }
            // Auth configured in a way we cannot see (e.g. ACL args): the
            // server answered, which is all readiness needs.
            Err(e) if e.code() == Some("NOAUTH") => Probe::Up,
            Err(_) => Probe::NotYet,
        }
    }
}

impl Default for RedisServer {
    fn default() -> Self {
        RedisServer::new()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port that was free a moment ago, and never handed out before in this
/// process. Another process may take it before it is used; `RedisServer` retries for
/// exactly that reason. Within one test process the kernel's random pick repeats itself
/// often enough (a repeat in the first few hundred picks) that a test keeping a port free
/// on purpose (a Redis that is down, started later on it) could find a parallel test's
/// server there: so each port is handed out once.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral loopback port")
            .port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// `REDIS_URL` from the environment (with no server), else a throwaway server
/// and its URL; the server must be kept alive as long as the URL is used.
pub fn redis_url_or_spawn() -> (String, Option<RedisServer>) {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => (url, None),
        _ => {
            let server = RedisServer::new();
            (server.url(), Some(server))
        }
    }
}

/// Re-checks `cond` every 2 ms until it holds or `timeout` passes; returns
/// whether it held. Only for state in another process that sends no signal
/// (e.g. a key expiring inside Redis): prefer waiting on a real signal
/// (channel, join handle) whenever the code under test offers one.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// The binary to run: `REDIS_SERVER_BIN` lets CI point at a non-PATH build.
pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER_BIN")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// Which server a binary is, from `<bin> --version` ("Redis server v=6.2.14 ..." or
/// "Valkey server v=8.1.8 ..."): the features a test needs differ between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerKind {
    /// The binary asked.
    pub bin: String,
    /// "Redis" or "Valkey", as the binary names itself.
    pub product: String,
    /// Its own version (Valkey's, not the `redis_version` it also reports).
    pub version: (u32, u32, u32),
}

impl ServerKind {
    /// Asks `bin --version`; panics when the binary cannot be run or its answer is not
    /// understood, since no test of a server feature can then be trusted.
    pub fn of(bin: &str) -> ServerKind {
        let out = Command::new(bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {bin:?} --version: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let parsed = text.split_whitespace().next().zip(
            text.split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .and_then(parse_version),
        );
        let Some((product, version)) = parsed else {
            panic!("{bin:?} --version said {text:?}: not a Redis or Valkey server")
        };
        ServerKind {
            bin: bin.to_owned(),
            product: product.to_owned(),
            version,
        }
    }

    /// Whether this is Valkey (which reports `redis_version:7.2.4` beside its own).
    pub fn is_valkey(&self) -> bool {
        self.product.eq_ignore_ascii_case("valkey")
    }

    /// Redis `major.minor` or later; every Valkey is (it forked from Redis 7.2).
    fn redis_at_least(&self, major: u32, minor: u32) -> bool {
        self.is_valkey() || (self.version.0, self.version.1) >= (major, minor)
    }

    /// `FUNCTION` and `FCALL` (Redis 7.0).
    pub fn has_functions(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// `CLUSTER ADDSLOTSRANGE` (Redis 7.0); before it slots are added one by one.
    pub fn has_slot_ranges(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// A command over several keys of a slot being migrated, some on the source and some
    /// not, gets `TRYAGAIN` from the source (Redis 7.0); before, the source sends it to
    /// the target with `ASK`, as when none is there.
    pub fn tries_again_when_some_keys_are_here(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// The `cluster-port` setting (Redis 7.0); before it the bus is on port + 10000.
    pub fn has_cluster_port(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// `SENTINEL DEBUG`, which shortens a sentinel's periods (Redis 7.0).
    pub fn has_sentinel_debug(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// Whether the binary was built with TLS: one without it refuses `tls-port` (Redis)
    /// or finds no TLS connection type (Valkey) and exits; one with it exits too, for the
    /// missing certificate, which is what is asked for here.
    pub fn has_tls(&self) -> bool {
        let out = Command::new(&self.bin)
            .args([
                "--port",
                "0",
                "--tls-port",
                "1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--daemonize", "no", "--logfile", ""])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", self.bin));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        !(text.contains("Bad directive") || text.contains("Failed finding TLS support"))
    }

    /// "Redis 6.2.14", "Valkey 8.1.8".
    pub fn name(&self) -> String {
        let (a, b, c) = self.version;
        format!("{} {a}.{b}.{c}", self.product)
    }
}

/// `"8.1.8"` as numbers.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// The server the tests run (`REDIS_SERVER_BIN`, else `redis-server`), asked once.
pub fn server_kind() -> &'static ServerKind {
    static KIND: std::sync::OnceLock<ServerKind> = std::sync::OnceLock::new();
    KIND.get_or_init(|| ServerKind::of(&server_binary()))
}

/// Says on stderr that `test` does not run on this server, and why (a feature it lacks):
/// the caller then returns. Only for features the server lacks, never for a behaviour
/// of the library that differs.
pub fn skip(test: &str, lacks: &str) {
    eprintln!(
        "SKIPPED {test}: {} ({}) lacks {lacks}",
        server_kind().name(),
        server_kind().bin
    );
}

/// The words of an ACL rule as the server under test takes it: one without functions
/// (before Redis 7.0) refuses `+fcall` and `+function|load`, and the sharded pub/sub
/// commands of a cluster's rule (`+ssubscribe +sunsubscribe +spublish`), which a user
/// there does not need, so they are left out (docs/servers.md and docs/redis-layout.md
/// say so for users).
pub fn acl_rule_words(rule: &str) -> Vec<&str> {
    let since_7 = [
        "+fcall",
        "+function",
        "+ssubscribe",
        "+sunsubscribe",
        "+spublish",
    ];
    let functions = server_kind().has_functions();
    rule.split_whitespace()
        .filter(|w| functions || !since_7.iter().any(|c| w.starts_with(c)))
        .collect()
}

/// The minimal ACL rule for the default prefix (docs/redis-layout.md, "The ACL").
pub const MINIMAL_ACL_RULE: &str = "on >s3cret-pw resetchannels ~redmutex:* &redmutex:* -@all \
    +fcall +function|load +evalsha +script|load +exists +hget +hmget +hgetall +pttl +subscribe \
    +unsubscribe +publish +ping +wait +hincrby +hset +hexists +pexpire +del +incr +time +type \
    +hkeys +hdel +rpush +lindex +lpop +lrem +lrange +get +set +decr +zadd +zscore +zrem +zcard \
    +zrange +zrangebyscore";

/// Makes (or changes) the ACL user `name` with `rule`, its words as
/// [`acl_rule_words`] leaves them for this server.
pub fn set_acl_user(server: &RedisServer, name: &str, rule: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name);
    for part in acl_rule_words(rule) {
        cmd.arg(part);
    }
    cmd.exec(&mut server.connection()).expect("ACL SETUSER");
}

/// The Redis 6.2 server binary CI provides in `REDIS_6_SERVER_BIN` (6.2 has no functions,
/// so the scripts run there with `EVALSHA`), if it is set.
pub fn redis6_binary() -> Option<String> {
    std::env::var("REDIS_6_SERVER_BIN")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Value of the last `flag value` pair, matching Redis's "last one wins".
fn arg_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.windows(2)
        .rev()
        .find(|w| w[0].eq_ignore_ascii_case(flag))
        .map(|w| w[1].as_str())
}

/// Fails fast on a typo in test setup instead of a confusing startup timeout.
fn parse_port(flag: &str, value: &str) -> u16 {
    value
        .parse()
        .unwrap_or_else(|_| panic!("{flag} {value:?} is not a port number"))
}

/// Log text written since `offset`, so a restart is judged on its own output.
fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(path) {
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_string(&mut text);
        }
    }
    text
}

/// Parses `cmdstat_<name>:calls=N,usec=...` lines of `INFO commandstats`.
/// Calls per command (lowercase name) since the server started, from `INFO commandstats`
/// on `con`: for servers the harness did not start (`REDIS_URL`).
pub fn commandstats(con: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    parse_commandstats(&info)
}

/// The constants line the library puts before every script (`src/runtime/scripting/scripts.rs`'s
/// `constants`): the pickup window and the starvation bound, in ms, here the ones the
/// tests of the scripts by hand were written for.
pub const SCRIPT_CONSTANTS: &str = "local PICKUP, STARVE = 1000, 10\n";

/// A bundled script's text as the library runs it when it can hand a lock on (acquire,
/// release, cancel, kick, force_unlock): the constants, then the queue's rules,
/// `lua/queue.lua`, first. (A lock's acquire and release: `script` is their fast path's
/// file and the rest together, see [`LOCK_ACQUIRE`].)
pub fn queued_script(script: &str) -> String {
    [SCRIPT_CONSTANTS, manifest::QUEUE.text, script].concat()
}

/// A lock's acquire script body for [`queued_script`]: its fast path, then the rest (the
/// library puts the queue's rules between them when it sends it as a script of its own).
pub fn lock_acquire() -> &'static str {
    static TEXT: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| [manifest::ACQUIRE_FAST.text, manifest::ACQUIRE.text].concat());
    &TEXT
}

/// A lock's release script body for [`queued_script`], as [`lock_acquire`].
pub fn lock_release() -> &'static str {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        [
            manifest::LEVELS.text,
            manifest::RELEASE_FAST.text,
            manifest::RELEASE.text,
        ]
        .concat()
    });
    &TEXT
}

/// Script executions in `stats` (`INFO commandstats`): FCALLs of the library's functions,
/// or EVALSHAs where a client runs the scripts as scripts of their own (and EVALs).
/// Before Redis 7.0 a refused call counts too, and `SCRIPT` is one entry (no
/// `script|load`): each EVALSHA refused with NOSCRIPT was followed by one SCRIPT LOAD,
/// which is taken off.
pub fn script_calls(stats: &HashMap<String, u64>) -> u64 {
    let sent: u64 = ["fcall", "evalsha", "eval"]
        .iter()
        .map(|c| stats.get(*c).copied().unwrap_or(0))
        .sum();
    sent - stats.get("script").copied().unwrap_or(0)
}

impl RedisServer {
    /// Script executions so far (see [`script_calls`]).
    pub fn script_calls(&self) -> u64 {
        script_calls(&self.command_calls())
    }

    /// On a server without functions (before Redis 7.0), `SCRIPT LOAD`s every bundled
    /// script, as a client's first call loads them all (the library) on one with them:
    /// the first call of each script is then no NOSCRIPT refusal and load there either,
    /// for tests that count calls. Nothing on other servers.
    pub fn load_scripts(&self) {
        if server_kind().has_functions() {
            return;
        }
        let mut con = self.connection();
        for (_, function) in manifest::functions() {
            let name = function.name;
            redis::Script::new(&script_text(name))
                .prepare_invoke()
                .load(&mut con)
                .unwrap_or_else(|e| self.fail(&format!("SCRIPT LOAD {name}: {e}")));
        }
    }
}

/// The name of the function that runs the bundled script `script` ("acquire",
/// "rw_release", "renew"...: the names `src/runtime/scripting/manifest.rs` gives them), as the
/// clients of this build call it with `FCALL` on the server at `url`: it appears in their
/// requests (which the proxy and MONITOR see) instead of an `EVALSHA`'s SHA-1. Loads the
/// library there, as a client's first call would, so that calls counted afterwards
/// include no load.
///
/// On a server without functions (Redis 6.2) the clients send `EVALSHA <sha1>` instead:
/// the SHA-1 of the script's text, which is returned then (the script loaded there), so
/// that the same tests look for what the requests there carry.
pub fn function_name(url: &str, script: &str) -> String {
    let client = redmutex::Client::open(url).expect("build client");
    client
        .inspect("support:load")
        .expect("inspect, which loads the library");
    let info = url.into_connection_info().expect("valid redis url");
    let mut con = redis::Client::open(info)
        .and_then(|c| c.get_connection())
        .expect("connect");
    loaded_function_name(&mut con, script)
}

/// [`function_name`] on the server `con` is connected to, where a client of this build
/// already ran a script (so loaded the library): a cluster node, which a lone client's
/// first call, as `function_name` makes it, may not reach (`MOVED`).
pub fn loaded_function_name(con: &mut redis::Connection, script: &str) -> String {
    let version = redis_version(con);
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_some_and(|m| m < 7) {
        // Loaded too, as the library would be: calls counted afterwards include no load.
        return load_script(con, script);
    }
    let libraries: Vec<HashMap<String, redis::Value>> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("redmutex_*")
        .query(con)
        .expect("FUNCTION LIST");
    let names: Vec<String> = libraries
        .iter()
        .filter_map(|l| match l.get("library_name") {
            Some(redis::Value::BulkString(name)) => Some(String::from_utf8_lossy(name).into()),
            _ => None,
        })
        .collect();
    assert_eq!(names.len(), 1, "one redmutex library expected: {names:?}");
    format!("{}_{script}", names[0])
}

/// The constants line `src/runtime/scripting/scripts.rs` puts before every script it sends, with the
/// library's own values (`lease::PICKUP`, 1 s; `lease::STARVATION_BOUND`, 2 ms): a script's
/// SHA-1 covers it, so the tests that look for a script's `EVALSHA` find it only while
/// these are the library's (a change there fails them, which is the point).
const LIBRARY_CONSTANTS: &str = "local PICKUP, STARVE = 1000, 2\n";

/// Kills every connection of `con`'s server but `con` itself and those named `spare`
/// (`CLIENT KILL ID`): the calls in flight on them fail with their outcome unknown, and
/// their clients reconnect. Returns how many were killed.
pub fn kill_connections(con: &mut redis::Connection, spare: Option<&str>) -> usize {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query(con)
        .expect("CLIENT ID");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(con)
        .expect("CLIENT LIST");
    let mut killed = 0;
    for line in list.lines() {
        let field = |name: &str| {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        let Some(id) = field("id").and_then(|id| id.parse::<i64>().ok()) else {
            continue;
        };
        if id != me && (spare.is_none() || field("name") != spare) {
            // Gone already (its process killed meanwhile) is fine.
            let done: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query(con);
            killed += usize::from(done.is_ok());
        }
    }
    killed
}

/// The SHA-1 a client that runs `script` with `EVALSHA` names it by (the text it sends,
/// constants first): what its requests carry, on any server.
pub fn script_sha(script: &str) -> String {
    redis::Script::new(&script_text(script))
        .get_hash()
        .to_owned()
}

/// Loads the bundled script `script` (`SCRIPT LOAD`) on the server `con` is connected to,
/// as an `EVALSHA` client does on its first call of it, and returns its SHA-1
/// ([`script_sha`]). A test that delays a script's first `EVALSHA` there loads it first:
/// otherwise the late call finds no script (`NOSCRIPT`) and runs nothing.
pub fn load_script(con: &mut redis::Connection, script: &str) -> String {
    redis::Script::new(&script_text(script))
        .prepare_invoke()
        .load(con)
        .expect("SCRIPT LOAD")
}

/// The text of the bundled script `script` as a script of its own (what `EVALSHA` names
/// by its SHA-1): the constants line, allow_oom.lua for those that must run at the memory
/// limit, its rule files, then its body, as `src/runtime/scripting/manifest.rs` lists them.
fn script_text(script: &str) -> String {
    let text =
        manifest::script_text(script).unwrap_or_else(|| panic!("no bundled script {script:?}"));
    [LIBRARY_CONSTANTS, &text].concat()
}

/// The length of list `key` (a lock's queue, say).
pub fn llen(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("LLEN").arg(key).query(con).expect("LLEN")
}

/// Whether `key` exists.
/// `lock` taken for a fixed `lease`, waiting as long as it takes: how a test sets up a
/// hold that runs out. `what` names the hold if the acquisition fails.
pub fn leased<K: redmutex::Kind>(
    lock: &redmutex::Lock<K>,
    lease: Duration,
    what: &str,
) -> redmutex::LockGuard<K> {
    lock.try_lock_with(redmutex::LockOptions::new().lease(lease))
        .map(Option::unwrap)
        .expect(what)
}

/// The options of a hold for a fixed lease of `ms`, or (`None`) of a watchdog hold: the
/// defaults, with which `try_lock_with` is `lock`.
pub fn lease_or_watchdog(ms: Option<u64>) -> redmutex::LockOptions {
    match ms {
        Some(ms) => redmutex::LockOptions::new().lease(Duration::from_millis(ms)),
        None => redmutex::LockOptions::new(),
    }
}

/// Starts `cmd`, a server binary, with no stdin or stdout and its stderr appended to
/// `stderr_path`: a file rather than null keeps test output quiet without losing argument
/// errors, which Redis prints before its log file exists.
fn spawn_server(cmd: &mut Command, stderr_path: &Path) -> Child {
    let stderr = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr_path)
        .unwrap_or_else(|e| panic!("open {}: {e}", stderr_path.display()));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (set REDIS_SERVER_BIN to override): {e}"))
}

/// A fresh directory for a server process (`what`), removed when dropped.
pub fn temp_dir(what: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("redmutex-{what}-"))
        .tempdir()
        .unwrap_or_else(|e| panic!("create temp dir for {what}: {e}"))
}

/// `result` is the refusal of a call on a name in use by another kind, `in_use`.
pub fn assert_wrong_kind<T: std::fmt::Debug>(result: Result<T, redmutex::Error>, in_use: &str) {
    match result {
        Err(redmutex::Error::WrongKind { in_use: got, .. }) => {
            assert_eq!(got, in_use, "the kind in use")
        }
        other => panic!("expected WrongKind ({in_use} in use), got {other:?}"),
    }
}

/// What `f` returned, and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// The answer of `command key` (`GET`, `PTTL`, `HGETALL`...): a test reading one key
/// straight from Redis.
pub fn query_key<T: redis::FromRedisValue>(
    con: &mut redis::Connection,
    command: &str,
    key: impl redis::ToRedisArgs,
) -> T {
    redis::cmd(command)
        .arg(key)
        .query(con)
        .unwrap_or_else(|e| panic!("{command}: {e}"))
}

pub fn exists(con: &mut redis::Connection, key: impl redis::ToRedisArgs) -> bool {
    redis::cmd("EXISTS").arg(key).query(con).expect("EXISTS")
}

/// Thaws a frozen server when dropped, however the test ends, so a failed assertion
/// cannot leave it stopped.
pub struct Thaw<'a>(pub &'a RedisServer);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

/// A primary that starts a replica's sync at once instead of waiting 5 s for others.
pub fn primary() -> RedisServer {
    RedisServer::with_args(&["--repl-diskless-sync-delay", "0"])
}

/// A replica of `primary`, returned once writes stream to it: the replica has read a
/// value written after its sync. (`INFO` and `WAIT` can look ready earlier: after a
/// diskless sync the primary streams only from the replica's first ACK.)
pub fn synced_replica(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    let replica = RedisServer::with_args(&["--replicaof", "127.0.0.1", &port]);
    let (mut p, mut r) = (primary.connection(), replica.connection());
    assert!(
        wait_until(Duration::from_secs(10), || {
            let n: i64 = redis::cmd("INCR").arg("probe").query(&mut p).unwrap();
            let seen: Option<i64> = redis::cmd("GET").arg("probe").query(&mut r).unwrap();
            seen == Some(n)
                || wait_until(Duration::from_millis(100), || {
                    redis::cmd("GET")
                        .arg("probe")
                        .query::<Option<i64>>(&mut r)
                        .unwrap()
                        == Some(n)
                })
        }),
        "the replica never synced"
    );
    replica
}

/// Blocks until `client`'s pub/sub connection listens on its own channel
/// (`<prefix>__control:<client id>`), which a client subscribes on a thread of its own
/// once it first holds or waits: a count of commands that starts after this counts the
/// calls' own traffic only.
pub fn await_own_channel(server: &RedisServer, prefix: &str, client: &redmutex::Client) {
    let own = keys::control_channel(prefix, client);
    assert!(
        wait_until(Duration::from_secs(10), || {
            subscribers(&mut server.connection(), &own) == 1
        }),
        "the client never subscribed {own}"
    );
}

/// How many subscriptions there are to channels starting with `prefix` (a lock's
/// channels are `<key>:to:<client id>`, one per client waiting on it).
pub fn subscribers(con: &mut redis::Connection, prefix: impl AsRef<[u8]>) -> i64 {
    counted(con, prefix.as_ref(), "CHANNELS", "NUMSUB").expect("PUBSUB CHANNELS")
}

/// The sharded subscriptions (`SSUBSCRIBE`) of channels starting with `prefix` on the
/// node `con` reaches: a cluster's waiters listen so on Redis 7.0 and later and Valkey.
/// None before 7.0, which has no sharded pub/sub.
pub fn shard_subscribers(con: &mut redis::Connection, prefix: impl AsRef<[u8]>) -> i64 {
    counted(con, prefix.as_ref(), "SHARDCHANNELS", "SHARDNUMSUB").unwrap_or(0)
}

/// The subscriptions of the channels starting with `prefix` that `PUBSUB <list>` names, as
/// `PUBSUB <count>` counts them; `Err` when the server refuses the listing.
fn counted(
    con: &mut redis::Connection,
    prefix: &[u8],
    list: &str,
    count: &str,
) -> redis::RedisResult<i64> {
    let mut pattern = prefix.to_vec();
    pattern.push(b'*');
    let channels: Vec<Vec<u8>> = redis::cmd("PUBSUB").arg(list).arg(pattern).query(con)?;
    if channels.is_empty() {
        return Ok(0);
    }
    let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg(count)
        .arg(&channels)
        .query(con)
        .unwrap_or_else(|e| panic!("PUBSUB {count}: {e}"));
    Ok(counts
        .chunks(2)
        .map(|pair| match pair.get(1) {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        })
        .sum())
}

/// The `redis_version` line of `INFO server` on `con`. On Valkey, which reports the Redis version it is compatible with, its own follows:
/// "7.2.4 (Valkey 8.1.8)".
pub fn redis_version(con: &mut redis::Connection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(con)
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    let redis = field("redis_version").unwrap_or_else(|| "?".to_owned());
    match field("valkey_version") {
        Some(valkey) => format!("{redis} (Valkey {valkey})"),
        None => redis,
    }
}

fn parse_commandstats(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_ascii_lowercase(), calls))
        })
        .collect()
}

/// Where a [`Monitor`] puts each line it receives: `<time> [<db> <client>] "cmd" "arg" ...`
/// (commands run by scripts show as `[<db> lua]`).
pub trait Sink: Send + 'static {
    /// Takes one line.
    fn line(&mut self, line: &str);
}

/// Keeps every line.
impl Sink for Vec<String> {
    fn line(&mut self, line: &str) {
        self.push(line.to_owned());
    }
}

/// Every command a server receives while it runs, from `MONITOR` on a connection of its
/// own, fed to a [`Sink`]: for counting round trips. Commands that scripts run show up
/// too, marked `[<db> lua]`; [`Monitor::top_level`] leaves them out. Stopping is exact:
/// every command that completed before [`stop`](Monitor::stop) was called is in.
pub struct Monitor<S: Sink = Vec<String>> {
    url: String,
    // Echoed on another connection to end the recording: MONITOR shows it after every
    // command Redis ran before it.
    marker: String,
    reader: Option<thread::JoinHandle<S>>,
}

impl<S: Sink> Monitor<S> {
    /// Starts recording into `sink`; returns once the server confirmed `MONITOR`, so every
    /// command sent after this call is recorded. `url` may carry a password.
    pub fn start(url: &str, mut sink: S) -> Monitor<S> {
        let mut con = redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("MONITOR connection");
        // Blocking reads: the marker ends the recording, and a read timeout could drop the
        // line arriving as it fires.
        con.set_read_timeout(None).expect("read timeout");
        con.send_packed_command(&redis::cmd("MONITOR").get_packed_command())
            .expect("send MONITOR");
        let ok = con.recv_response().expect("MONITOR reply");
        assert_eq!(ok, redis::Value::Okay, "MONITOR refused");
        let marker = format!(
            "redmutex-monitor-stop:{}:{:?}",
            std::process::id(),
            Instant::now()
        );
        let end = marker.clone();
        let reader = thread::spawn(move || loop {
            match con.recv_response() {
                Ok(redis::Value::SimpleString(line)) if line.contains(&end) => return sink,
                Ok(redis::Value::SimpleString(line)) => sink.line(&line),
                Ok(other) => panic!("unexpected MONITOR output {other:?}"),
                Err(e) => panic!("MONITOR failed: {e}"),
            }
        });
        Monitor {
            url: url.to_owned(),
            marker,
            reader: Some(reader),
        }
    }

    /// Stops recording and returns the sink.
    pub fn stop(mut self) -> S {
        self.end();
        self.reader
            .take()
            .expect("stopped once")
            .join()
            .expect("MONITOR reader")
    }

    fn end(&self) -> bool {
        // Without `CLIENT SETINFO`: servers that know it (Redis 7.2, Valkey) would show it
        // in the recording, as commands no client under test sent.
        let info = match self.url.as_str().into_connection_info() {
            Ok(info) => info,
            Err(_) => return false,
        };
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        redis::Client::open(info.set_redis_settings(settings))
            .and_then(|c| c.get_connection())
            .and_then(|mut con| redis::cmd("ECHO").arg(&self.marker).exec(&mut con))
            .is_ok()
    }
}

impl Monitor {
    /// The lines of commands that clients sent (not run by a script): round trips of the
    /// operations under test. A new connection's `CLIENT SETINFO` (which redis-rs sends and
    /// Valkey and Redis 7.2+ record) is not one: a client's pool may open a connection in
    /// any window, e.g. when a renewal finds every pooled connection busy on a loaded
    /// machine (seen on Valkey: "commands besides the release: [.. CLIENT SETINFO
    /// LIB-NAME ..]").
    pub fn top_level(lines: &[String]) -> Vec<&String> {
        lines
            .iter()
            .filter(|l| !l.contains(" lua] ") && !l.contains(r#""CLIENT" "SETINFO""#))
            .collect()
    }
}

impl<S: Sink> Drop for Monitor<S> {
    fn drop(&mut self) {
        // Not stopped (a failing test): let the reader thread end.
        if self.reader.is_some() {
            self.end();
        }
    }
}

impl RedisServer {
    /// Starts recording every command this server receives (see [`Monitor`]).
    pub fn monitor(&self) -> Monitor {
        let url = match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}/", self.port),
            None => self.url(),
        };
        Monitor::start(&url, Vec::new())
    }
}
