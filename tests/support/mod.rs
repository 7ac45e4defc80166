//! Test harness that runs real `redis-server` processes.
//!
//! Every server gets its own loopback port and temporary directory, so tests
//! can run in parallel and kill, restart or freeze "their" Redis without
//! disturbing anyone else. Shared by the integration tests (`mod support;`),
//! the benches and the examples (`#[path = "../tests/support/mod.rs"]`).
//!
//! Where each concept lives (every public name is re-exported here, as `support::X`):
//! - [`server`]: the `redis-server` process a test owns ([`RedisServer`], ports, freeze);
//! - [`version`]: which server runs the tests and what it lacks ([`ServerKind`], [`skip`]);
//! - [`acl`]: ACL users; [`scripts`]: the library's scripts by hand (made from
//!   [`manifest`], the library's own list of their `lua/` files), counting script calls;
//! - [`server_state`]: keys, subscriptions and connections read or killed from a test;
//! - [`holds`]: holds a test sets up; [`timing`]: [`wait_until`], [`timed`];
//! - [`replicas`]: a primary and a synced replica; [`monitor`]: [`Monitor`] (`MONITOR`);
//! - [`topology`]: Sentinel and Cluster deployments; [`proxy`]: [`FaultProxy`];
//! - [`clients`], [`keys`], [`child`], [`deployment`]: clients, key names, child processes,
//!   and the deployments a test may run against.
#![allow(dead_code)]

pub mod acl;
pub mod child;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clients;
pub mod deployment;
pub mod holds;
pub mod keys;
/// Which files of `lua/` make up each bundled script: the library's own list.
#[path = "../../src/runtime/scripting/manifest.rs"]
pub mod manifest;
pub mod monitor;
mod proxy;
pub mod replicas;
pub mod scripts;
pub mod server;
pub mod server_state;
pub mod timing;
pub mod topology;
pub mod version;

#[allow(unused_imports)]
pub use acl::*;
#[allow(unused_imports)]
pub use clients::{build, Clients};
#[allow(unused_imports)]
pub use holds::*;
#[allow(unused_imports)]
pub use keys::Keys;
#[allow(unused_imports)]
pub use monitor::*;
#[allow(unused_imports)]
pub use proxy::FaultProxy;
#[allow(unused_imports)]
pub use replicas::*;
#[allow(unused_imports)]
pub use scripts::*;
#[allow(unused_imports)]
pub use server::*;
#[allow(unused_imports)]
pub use server_state::*;
#[allow(unused_imports)]
pub use timing::*;
#[allow(unused_imports)]
pub use version::*;
