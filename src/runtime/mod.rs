//! The shared runtime every primitive stands on: one client per Redis deployment with its
//! connection pool, its one pub/sub connection, its one watchdog thread, the key layout and
//! the bundled scripts.

pub(crate) mod builder;
pub(crate) mod client;
pub(crate) mod fanout;
pub(crate) mod keys;
pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod scripts;
pub(crate) mod subscriber;
pub(crate) mod target;
pub(crate) mod watchdog;
