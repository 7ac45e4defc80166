//! `CountDownLatch`: wait, across processes, until a count of events has happened.

use std::fmt;
use std::time::{Duration, Instant};

use crate::runtime::connection::executor::CALL_MEMORY;
use crate::runtime::holds::lease::{IO_GRACE, MAX_LEASE};
use crate::runtime::keys::{self, thread_token, LockKeys};
use crate::runtime::scripting::calls;
use crate::runtime::subscriber::BROADCAST;
use crate::{Client, Error};

/// A count that every thread and process using the name can count down, and wait to see
/// reach zero: "go on once all N jobs are done".
///
/// One party sets the count with [`try_set_count`](CountDownLatch::try_set_count), the
/// workers call [`count_down`](CountDownLatch::count_down) as they finish, and any number
/// of threads in any process [`wait`](CountDownLatch::wait) until it reaches zero. Waiting
/// does not poll: the count-down that opens the latch publishes one message that wakes
/// every waiter. The latch is one Redis string with an expiry (one hour unless the setter
/// chose another: [`LatchOptions::expire_after`]), so a latch left counting by crashed
/// workers does not stay forever; an expired latch reads 0 and counts as open, like one
/// that was never set.
///
/// # Guarantees
///
/// - A waiter returns only once the count reached zero or the latch expired (or its own
///   deadline passed: `Ok(false)`); an opening is never missed, whenever it comes between
///   the waiter's subscription and its first read.
/// - The count is set once per round: a second [`try_set_count`](CountDownLatch::try_set_count)
///   while counting changes nothing, and a repeat after a lost reply never sets twice.
/// - No count below zero; a latch left by crashed workers expires when its setter said (an
///   hour unless it said otherwise).
/// - Bounded waits return by their deadline plus 250 ms, even when Redis stops answering.
///
/// ```no_run
/// # use std::time::Duration;
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let latch = client.count_down_latch("nightly-import");
/// latch.try_set_count(3)?;               // three shards to import; expires in an hour
/// // ... each of three workers, anywhere: latch.count_down()?;
/// if latch.wait_for(Duration::from_secs(600))? {
///     println!("all shards imported");
/// }
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone)]
pub struct CountDownLatch {
    client: Client,
    name: Vec<u8>,
    // The latch's key and channel: `<prefix>!latch:<lock key of the name, unprefixed>`,
    // in the name's hash slot and a namespace no lock name reaches.
    key: Vec<u8>,
    channel: Vec<u8>,
    // The id of the call that last set the count (see `lua/latch_set.lua`).
    setter: Vec<u8>,
    // The name's lock, read-write lock and semaphore: a name is one kind at a time, so
    // the latch is not set while one of them is held.
    others: [Vec<u8>; 3],
}

impl CountDownLatch {
    pub(crate) fn new(client: Client, keys: LockKeys) -> CountDownLatch {
        let key = keys.latch();
        let mut channel = key.clone();
        channel.extend_from_slice(b":opened");
        CountDownLatch {
            client,
            setter: keys.latch_setter(),
            others: keys.other_kinds(true),
            name: keys.name().to_vec(),
            key,
            channel,
        }
    }

    /// How long a latch set with [`try_set_count`](CountDownLatch::try_set_count) lasts
    /// whatever its count: one hour. Then it reads 0 and its waiters return, as if it had
    /// opened. Set the expiry longer than the work it counts can take, with
    /// [`try_set_count_with`](CountDownLatch::try_set_count_with) and
    /// [`LatchOptions::expire_after`].
    pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(3600);

