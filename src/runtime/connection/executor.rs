//! The executor: runs a client's calls on its pooled connections, bounded by deadlines
//! and the configured timeouts, and repeats the ones a dropped connection, a settling
//! deployment or a demoted primary refused, when repeating them is safe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::config::Config;
use crate::runtime::connection::con::Con;
use crate::runtime::connection::pool::{self, Gate, Manager, PoolConn, Pooled, Room};
use crate::runtime::connection::settling::{self, Settling};
use crate::runtime::connection::target::{Target, Topology};
use crate::runtime::scripting::scripts::{ScriptCall, Scripting};
use crate::Error;

/// How long a script that must recognize its own repeat (`latch_set.lua`,
/// `force_unlock.lua`) remembers the id of the call that ran it. The client repeats such a
/// call only within half of it, so the first run is always still remembered.
pub(crate) const CALL_MEMORY: Duration = Duration::from_secs(60);

/// How often a checkout waiting for a new connection looks whether its credentials were
/// refused (see `Executor::checkout`).
const REFUSAL_POLL: Duration = Duration::from_millis(10);

/// The shortest socket timeout a call gets, even past its deadline: zero means "none".
const MIN_IO_TIMEOUT: Duration = Duration::from_millis(1);

/// What is left of the time until `until`, as a socket timeout: at least a millisecond.
pub(crate) fn time_left(until: Instant) -> Duration {
    until
        .saturating_duration_since(Instant::now())
        .max(MIN_IO_TIMEOUT)
}

/// How a call is run: in a room it already has, whether it may be sent again after a
/// dropped connection, and whether it goes before the calls waiting for room.
struct Calling {
    room: Option<Room>,
    repeatable: bool,
    urgent: bool,
}

impl Default for Calling {
    fn default() -> Calling {
        Calling {
            room: None,
            repeatable: true,
            urgent: false,
        }
    }
}

/// What runs a client's calls: its connection pool and the deployment it connects to,
/// its settings, and what calls have lately seen of the deployment.
pub(crate) struct Executor {
    pub(crate) id: String,
    // The process that made the client: a fork()ed child must not use the parent's ids.
    pid: u32,
    pub(crate) config: Config,
    pool: r2d2::Pool<Manager>,
    // Lets as many callers at the pool as it has connections (see `Gate`).
    gate: Arc<Gate>,
    target: Arc<Target>,
    // Signs of the deployment changing, seen by the connection layer (see `Topology`).
    topology: Arc<Topology>,
    /// How the scripts are sent (`FCALL` or `EVALSHA`): one choice for every call.
    pub(crate) scripting: Scripting,
    // Until when calls sent to several clients at once (`fanout`) skip this one, and why:
    // its server just failed one (down, unreachable, frozen), and waiting for it again in
    // every round would cost each acquisition the whole member timeout.
    pub(crate) unreachable: parking_lot::Mutex<Option<(Instant, String)>>,
    // Since when, and until when last, calls found a cluster node refusing connections
    // (see `is_node_down`). Calls wait such a node out only until `connect_timeout` after
    // the first refusal, together: one after another (the watchdog renews lock after
    // lock) they would otherwise each wait the whole time, while leases elsewhere ran out.
    node_down: parking_lot::Mutex<Option<(Instant, Instant)>>,
    // New connections' refused credentials (see `Manager::refused`).
    refused: Arc<parking_lot::Mutex<Option<(Instant, redis::RedisError)>>>,
}

