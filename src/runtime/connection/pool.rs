//! Pooled command connections: r2d2 over redis, with timeouts and no PING per checkout,
//! behind a gate that lets as many callers in as the pool has connections. Three layers:
//! the wire (`con::Con`), the connection as the pool keeps it ([`PoolConn`]: a `Con` with
//! its socket timeout, whether it is retired, and the primary it reached), and a checked-out
//! one with its room at the gate ([`Pooled`]).

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use redis::ConnectionLike;

use crate::runtime::connection::con::Con;
use crate::runtime::connection::target::{Target, Topology};

/// A command connection (`con::Con`) as the pool keeps it: it remembers when a failure
/// left it unusable, and which socket timeout is set.
pub(crate) struct PoolConn {
    pub(crate) con: Con,
    // The read/write timeout now set on the socket: the command timeout, or less for a
    // call bounded by a deadline. Changed only when a call needs another (two syscalls).
    timeout: Duration,
    // A timed-out or failed reply may still be in flight; such a connection must never be
    // handed to another caller, whose reply would then be someone else's.
    broken: bool,
    // The primary it reached (see `Target::generation`).
    pub(crate) generation: u64,
    // Told when a failure here is a sign of the deployment changing.
    topology: Arc<Topology>,
}

pub(crate) struct Manager {
    pub(crate) target: Arc<Target>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    // The client's count of signs of the deployment changing (see `Topology`).
    pub(crate) topology: Arc<Topology>,
    // The last refusal of a new connection's credentials, and when: r2d2 retries a failed
    // connect until the checkout times out and then reports only a timeout, so a checkout
    // looks here to report a wrong password at once, as what it is.
    pub(crate) refused: Arc<parking_lot::Mutex<Option<(Instant, redis::RedisError)>>>,
}

impl Manager {
    /// A new connection with the configured timeouts, for the subscriber (to any node of
    /// a cluster), and the generation of the primary it reached.
    pub(crate) fn connect(&self) -> redis::RedisResult<(redis::Connection, u64)> {
        self.target
            .connect(self.connect_timeout, self.command_timeout)
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = PoolConn;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<PoolConn, redis::RedisError> {
        let (con, generation) = self
            .target
            .connect_commands(self.connect_timeout, self.command_timeout)
            .inspect_err(|e| {
                if crate::error::is_auth_failure(e) {
                    *self.refused.lock() = Some((Instant::now(), e.clone()));
                }
            })?;
        Ok(PoolConn {
            con,
            timeout: self.command_timeout,
            broken: false,
            generation,
            topology: self.topology.clone(),
        })
    }

    fn is_valid(&self, conn: &mut PoolConn) -> Result<(), redis::RedisError> {
        redis::cmd("PING").query::<()>(&mut conn.con)
    }

    fn has_broken(&self, conn: &mut PoolConn) -> bool {
        conn.broken || !conn.con.is_open() || conn.generation != self.target.generation()
    }
}

impl PoolConn {
    /// Retires the connection: the pool drops it when it comes back.
    pub(crate) fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Runs `f` on the connection with `timeout` for each read and write; any I/O failure
    /// or timeout retires the connection.
    pub(crate) fn run<T>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&mut Con) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.set_timeout(timeout)?;
        let result = f(&mut self.con);
        if let Err(e) = &result {
            self.failed(e);
        }
        result
    }

    /// Sets `timeout` for each read and write (when it is not set already).
    pub(crate) fn set_timeout(&mut self, timeout: Duration) -> redis::RedisResult<()> {
        if timeout != self.timeout {
            if let Err(e) = self.con.set_timeouts(timeout) {
                self.broken = true;
                self.topology.changed();
                return Err(e);
            }
            self.timeout = timeout;
        }
        Ok(())
    }

    /// Retires the connection if `e` may have left it out of step with the server; tells
    /// the client's [`Topology`] when that, or a refusal of a settling deployment, may
    /// mean the deployment changed.
    pub(crate) fn failed(&mut self, e: &redis::RedisError) {
        let retire =
            e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() || is_readonly(e);
        if retire {
            self.broken = true;
        }
        if retire || is_settling(e) {
            self.topology.changed();
        }
    }

    /// The connection to one server (`None` for a cluster's), to write commands to and
    /// read their replies separately.
    pub(crate) fn single(&mut self) -> Option<&mut redis::Connection> {
        match &mut self.con {
            Con::Single(c) => Some(c),
            Con::Cluster(_) => None,
        }
    }
}

