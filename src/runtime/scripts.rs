//! The bundled Lua scripts, run with EVALSHA and loaded on NOSCRIPT by `redis::Script`.

use std::sync::LazyLock;

use redis::Script;

/// A script that hands locks on: the queue's rules (`lua/queue.lua`) come first.
macro_rules! with_queue {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/queue.lua"),
                include_str!(concat!("../../lua/", $file))
            ))
        })
    };
}

pub(crate) static ACQUIRE: LazyLock<Script> = with_queue!("acquire.lua");
pub(crate) static RELEASE: LazyLock<Script> = with_queue!("release.lua");
pub(crate) static CANCEL: LazyLock<Script> = with_queue!("cancel.lua");
pub(crate) static KICK: LazyLock<Script> = with_queue!("kick.lua");
pub(crate) static FORCE_UNLOCK: LazyLock<Script> = with_queue!("force_unlock.lua");
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/renew.lua")));
pub(crate) static LATCH_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/latch_set.lua")));
pub(crate) static LATCH_COUNT_DOWN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/latch_count_down.lua")));
pub(crate) static LATCH_STATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/latch_state.lua")));
