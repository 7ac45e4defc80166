//! `Client`: one connection pool, one subscriber and one watchdog shared by all locks.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::con::Con;
use crate::runtime::holds::HoldTable;
use crate::runtime::keys::{self, LockKeys, Object};
use crate::runtime::pool::{self, Conn, Manager};
use crate::runtime::scripts::{self, ScriptCall, Scripting};
use crate::runtime::subscriber::Subscriber;
use crate::runtime::target::{Target, Topology};
use crate::{
    ClientBuilder, CountDownLatch, Error, FairLock, FencedLock, HolderMetadata, Kind, Lock,
    LockInfo, LockName, ReadWriteLock, Semaphore,
};

/// The first pause before a command refused by a settling cluster is sent again; it
/// doubles up to `MAX_SETTLE_PAUSE`.
const SETTLE_PAUSE: Duration = Duration::from_millis(2);
const MAX_SETTLE_PAUSE: Duration = Duration::from_millis(100);

/// The same for a cluster node that refuses connections (killed, its replica not yet
/// promoted): a failover takes seconds, so the pauses start and end longer.
const DOWN_PAUSE: Duration = Duration::from_millis(10);
const MAX_DOWN_PAUSE: Duration = Duration::from_millis(200);

/// How long a script that must recognize its own repeat (`latch_set.lua`,
/// `force_unlock.lua`) remembers the id of the call that ran it. The client repeats such a
/// call only within half of it, so the first run is always still remembered.
pub(crate) const CALL_MEMORY: Duration = Duration::from_secs(60);

/// How long past its deadline a bounded call (`try_lock*`) waits for a round trip already
/// under way: Redis's answer to an attempt sent just before the deadline. A server that
/// does not answer by then (frozen, unreachable) fails the call with [`Error::Timeout`]
/// or [`Error::Pool`] instead of holding it for the command or connect timeout.
pub(crate) const IO_GRACE: Duration = Duration::from_millis(250);

/// The shortest socket timeout a call gets, even past its deadline: zero means "none".
const MIN_IO_TIMEOUT: Duration = Duration::from_millis(1);

/// What is left of the time until `until`, as a socket timeout: at least a millisecond.
pub(crate) fn time_left(until: Instant) -> Duration {
    until
        .saturating_duration_since(Instant::now())
        .max(MIN_IO_TIMEOUT)
}

/// A handle to one Redis deployment, from which named [`Lock`]s are made.
///
/// Cheap to clone (clones share everything) and safe to share between threads. Each client
/// has a random id, so holder ids of different clients, even in one process, never meet.
/// It owns a pool of command connections, at most one pub/sub connection (opened when a
/// thread first has to wait) and at most one watchdog thread (started when the first
/// watchdog lease is taken), and at most one loss thread (started when a guard's `lost()`
/// is first asked for, or at once with an
/// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) hook); the threads end once the
/// last clone and guard are dropped.
///
/// ```no_run
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let guard = client.lock("nightly-report").lock()?;
/// // ... only one thread in all processes runs this at a time ...
/// guard.unlock()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl Clone for Client {
    fn clone(&self) -> Client {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        Client {
            inner: self.inner.clone(),
        }
    }
}

