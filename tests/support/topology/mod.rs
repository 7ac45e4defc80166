//! Multi-process Redis deployments for the tests: a primary with replicas watched by
//! sentinels ([`Sentinels`]) and a Redis Cluster ([`Cluster`]).
//!
//! Everything is built from the Debian `redis-server` binary (or `REDIS_SERVER_BIN`):
//! data nodes are ordinary [`RedisServer`]s (free loopback port, no persistence, own
//! temporary directory, SIGKILLed on drop), sentinels are `redis-server <conf>
//! --sentinel` processes owned the same way ([`Sentinel`]). Every topology picks its own
//! ports and, for Sentinel, its own service name, so any number of them can run at once
//! in one test binary.
//!
//! Waiting: a Sentinel failover is awaited on the sentinels' own `+switch-master`
//! events (a listener per sentinel, subscribed before the topology is handed out). What
//! Redis announces nowhere (replicas in sync, a cluster agreeing on its slots, a cluster
//! replica promoted) is polled every [`POLL`] against a deadline.
//!
//! Timing knobs, chosen so that a failover takes a few seconds (measured figures are
//! printed by `tests/harness_topology.rs`):
//! - sentinels: `down-after-milliseconds` 1000 (2000 before Redis 7.0) and
//!   `failover-timeout` 3000 by default ([`SentinelsBuilder`]), and `SENTINEL DEBUG
//!   info-period 100 publish-period 200 ask-period 100` (Redis 7's test knobs: faster
//!   discovery of replicas and of the other sentinels, and faster agreement that the
//!   primary is down), and `ping-period` half of down-after, within 300–1000 ms. Why
//!   that: a sentinel reconnects a link at most once per ping period, so with the
//!   default 1 s it calls a just-promoted primary down for a moment after switching to
//!   it (its new link is not up within down-after); but it only promotes a replica it
//!   heard from within 5 ping periods, and during a failover it asks replicas for INFO
//!   only once a second (hard-coded), so a ping period much under 300 ms would leave it
//!   no replica good enough. Hence keep down-after at 600 ms or more.
//! - cluster: `cluster-node-timeout` 1000 ms by default ([`ClusterBuilder`]),
//!   `cluster-replica-validity-factor 0` (a replica may always take over),
//!   `cluster-allow-replica-migration no` (replicas stay where they were put).
//! - replication: `repl-diskless-sync-delay 0` (Redis 7 otherwise waits 5 s for more
//!   replicas before a full sync).
//!
//! A cluster may be reached through a [`FaultProxy`] per node
//! ([`ClusterBuilder::through_proxies`]): each node announces its proxy's port, so that
//! the slot map and the redirections a client is given name the proxies, and every
//! client connection goes through them (the harness's own connections and the bus do
//! not).
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::RedisServer;

/// Pause between checks of state that no event announces.
pub const POLL: Duration = Duration::from_millis(10);
/// How long a topology may take to form before the test fails (it takes 0.5–3 s).
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// I/O timeouts of the connections the harness polls with, so a frozen node costs a
/// poll this long instead of hanging it.
const POLL_IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// Arguments of every data node.
const DATA_ARGS: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// The address of a server the harness started (always loopback).
pub fn addr_of(server: &RedisServer) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()))
}

/// `<prefix>-<pid>-<n>`, unique among every topology of every test process running.
fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

mod cluster;
mod cluster_builder;
mod probe;
mod sentinel;
mod sentinel_events;
mod sentinels;
mod slot_migration;
mod slots;

#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use cluster_builder::*;
#[allow(unused_imports)]
pub use probe::*;
#[allow(unused_imports)]
pub use sentinel::*;
#[allow(unused_imports)]
pub use sentinel_events::*;
#[allow(unused_imports)]
pub use sentinels::*;
#[allow(unused_imports)]
pub use slot_migration::*;
#[allow(unused_imports)]
pub use slots::*;
