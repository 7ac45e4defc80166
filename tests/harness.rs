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