impl Client {
    /// A handle on the client `inner` (a guard's), counted as any other handle.
    pub(crate) fn of(inner: &Arc<Inner>) -> Client {
        inner.handles.fetch_add(1, Ordering::Relaxed);
        Client {
            inner: inner.clone(),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Guards keep `Inner` alive so that they can still release, but they do not count:
        // a guard leaked with `mem::forget` must not have its lease renewed forever.
        self.inner.handles.fetch_sub(1, Ordering::Release);
    }
}

pub(crate) struct Config {
    pub(crate) key_prefix: Vec<u8>,
    pub(crate) watchdog_timeout: Duration,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    /// (replicas, timeout in ms) for `WAIT` after acquire and release scripts.
    pub(crate) sync_replicas: Option<(u32, u64)>,
    pub(crate) redacted_url: String,
    /// Run the scripts as the library's functions where the server has them.
    pub(crate) use_functions: bool,
    /// Told of every hold lost (`ClientBuilder::on_lease_lost`).
    pub(crate) on_lease_lost: Option<crate::runtime::loss::Hook>,
    /// The longest a watchdog hold is renewed (`ClientBuilder::max_hold`).
    pub(crate) max_hold: Option<Duration>,
    /// The text every hold this client takes records (`ClientBuilder::metadata`).
    pub(crate) metadata: Option<String>,
}

pub(crate) struct Inner {
    pub(crate) id: String,
    // The process that made the client: a fork()ed child must not use the parent's ids.
    pid: u32,
    pub(crate) config: Config,
    pool: r2d2::Pool<Manager>,
    target: Arc<Target>,
    // Signs of the deployment changing, seen by the connection layer (see `Topology`).
    topology: Arc<Topology>,
    pub(crate) subscriber: Subscriber,
    // What this process holds, with the thread that renews it (the field is named for
    // that thread, the watchdog).
    pub(crate) watchdog: HoldTable,
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
    // Live `Client` values, the ones inside `Lock`s included. At zero nobody can take a
    // lock any more, and the watchdog stops renewing.
    handles: AtomicUsize,
}

impl Client {
    /// A client for the Redis at `url` (`redis://[user:password@]host[:port][/db]`) with
    /// default settings; see [`ClientBuilder`] for the others.
    ///
    /// Does not connect: it succeeds while Redis is down, and the first operation then
    /// fails with a clear error.
    ///
    /// ```no_run
    /// let client = redmutex::Client::open("redis://127.0.0.1:6379/")?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn open(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder().url(url).build()
    }

    /// A builder with every setting at its default.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The lock called `name`. Any byte string of 1 to [`MAX_NAME_LEN`] bytes is a valid
    /// name; with an empty or longer one every operation of the returned lock fails with
    /// [`Error::InvalidName`], sending nothing. Making a `Lock` touches no network.
    ///
    /// [`MAX_NAME_LEN`]: crate::MAX_NAME_LEN
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let lock = client.lock(format!("invoice:{}", 42));
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn lock(&self, name: impl LockName) -> Lock {
        self.make_lock(name)
    }

    fn make_lock<K: Kind>(&self, name: impl LockName) -> Lock<K> {
        self.handle(name.into_name(), Object::Lock)
    }

    /// A handle of kind `K` on the object `object` called `name`.
    pub(crate) fn handle<K: Kind>(&self, name: Vec<u8>, object: Object) -> Lock<K> {
        let c = &self.inner.config;
        Lock::new(
            self.clone(),
            LockKeys::new(&c.key_prefix, name, &self.inner.id, object, K::OPS),
        )
    }

    /// The read-write lock called `name`: many readers or one writer, across threads and
    /// processes (see [`ReadWriteLock`]). A read-write lock and a lock of the same name
    /// are different objects. Making one touches no network.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let prices = client.read_write_lock("prices");
    /// let guard = prices.read().lock()?;   // shared with other readers
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn read_write_lock(&self, name: impl LockName) -> ReadWriteLock {
        ReadWriteLock::new(self, name.into_name())
    }

    /// The semaphore called `name`, with `permits` permits if it does not exist in Redis
    /// yet (see [`Semaphore`]): at most that many permits are held at once, across threads
    /// and processes. Making one touches no network; with zero `permits` every operation
    /// fails with [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let api = client.semaphore("partner-api", 4);
    /// let permit = api.acquire()?;          // one of at most 4 concurrent calls
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn semaphore(&self, name: impl LockName, permits: u32) -> Semaphore {
        Semaphore::new(self, name.into_name(), permits)
    }

    /// The fenced lock called `name`: a [`Lock`] whose guards also carry a fencing token
    /// that grows with every new hold of the name, so the resource it guards can refuse a
    /// holder whose lease ran out (see [`FencedLock`]). The same name through
    /// [`lock`](Client::lock) is the same lock, without tokens.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("ledger").lock()?;
    /// let token = guard.token(); // send it along with every write to the resource
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn fenced_lock(&self, name: impl LockName) -> FencedLock {
        self.make_lock(name)
    }

