//! The primitives: one generic lock over its kinds (plain, fair, fenced, and the two sides
//! of a read-write lock), its guard, the semaphore and its permits, and the count-down
//! latch, and the `MultiLock` over several locks (RedLock). Each kind contributes only its scripts and key layout (`runtime::scripting::scripts::Ops`).

pub(crate) mod acquire;
pub(crate) mod cancel;
pub(crate) mod guard;
pub(crate) mod holder_metadata;
pub(crate) mod info;
pub(crate) mod kind;
pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod lock_kind;
pub(crate) mod multi_guard;
pub(crate) mod multilock;
pub(crate) mod options;
pub(crate) mod owned_guard;
pub(crate) mod owned_lock;
pub(crate) mod permit;
pub(crate) mod release;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod upgradeable;