/// The way into a client's pool: room for as many callers as the pool has connections.
///
/// A caller holds its room as long as it holds its connection, so that one who has room
/// finds an idle connection or a free place for a new one, and r2d2's wait, bounded by the
/// connect timeout, is only ever a wait for a connection being made: a connect timeout
/// that runs out means the server could not be reached, never that the client's other
/// calls had every connection. Those who find no room wait here, for as long as their
/// own call may wait (`enter`), each parked until a leaving caller hands its room on, in
/// the order they came (urgent ones first): a burst of thousands of threads costs one
/// wake-up per connection handed on, where r2d2's own wait (a condition variable all of
/// them poll) let a few hundred of 10,000 in within the connect timeout and failed the
/// rest (issue 38).
pub(crate) struct Gate {
    size: u32,
    state: parking_lot::Mutex<GateState>,
}

struct GateState {
    // Rooms nobody holds, while nobody waits.
    free: u32,
    // Who waits for room, served from the front.
    queue: VecDeque<Arc<Turn>>,
}

/// A caller waiting for room: set `given` (under the gate's lock) hands it a room.
struct Turn {
    given: AtomicBool,
    thread: Thread,
}

/// The right to hold one of the pool's connections, given back when dropped.
pub(crate) struct Room {
    gate: Arc<Gate>,
}

impl Drop for Room {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

impl Gate {
    /// A gate for a pool of `size` connections.
    pub(crate) fn new(size: u32) -> Arc<Gate> {
        Arc::new(Gate {
            size,
            state: parking_lot::Mutex::new(GateState {
                free: size,
                queue: VecDeque::new(),
            }),
        })
    }

    /// How many connections the pool has room for.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Room now, if there is some and nobody waits for it.
    pub(crate) fn try_enter(self: &Arc<Self>) -> Option<Room> {
        let mut state = self.state.lock();
        if state.free == 0 || !state.queue.is_empty() {
            return None;
        }
        state.free -= 1;
        Some(Room { gate: self.clone() })
    }

    /// Room, waiting for it until `until` (`None`: as long as it takes: every room is given
    /// back within a call's timeouts); `Err` with how long it waited when `until` came
    /// first. `urgent` callers go before those already waiting (the watchdog's renewals,
    /// whose leases run out meanwhile; the nudge that lets a burst's threads queue).
    pub(crate) fn enter(
        self: &Arc<Self>,
        until: Option<Instant>,
        urgent: bool,
    ) -> Result<Room, Duration> {
        let began = Instant::now();
        let turn = {
            let mut state = self.state.lock();
            if state.free > 0 && state.queue.is_empty() {
                state.free -= 1;
                return Ok(Room { gate: self.clone() });
            }
            let turn = Arc::new(Turn {
                given: AtomicBool::new(false),
                thread: thread::current(),
            });
            if urgent {
                state.queue.push_front(turn.clone());
            } else {
                state.queue.push_back(turn.clone());
            }
            turn
        };
        loop {
            // (A wake-up may be spurious, or meant for another wait of this thread.)
            if turn.given.load(Ordering::Acquire) {
                return Ok(Room { gate: self.clone() });
            }
            match until {
                None => thread::park(),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    thread::park_timeout(until - now);
                }
            }
        }
        let mut state = self.state.lock();
        // Handed one as the wait ended: it is taken (the caller may still use it).
        if turn.given.load(Ordering::Acquire) {
            return Ok(Room { gate: self.clone() });
        }
        state.queue.retain(|t| !Arc::ptr_eq(t, &turn));
        Err(began.elapsed())
    }

    /// A room given back: to the first who waits, or kept free.
    fn leave(&self) {
        let mut state = self.state.lock();
        match state.queue.pop_front() {
            Some(turn) => {
                turn.given.store(true, Ordering::Release);
                turn.thread.unpark();
            }
            None => state.free += 1,
        }
    }
}

/// A pooled connection with the room it takes: the connection goes back to the pool
/// before the room is given back (the fields drop in order), so that whoever gets the
/// room finds it idle.
pub(crate) struct Pooled {
    conn: r2d2::PooledConnection<Manager>,
    room: Room,
}

impl Pooled {
    pub(crate) fn new(conn: r2d2::PooledConnection<Manager>, room: Room) -> Pooled {
        Pooled { conn, room }
    }

