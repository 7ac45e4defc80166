//! The connection to Redis: where a client's connections go (one server, a Cluster, the
//! primary Sentinel names), the pooled command connections, and the executor that runs a
//! call on them within its deadline, alone or fanned out to several clients at once.
//!
//! The layers, from the socket up: `node_con.rs` (a cluster node's socket), `con.rs` (the
//! wire: one server's connection, or a cluster connection over node sockets), `pool.rs`
//! (`PoolConn`, a wire as the pool keeps it; the pool's gate; `Pooled`, a checked-out
//! one), `target.rs` and `urls.rs` (where connections go), `executor.rs` (one call within
//! its deadline; `settling.rs`, how it waits out a settling deployment) and `fanout.rs`
//! (many calls of many clients at once).

pub(crate) mod con;
pub(crate) mod executor;
pub(crate) mod fanout;
pub(crate) mod node_con;
pub(crate) mod pool;
pub(crate) mod settling;
pub(crate) mod target;
pub(crate) mod urls;
