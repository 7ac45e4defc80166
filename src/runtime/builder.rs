//! `ClientBuilder`: the settings of a `Client`, with their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::client::Client;
use crate::runtime::config::Config;
use crate::runtime::connection::target::{Sentinel, Target};
use crate::runtime::connection::urls::{
    cluster_target, parse_urls, redact_url, tls_certificates, tls_client,
};
use crate::runtime::holds::lease::LeasePolicy;
use crate::runtime::holds::loss::Hook;
use crate::Error;

/// The longest text [`ClientBuilder::metadata`] takes, in bytes.
const MAX_METADATA: usize = 1024;

/// Builds a [`Client`] with non-default settings.
///
/// ```no_run
/// use std::time::Duration;
/// let client = redmutex::Client::builder()
///     .url("redis://127.0.0.1:6379/")
///     .key_prefix("billing:locks:")
///     .watchdog_timeout(Duration::from_secs(10))
///     .build()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[must_use = "a builder does nothing until .build() is called"]
pub struct ClientBuilder {
    url: String,
    key_prefix: String,
    watchdog_timeout: Duration,
    pool_size: u32,
    connect_timeout: Duration,
    command_timeout: Duration,
    sync_replicas: Option<(u32, Duration)>,
    tls_ca: Option<Vec<u8>>,
    tls_client: Option<(Vec<u8>, Vec<u8>)>,
    sentinel: Option<(Vec<String>, String)>,
    cluster: Option<Vec<String>>,
    use_functions: bool,
    on_lease_lost: Option<Hook>,
    max_hold: Option<Duration>,
    metadata: Option<String>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            url: "redis://127.0.0.1:6379/".to_owned(),
            key_prefix: "redmutex:".to_owned(),
            watchdog_timeout: Duration::from_secs(30),
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(3),
            sync_replicas: None,
            tls_ca: None,
            tls_client: None,
            sentinel: None,
            cluster: None,
            use_functions: true,
            on_lease_lost: None,
            max_hold: None,
            metadata: None,
        }
    }
}

