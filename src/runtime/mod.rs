//! The shared runtime every primitive stands on: one client per Redis deployment with its
//! connection pool, its one pub/sub connection, its table of what this process holds and
//! the one watchdog thread that renews it, the leases, the key layout and the bundled
//! scripts.

pub(crate) mod admin;
pub(crate) mod builder;
pub(crate) mod calls;
pub(crate) mod client;
pub(crate) mod con;
pub(crate) mod config;
pub(crate) mod executor;
pub(crate) mod fanout;
pub(crate) mod holds;
pub(crate) mod keys;
pub(crate) mod lease;
pub(crate) mod loss;
pub(crate) mod lost_lease;
pub(crate) mod node_con;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod renewer;
pub(crate) mod scripts;
pub(crate) mod subscriber;
pub(crate) mod target;
pub(crate) mod telemetry;
pub(crate) mod urls;