    /// Gives the connection back to the pool and keeps its room, for a call that tries
    /// again on another connection at once.
    pub(crate) fn into_room(self) -> Room {
        let Pooled { conn, room } = self;
        drop(conn);
        room
    }
}

impl Deref for Pooled {
    type Target = PoolConn;

    fn deref(&self) -> &PoolConn {
        &self.conn
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut PoolConn {
        &mut self.conn
    }
}

/// Whether `e` is a refusal of a cluster (or a server) that is settling: a slot migrating
/// with the lock's keys split between two nodes (`TRYAGAIN`), slots unserved mid-failover
/// (`CLUSTERDOWN`), a replica not yet in sync (`MASTERDOWN`), a dataset loading
/// (`LOADING`), or redirections (`ASK`, `MOVED`) still bouncing when redis-rs's own
/// retries ran out. The command did not run; it may be sent again after a pause.
pub(crate) fn is_settling(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some("TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "LOADING" | "ASK" | "MOVED")
    ) || e.redirect_node().is_some()
}

/// `EINTR` on Linux, the BSDs and macOS (the unit test checks it is `Interrupted` here).
pub(crate) const EINTR: i32 = 4;

/// Whether `e` is a read (or write) interrupted by a signal before it completed: on Linux
/// a process stopped and continued (Ctrl-Z and `fg`, a debugger, a frozen container) gets
/// it from a socket read with a timeout even without a signal handler (signal(7)).
/// Nothing is wrong with the server or the network. redis-rs does not expose the I/O
/// error's kind, only its text, which is the `io::Error`'s own.
pub(crate) fn is_interrupted(e: &redis::RedisError) -> bool {
    if !e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return false;
    }
    let text = e.to_string();
    text == std::io::Error::from_raw_os_error(EINTR).to_string()
        || text == std::io::Error::from(std::io::ErrorKind::Interrupted).to_string()
}

/// Whether `e` says the node is a replica now: a failover demoted the primary this
/// connection was made to. The write was refused, so nothing of it happened.
pub(crate) fn is_readonly(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY") || e.detail().is_some_and(|d| d.contains("READONLY"))
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;
    use std::time::{Duration, Instant};

    use super::Gate;

    fn queued(gate: &Gate) -> usize {
        gate.state.lock().queue.len()
    }

    fn until_queued(gate: &Gate, n: usize) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while queued(gate) < n {
            assert!(Instant::now() < give_up, "{n} callers never queued");
            thread::yield_now();
        }
    }

    /// A caller that gives up leaves the queue: the room given back later is free again,
    /// not handed to a caller that is gone.
    #[test]
    fn a_caller_that_gives_up_takes_no_room_with_it() {
        let gate = Gate::new(1);
        let held = gate.try_enter().expect("a free room");
        assert!(gate.try_enter().is_none(), "one room, taken");
        let t = Instant::now();
        let waited = gate
            .enter(Some(t + Duration::from_millis(50)), false)
            .err()
            .expect("no room until the bound");
        assert!(
            waited >= Duration::from_millis(50),
            "gave up after {waited:?}"
        );
        assert_eq!(queued(&gate), 0, "the caller left the queue");
        drop(held);
        assert!(gate.try_enter().is_some(), "the room was given back");
    }

    /// Rooms are handed on in the order callers came, urgent ones first, and a newcomer
    /// never takes one ahead of those waiting.
    #[test]
    fn rooms_go_to_the_callers_in_order_urgent_ones_first() {
        let gate = Gate::new(1);
        let held = gate.try_enter().expect("a free room");
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        for (i, (name, urgent)) in [("first", false), ("second", false), ("urgent", true)]
            .into_iter()
            .enumerate()
        {
            let (mine, tx) = (gate.clone(), tx.clone());
            threads.push(thread::spawn(move || {
                let room = mine.enter(None, urgent).expect("no bound");
                tx.send(name).unwrap();
                drop(room);
            }));
            until_queued(&gate, i + 1);
        }
        assert!(
            gate.try_enter().is_none(),
            "a newcomer went ahead of the queue"
        );
        drop(held);
        let order: Vec<&str> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, ["urgent", "first", "second"]);
        for t in threads {
            t.join().unwrap();
        }
        assert!(gate.try_enter().is_some(), "the room came back");
    }
}