impl Executor {
    /// The executor of a new client with the id `id`: its pool makes connections on
    /// demand, so a Redis that is down does not fail it.
    pub(crate) fn new(id: String, target: Target, config: Config) -> Executor {
        let target = Arc::new(target);
        let topology = Arc::new(Topology::default());
        let refused = Arc::new(parking_lot::Mutex::new(None));
        let manager = Manager {
            target: target.clone(),
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
            topology: topology.clone(),
            refused: refused.clone(),
        };
        // Connections are made on demand (min_idle 0, build_unchecked), so a Redis that is
        // down does not fail the build. No PING on checkout: it would double the cost of
        // every lock operation; a broken connection shows itself on use and is dropped.
        let pool = r2d2::Pool::builder()
            .max_size(config.pool_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(config.connect_timeout)
            // Connection setup and idle reaping need little: one thread, not r2d2's three.
            // Dropped with the pool, it ends at once: by default it would first wait for
            // its pending jobs, among them the reaper's next run (up to 30 s away), for a
            // pool that no longer exists.
            .thread_pool(Arc::new(
                scheduled_thread_pool::ScheduledThreadPool::builder()
                    .num_threads(1)
                    .thread_name_pattern("redmutex-pool")
                    .on_drop_behavior(
                        scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled,
                    )
                    .build(),
            ))
            .build_unchecked(manager);
        Executor {
            id,
            pid: std::process::id(),
            scripting: Scripting::new(config.use_functions),
            unreachable: parking_lot::Mutex::new(None),
            node_down: parking_lot::Mutex::new(None),
            gate: Gate::new(config.pool_size),
            config,
            pool,
            target,
            topology,
            refused,
        }
    }

    /// A connection manager to the same deployment, with the same timeouts, sharing what
    /// the pool's connections see of it (the pub/sub connection's).
    pub(crate) fn manager(&self) -> Manager {
        Manager {
            target: self.target.clone(),
            connect_timeout: self.config.connect_timeout,
            command_timeout: self.config.command_timeout,
            topology: self.topology.clone(),
            refused: self.refused.clone(),
        }
    }
    /// Runs the script call `call` on `con` (see `Scripting::run`).
    pub(crate) fn eval<T: redis::FromRedisValue>(
        &self,
        con: &mut Con,
        call: &ScriptCall,
    ) -> redis::RedisResult<T> {
        self.scripting.run(con, call)
    }

    /// With `sync_replicas` set, WAITs for the replicas on `con` (right after a write on
    /// it) and returns the shortfall as an error to report, if any.
    pub(crate) fn await_replicas(
        &self,
        con: &mut Con,
        key: &[u8],
    ) -> redis::RedisResult<Option<Error>> {
        let Some((required, timeout_ms)) = self.config.sync_replicas else {
            return Ok(None);
        };
        let acked = con.wait_replicas(key, required, timeout_ms)?;
        Ok((acked < required).then_some(Error::NotReplicated {
            acked,
            required,
            lock: None,
        }))
    }

    /// Which primary connections now go to; it changes with each failover (Sentinel).
    pub(crate) fn generation(&self) -> u64 {
        self.target.generation()
    }

    /// The client's topology epoch: it changes whenever the connection layer sees a sign
    /// of the deployment changing (see [`Topology`]), a Sentinel failover included.
    pub(crate) fn topology_epoch(&self) -> u64 {
        self.topology
            .changes()
            .wrapping_add(self.target.generation())
    }

    /// Whether the deployment, as far as this client can see, stayed the same since it
    /// read `epoch` ([`topology_epoch`](Executor::topology_epoch)): then two times read from
    /// its server's clock meanwhile came from one clock. Never on a cluster, whose `MOVED`
    /// and `ASK` redirections redis-rs follows unseen (a slot may have moved to another
    /// node, with another clock).
    pub(crate) fn same_topology_since(&self, epoch: u64) -> bool {
        !self.target.is_cluster() && self.topology_epoch() == epoch
    }

    /// Whether this client talks to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.target.is_cluster()
    }

    /// Queue-entry flags saying where this client listens (see `lua/queue.lua`): on a
    /// cluster, perhaps on another node than the one a release runs on (with classic
    /// pub/sub on any node; with sharded pub/sub on the lock's, but a release sent by `ASK`
    /// to the node its slot is moving to finds it on the other), so that a release there
    /// cannot count it among the subscribers.
    pub(crate) fn listener_flags(&self) -> u8 {
        if self.target.is_cluster() {
            crate::runtime::scripting::flags::LISTENS_ELSEWHERE
        } else {
            0
        }
    }

    /// Whether `e` is a cluster node refusing connections: a primary killed, its slots
    /// not yet taken over. redis-rs reports it once its own reconnects failed; the
    /// command reached no server then, unless an earlier attempt of redis-rs's own did, so
    /// only a call that may run twice waits it out.
    fn is_node_down(&self, e: &redis::RedisError) -> bool {
        self.target.is_cluster() && e.is_connection_refusal()
    }

