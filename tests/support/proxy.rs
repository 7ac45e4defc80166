//! A TCP proxy in front of a redis-server that can lose one reply on purpose: it forwards
//! a request, swallows the server's answer and closes the client's connection, as when a
//! network fails between Redis executing a command and the client reading the reply.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    // The next request containing these bytes loses its reply.
    trap: Mutex<Option<Vec<u8>>>,
    dropped: AtomicUsize,
    stop: AtomicBool,
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `127.0.0.1:upstream_port`.
    pub fn new(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            trap: Mutex::new(None),
            dropped: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream_port)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                pipe(client, server, s.clone());
            }
        });
        FaultProxy { port, shared }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Arms the trap: the next request whose bytes contain `marker` is executed by Redis,
    /// but its reply never reaches the client, whose connection is closed instead.
    pub fn lose_next_reply_to(&self, marker: &str) {
        *self.shared.trap.lock().unwrap() = Some(marker.as_bytes().to_vec());
    }

    /// Replies lost so far.
    pub fn lost_replies(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

fn pipe(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let swallow = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let trap_hit = swallow.clone();
    let s = shared.clone();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = c_in.read(&mut buf) {
            if n == 0 || s.stop.load(Ordering::SeqCst) {
                break;
            }
            let chunk = &buf[..n];
            {
                let mut trap = s.trap.lock().unwrap();
                if trap
                    .as_ref()
                    .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m.as_slice()))
                {
                    *trap = None;
                    trap_hit.store(true, Ordering::SeqCst);
                }
            }
            if s_out.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Both);
    });
    let (mut s_in, mut c_out) = (server, client);
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = s_in.read(&mut buf) {
            if n == 0 {
                break;
            }
            if swallow.load(Ordering::SeqCst) {
                shared.dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = s_in.shutdown(Shutdown::Both);
    });
}