    /// The fair lock called `name`: a [`Lock`] that waiting threads get strictly in the
    /// order their requests reached Redis, each handed the lock directly by the release
    /// before it (see [`FairLock`]). The same name through [`lock`](Client::lock) is the
    /// same lock: while a fair waiter is queued, plain acquisitions queue behind it too.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fair_lock("payouts").lock()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn fair_lock(&self, name: impl LockName) -> FairLock {
        self.make_lock(name)
    }

    /// The count-down latch called `name`: a count that threads and processes count down
    /// and wait to see reach zero (see [`CountDownLatch`]). A latch and a lock of the same
    /// name are different objects. Making one touches no network.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let latch = client.count_down_latch("batch-42");
    /// latch.try_set_count(8, Duration::from_secs(600))?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn count_down_latch(&self, name: impl LockName) -> CountDownLatch {
        let c = &self.inner.config;
        CountDownLatch::new(
            self.clone(),
            LockKeys::new(
                &c.key_prefix,
                name.into_name(),
                &self.inner.id,
                Object::Lock,
                &scripts::PLAIN,
            ),
        )
    }

    /// What Redis records right now of each object called `name` that exists: its lock,
    /// read-write lock, semaphore and count-down latch (see [`LockInfo`]); empty when
    /// none does. One script call, reading only.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.inspect("nightly")?.first() {
    ///     Some(info) => println!("held by {:?}, {:?} left", info.holders, info.remaining_lease),
    ///     None => println!("free"),
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn inspect(&self, name: impl LockName) -> Result<Vec<LockInfo>, Error> {
        let name = name.into_name();
        self.inspect_name(&name).map_err(|e| e.on_lock(&name))
    }

    fn inspect_name(&self, name: &[u8]) -> Result<Vec<LockInfo>, Error> {
        crate::name::check(name, "lock names must not be empty")?;
        let c = &self.inner.config;
        // Each with its own kind's layout, so that the leases' keys are named.
        let keys = |object, ops| LockKeys::new(&c.key_prefix, name.to_vec(), "", object, ops);
        let (lock, rw, sem) = (
            keys(Object::Lock, &scripts::PLAIN),
            keys(Object::ReadWrite, &scripts::READ),
            keys(Object::Semaphore, &scripts::PERMITS),
        );
        type Object3 = Option<(
            String,
            i64,
            Vec<Vec<u8>>,
            Vec<Vec<u8>>,
            Option<u64>,
            Vec<Vec<u8>>,
        )>;
        type Reply = (
            Object3,
            Object3,
            Object3,
            Option<(String, i64, Option<u64>)>,
        );
        let mut call = ScriptCall::new(&scripts::INSPECT);
        call.key(lock.key())
            .key(lock.queue().as_slice())
            .key(lock.fence().as_slice())
            .key(rw.key())
            .key(rw.queue().as_slice())
            .key(sem.key())
            .key(sem.queue().as_slice())
            .key(sem.permits().as_slice())
            .key(lock.latch().as_slice())
            .key(rw.leases().as_slice())
            .key(sem.leases().as_slice());
        let (l, r, m, latch): Reply = self.inner.run(|con| self.inner.eval(con, &call))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let lease = |pttl: i64| (pttl >= 0).then(|| Duration::from_millis(pttl as u64));
        let mut out = Vec::new();
        for (found, keys, kind) in [
            (l, &lock, "lock"),
            (r, &rw, "read-write lock"),
            (m, &sem, "semaphore"),
        ] {
            let Some((redis_type, pttl, fields, queue, extra, ended)) = found else {
                continue;
            };
            let mut info = LockInfo {
                name: text(name),
                kind: if redis_type == "hash" || redis_type == "none" {
                    kind
                } else {
                    "foreign"
                },
                key: text(keys.key()),
                holders: Vec::new(),
                remaining_lease: lease(pttl),
                waiters: queue.iter().map(|w| text(w)).collect(),
                token: None,
                count: if kind == "semaphore" { extra } else { None },
                metadata: Vec::new(),
            };
            let mut records = std::collections::HashMap::new();
            for pair in fields.chunks_exact(2) {
                if let Some(holder) = pair[0].strip_prefix(META_PREFIX) {
                    records.insert(holder, &pair[1]);
                    continue;
                }
                let value = std::str::from_utf8(&pair[1])
                    .ok()
                    .and_then(|v| v.parse().ok());
                match (pair[0].first(), value) {
                    (Some(b'~'), v) => {
                        if pair[0] == b"~fence" {
                            info.token = v;
                        }
                    }
                    // A hold whose own lease ended is gone, whether or not a script has
                    // dropped it yet.
                    (_, Some(_)) if ended.contains(&pair[0]) => {}
                    (_, Some(count)) => info.holders.push((text(&pair[0]), count)),
                    (_, None) => {}
                }
            }
            // Only the holds shown: a record whose hold is not there is never reported.
            for pair in fields.chunks_exact(2) {
                let Some(record) = records.get(pair[0].as_slice()) else {
                    continue;
                };
                if !info.holders.iter().any(|(h, _)| h.as_bytes() == pair[0]) {
                    continue;
                }
                if let Some(metadata) = parse_metadata(text(&pair[0]), record) {
                    info.metadata.push(metadata);
                }
            }
            out.push(info);
        }
        if let Some((redis_type, pttl, count)) = latch {
            out.push(LockInfo {
                name: text(name),
                kind: if redis_type == "string" {
                    "count-down latch"
                } else {
                    "foreign"
                },
                key: text(&lock.latch()),
                holders: Vec::new(),
                remaining_lease: lease(pttl),
                waiters: Vec::new(),
                token: None,
                count,
                metadata: Vec::new(),
            });
        }
        Ok(out)
    }

    /// Every object of this client's key prefix whose name matches the glob `pattern`
    /// (`*`, `?`, `[abc]`; `"*"` for all), as [`inspect`](Client::inspect) reports it,
    /// sorted by name. Walks the keyspace with `SCAN` (never `KEYS`), so it does not
    /// block the server, and an object created or removed meanwhile may be missed. On a
    /// Redis Cluster every primary is walked (as `CLUSTER SLOTS` names them when the call
    /// starts); a slot that moves meanwhile may be missed or seen twice (seen once here).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// for info in client.list("deploy-*")? {
    ///     println!("{} {} {:?}", info.kind, info.name, info.holders);
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let glob = glob::Pattern::new(pattern)
            .map_err(|e| Error::InvalidArgument(format!("bad pattern {pattern:?}: {e}")))?;
        let prefix = self.inner.config.key_prefix.clone();
        let mut matching = Vec::new();
        for b in &prefix {
            if b"*?[]\\".contains(b) {
                matching.push(b'\\');
            }
            matching.push(*b);
        }
        matching.push(b'*');
        let mut names = std::collections::BTreeSet::new();
        // A SCAN cursor belongs to one server: a cluster's primaries are walked one by one.
        let nodes = if self.inner.is_cluster() {
            self.inner.run(|con| con.primaries())?
        } else {
            vec![None]
        };
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(matching.as_slice())
                    .arg("COUNT")
                    .arg(1000);
                let (next, keys): (u64, Vec<Vec<u8>>) =
                    self.inner.run(|con| con.query_on(&scan, node.as_ref()))?;
                for key in keys {
                    if let Some((_, _, name)) = keys::object_of(&prefix, &key) {
                        if glob.matches(&String::from_utf8_lossy(&name)) {
                            names.insert(name);
                        }
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        let mut out = Vec::new();
        for name in names {
            out.extend(self.inspect(name)?);
        }
        Ok(out)
    }

    /// Frees every object called `name` that can be held, whoever holds it: its lock
    /// (plain, fair or fenced holds), every reader and the writer of its read-write lock,
    /// and every permit held of its semaphore (its number of permits stays), each handed
    /// on to its first waiters. Returns the kinds that were held, as [`LockInfo::kind`]
    /// names them; empty when none was. A count-down latch has no holder and is left as it
    /// is. An administrative operation (what `redmutex unlock --force` runs), like
    /// [`Lock::force_unlock`]: the former holders are not stopped, but their clients are
    /// told at once (their guards' `lost()` fire, the hook is called) and their releases
    /// fail with [`Error::LeaseLost`]. Each kind is freed in one script of its own; a key holding someone else's
    /// data fails with a `WRONGTYPE` error and is left as it is, and then the kinds after
    /// it (in the order above) are not tried.
    pub fn force_unlock(&self, name: impl LockName) -> Result<Vec<&'static str>, Error> {
        let name = name.into_name();
        let mut freed = Vec::new();
        if self.lock(name.clone()).force_unlock()? {
            freed.push("lock");
        }
        if self.read_write_lock(name.clone()).write().force_unlock()? {
            freed.push("read-write lock");
        }
        if Semaphore::new(self, name, 0).force_unlock()? {
            freed.push("semaphore");
        }
        Ok(freed)
    }

    /// This client's random id: the first half of the holder ids it writes into lock hashes.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    pub(crate) fn from_config(target: Target, config: Config) -> Result<Client, Error> {
        let target = Arc::new(target);
        let topology = Arc::new(Topology::default());
        let manager = Manager {
            target: target.clone(),
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
            topology: topology.clone(),
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
            .thread_pool(Arc::new(
                scheduled_thread_pool::ScheduledThreadPool::builder()
                    .num_threads(1)
                    .thread_name_pattern("redmutex-pool")
                    .build(),
            ))
            .build_unchecked(manager);
        let id = uuid::Uuid::new_v4().to_string();
        let subscriber = Subscriber::new(
            Manager {
                target: target.clone(),
                connect_timeout: config.connect_timeout,
                command_timeout: config.command_timeout,
                topology: topology.clone(),
            },
            &config.key_prefix,
            &id,
        );
        let client = Client {
            inner: Arc::new(Inner {
                id,
                pid: std::process::id(),
                watchdog: HoldTable::new(config.on_lease_lost.clone()),
                scripting: Scripting::new(config.use_functions),
                handles: AtomicUsize::new(1),
                unreachable: parking_lot::Mutex::new(None),
                node_down: parking_lot::Mutex::new(None),
                subscriber,
                config,
                pool,
                target,
                topology,
            }),
        };
        if client.inner.watchdog.notifier.has_hook() {
            // The hook must hear of every loss, also of holds nobody watches.
            client
                .inner
                .watchdog
                .notifier
                .ensure_running(&client.inner)?;
        }
        Ok(client)
    }
}