    /// Records a refusal by a node that is down (see `node_down`) seen at `now`, and
    /// returns since when the outage lasts: a refusal after a quiet spell starts a new
    /// one. The spell is longer than a watchdog timeout, so that a node down for good,
    /// whose holds the watchdog tries to renew every third of one, costs each round a few
    /// quick tries, not `connect_timeout` again.
    fn node_down_since(&self, now: Instant) -> Instant {
        let mut down = self.node_down.lock();
        let quiet = self.config.connect_timeout + self.config.lease.watchdog();
        let (since, last) = match *down {
            Some((since, last)) if now.saturating_duration_since(last) < quiet => (since, now),
            _ => (now, now),
        };
        *down = Some((since, last));
        since
    }

    /// Fails with [`Error::Forked`] in a process that did not make this client.
    pub(crate) fn check_process(&self) -> Result<(), Error> {
        if std::process::id() == self.pid {
            Ok(())
        } else {
            Err(Error::Forked {
                created_in: self.pid,
            })
        }
    }

    /// A pooled connection to a single server that is ready now, if there is one: calls
    /// sent to several clients at once (`fanout`) must not wait for one client's pool (its
    /// server down) while the other replies arrive.
    pub(crate) fn idle_connection(&self) -> Option<Pooled> {
        let room = self.gate.try_enter()?;
        let mut conn = Pooled::new(self.pool.try_get()?, room);
        if conn.generation != self.target.generation() || conn.single().is_none() {
            conn.mark_broken();
            return None;
        }
        Some(conn)
    }

    /// Room for one call in the pool (see [`Gate`]), waiting for it until `until` (`None`:
    /// as long as it takes), for a caller that decides what to send once it has it (see
    /// `Wait::run`): then [`run_in`](Executor::run_in).
    pub(crate) fn enter(&self, until: Option<Instant>) -> Result<Room, Error> {
        self.enter_as(until, false).map_err(|e| self.explain(e))
    }

    fn enter_as(&self, until: Option<Instant>, urgent: bool) -> Result<Room, Error> {
        self.gate
            .enter(until, urgent)
            .map_err(|waited| Error::pool_exhausted(self.gate.size(), waited))
    }

    /// Runs `f` on a pooled connection with the configured timeouts; see
    /// [`run_until`](Executor::run_until).
    pub(crate) fn run<T>(
        &self,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.run_until(None, f)
    }

    /// Runs `f` on a pooled connection, retiring the connection if `f` failed on I/O.
    /// With `until`, neither the pool checkout nor any read or write waits past it (nor
    /// past the configured timeouts), so a bounded call stays bounded against a frozen or
    /// unreachable server.
    ///
    /// A connection the server dropped (a restart, an idle timeout, a lost reply) fails
    /// fast, and `f` runs again on another one: after a restart every pooled connection
    /// is stale, hence up to `pool_size` retries. That is safe because every call this
    /// crate makes can be repeated: reads, renewals, and acquire and release scripts that
    /// are told how many levels the thread holds, so a repeated one changes nothing.
    /// Timeouts are not retried: they surface as `Error::Timeout` at `command_timeout`.
    /// A settling deployment (see `pool::is_settling`, and a cluster node refusing
    /// connections until its replica is promoted) is waited out for up to
    /// `connect_timeout`, and never past `until`, where it gives `Error::Timeout`.
    ///
    /// A call waits for room in the pool (every connection in use by the client's other
    /// calls) as long as `until` allows, and no longer: an unbounded one as long as it
    /// takes, since each of those calls gives its connection back within its timeouts. A
    /// call that finds no room by `until` fails with [`Error::PoolExhausted`], having run
    /// nothing (room to repeat a call whose reply was lost is kept, or its failure is a
    /// `Timeout`). The connect timeout bounds only the making of a new connection.
    pub(crate) fn run_until<T>(
        &self,
        until: Option<Instant>,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.run_with(until, Calling::default(), None, f)
    }

    /// [`run_until`](Executor::run_until) in the room `room`, when the caller has one (see
    /// [`enter`](Executor::enter)), for its first connection.
    pub(crate) fn run_in<T>(
        &self,
        room: Option<Room>,
        until: Option<Instant>,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        let how = Calling {
            room,
            ..Calling::default()
        };
        self.run_with(until, how, None, f)
    }

    /// [`run_until`](Executor::run_until) ahead of the calls waiting for room in the pool:
    /// for the watchdog's renewals, whose leases run out while they wait, and the nudge
    /// that lets a burst of waiting threads queue with their first call.
    pub(crate) fn run_urgent<T>(
        &self,
        until: Option<Instant>,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        let how = Calling {
            urgent: true,
            ..Calling::default()
        };
        self.run_with(until, how, None, f)
    }

