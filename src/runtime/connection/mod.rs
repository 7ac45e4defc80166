//! The connection to Redis: where a client's connections go (one server, a Cluster, the
//! primary Sentinel names), the pooled command connections, and the executor that runs a
//! call on them within its deadline, alone or fanned out to several clients at once.

pub(crate) mod con;
pub(crate) mod executor;
pub(crate) mod fanout;
pub(crate) mod node_con;
pub(crate) mod pool;
pub(crate) mod target;
pub(crate) mod urls;