impl Inner {
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
    /// read `epoch` ([`topology_epoch`](Inner::topology_epoch)): then two times read from
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
    /// cluster, perhaps on another node than the lock's, so that a release there cannot
    /// count it among the subscribers.
    pub(crate) fn listener_flags(&self) -> u8 {
        if self.target.is_cluster() {
            8
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
        let quiet = self.config.connect_timeout + self.config.watchdog_timeout;
        let (since, last) = match *down {
            Some((since, last)) if now.saturating_duration_since(last) < quiet => (since, now),
            _ => (now, now),
        };
        *down = Some((since, last));
        since
    }

    /// Whether any `Client` (or `Lock`) of this client is still alive.
    pub(crate) fn has_handles(&self) -> bool {
        self.handles.load(Ordering::Acquire) > 0
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
    pub(crate) fn idle_connection(&self) -> Option<r2d2::PooledConnection<Manager>> {
        let mut conn = self.pool.try_get()?;
        if conn.generation != self.target.generation() || conn.single().is_none() {
            conn.mark_broken();
            return None;
        }
        Some(conn)
    }

    /// Runs `f` on a pooled connection with the configured timeouts; see
    /// [`run_until`](Inner::run_until).
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
    pub(crate) fn run_until<T>(
        &self,
        until: Option<Instant>,
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.run_with(until, true, None, f)
    }

    /// [`run_until`](Inner::run_until) for the watchdog thread: while the call waits out
    /// a settling deployment, `meanwhile` runs in its pauses (the extensions of holds
    /// handed over, whose pickup window is shorter than such a wait may last).
    pub(crate) fn run_minding<T>(
        &self,
        until: Option<Instant>,
        meanwhile: &mut dyn FnMut(),
        f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.run_with(until, true, Some(meanwhile), f)
    }

    /// A new id for one call whose script records it (see [`CALL_MEMORY`]): the client's
    /// id and a random part, so no two calls anywhere share one.
    pub(crate) fn call_id(&self) -> String {
        format!("{}:{}", self.id, uuid::Uuid::new_v4())
    }

    /// Runs `f` like [`run`](Inner::run), for a call whose script records the call's id for
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
        self.run_with(None, false, None, f)
    }

    fn run_with<T>(
        &self,
        until: Option<Instant>,
        repeatable: bool,
        mut meanwhile: Option<&mut dyn FnMut()>,
        mut f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        self.check_process()?;
        let config = &self.config;
        let mut retries = 0;
        // While the deployment settles (see `pool::is_settling`): since when, and the
        // next pause.
        let mut settling: Option<(Instant, Duration)> = None;
        loop {
            let (checkout, io) = match until {
                None => (config.connect_timeout, config.command_timeout),
                Some(until) => {
                    let left = time_left(until);
                    (
                        left.min(config.connect_timeout),
                        left.min(config.command_timeout),
                    )
                }
            };
            let mut pooled: r2d2::PooledConnection<Manager> = self.pool.get_timeout(checkout)?;
            let conn: &mut Conn = &mut pooled;
            if conn.generation != self.target.generation() {
                // Made to a primary the sentinels no longer name: retired on return. The
                // generation changes once per failover, so this ends within the pool.
                conn.mark_broken();
                continue;
            }
            let result = conn.run(io, &mut f);
            // Back to the pool before any pause: what runs meanwhile may need it.
            drop(pooled);
            match result {
                // Refused before it ran: a slot mid-migration, a failover under way (the
                // slot's primary dead and its replica not yet promoted: its connections
                // refused, or CLUSTERDOWN). The call waits it out, with a growing pause,
                // for as long as a connection to a new primary would be waited for, and
                // never past its deadline: a call stopped by its deadline says `Timeout`.
                Err(e) if pool::is_settling(&e) || (repeatable && self.is_node_down(&e)) => {
                    let down = self.is_node_down(&e);
                    let (began, pause) = settling.get_or_insert_with(|| {
                        let first = if down { DOWN_PAUSE } else { SETTLE_PAUSE };
                        (Instant::now(), first)
                    });
                    let now = Instant::now();
                    let give_up = if down {
                        // Past the outage's bound a call still gets a few quick tries:
                        // a refusal may come from a slot-map refresh on the way to a
                        // node that is up.
                        (*began + config.connect_timeout)
                            .min(self.node_down_since(now) + config.connect_timeout)
                            .max(*began + DOWN_PAUSE * 7)
                    } else {
                        *began + config.connect_timeout
                    };
                    if now + *pause >= give_up {
                        return Err(e.into());
                    }
                    if until.is_some_and(|u| now + *pause >= u) {
                        return Err(Error::timeout(e));
                    }
                    log::debug!("redmutex: retrying in {pause:?}: {e}");
                    if let Some(meanwhile) = meanwhile.as_mut() {
                        meanwhile();
                    }
                    std::thread::sleep((now + *pause).saturating_duration_since(Instant::now()));
                    let most = if down {
                        MAX_DOWN_PAUSE
                    } else {
                        MAX_SETTLE_PAUSE
                    };
                    *pause = (*pause * 2).min(most).max(*pause);
                }
                // A demoted primary refused the write: nothing happened, so even a call
                // that must not run twice may run again, on a connection to the new one.
                Err(e) if pool::is_readonly(&e) && retries < self.config.pool_size => {
                    log::info!("redmutex: the primary was demoted; looking for the new one");
                    self.target.refresh(config.connect_timeout);
                    retries += 1;
                }
                Err(e)
                    if repeatable
                        && e.is_connection_dropped()
                        && !e.is_timeout()
                        && retries < self.config.pool_size =>
                {
                    log::debug!("redmutex: connection dropped, retrying on another: {e}");
                    retries += 1;
                }
                result => return Ok(result?),
            }
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("url", &c.redacted_url)
            .field("key_prefix", &String::from_utf8_lossy(&c.key_prefix))
            .field("watchdog_timeout", &c.watchdog_timeout)
            .field("pool_size", &c.pool_size)
            .field("connect_timeout", &c.connect_timeout)
            .field("command_timeout", &c.command_timeout)
            .field("use_functions", &c.use_functions)
            .finish()
    }
}

/// The prefix of a holds hash's field that records the metadata of the hold named by the
/// rest of it (see `lua/queue.lua`).
const META_PREFIX: &[u8] = b"~m:";

/// A hold's metadata record, `"<server ms> <text>"`; `None` when it is not one.
fn parse_metadata(holder: String, record: &[u8]) -> Option<HolderMetadata> {
    let space = record.iter().position(|&b| b == b' ')?;
    let ms: u64 = std::str::from_utf8(&record[..space]).ok()?.parse().ok()?;
    Some(HolderMetadata {
        holder,
        text: String::from_utf8_lossy(&record[space + 1..]).into_owned(),
        since: std::time::UNIX_EPOCH + Duration::from_millis(ms),
    })
}