impl ClientBuilder {
    /// The Redis server, as a `redis://` URL (`redis://[user:password@]host[:port][/db]`):
    /// `Client::builder().url(url)`, then the other settings, then
    /// [`build`](ClientBuilder::build). ([`Client::open(url)`](Client::open) is the same with
    /// every other setting at its default.) A URL with a wrong part fails `build` with
    /// [`Error::InvalidUrl`].
    ///
    /// Defaults to `redis://127.0.0.1:6379/`.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .url("rediss://locks:secret@redis.internal:6380/2") // user, password, TLS, db 2
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// Talks to the primary of the Sentinel-monitored service `service_name`, found by
    /// asking the sentinels at `sentinel_urls` (`redis://[user:password@]host:port`, the
    /// credentials being the sentinels' own) instead of a fixed server.
    ///
    /// Every new connection asks the sentinels (the first that answers is asked first
    /// from then on) and checks with `ROLE` that the node is a primary. Through a
    /// failover, operations wait for the new primary for up to the
    /// [`connect_timeout`](ClientBuilder::connect_timeout); connections to the old one
    /// are retired, and waiting threads move to the new one and look again. A hold the
    /// failover lost is reported by [`is_lease_lost`](crate::LockGuard::is_lease_lost)
    /// and [`Error::LeaseLost`]; [`sync_replicas`](ClientBuilder::sync_replicas) makes
    /// such losses rare (see [`guide::topologies`](crate::guide::topologies) for what is guaranteed).
    ///
    /// The [`url`](ClientBuilder::url), if set, then only carries what the connections to
    /// the primary need besides its address: user, password, database and, with
    /// `rediss://`, TLS. Its host and port are ignored.
    ///
    /// Defaults to off: a single server at [`url`](ClientBuilder::url).
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "locks")
    ///     .url("redis://:primary-password@sentinel-named/0")
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn sentinel<I, S>(mut self, sentinel_urls: I, service_name: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sentinel = Some((
            sentinel_urls.into_iter().map(Into::into).collect(),
            service_name.into(),
        ));
        self
    }

    /// Talks to the Redis Cluster reached through any of `node_urls`
    /// (`redis[s]://[user:password@]host:port`; a few of the nodes are enough, the others
    /// are discovered) instead of a single server.
    ///
    /// Every script of a lock touches keys of one hash slot (the name is the hash tag),
    /// and runs on that slot's primary; `MOVED` and `ASK` redirections during resharding
    /// and `TRYAGAIN` while a slot migrates are followed and retried, within the call's
    /// timeouts. Wake-ups travel by classic pub/sub, which the cluster delivers on every
    /// node, so the client's one pub/sub connection may be to any node. See
    /// [`guide::topologies`](crate::guide::topologies).
    ///
    /// Defaults to off: a single server at [`url`](ClientBuilder::url).
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000", "redis://10.0.0.3:7000"])
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn cluster<I, S>(mut self, node_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.cluster = Some(node_urls.into_iter().map(Into::into).collect());
        self
    }

    /// Prepended to every key and channel this client uses, so that locks of different
    /// applications sharing a Redis do not meet. It must not contain `{` or `}` (those
    /// would break the hash tag that keeps a lock's keys in one cluster slot), nor `!`, `~`
    /// or `#`, which start what follows the prefix in a key: without them no key of one
    /// prefix is ever a key of another (`a!queue:`'s lock `x` would be `a`'s queue of `x`).
    ///
    /// Defaults to `"redmutex:"`.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder().key_prefix("billing:").build()?;
    /// // client.lock("invoice") is the Redis key billing:{invoice}
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The lease of locks taken without an explicit lease (`Lock::lock`, `try_lock*`). The
    /// watchdog renews them every third of it for as long as they are held, so it is also
    /// how long such a lock outlives a crashed holder.
    ///
    /// Must be longer than [`command_timeout`](ClientBuilder::command_timeout) (`build`
    /// fails otherwise): a lock taken by a slow acquire would otherwise lapse before its
    /// guard exists. A renewal call gives up after a third of this timeout, whatever the
    /// command timeout, so that one slow renewal leaves time for the next.
    ///
    /// Defaults to 30 seconds.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// // A crashed holder's locks free themselves within 10 s.
    /// let client = redmutex::Client::builder()
    ///     .watchdog_timeout(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "lockWatchdogTimeout")]
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// A hook told of every hold of this client that is lost, once per hold (a thread's
    /// nested levels of one lock are one hold), with the lock's name, its kind and why
    /// ([`LostLease`](crate::LostLease)); never of a hold released normally.
    ///
    /// The hook runs on a thread of the client's own (`redmutex-hook`), never while the
    /// client holds an internal lock, and is told as soon as the loss is known: when a
    /// renewal finds the hold gone, when a fixed lease runs out or no renewal reached Redis
    /// within the lease (at that instant, whether anyone polls or not), when a
    /// `force_unlock` is heard, when a later acquisition or a release finds it gone. The
    /// calls come one at a time, in the order the holds were lost. Keep it short (log,
    /// count, alert): a slow hook delays only its own later calls, never a renewal, and
    /// never another hold being marked lost (its guards'
    /// [`lost()`](crate::LockGuard::lost) and
    /// [`is_lease_lost()`](crate::LockGuard::is_lease_lost) say so at once, whatever the
    /// hook is doing). A panic in it is caught and logged. The thread ends once the client
    /// is gone (every clone and guard dropped) and the calls queued before are made.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .on_lease_lost(|lost| {
    ///         // (The library says it at WARN already: the hook is for what the program does.)
    ///         tracing::error!(lock = %lost.name_lossy(), reason = %lost.reason(), "page someone")
    ///     })
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    ///
    /// Defaults to none.
    pub fn on_lease_lost(
        mut self,
        hook: impl Fn(&crate::LostLease) + Send + Sync + 'static,
    ) -> Self {
        self.on_lease_lost = Some(Arc::new(hook));
        self
    }

    /// The longest the watchdog renews a hold: a holder that is stuck (a deadlock, a
    /// loop) cannot keep a lock forever. The lease of a watchdog hold is never renewed
    /// past `max_hold` from its (outermost) acquisition, and its first lease is no longer
    /// than `max_hold`: the key runs out at that instant, the lock is free for others, and
    /// the hold is reported lost then ([`LossReason::MaxHold`](crate::LossReason::MaxHold),
    /// to [`is_lease_lost`](crate::LockGuard::is_lease_lost),
    /// [`lost`](crate::LockGuard::lost) and the [`on_lease_lost`](ClientBuilder::on_lease_lost)
    /// hook). A nested level taken later sets its own first lease like any acquisition
    /// (at most a `watchdog_timeout`, or its handle's `max_hold`), which the lock keeps.
    /// Fixed leases are not affected: they end when they say. One handle can set its own
    /// with [`Lock::with_max_hold`](crate::Lock::with_max_hold). Must be longer than
    /// [`command_timeout`](ClientBuilder::command_timeout) (`build` fails otherwise), for
    /// the reason `watchdog_timeout` must.
    ///
    /// Defaults to no cap.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let client = redmutex::Client::builder()
    ///     .max_hold(Duration::from_secs(3600)) // no hold of this client outlives an hour
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Free text every hold this client takes records beside its holder id, with the
    /// server's time when it was taken, for operators to see who holds a lock
    /// ([`Client::inspect`], [`Client::list`], `redmutex status`): a host name, a process
    /// id, a command line. Every kind of hold carries it (locks, read-write locks,
    /// semaphore permits, owned and `MultiLock` holds, and holds handed over from the
    /// queue), in the lock's own hash, so it lives exactly as long as the hold: a release
    /// of the last level, a forced unlock or the lease's end removes it. Re-entries keep
    /// the outermost level's record. At most 1 KiB (`build` fails otherwise); it is sent
    /// with every acquisition, so keep it short.
    ///
    /// Defaults to none: holds carry nothing extra and cost nothing more.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .url("redis://127.0.0.1:6379/")
    ///     .metadata(format!("host=build-7 pid={}", std::process::id()))
    ///     .build()?;
    /// let _guard = client.lock("nightly-report").lock()?;
    /// let info = &client.inspect("nightly-report")?[0];
    /// println!("{} since {:?}", info.metadata[0].text, info.metadata[0].since);
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    ///
    /// [`Client::inspect`]: crate::Client::inspect
    /// [`Client::list`]: crate::Client::list
    #[doc(alias = "holder_metadata")]
    #[doc(alias = "with_metadata")]
    #[doc(alias = "set_metadata")]
    pub fn metadata(mut self, text: impl Into<String>) -> Self {
        self.metadata = Some(text.into());
        self
    }

    /// The most command connections the client keeps open. A connection is only borrowed
    /// for the duration of one command, never while a lock is held or awaited.
    ///
    /// A call that finds every connection in use by the client's other calls waits for
    /// one, in the order they came: a call without a deadline as long as it takes, a
    /// bounded one (`try_lock*`) until its deadline plus 250 ms, then it fails with
    /// [`Error::PoolExhausted`], having done nothing.
    ///
    /// Defaults to 16.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder().pool_size(32).build()?; // many threads
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long to wait for a new connection to Redis to be made before an operation fails
    /// with [`Error::Pool`]. (Waiting for one of the pool's connections in use by other
    /// calls is bounded by the call's own deadline instead: see
    /// [`pool_size`](ClientBuilder::pool_size).)
    ///
    /// Defaults to 5 seconds.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let client = redmutex::Client::builder()
    ///     .connect_timeout(Duration::from_secs(2))
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for Redis to answer one command before the operation fails with
    /// [`Error::Timeout`]. Must be shorter than the
    /// [`watchdog_timeout`](ClientBuilder::watchdog_timeout). Calls with a deadline
    /// (`try_lock*`) wait less: until their deadline plus 250 ms.
    ///
    /// Defaults to 3 seconds.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let client = redmutex::Client::builder()
    ///     .command_timeout(Duration::from_millis(500))
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[doc(alias = "timeout")]
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// After every acquire, release and renewal script, waits (`WAIT`, on its connection)
    /// until `min_replicas` replicas have the write, for at most `timeout`. When fewer
    /// confirm, an acquisition is rolled back and fails with [`Error::NotReplicated`] (never
    /// a half-taken lock), a release fails with it (the lock is free on the primary), and a
    /// renewal does not extend the guard's validity (told lost, `RenewalFailed`, when the
    /// lease the replicas have ends). `timeout` must be shorter than the command timeout
    /// (and than a third of the watchdog timeout). Defaults to off. This narrows, but does
    /// not close, the window in which a failover loses a lock: replication stays
    /// asynchronous, and a replica that confirmed may still not be the one promoted. See
    /// [`guide::topologies`](crate::guide::topologies).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let client = redmutex::Client::builder()
    ///     .url("redis://primary:6379/")
    ///     .sync_replicas(1, Duration::from_millis(100))
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn sync_replicas(mut self, min_replicas: u32, timeout: Duration) -> Self {
        self.sync_replicas = Some((min_replicas, timeout));
        self
    }

    /// Whether to run the bundled scripts as a function library (loaded once per server
    /// with `FUNCTION LOAD`, each call an `FCALL`) on servers that have functions (Redis 7
    /// and later, Valkey). A function costs the server less per call than the same script
    /// sent with `EVALSHA`, which defines the rules every script shares anew on each call.
    /// A server without functions (Redis 6.2, or a user whose ACL refuses `FCALL` or
    /// `FUNCTION LOAD`) is noticed on the first call it refuses, which is sent again
    /// with `EVALSHA`, as every call of the client is from then on. `false` sends
    /// `EVALSHA` from the start: for a proxy in front of Redis that does not pass `FCALL`
    /// on, or refuses it in a way that cannot be told from a script's own error.
    ///
    /// Defaults to `true`.
    ///
    /// ```no_run
    /// // Run the scripts with EVALSHA even where the server has functions.
    /// let client = redmutex::Client::builder().use_functions(false).build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn use_functions(mut self, enabled: bool) -> Self {
        self.use_functions = enabled;
        self
    }

    /// For `rediss://` URLs: trust only the certificate authority in `pem` (PEM-encoded)
    /// instead of the system's trust store, e.g. a private CA that signed the server's
    /// certificate. Defaults to the system's trust store.
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .url("rediss://redis.internal:6380/")
    ///     .tls_ca_certificate(std::fs::read("ca.crt").unwrap())
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate and key (both PEM) to servers
    /// that authenticate clients (`tls-auth-clients yes`). Defaults to none.
    #[cfg(feature = "tls")]
    ///
    /// ```no_run
    /// let client = redmutex::Client::builder()
    ///     .url("rediss://redis.internal:6380/")
    ///     .tls_ca_certificate(std::fs::read("ca.pem").unwrap())
    ///     .tls_client_certificate(std::fs::read("client.pem").unwrap(), std::fs::read("client.key").unwrap())
    ///     .build()?;
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the settings and creates the client. No connection is made yet: building
    /// succeeds while Redis is down, and the first operation then reports it.
    ///
    /// Fails with [`Error::InvalidUrl`] for a URL with a wrong part (it names the part:
    /// scheme, host, port, database, password, socket path), and with
    /// [`Error::InvalidArgument`] for a URL refused for no part that can be told, a URL at
    /// odds with the TLS settings, a prefix with `{`, `}`, `!`, `~` or `#`, zero
    /// durations, a zero pool size, a `watchdog_timeout` not longer than the
    /// `command_timeout`, or `metadata` longer than 1 KiB.
    ///
    /// ```
    /// use redmutex::{Client, Error};
    /// let client = Client::builder().url("redis://127.0.0.1:6379/").build()?;
    /// // Nothing is sent to check a URL: a wrong one fails here, naming what is wrong.
    /// let wrong = Client::builder().url("redis://127.0.0.1:63790000/").build();
    /// assert!(matches!(wrong, Err(Error::InvalidUrl { part: "port", .. })));
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn build(self) -> Result<Client, Error> {
        crate::runtime::telemetry::describe();
        let sync_replicas = self.check_settings()?;
        let (target, described) = self.target()?;
        Client::from_config(
            target,
            Config {
                key_prefix: self.key_prefix.into_bytes(),
                lease: LeasePolicy::new(self.watchdog_timeout),
                pool_size: self.pool_size,
                connect_timeout: self.connect_timeout,
                command_timeout: self.command_timeout,
                sync_replicas,
                redacted_url: described,
                use_functions: self.use_functions,
                on_lease_lost: self.on_lease_lost,
                max_hold: self.max_hold,
                metadata: self.metadata,
            },
        )
    }

    /// Checks every setting but the addresses, in the order `build` documents; returns
    /// `sync_replicas` as the scripts take it (the timeout in milliseconds).
    fn check_settings(&self) -> Result<Option<(u32, u64)>, Error> {
        let invalid = |what: &str| Err(Error::invalid(what));
        if let Err(why) = crate::runtime::keys::check_prefix(&self.key_prefix) {
            return Err(Error::invalid(why));
        }
        if self.watchdog_timeout < Duration::from_millis(3) {
            return invalid("watchdog_timeout must be at least 3 ms");
        }
        if self.watchdog_timeout > crate::runtime::holds::lease::MAX_LEASE {
            return invalid("watchdog_timeout is too long");
        }
        if self.pool_size == 0 {
            return invalid("pool_size must be at least 1");
        }
        if self.connect_timeout.is_zero() || self.command_timeout.is_zero() {
            return invalid("connect_timeout and command_timeout must be non-zero");
        }
        if self.watchdog_timeout <= self.command_timeout {
            return Err(Error::invalid(format!(
                "watchdog_timeout ({:?}) must be longer than command_timeout ({:?}): \
                 lower command_timeout too",
                self.watchdog_timeout, self.command_timeout
            )));
        }
        if let Some(max_hold) = self.max_hold {
            crate::runtime::holds::lease::check_max_hold(max_hold, self.command_timeout)?;
        }
        if let Some(text) = &self.metadata {
            if text.len() > MAX_METADATA {
                return Err(Error::invalid(format!(
                    "metadata must be at most {MAX_METADATA} bytes, not {}",
                    text.len()
                )));
            }
        }
        match self.sync_replicas {
            None => Ok(None),
            Some((0, _)) => invalid("sync_replicas needs at least one replica"),
            Some((_, t)) if t.is_zero() || t >= self.command_timeout => invalid(
                "the sync_replicas timeout must be non-zero and shorter than command_timeout",
            ),
            Some((n, t)) => Ok(Some((n, crate::runtime::holds::lease::millis(t)))),
        }
    }

    /// Where the client's connections go (one server, a Sentinel service's primary, a
    /// cluster), from the URL and the TLS, Sentinel and Cluster settings, and how the
    /// client describes it (passwords redacted).
    fn target(&self) -> Result<(Target, String), Error> {
        let invalid = |what: &str| Err(Error::invalid(what));
        let bad_url =
            |e: redis::RedisError| crate::runtime::connection::urls::bad_url(&self.url, &e);
        let redis = if self.tls_ca.is_none() && self.tls_client.is_none() {
            redis::Client::open(self.url.as_str()).map_err(bad_url)?
        } else {
            tls_client(&self.url, self.tls_ca.clone(), self.tls_client.clone()).map_err(bad_url)?
        };
        if self.sentinel.is_some() && self.cluster.is_some() {
            return invalid("a client talks to a sentinel service or a cluster, not both");
        }
        Ok(match &self.sentinel {
            None => match &self.cluster {
                None => (Target::Server(redis), redact_url(&self.url)),
                Some(urls) => cluster_target(
                    urls.clone(),
                    self.connect_timeout,
                    self.command_timeout,
                    tls_certificates(self.tls_ca.clone(), self.tls_client.clone()),
                )?,
            },
            Some((urls, service)) => {
                if service.is_empty() {
                    return invalid("sentinel needs a service name");
                }
                let (sentinels, urls) = parse_urls(urls, "sentinel")?;
                let described = format!("sentinel service {service:?} via {urls:?}");
                let node = redis.get_connection_info().clone();
                (
                    Target::Sentinel(Sentinel::new(sentinels, service.clone(), node)),
                    described,
                )
            }
        })
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("sync_replicas", &self.sync_replicas)
            .field("on_lease_lost", &self.on_lease_lost.is_some())
            .field("max_hold", &self.max_hold)
            .field("metadata", &self.metadata)
            // Certificates and keys are never printed, only whether they are set.
            .field("tls_ca_certificate", &self.tls_ca.is_some())
            .field("tls_client_certificate", &self.tls_client.is_some())
            .field(
                "cluster",
                &self
                    .cluster
                    .as_ref()
                    .map(|urls| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>()),
            )
            .field(
                "sentinel",
                &self.sentinel.as_ref().map(|(urls, service)| {
                    let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                    (urls, service)
                }),
            )
            .finish()
    }
}
