//! The primitives: one generic lock over its kinds (plain, fair, fenced), its guard, and
//! the count-down latch. Each kind contributes only what its scripts are told.

pub(crate) mod guard;
pub(crate) mod kind;
pub(crate) mod latch;
pub(crate) mod lock;