    /// [`run_urgent`](Executor::run_urgent) for the watchdog thread: while the call waits
    /// out a settling deployment, `meanwhile` runs in its pauses (the extensions of holds
    /// handed over, whose pickup window is shorter than such a wait may last).
    pub(crate) fn run_minding<T>(
        &self,
        until: Option<Instant>,
        meanwhile: &mut dyn FnMut(),
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        let how = Calling {
            urgent: true,
            ..Calling::default()
        };
        self.run_with(until, how, Some(meanwhile), f)
    }

    /// A new id for one call whose script records it (see [`CALL_MEMORY`]): the client's
    /// id and a random part, so no two calls anywhere share one.
    pub(crate) fn call_id(&self) -> String {
        format!("{}:{}", self.id, uuid::Uuid::new_v4())
    }

    /// Runs `f` like [`run`](Executor::run), for a call whose script records the call's id for
    /// [`CALL_MEMORY`] and answers a repeat of the same id with what the first run did.
    /// A repeat after half of that (the first run might be forgotten by the time it
    /// lands) is not sent: the call fails with `Error::Timeout`, its outcome unknown.
    pub(crate) fn run_remembered<T>(
        &self,
        mut f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let mut runs = 0;
        self.run(|con| {
            runs += 1;
            if runs > 1 && started.elapsed() > CALL_MEMORY / 2 {
                return Err(crate::error::timed_out(
                    "the reply was lost, and too long ago to repeat the call safely",
                ));
            }
            f(con)
        })
    }

    /// Runs `f` once on a pooled connection: for a call that must not run twice (it is not
    /// told enough to make a repeat harmless), a dropped connection is the caller's error.
    pub(crate) fn run_once<T>(
        &self,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        let how = Calling {
            repeatable: false,
            ..Calling::default()
        };
        self.run_with(None, how, None, f)
    }

    /// A pooled connection within `timeout`. A connect refused for its credentials ends
    /// the wait at once: r2d2 would retry it until `timeout` and report a timeout, while
    /// the same password cannot succeed later.
    fn checkout(&self, timeout: Duration) -> Result<r2d2::PooledConnection<Manager>, Error> {
        let start = Instant::now();
        let end = start + timeout;
        // r2d2 hands the last connect failure ("Connection refused") to one timed-out
        // checkout only: the most telling report of the slices is kept.
        let mut report: Option<r2d2::Error> = None;
        loop {
            let slice = end
                .saturating_duration_since(Instant::now())
                .min(REFUSAL_POLL);
            match self.pool.get_timeout(slice) {
                Ok(conn) => return Ok(conn),
                Err(e) => {
                    if let Some((_, refusal)) =
                        self.refused.lock().as_ref().filter(|(at, _)| *at >= start)
                    {
                        return Err(Error::redis(refusal.clone()));
                    }
                    if report
                        .as_ref()
                        .is_none_or(|r| e.to_string().len() > r.to_string().len())
                    {
                        report = Some(e);
                    }
                    if Instant::now() >= end {
                        return Err(report.map_or_else(|| unreachable!(), Error::from));
                    }
                }
            }
        }
    }

    /// `e` naming this client's server and user (see [`Error::at_server`]).
    pub(crate) fn explain(&self, e: Error) -> Error {
        e.at_server(
            || self.target.server(),
            || self.target.user(),
            self.target.has_password(),
        )
    }

    fn run_with<T>(
        &self,
        until: Option<Instant>,
        how: Calling,
        meanwhile: Option<&mut dyn FnMut()>,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.run_checked(until, how, meanwhile, f)
            .map_err(|e| self.explain(e))
    }

