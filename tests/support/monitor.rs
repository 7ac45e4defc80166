//! `Monitor`: every command a server receives, recorded through `MONITOR`.

use std::thread;
use std::time::Instant;

use redis::IntoConnectionInfo;

use super::RedisServer;

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
