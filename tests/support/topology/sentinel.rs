//! One `redis-server --sentinel` process ([`Sentinel`]), owned by a topology.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::panic;
use std::process::{Child, Command};
use std::thread;
use std::time::Instant;

use super::super::free_port;
use super::{answers_as, connect, signal};

/// A `redis-server <conf> --sentinel` child process owned by one topology.
///
/// Dropping it SIGKILLs and reaps the process and then removes its directory (config
/// file, which the sentinel rewrites as it learns, and log).
#[derive(Debug)]
pub struct Sentinel {
    /// `None` once killed, so a reaped pid is never signalled.
    child: Option<Child>,
    pid: u32,
    pub(super) port: u16,
    /// Declared last: removed after the process is dead.
    dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a sentinel whose config is the harness's lines plus `body` (the
    /// `sentinel monitor ...` lines); retries on another port when a parallel test took
    /// the one probed free.
    pub(super) fn spawn(body: &str) -> Sentinel {
        let dir = super::super::temp_dir("sentinel");
        let mut sentinel = Sentinel {
            child: None,
            pid: 0,
            port: 0,
            dir,
        };
        let mut failures = Vec::new();
        for attempt in 1..=super::super::START_ATTEMPTS {
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
        let mut child = super::super::spawn_server(
            Command::new(super::super::server_binary())
                .arg(&conf)
                .arg("--sentinel"),
            &self.dir.path().join("stderr.log"),
        );
        let deadline = Instant::now() + super::super::STARTUP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let tail = super::super::read_from(&log, log_start);
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
                    format!("no answer within {:?}", super::super::STARTUP_TIMEOUT),
                ));
            }
            thread::sleep(super::super::PROBE_INTERVAL);
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
        connect(self.port, super::super::ADMIN_IO_TIMEOUT).unwrap_or_else(|e| {
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
