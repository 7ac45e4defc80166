//! The lease loss the logging tests (tests/log_facade*.rs) provoke: a watchdog hold
//! force-unlocked by another client, found lost by its guard, then dropped (a release
//! that finds nothing must not say the loss again). Included by path: only those binaries
//! use it.

use std::time::Duration;

use redmutex::Client;

use super::support::clients::Clients;
use super::support::RedisServer;

/// The lock's name: unique to these tests, so that what mentions it is theirs.
pub const NAME: &str = "facade-lost";

/// Holds `NAME` with the watchdog, has another client force-unlock it, waits until the
/// guard says it is lost, drops the guard and lets a renewal round pass. Returns the
/// server and the clients, to be dropped once what was said is read (the clients' threads
/// would say the server went away).
pub fn lose_a_lease(prefix: &'static str) -> (RedisServer, Client, Client) {
    let clients = Clients::new(prefix)
        .watchdog(Duration::from_millis(900))
        .command(Duration::from_millis(300));
    let (server, holder) = clients.serve();
    let other = clients.at(&server);
    let guard = holder.lock(NAME).lock().expect("acquire");
    let lost = guard.lost();
    assert!(other.lock(NAME).force_unlock().expect("force_unlock"));
    let told = lost.recv_timeout(Duration::from_secs(5));
    assert!(told.is_ok(), "told of the loss: {told:?}");
    assert!(guard.is_lease_lost());
    drop(guard);
    // A renewal round (every 300 ms) and the loss thread have had their say.
    std::thread::sleep(Duration::from_millis(700));
    (server, holder, other)
}