    /// Runs `f` on pooled connections until it succeeds or fails for good: decides, per
    /// failure, whether the call waits the deployment out, finds a new primary, or is sent
    /// again on another connection (only a repeatable call whose reply was lost).
    fn run_checked<T>(
        &self,
        until: Option<Instant>,
        how: Calling,
        mut meanwhile: Option<&mut dyn FnMut()>,
        mut f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.check_process()?;
        let Calling {
            mut room,
            repeatable,
            urgent,
        } = how;
        let config = &self.config;
        let mut retries = 0;
        // While the deployment settles (see `pool::is_settling`): since when, and the
        // next pause.
        let mut settling: Option<Settling> = None;
        // Whether a try's reply was lost (the call may have run).
        let mut perhaps_ran = false;
        loop {
            // Room first, then the connection: the room is held with the connection (and
            // given back with it, before any pause below).
            let entered = self.room_for_try(room.take(), until, urgent, perhaps_ran)?;
            let (checkout, io) = self.try_timeouts(until);
            let mut pooled = Pooled::new(self.checkout(checkout)?, entered);
            let conn: &mut PoolConn = &mut pooled;
            if conn.generation != self.target.generation() {
                // Made to a primary the sentinels no longer name: retired on return. The
                // generation changes once per failover, so this ends within the pool.
                conn.mark_broken();
                room = Some(pooled.into_room());
                continue;
            }
            let result = conn.run(io, &mut f);
            // The connection back to the pool; its room kept for a try again at once, and
            // given back before any pause: what runs meanwhile may need it.
            let kept = pooled.into_room();
            match result {
                // Refused before it ran, the deployment settling: waited out.
                Err(e) if pool::is_settling(&e) || (repeatable && self.is_node_down(&e)) => {
                    drop(kept);
                    self.wait_out_settling(e, until, &mut settling, &mut meanwhile)?;
                }
                // A demoted primary refused the write: nothing happened, so even a call
                // that must not run twice may run again, on a connection to the new one.
                Err(e) if pool::is_readonly(&e) && retries < self.config.pool_size => {
                    tracing::info!(
                        target: "redmutex",
                        "redmutex: the primary was demoted; looking for the new one"
                    );
                    self.target.refresh(config.connect_timeout);
                    retries += 1;
                    room = Some(kept);
                }
                // A read interrupted by a signal (the process was stopped and continued)
                // left its reply unread on a connection now retired (an I/O error): like
                // a dropped connection's, the call may have run, and is sent again.
                Err(e)
                    if repeatable
                        && (e.is_connection_dropped() || pool::is_interrupted(&e))
                        && !e.is_timeout()
                        && retries < self.config.pool_size =>
                {
                    tracing::debug!(
                        target: "redmutex",
                        error = %e,
                        "redmutex: connection dropped or read interrupted, retrying on another"
                    );
                    retries += 1;
                    perhaps_ran = true;
                    room = Some(kept);
                }
                result => return Ok(result?),
            }
        }
    }

    /// The room for one try: the one kept from the last try, or a new one. When none
    /// comes in time after a try whose reply was lost, the call's outcome is unknown
    /// (it may have run), as a timed-out one's is, though nothing more was sent.
    fn room_for_try(
        &self,
        kept: Option<Room>,
        until: Option<Instant>,
        urgent: bool,
        perhaps_ran: bool,
    ) -> Result<Room, Error> {
        match kept {
            Some(room) => Ok(room),
            None => match self.enter_as(until, urgent) {
                Ok(room) => Ok(room),
                Err(_) if perhaps_ran => Err(Error::timeout(crate::error::timed_out(
                    "the reply was lost, and no pooled connection came free in time \
                     to send the call again",
                ))),
                Err(e) => Err(e),
            },
        }
    }

    /// How long one try may wait for a pooled connection, and for each read and write:
    /// the configured timeouts, cut to what is left of the deadline `until`.
    fn try_timeouts(&self, until: Option<Instant>) -> (Duration, Duration) {
        let config = &self.config;
        match until {
            None => (config.connect_timeout, config.command_timeout),
            Some(until) => {
                let left = time_left(until);
                (
                    left.min(config.connect_timeout),
                    left.min(config.command_timeout),
                )
            }
        }
    }

    /// A call refused before it ran because the deployment settles (or, repeatable, its
    /// node is down): waits for another try, or gives up (`Err`); see
    /// [`settling::wait_out`].
    fn wait_out_settling(
        &self,
        e: redis::RedisError,
        until: Option<Instant>,
        settling: &mut Option<Settling>,
        meanwhile: &mut Option<&mut dyn FnMut()>,
    ) -> Result<(), Error> {
        let down = self.is_node_down(&e);
        let outage = |now| self.node_down_since(now);
        settling::wait_out(
            settling,
            e,
            down.then_some(&outage as &dyn Fn(Instant) -> Instant),
            self.config.connect_timeout,
            until,
            meanwhile,
        )
    }
}
