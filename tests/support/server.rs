//! The `redis-server` child process a test owns: ports, start, restart, stop, freeze.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;

use super::parse_commandstats;

/// How long one start attempt may take before the server counts as hung.
pub(super) const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between readiness probes; only process startup is being waited on.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// Start attempts before giving up; a port lost to a parallel test costs one.
pub(super) const START_ATTEMPTS: usize = 5;
/// Read/write timeout of admin connections, so a frozen server fails a test
/// instead of hanging it.
pub(super) const ADMIN_IO_TIMEOUT: Duration = Duration::from_secs(5);

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
    pub(super) port: u16,
    /// TLS port given through `--tls-port`, probed when there is no plain port.
    tls_port: Option<u16>,
    /// Password from `--requirepass`, so admin connections can authenticate.
    pub(super) password: Option<String>,
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
    pub(super) fn fail(&self, what: &str) -> ! {
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

/// The binary to run: `REDIS_SERVER_BIN` lets CI point at a non-PATH build.
pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER_BIN")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
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
pub(super) fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(path) {
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_string(&mut text);
        }
    }
    text
}

/// Starts `cmd`, a server binary, with no stdin or stdout and its stderr appended to
/// `stderr_path`: a file rather than null keeps test output quiet without losing argument
/// errors, which Redis prints before its log file exists.
pub(super) fn spawn_server(cmd: &mut Command, stderr_path: &Path) -> Child {
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

/// Thaws a frozen server when dropped, however the test ends, so a failed assertion
/// cannot leave it stopped.
pub struct Thaw<'a>(pub &'a RedisServer);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}
