//! The Lua side of every operation: the bundled scripts as one function library (FCALL) or
//! as EVALSHA bundles, the set each kind runs, and one typed call per script.

pub(crate) mod calls;
pub(crate) mod flags;
pub(crate) mod manifest;
pub(crate) mod queue;
pub(crate) mod scripts;
