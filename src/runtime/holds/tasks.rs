//! What the watchdog thread does for the table besides renewing holds: the acquire
//! attempts in doubt it cleans up after, the queue entries it keeps alive, and the locks
//! handed on it checks.

use std::sync::Arc;
use std::time::Instant;

use crate::runtime::keys::LockKeys;

/// How often a failing check of a handed-on lock is tried again before it is left to the
/// waiters' own timers.
pub(crate) const KICK_TRIES: u8 = 3;

/// An acquire attempt whose outcome is unknown (it timed out, or its connection failed
/// after sending): Redis may have run it, or may still run it, leaving a level nobody
/// holds. The watchdog thread gives such a level back (twice, in case the script ran
/// late), unless this thread's next grant on the lock adopted it meanwhile.
pub(crate) struct Doubtful {
    pub(crate) id: u64,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: u64,
    pub(crate) holder: String,
    // The levels the attempt was told the thread held: the ghost, if any, is one more.
    pub(crate) expected: usize,
    pub(crate) runs_left: u8,
    pub(crate) in_flight: bool,
    // This thread is attempting on the lock right now: its attempt may adopt the level.
    pub(crate) paused: bool,
}

/// A thread of this client waiting in a lock's queue: its entry is kept alive each round.
pub(crate) struct Waiting {
    pub(super) keys: Arc<LockKeys>,
    pub(super) holder: String,
    pub(super) deadline: Option<Instant>,
}

/// A lock this client handed on: checked once the pickup window is over, so that a grant
/// nobody took (or a wake-up nobody acted on) does not leave it free with waiters asleep.
pub(crate) struct Kick {
    pub(crate) keys: Arc<LockKeys>,
    pub(super) due: Instant,
    pub(crate) tries_left: u8,
}
