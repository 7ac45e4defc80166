//! The shared runtime every primitive stands on: one client per Redis deployment with its
//! connection pool, its one pub/sub connection, its table of what this process holds and
//! the one watchdog thread that renews it, the leases, the key layout and the bundled
//! scripts.
//!
//! The map: the public `Client` (`client.rs`), its settings (`builder.rs`, `config.rs`)
//! and administrative calls (`admin.rs`); what its clones share (`inner.rs`); the
//! connection to Redis (`connection/`); the Lua side (`scripting/`) and the key layout
//! (`keys/`); what this process holds, its renewal by the watchdog and its losses
//! (`holds/`); waking waiters (`subscriber/`); and what is told to `tracing` and
//! `metrics` (`telemetry.rs`).

pub(crate) mod admin;
pub(crate) mod builder;
pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod connection;
pub(crate) mod holds;
pub(crate) mod inner;
pub(crate) mod keys;
pub(crate) mod scripting;
pub(crate) mod subscriber;
pub(crate) mod telemetry;
