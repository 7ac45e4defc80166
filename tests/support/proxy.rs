//! A TCP proxy in front of a redis-server that injects faults into the client → server
//! direction, chosen by a marker (bytes the request must contain, e.g. a script's SHA1 or a
//! channel name):
//!
//! - lose a reply: the request is executed by Redis, but its answer is swallowed and the
//!   client's connection closed, as when a network fails between Redis executing a command
//!   and the client reading the reply ([`FaultProxy::lose_next_reply_to`]);
//! - fail a request: it never reaches Redis, the proxy answers it with an error of its own
//!   ([`FaultProxy::fail_next_request_with`]);
//! - delay requests: they reach Redis late, as over a slow link
//!   ([`FaultProxy::delay_requests_containing`]);
//! - delay replies and pushed messages (server → client), e.g. pub/sub messages that reach
//!   a subscriber late ([`FaultProxy::delay_replies_containing`]);
//! - shift the server's time a grant message carries, as if another server whose clock
//!   is ahead had made it ([`FaultProxy::shift_grant_times`]).
//!
//! Every marker given to one of these (or to [`FaultProxy::watch`]) is counted, when a
//! request containing it is read from the client ([`FaultProxy::seen`]) and when it has been
//! handed to Redis ([`FaultProxy::forwarded`]), so tests can wait for an event instead of
//! sleeping. One request is one read of the client's socket: redis-rs writes a command in a
//! single write, which is all the markers rely on.
//!
//! Each connection is served by two threads of its own, so a delayed connection never holds
//! up another one, and requests of one connection keep their order. Dropping the proxy
//! closes every connection and joins every thread.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    rules: Mutex<Rules>,
    // Notified whenever a counter changes, and when the proxy stops.
    changed: Condvar,
    dropped: AtomicUsize,
    failed: AtomicUsize,
    stop: AtomicBool,
    // The server's port; 0 until it is known (`FaultProxy::reserve`), while connections
    // are closed as soon as they are accepted.
    upstream: AtomicU16,
    next_conn: AtomicU64,
    // Every live connection's two sockets, shut down when the proxy is dropped.
    conns: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct Rules {
    // The next request containing these bytes loses its reply.
    lose: Option<Vec<u8>>,
    // The next request containing the marker is answered with the reply, not forwarded.
    fail: Option<(Vec<u8>, Vec<u8>)>,
    // Requests containing a marker are held back that long.
    delays: Vec<(Vec<u8>, Duration)>,
    // Server → client chunks containing a marker are held back that long.
    reply_delays: Vec<(Vec<u8>, Duration)>,
    // Grant messages in server → client chunks containing a marker carry a server time
    // later by that many ms.
    grant_shifts: Vec<(Vec<u8>, u64)>,
    shifted: usize,
    watches: Vec<Watch>,
}

struct Watch {
    marker: Vec<u8>,
    seen: usize,
    forwarded: usize,
}

