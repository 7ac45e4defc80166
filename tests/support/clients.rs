//! The one way a test gets a redmutex client: a [`Clients`] value says how a file's
//! clients are made (prefix, timeouts, scripts), usually one `const` per file, and
//! [`Clients::at`] makes one for a server. A test that needs more of the builder starts
//! from [`Clients::builder`] and finishes with [`build`].

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redmutex::{Client, ClientBuilder, LossReason, LostLease};

use super::{FaultProxy, RedisServer};

/// Where a client connects: a URL (`&str`, `String`) or a harness server.
pub trait Endpoint {
    /// The URL to connect to.
    fn url(&self) -> String;
}

impl Endpoint for str {
    fn url(&self) -> String {
        self.to_owned()
    }
}

impl Endpoint for String {
    fn url(&self) -> String {
        self.clone()
    }
}

impl Endpoint for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }
}

impl<T: Endpoint + ?Sized> Endpoint for &T {
    fn url(&self) -> String {
        (**self).url()
    }
}

/// `const` setters of [`Clients`]: each returns the same clients with one more setting.
macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty;)*) => {
        impl Clients {
            $($(#[$doc])* pub const fn $field(mut self, $field: $ty) -> Clients {
                self.$field = Some($field);
                self
            })*
        }
    };
}

setters! {
    /// The watchdog timeout (the lease).
    watchdog: Duration;
    /// The command timeout.
    command: Duration;
    /// The connect timeout.
    connect: Duration;
    /// Scripts run as functions (`true`) or with EVALSHA (`false`).
    functions: bool;
}

/// How a test's clients are made. What is left unset keeps the library's default.
#[derive(Clone, Debug)]
pub struct Clients {
    prefix: Option<Cow<'static, str>>,
    watchdog: Option<Duration>,
    command: Option<Duration>,
    functions: Option<bool>,
    connect: Option<Duration>,
    metadata: Option<String>,
}

impl Clients {
    /// Clients with the library's default prefix and timeouts.
    pub const DEFAULT: Clients = Clients {
        prefix: None,
        watchdog: None,
        command: None,
        functions: None,
        connect: None,
        metadata: None,
    };

    /// Clients whose keys start with `prefix`, which keeps a test file's keys apart.
    pub const fn new(prefix: &'static str) -> Clients {
        Clients {
            prefix: Some(Cow::Borrowed(prefix)),
            ..Clients::DEFAULT
        }
    }

    /// The same, with a prefix made at run time.
    pub fn prefix(mut self, prefix: &str) -> Clients {
        self.prefix = Some(Cow::Owned(prefix.to_owned()));
        self
    }

    /// The same, with watchdog timeout `watchdog` and a command timeout a third of it (at
    /// most 2 s): short enough that a stalled call fails before the lease runs out.
    pub fn scaled(self, watchdog: Duration) -> Clients {
        self.watchdog(watchdog)
            .command((watchdog / 3).min(Duration::from_secs(2)))
    }

    /// The same, with holder metadata `text`.
    pub fn metadata(mut self, text: &str) -> Clients {
        self.metadata = Some(text.to_owned());
        self
    }

    /// A builder with all of this set and no server yet (a URL, Sentinel or Cluster
    /// seeds are the caller's), for the tests that set more of it.
    pub fn builder(&self) -> ClientBuilder {
        let mut builder = Client::builder();
        if let Some(prefix) = &self.prefix {
            builder = builder.key_prefix(prefix.as_ref());
        }
        if let Some(watchdog) = self.watchdog {
            builder = builder.watchdog_timeout(watchdog);
        }
        if let Some(command) = self.command {
            builder = builder.command_timeout(command);
        }
        if let Some(functions) = self.functions {
            builder = builder.use_functions(functions);
        }
        if let Some(connect) = self.connect {
            builder = builder.connect_timeout(connect);
        }
        if let Some(text) = &self.metadata {
            builder = builder.metadata(text.as_str());
        }
        builder
    }

    /// [`builder`](Clients::builder) with the URL of `to` set.
    pub fn builder_at<E: Endpoint + ?Sized>(&self, to: &E) -> ClientBuilder {
        self.builder().url(to.url())
    }

    /// A client of `to`.
    pub fn at<E: Endpoint + ?Sized>(&self, to: &E) -> Client {
        build(self.builder_at(to))
    }

    /// A client of each of `urls`, in their order (the masters of a Redlock).
    pub fn each_at(&self, urls: &[String]) -> Vec<Client> {
        urls.iter().map(|url| self.at(url)).collect()
    }

    /// A client of the Cluster whose nodes `seeds` are (any of them will do).
    pub fn cluster_at(&self, seeds: Vec<String>) -> Client {
        build(self.builder().cluster(seeds))
    }

    /// A fresh server (the harness defaults) and a client of it: how most tests begin.
    pub fn serve(&self) -> (RedisServer, Client) {
        let server = RedisServer::new();
        let client = self.at(&server);
        (server, client)
    }

    /// A fresh server, a [`FaultProxy`] in front of it and a client talking through the
    /// proxy: how the tests of lost replies begin.
    pub fn serve_through_proxy(&self) -> (RedisServer, FaultProxy, Client) {
        let server = RedisServer::new();
        let proxy = FaultProxy::new(server.port());
        let client = self.at(&proxy.url());
        (server, proxy, client)
    }

    /// A client of `to` whose lost leases are [`Heard`].
    pub fn heard_at<E: Endpoint + ?Sized>(&self, to: &E) -> (Client, Heard) {
        with_hook(self.builder_at(to))
    }
}

/// Builds the client a test set up; no test goes on without it.
pub fn build(builder: ClientBuilder) -> Client {
    builder.build().expect("build client")
}

/// What the `on_lease_lost` hook told: the name, the kind of object and the reason.
pub type Told = (String, &'static str, LossReason);

/// What a client's `on_lease_lost` hook was told ([`with_hook`]): every loss in order, and
/// one message per loss to wait on.
pub struct Heard {
    /// Every loss told so far.
    pub all: Arc<Mutex<Vec<Told>>>,
    /// One `()` per loss, sent after it was added to `all`.
    pub each: crossbeam_channel::Receiver<()>,
}

/// Builds `builder` with an `on_lease_lost` hook that records what it is told.
pub fn with_hook(builder: ClientBuilder) -> (Client, Heard) {
    let all = Arc::new(Mutex::new(Vec::new()));
    let (tx, each) = crossbeam_channel::unbounded();
    let seen = all.clone();
    let client = build(builder.on_lease_lost(move |lost: &LostLease| {
        seen.lock()
            .unwrap()
            .push((lost.name_lossy(), lost.kind(), lost.reason()));
        let _ = tx.send(());
    }));
    (client, Heard { all, each })
}
