//! The flag bits of a hold and of a queue entry, as the scripts read them (`lua/queue.lua`'s
//! waiters hash, `lua/rw.lua`, `lua/acquire.lua`): one name per bit, shared by the scripts'
//! Rust side and the benches, which include this file with `#[path]` (so nothing of the
//! crate here).

/// A fair waiter: never passes the queue (`is_fair` in `queue.lua`).
pub const FAIR: u8 = 1;
/// Each hold draws a fencing token (`is_fenced` in `queue.lua`, `acquire.lua`).
pub const FENCED: u8 = 2;
/// A reader of a read-write lock (`RW.is_read`).
pub const READ: u8 = 4;
/// The waiter's client listens on another cluster node, so `PUBLISH`'s count, this node's
/// alone, cannot tell it is alive (`listens_elsewhere` in `queue.lua`).
pub const LISTENS_ELSEWHERE: u8 = 8;
/// The upgradeable reader of a read-write lock (`RW.is_upgradeable`).
pub const UPGRADEABLE: u8 = 16;
/// A writer that upgrades, refused if its upgradeable hold is gone (`RW.is_upgrade`).
pub const UPGRADE: u8 = 32;
/// The entry ends with the metadata text its hold is to carry: set by the scripts
/// (`Q.join`), never sent by the client.
#[allow(dead_code)] // named so that no other meaning is given to the bit
pub const WITH_METADATA: u8 = 64;
/// The waiter's client listens with sharded pub/sub: it is told with `SPUBLISH`
/// (`Q.tell`).
pub const SHARDED: u8 = 128;