    /// Sets the count to `count`, unless the latch is counting already (then `Ok(false)`
    /// and nothing changes). The latch expires [`DEFAULT_EXPIRY`](Self::DEFAULT_EXPIRY)
    /// (one hour) from now whatever its count: then it reads 0 and its waiters return. For
    /// another expiry, [`try_set_count_with`](CountDownLatch::try_set_count_with).
    ///
    /// A call whose reply was lost is sent again, and the repeat recognizes the set its
    /// first run made: `Ok(true)`, never "someone else set it", and never a second set.
    ///
    /// Any count from 1 to `i64::MAX` is kept exactly (Redis integers, never a Lua double).
    /// Fails with [`Error::InvalidArgument`] for a zero count or one above `i64::MAX`, and
    /// with [`Error::WrongKind`] while the name is held as a lock, a read-write lock or a
    /// semaphore (a name is one kind at a time; nothing is changed).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let latch = client.count_down_latch("batch-42");
    /// if !latch.try_set_count(10)? {
    ///     println!("another coordinator set it already");
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "trySetCount")]
    #[doc(alias = "set_count")]
    pub fn try_set_count(&self, count: u64) -> Result<bool, Error> {
        self.try_set_count_with(count, LatchOptions::new())
    }

    /// [`try_set_count`](CountDownLatch::try_set_count) with [`LatchOptions`]: another
    /// expiry. Fails as `try_set_count` does, and with [`Error::InvalidArgument`] for a
    /// zero expiry or one over ten years (nothing is sent).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redmutex::LatchOptions;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let latch = client.count_down_latch("nightly-import");
    /// // The import can take all night: the latch lasts 12 hours if nobody opens it.
    /// let options = LatchOptions::new().expire_after(Duration::from_secs(12 * 3600));
    /// latch.try_set_count_with(3, options)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn try_set_count_with(&self, count: u64, options: LatchOptions) -> Result<bool, Error> {
        let expire_after = options.expire_after;
        self.check_name()?;
        Self::check_count(count, expire_after).map_err(|e| e.on_lock(&self.name))?;
        let exec = &self.client.inner.exec;
        let (key, setter, id) = (self.key.as_slice(), self.setter.as_slice(), exec.call_id());
        // A repeat after a lost reply finds its own id and answers that it set the count,
        // even if the latch opened in between (it is not set again).
        let call = calls::latch_set(
            key,
            setter,
            &self.others,
            count,
            expire_after,
            &id,
            CALL_MEMORY,
        );
        let set: i64 = exec
            .run_remembered(|con| exec.eval(con, &call))
            .map_err(|e| e.on_lock(&self.name))?;
        if set < 0 {
            return Err(Error::wrong_kind(keys::kind_name(-set)).on_lock(&self.name));
        }
        Ok(set == 1)
    }

    /// Counts down by one and returns the count left; the call that reaches zero opens the
    /// latch and wakes every waiter. On a latch that is not counting (open, expired, never
    /// set) it changes nothing and returns 0.
    ///
    /// Not idempotent: a call whose reply was lost (the connection failed after sending)
    /// may or may not have counted, and is not repeated by the client.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let left = client.count_down_latch("batch-42").count_down()?; // one job done
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "countDown")]
    pub fn count_down(&self) -> Result<u64, Error> {
        self.check_name()?;
        let (key, channel) = (self.key.as_slice(), self.channel.as_slice());
        let call = calls::latch_count_down(key, channel, BROADCAST);
        let exec = &self.client.inner.exec;
        let left: i64 = exec
            .run_once(|con| exec.eval(con, &call))
            .map_err(|e| e.on_lock(&self.name))?;
        Ok(left.max(0) as u64)
    }

    /// The count left: 0 when the latch is open (reached zero, expired or never set).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// println!("{} jobs to go", client.count_down_latch("batch-42").count()?);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "getCount")]
    #[doc(alias = "get_count")]
    pub fn count(&self) -> Result<u64, Error> {
        Ok(self.state(None)?.0)
    }

    /// Blocks until the latch is open (its count reached zero, or it expired): Redisson's
    /// `await()` (`await` is a keyword in Rust).
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// client.count_down_latch("batch-42").wait()?;
    /// println!("the batch is done");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "await")]
    pub fn wait(&self) -> Result<(), Error> {
        self.wait_with(None).map(|_| ())
    }

    /// Blocks at most `timeout` for the latch to open: `Ok(true)` when it did. A timeout
    /// too long to add to the current time waits like [`wait`](CountDownLatch::wait).
    /// Redisson's `await(timeout, unit)`.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// if !client.count_down_latch("batch-42").wait_for(Duration::from_secs(60))? {
    ///     println!("still not done after a minute");
    /// }
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "await")]
    #[doc(alias = "await_for")]
    pub fn wait_for(&self, timeout: Duration) -> Result<bool, Error> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_until(deadline),
            None => self.wait_with(None),
        }
    }

    /// Blocks until `deadline` at most for the latch to open: `Ok(true)` when it did.
    /// Returns by the deadline plus 250 ms even when Redis stops answering.
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let deadline = Instant::now() + Duration::from_secs(60);
    /// let open = client.count_down_latch("batch-42").wait_until(deadline)?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "await_until")]
    pub fn wait_until(&self, deadline: Instant) -> Result<bool, Error> {
        self.wait_with(Some(deadline))
    }

    /// The name the latch was made with.
    ///
    /// ```no_run
    /// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// assert_eq!(client.count_down_latch("batch-42").name(), b"batch-42");
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The one waiting path: subscribe, read the count once the subscription is confirmed
    /// (an opening before that would be missed), then sleep until the opening message, the
    /// latch's expiry, or the deadline.
    fn wait_with(&self, deadline: Option<Instant>) -> Result<bool, Error> {
        self.check_name()?;
        let inner = &self.client.inner;
        inner.exec.check_process()?;
        let until = deadline.map(|d| d.max(Instant::now()) + IO_GRACE);
        let (count, pttl) = self.state(until)?;
        if count == 0 {
            return Ok(true);
        }
        let mut expires = self.expiry(pttl);
        let sub =
            inner
                .subscriber
                .subscribe(&inner.exec, &self.channel, thread_token(), until, false)?;
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let wake_at = deadline.map_or(expires, |d| d.min(expires));
            // Read the count only once the subscription is confirmed: an opening between
            // the read and the confirmation would otherwise be missed. (Unconfirmed at the
            // latch's expiry, it reads the count anyway: an expiry publishes nothing.)
            // A channel the server refuses can never be confirmed: the wait fails.
            if !sub.is_confirmed()
                && !sub
                    .wait_confirmed(wake_at, None)
                    .map_err(|e| e.on_lock(&self.name))?
                && Instant::now() < wake_at
            {
                continue;
            }
            let (count, pttl) = self.state(until)?;
            if count == 0 {
                return Ok(true);
            }
            expires = self.expiry(pttl);
            if sub.is_confirmed() {
                // Woken by the opening message (to every waiter of the latch), or at the
                // expiry or the deadline: the loop reads the count again.
                let _ = sub.wait(deadline.map_or(expires, |d| d.min(expires)), None);
            }
        }
    }

    /// When a latch whose key has `pttl` ms left expires (it then reads 0, and nothing is
    /// published): a key somehow without expiry is looked at again after a minute.
    fn expiry(&self, pttl: i64) -> Instant {
        let left = match pttl {
            ms if ms >= 0 => Duration::from_millis(ms as u64 + 1),
            _ => Duration::from_secs(60),
        };
        Instant::now() + left
    }

    fn state(&self, until: Option<Instant>) -> Result<(u64, i64), Error> {
        self.check_name()?;
        let key = self.key.as_slice();
        let call = calls::latch_state(key);
        let exec = &self.client.inner.exec;
        let (count, pttl): (i64, i64) = exec
            .run_until(until, |con| exec.eval(con, &call))
            .map_err(|e| e.on_lock(&self.name))?;
        Ok((count.max(0) as u64, pttl))
    }

    /// Whether `count` and `expire_after` are ones a latch can be set to.
    fn check_count(count: u64, expire_after: Duration) -> Result<(), Error> {
        if count == 0 || count > i64::MAX as u64 {
            return Err(Error::invalid(format!(
                "a latch count must be between 1 and {}, not {count}",
                i64::MAX
            )));
        }
        if expire_after.is_zero() || expire_after > MAX_LEASE {
            return Err(Error::invalid(format!(
                "a latch expiry must be longer than zero and at most ten years, not {expire_after:?}"
            )));
        }
        Ok(())
    }

    fn check_name(&self) -> Result<(), Error> {
        crate::name::check(&self.name, "latch names must not be empty")
    }
}

