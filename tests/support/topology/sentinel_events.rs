//! What the sentinels announce: their events, logged by a listener per sentinel.

use super::connect;
use std::net::SocketAddr;
use std::panic;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

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
pub(super) struct EventLog {
    pub(super) events: Mutex<Vec<SentinelEvent>>,
    pub(super) changed: Condvar,
}

impl EventLog {
    fn push(&self, event: SentinelEvent) {
        self.events.lock().unwrap().push(event);
        self.changed.notify_all();
    }

    /// Waits (on the events, no polling) until `found` returns something or `deadline`.
    pub(super) fn wait_for<T>(
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
    pub(super) fn wait_past(&self, seen: usize, deadline: Instant) -> usize {
        self.wait_for(deadline, |events| {
            (events.len() > seen).then_some(events.len())
        })
        .unwrap_or_else(|| self.events.lock().unwrap().len())
    }
}

/// Subscribes to every event of the sentinel on `port` from a thread of its own, and
/// returns once the subscription is confirmed. The thread ends when the sentinel's
/// connection closes (the sentinel was killed); dropping `done` tells the topology so.
pub(super) fn listen(index: usize, port: u16, log: &Arc<EventLog>, done: mpsc::Sender<()>) {
    let log = Arc::clone(log);
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    thread::Builder::new()
        .name(format!("sentinel-{port}-events"))
        .spawn(move || {
            let _done = done;
            let subscribed = connect(port, super::super::ADMIN_IO_TIMEOUT).and_then(|con| {
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
