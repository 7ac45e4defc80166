//! What the benchmark harnesses share (`mod common;` in each): a toolbox of
//! connections, clocks, statistics and the printed tables. The servers and child
//! processes come from `tests/support`, like the tests'.
//!
//! Where each part lives (every public name is re-exported here, as `common::X`):
//! - [`workers`]: the protocol of the multi-process benches (roles, the window, events);
//! - [`setup`]: connections, clients, settings; [`clock`]: one clock for all processes;
//! - [`stats`]: fairness, percentiles; [`tables`]: the printed tables and number formats;
//! - [`server_cost`]: what a run cost the server; [`handoff_floor`]: the raw handoff floor;
//! - the baseline locks: [`naive_lock`], [`hash_floor`], [`script_floor`], [`queue_floor`];
//!   the Redisson peers: [`redisson_lock`], [`redisson_fair_lock`].

#![allow(dead_code)]

mod clock;
mod handoff_floor;
#[macro_use]
mod hash_floor;
mod naive_lock;
mod queue_floor;
mod redisson_fair_lock;
mod redisson_lock;
mod script_floor;
mod server_cost;
mod setup;
mod stats;
mod tables;
mod workers;

#[allow(unused_imports)]
pub use clock::*;
#[allow(unused_imports)]
pub use handoff_floor::*;
#[allow(unused_imports)]
pub use hash_floor::*;
#[allow(unused_imports)]
pub use naive_lock::*;
#[allow(unused_imports)]
pub use queue_floor::*;
#[allow(unused_imports)]
pub use redisson_fair_lock::*;
#[allow(unused_imports)]
pub use redisson_lock::*;
#[allow(unused_imports)]
pub use script_floor::*;
#[allow(unused_imports)]
pub use server_cost::*;
#[allow(unused_imports)]
pub use setup::*;
#[allow(unused_imports)]
pub use stats::*;
#[allow(unused_imports)]
pub use tables::*;
#[allow(unused_imports)]
pub use workers::*;
