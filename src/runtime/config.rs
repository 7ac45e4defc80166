//! The settings a client was built with (see `ClientBuilder`).

use std::time::Duration;

use crate::runtime::holds::lease::LeasePolicy;
use crate::runtime::holds::loss::Hook;

/// A client's settings, fixed once it is built.
pub(crate) struct Config {
    pub(crate) key_prefix: Vec<u8>,
    /// The watchdog timeout, and every timing derived from it (see [`LeasePolicy`]).
    pub(crate) lease: LeasePolicy,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    /// (replicas, timeout in ms) for `WAIT` after acquire and release scripts.
    pub(crate) sync_replicas: Option<(u32, u64)>,
    pub(crate) redacted_url: String,
    /// Run the scripts as the library's functions where the server has them.
    pub(crate) use_functions: bool,
    /// Told of every hold lost (`ClientBuilder::on_lease_lost`).
    pub(crate) on_lease_lost: Option<Hook>,
    /// The longest a watchdog hold is renewed (`ClientBuilder::max_hold`).
    pub(crate) max_hold: Option<Duration>,
    /// The text every hold this client takes records (`ClientBuilder::metadata`).
    pub(crate) metadata: Option<String>,
}
