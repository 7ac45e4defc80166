//! Smoke tests for the `redis-server` test harness itself.

mod support;

use std::collections::HashSet;

use support::RedisServer;

#[test]
fn spawned_server_answers_ping() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    assert!(server.url().ends_with(&format!(":{}/", server.port())));
}

#[test]
fn restart_keeps_port_and_loses_data() {
    let mut server = RedisServer::new();
    let (port, pid) = (server.port(), server.pid());
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut server.connection())
        .unwrap();

    server.restart();

    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid);
    let value: Option<String> = support::query_key(&mut server.connection(), "GET", "k");
    assert_eq!(value, None);
}

#[test]
fn parallel_servers_get_distinct_ports() {
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::new()).collect();
    let ports: HashSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        let pong: String = redis::cmd("PING").query(&mut server.connection()).unwrap();
        assert_eq!(pong, "PONG");
    }
}

#[test]
fn command_calls_counts_ping() {
    let server = RedisServer::new();
    let before = server.command_calls();
    let _: String = redis::cmd("PING").query(&mut server.connection()).unwrap();
    let after = server.command_calls();
    let delta = after.get("ping").copied().unwrap_or(0) - before.get("ping").copied().unwrap_or(0);
    assert!(delta >= 1, "ping delta {delta}: {after:?}");
    assert!(server.total_calls() > before.values().sum::<u64>());
}

/// A test that keeps a port free on purpose (a Redis that is down, started later on the
/// same port) must not see another test's server come up on it: within one test process,
/// `free_port` never hands out a port twice. (`lock::building_while_redis_is_down…` once
/// found its "down" port answered by a parallel test's server.) The kernel picks an
/// ephemeral port at random, so 2,000 picks repeat one nearly always without that rule.
#[test]
fn free_ports_are_never_handed_out_twice() {
    let mut seen = HashSet::new();
    for i in 0..2_000 {
        let port = support::free_port();
        assert!(
            seen.insert(port),
            "port {port} handed out again at pick {i}"
        );
    }
}