/// What [`CountDownLatch::try_set_count_with`] sets beyond the count: how long the latch
/// lasts. A consuming builder, as [`LockOptions`](crate::LockOptions) is for locks: start
/// from [`LatchOptions::new`] (or `Default`), set what differs.
///
/// ```no_run
/// use std::time::Duration;
/// use redmutex::LatchOptions;
///
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let options = LatchOptions::new().expire_after(Duration::from_secs(600));
/// client.count_down_latch("batch-42").try_set_count_with(4, options)?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "options do nothing until passed to `try_set_count_with`"]
pub struct LatchOptions {
    expire_after: Duration,
}

impl Default for LatchOptions {
    fn default() -> LatchOptions {
        LatchOptions {
            expire_after: CountDownLatch::DEFAULT_EXPIRY,
        }
    }
}

impl LatchOptions {
    /// The defaults: the latch expires after
    /// [`CountDownLatch::DEFAULT_EXPIRY`] (one hour).
    ///
    /// ```no_run
    /// let options = redmutex::LatchOptions::new();
    /// ```
    pub fn new() -> LatchOptions {
        LatchOptions::default()
    }

    /// The latch expires `expire_after` from when its count is set, whatever its count:
    /// then it reads 0 and its waiters return, as if it had opened, so that a latch left
    /// counting by crashed workers does not stay forever. Set it longer than the work it
    /// counts can take. Must be longer than zero and at most ten years (the set fails with
    /// [`Error::InvalidArgument`] otherwise).
    ///
    /// Defaults to [`CountDownLatch::DEFAULT_EXPIRY`], one hour.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let options = redmutex::LatchOptions::new().expire_after(Duration::from_secs(4 * 3600));
    /// ```
    #[doc(alias = "expire")]
    #[doc(alias = "ttl")]
    pub fn expire_after(mut self, expire_after: Duration) -> LatchOptions {
        self.expire_after = expire_after;
        self
    }
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("key", &String::from_utf8_lossy(&self.key))
            .finish()
    }
}