/// What the client → server pump does with one request.
enum Action {
    Forward { delay: Duration, swallow: bool },
    Answer(Vec<u8>),
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Rules {
    fn watch(&mut self, marker: &[u8]) {
        if !self.watches.iter().any(|w| w.marker == marker) {
            self.watches.push(Watch {
                marker: marker.to_vec(),
                seen: 0,
                forwarded: 0,
            });
        }
    }

    fn counts(&self, marker: &[u8]) -> (usize, usize) {
        self.watches
            .iter()
            .find(|w| w.marker == marker)
            .map_or((0, 0), |w| (w.seen, w.forwarded))
    }

    /// Counts `chunk` as seen and decides what to do with it.
    fn on_request(&mut self, chunk: &[u8]) -> Action {
        for w in &mut self.watches {
            if contains(chunk, &w.marker) {
                w.seen += 1;
            }
        }
        if self.fail.as_ref().is_some_and(|(m, _)| contains(chunk, m)) {
            let (_, reply) = self.fail.take().expect("checked above");
            return Action::Answer(reply);
        }
        let swallow = self.lose.as_ref().is_some_and(|m| contains(chunk, m));
        if swallow {
            self.lose = None;
        }
        let delay = self
            .delays
            .iter()
            .filter(|(m, _)| contains(chunk, m))
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default();
        Action::Forward { delay, swallow }
    }

    /// How long a server → client chunk is held back: a marker in it, or one that began in
    /// `before` (the end of what was passed on) and ends in it.
    fn reply_delay(&self, before: &[u8], chunk: &[u8]) -> Duration {
        self.reply_delays
            .iter()
            .filter(|(m, _)| {
                // At most all but one byte of the marker from before: a marker wholly in
                // what was passed on already was dealt with then.
                let keep = before.len().min(m.len().saturating_sub(1));
                contains(&[&before[before.len() - keep..], chunk].concat(), m)
            })
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default()
    }

    /// Moves the server time of each grant message (`g <token> <ticket> <fence> <ms>`) in
    /// `chunk` later by the shift of a marker the chunk contains. The digits are rewritten
    /// in place (a shift that would change their number is not made), so the message's
    /// length stays as the server wrote it.
    fn shift_grants(&mut self, chunk: &mut [u8]) {
        let Some(shift) = self
            .grant_shifts
            .iter()
            .filter(|(m, _)| contains(chunk, m))
            .map(|(_, s)| *s)
            .max()
        else {
            return;
        };
        let mut from = 0;
        while let Some(at) = find(&chunk[from..], b"\r\ng ") {
            let start = from + at + 2;
            let Some(len) = find(&chunk[start..], b"\r\n") else {
                return;
            };
            let end = start + len;
            from = end;
            let fields: Vec<&[u8]> = chunk[start..end].split(|&b| b == b' ').collect();
            if fields.len() != 5 {
                continue;
            }
            let digits = fields[4].to_vec();
            let Some(ms) = std::str::from_utf8(&digits)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            let moved = (ms + shift).to_string();
            if moved.len() == digits.len() {
                chunk[end - digits.len()..end].copy_from_slice(moved.as_bytes());
                self.shifted += 1;
            }
        }
    }

    fn on_forwarded(&mut self, chunk: &[u8]) {
        for w in &mut self.watches {
            if contains(chunk, &w.marker) {
                w.forwarded += 1;
            }
        }
    }
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `127.0.0.1:upstream_port`.
    pub fn new(upstream_port: u16) -> FaultProxy {
        let proxy = FaultProxy::reserve();
        proxy.forward_to(upstream_port);
        proxy
    }

    /// A proxy on a free loopback port that forwards nowhere yet: its port is known before
    /// the server's, for a server that must be told it (a cluster node announcing the
    /// proxy's address, see `topology::ClusterBuilder::through_proxies`). Connections
    /// made before [`forward_to`](Self::forward_to) are closed at once.
    pub fn reserve() -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            rules: Mutex::new(Rules::default()),
            changed: Condvar::new(),
            dropped: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            upstream: AtomicU16::new(0),
            next_conn: AtomicU64::new(0),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let acceptor = thread::Builder::new()
            .name("fault-proxy-accept".to_owned())
            .spawn(move || {
                for client in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let upstream_port = s.upstream.load(Ordering::SeqCst);
                    if upstream_port == 0 {
                        continue;
                    }
                    let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream_port))
                    else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    pipe(client, server, &s);
                }
            })
            .expect("spawn the proxy's accept thread");
        FaultProxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// From now on, connections made to the proxy go to `127.0.0.1:upstream_port`.
    pub fn forward_to(&self, upstream_port: u16) {
        self.shared.upstream.store(upstream_port, Ordering::SeqCst);
    }

    /// The proxy's own (loopback) port.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Arms the trap: the next request whose bytes contain `marker` is executed by Redis,
    /// but its reply never reaches the client, whose connection is closed instead.
    pub fn lose_next_reply_to(&self, marker: &str) {
        let mut rules = self.shared.lock();
        rules.watch(marker.as_bytes());
        rules.lose = Some(marker.as_bytes().to_vec());
    }

    /// Replies lost so far.
    pub fn lost_replies(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// The next request containing `marker` never reaches Redis: the proxy answers the
    /// client itself with `reply`, raw RESP such as `"-ERR injected\r\n"`.
    pub fn fail_next_request_with(&self, marker: &str, reply: &str) {
        let mut rules = self.shared.lock();
        rules.watch(marker.as_bytes());
        rules.fail = Some((marker.as_bytes().to_vec(), reply.as_bytes().to_vec()));
    }

    /// Requests answered by the proxy so far ([`fail_next_request_with`](Self::fail_next_request_with)).
    pub fn failed_requests(&self) -> usize {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// From now on, requests containing `marker` reach Redis `delay` after the client sent
    /// them. Later requests of the same connection wait behind a delayed one (order is
    /// kept); other connections are not held up. `Duration::ZERO` lifts the delay.
    pub fn delay_requests_containing(&self, marker: &str, delay: Duration) {
        let mut rules = self.shared.lock();
        rules.watch(marker.as_bytes());
        rules.delays.retain(|(m, _)| m != marker.as_bytes());
        if !delay.is_zero() {
            rules.delays.push((marker.as_bytes().to_vec(), delay));
        }
    }

    /// From now on, what the server sends that contains `marker` (a reply, a pub/sub
    /// message) reaches the client `delay` late; what follows on that connection waits
    /// behind it. `Duration::ZERO` lifts the delay for chunks read from then on.
    pub fn delay_replies_containing(&self, marker: &str, delay: Duration) {
        let mut rules = self.shared.lock();
        rules.reply_delays.retain(|(m, _)| m != marker.as_bytes());
        if !delay.is_zero() {
            rules.reply_delays.push((marker.as_bytes().to_vec(), delay));
        }
    }

    /// From now on, each grant message (`g <token> <ticket> <fence> <server ms>`) the server
    /// sends in a chunk containing `marker` (a waiter's channel) carries a server time
    /// `shift` later, as if a server whose clock is that much ahead had made the grant.
    /// `Duration::ZERO` lifts it.
    pub fn shift_grant_times(&self, marker: &str, shift: Duration) {
        let mut rules = self.shared.lock();
        rules.grant_shifts.retain(|(m, _)| m != marker.as_bytes());
        if !shift.is_zero() {
            rules
                .grant_shifts
                .push((marker.as_bytes().to_vec(), shift.as_millis() as u64));
        }
    }

    /// Grant messages whose server time was shifted so far.
    pub fn shifted_grants(&self) -> usize {
        self.shared.lock().shifted
    }

    /// Starts counting requests containing `marker` (the fault-injecting methods count
    /// their markers already).
    pub fn watch(&self, marker: &str) {
        self.shared.lock().watch(marker.as_bytes());
    }

    /// Requests containing a watched `marker` read from clients so far (before any delay).
    pub fn seen(&self, marker: &str) -> usize {
        self.shared.lock().counts(marker.as_bytes()).0
    }

    /// Requests containing a watched `marker` handed to Redis so far (after any delay).
    pub fn forwarded(&self, marker: &str) -> usize {
        self.shared.lock().counts(marker.as_bytes()).1
    }

    /// Blocks until at least `n` requests containing the watched `marker` were seen;
    /// false if that did not happen within `timeout`.
    pub fn wait_seen(&self, marker: &str, n: usize, timeout: Duration) -> bool {
        self.shared
            .wait_for(timeout, |rules| rules.counts(marker.as_bytes()).0 >= n)
    }

    /// Blocks until at least `n` requests containing the watched `marker` were handed to
    /// Redis; false if that did not happen within `timeout`.
    pub fn wait_forwarded(&self, marker: &str, n: usize, timeout: Duration) -> bool {
        self.shared
            .wait_for(timeout, |rules| rules.counts(marker.as_bytes()).1 >= n)
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("upstream", &self.shared.upstream.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until `done` holds (true), looked at on every change, or `timeout` passed
    /// (false).
    fn wait_for(&self, timeout: Duration, mut done: impl FnMut(&Rules) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut rules = self.lock();
        loop {
            if done(&rules) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            rules = self
                .changed
                .wait_timeout(rules, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sleeps for `delay` unless the proxy stops first; false when it stopped.
    fn hold_back(&self, delay: Duration) -> bool {
        !self.wait_for(delay, |_| self.stop.load(Ordering::SeqCst))
    }

    fn forget(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(c, _, _)| *c != id);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            // Wakes delayed requests, under the lock so that no sleeper misses it.
            let _rules = self.shared.lock();
            self.shared.changed.notify_all();
        }
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // No new connection can appear now: close the live ones, which ends their pumps.
        for (_, client, server) in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
    }
}

fn pipe(client: TcpStream, server: TcpStream, shared: &Arc<Shared>) {
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let (Ok(c_keep), Ok(s_keep)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (Ok(c_in), Ok(s_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    shared
        .conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, c_keep, s_keep));
    // Both pumps write to the client: the one below when the proxy answers a request itself.
    let c_out = Arc::new(Mutex::new(client));
    let swallow = Arc::new(AtomicBool::new(false));

    let (s, out, trap_hit) = (shared.clone(), c_out.clone(), swallow.clone());
    let up = thread::Builder::new()
        .name("fault-proxy-up".to_owned())
        .spawn(move || {
            pump_requests(c_in, s_out, &s, &out, &trap_hit);
            s.forget(id);
        });
    let s = shared.clone();
    let down = thread::Builder::new()
        .name("fault-proxy-down".to_owned())
        .spawn(move || pump_replies(server, &c_out, &s, &swallow));
    let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
    // Finished pumps need no join later: keep the list short on long tests.
    threads.retain(|t| !t.is_finished());
    threads.extend(up.ok());
    threads.extend(down.ok());
}

fn pump_requests(
    mut c_in: TcpStream,
    mut s_out: TcpStream,
    shared: &Shared,
    c_out: &Mutex<TcpStream>,
    trap_hit: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = c_in.read(&mut buf) {
        if n == 0 || shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let chunk = &buf[..n];
        let action = {
            let mut rules = shared.lock();
            let action = rules.on_request(chunk);
            shared.changed.notify_all();
            action
        };
        match action {
            Action::Answer(reply) => {
                shared.failed.fetch_add(1, Ordering::SeqCst);
                let mut out = c_out.lock().unwrap_or_else(|e| e.into_inner());
                if out.write_all(&reply).is_err() {
                    break;
                }
            }
            Action::Forward { delay, swallow } => {
                if !delay.is_zero() && !shared.hold_back(delay) {
                    break;
                }
                if swallow {
                    trap_hit.store(true, Ordering::SeqCst);
                }
                if s_out.write_all(chunk).is_err() {
                    break;
                }
                let mut rules = shared.lock();
                rules.on_forwarded(chunk);
                shared.changed.notify_all();
            }
        }
    }
    let _ = s_out.shutdown(Shutdown::Both);
    let _ = c_in.shutdown(Shutdown::Both);
}

/// The longest reply marker looked for across two pieces of a reply (see `pump_replies`);
/// the tests' markers are a few dozen bytes.
const REPLY_MARKER_MAX: usize = 256;

fn pump_replies(
    mut s_in: TcpStream,
    c_out: &Mutex<TcpStream>,
    shared: &Shared,
    swallow: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    // The end of the bytes already passed on: a reply may reach the proxy in pieces (seen
    // with Redis 6.2, which sent a transaction's replies in two writes), so a marker is
    // looked for across the boundary too, and the piece that completes it is held back.
    let mut tail: Vec<u8> = Vec::new();
    while let Ok(n) = s_in.read(&mut buf) {
        if n == 0 {
            break;
        }
        if swallow.load(Ordering::SeqCst) {
            shared.dropped.fetch_add(1, Ordering::SeqCst);
            break;
        }
        let delay = {
            let mut rules = shared.lock();
            rules.shift_grants(&mut buf[..n]);
            rules.reply_delay(&tail, &buf[..n])
        };
        tail = [tail.as_slice(), &buf[..n]].concat();
        tail.drain(..tail.len().saturating_sub(REPLY_MARKER_MAX));
        if !delay.is_zero() && !shared.hold_back(delay) {
            break;
        }
        let mut out = c_out.lock().unwrap_or_else(|e| e.into_inner());
        if out.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let out = c_out.lock().unwrap_or_else(|e| e.into_inner());
    let _ = out.shutdown(Shutdown::Both);
    let _ = s_in.shutdown(Shutdown::Both);
}
