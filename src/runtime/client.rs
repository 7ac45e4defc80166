//! `Client`: the public handle on one Redis deployment, and the factories that make its
//! handles (locks, read-write locks, semaphores, latches). What its clones share is
//! `inner.rs`; its calls run in its executor (`connection/executor.rs`), its
//! administrative operations are in `admin.rs`.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::runtime::config::Config;
use crate::runtime::connection::target::Target;
use crate::runtime::inner::Inner;
use crate::runtime::keys::{LockKeys, Object};
use crate::runtime::scripting::scripts;
use crate::{
    ClientBuilder, CountDownLatch, Error, FairLock, FencedLock, Kind, Lock, LockName,
    ReadWriteLock, Semaphore,
};

/// A handle to one Redis deployment, from which named [`Lock`]s are made.
///
/// Cheap to clone (clones share everything) and safe to share between threads. Each client
/// has a random id, so holder ids of different clients, even in one process, never meet.
/// It owns a pool of command connections, at most one pub/sub connection (opened when a
/// thread first has to wait) and at most one watchdog thread (started when the first
/// watchdog lease is taken), at most one loss thread (started when a guard's `lost()`
/// is first asked for, or at once with an
/// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) hook) and, with a hook, one thread
/// that calls it; the threads end once the last clone and guard are dropped (within about
/// a second).
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
    #[doc(alias = "new")]
    #[doc(alias = "connect")]
    pub fn open(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder().url(url).build()
    }

    /// A builder with every setting at its default: set the server with
    /// [`url`](ClientBuilder::url) (or [`sentinel`](ClientBuilder::sentinel),
    /// [`cluster`](ClientBuilder::cluster)), then [`build`](ClientBuilder::build). It takes
    /// no argument: the URL is a setting like the others, `Client::builder().url(url)`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let client = redmutex::Client::builder()
    ///     .url("redis://127.0.0.1:6379/")
    ///     .watchdog_timeout(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "Config")]
    #[doc(alias = "Redisson.create")]
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
    #[doc(alias = "getLock")]
    #[doc(alias = "get_lock")]
    #[doc(alias = "mutex")]
    pub fn lock(&self, name: impl LockName) -> Lock {
        self.make_lock(name)
    }

    fn make_lock<K: Kind>(&self, name: impl LockName) -> Lock<K> {
        self.handle(name.into_name(), Object::Lock)
    }

    /// A handle of kind `K` on the object `object` called `name`.
    pub(crate) fn handle<K: Kind>(&self, name: Vec<u8>, object: Object) -> Lock<K> {
        let c = &self.inner.exec.config;
        Lock::new(
            self.clone(),
            LockKeys::new(&c.key_prefix, name, &self.inner.exec.id, object, K::OPS),
        )
    }

    /// The read-write lock called `name`: many readers or one writer, across threads and
    /// processes (see [`ReadWriteLock`]). A read-write lock and a lock of the same name
    /// are different objects. Making one touches no network.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let prices = client.read_write_lock("prices");
    /// let guard = prices.read()?;          // shared with other readers
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "getReadWriteLock")]
    #[doc(alias = "rwlock")]
    pub fn read_write_lock(&self, name: impl LockName) -> ReadWriteLock {
        ReadWriteLock::new(self, name.into_name())
    }

    /// The semaphore called `name`, with `permits` permits if it does not exist in Redis
    /// yet (see [`Semaphore`]): at most that many permits are held at once, across threads
    /// and processes. Making one touches no network; with zero `permits` every operation
    /// fails with [`Error::InvalidArgument`], and so does every acquisition when the name
    /// is defined with another number (never silently that one). Its definition expires
    /// a day past its last use ([`Semaphore::with_expire_after`] to choose).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let api = client.semaphore("partner-api", 4);
    /// let permit = api.acquire()?;          // one of at most 4 concurrent calls
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "getSemaphore")]
    #[doc(alias = "getPermitExpirableSemaphore")]
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
    #[doc(alias = "getFencedLock")]
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
    #[doc(alias = "getFairLock")]
    pub fn fair_lock(&self, name: impl LockName) -> FairLock {
        self.make_lock(name)
    }

    /// The count-down latch called `name`: a count that threads and processes count down
    /// and wait to see reach zero (see [`CountDownLatch`]). A latch and a lock of the same
    /// name are different objects. Making one touches no network.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let latch = client.count_down_latch("batch-42");
    /// latch.try_set_count(8)?; // expires in an hour (CountDownLatch::DEFAULT_EXPIRY)
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "getCountDownLatch")]
    #[doc(alias = "latch")]
    pub fn count_down_latch(&self, name: impl LockName) -> CountDownLatch {
        let c = &self.inner.exec.config;
        CountDownLatch::new(
            self.clone(),
            LockKeys::new(
                &c.key_prefix,
                name.into_name(),
                &self.inner.exec.id,
                Object::Lock,
                &scripts::PLAIN,
            ),
        )
    }

    /// This client's random id: the first half of the holder ids it writes into lock hashes.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// println!("holder ids of this process start with {}", client.id());
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn id(&self) -> &str {
        &self.inner.exec.id
    }

    pub(crate) fn from_config(target: Target, config: Config) -> Result<Client, Error> {
        let id = uuid::Uuid::new_v4().to_string();
        let client = Client {
            inner: Arc::new(Inner::new(id, target, config)),
        };
        if client.inner.holds.notifier.has_hook() {
            // The hook must hear of every loss, also of holds nobody watches.
            client.inner.holds.notifier.ensure_running(&client.inner)?;
        }
        Ok(client)
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.exec.config;
        f.debug_struct("Client")
            .field("id", &self.inner.exec.id)
            .field("url", &c.redacted_url)
            .field("key_prefix", &String::from_utf8_lossy(&c.key_prefix))
            .field("watchdog_timeout", &c.lease.watchdog())
            .field("pool_size", &c.pool_size)
            .field("connect_timeout", &c.connect_timeout)
            .field("command_timeout", &c.command_timeout)
            .field("use_functions", &c.use_functions)
            .finish()
    }
}
