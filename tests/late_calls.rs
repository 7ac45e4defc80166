//! Calls that run late never touch a later hold: a release or a cancel whose outcome the
//! client could not learn (its request slow on the wire, the call timed out) may still
//! reach Redis after the same thread took the lock again. Every kind (lock, fair, fenced,
//! read, write, upgradeable, permits, owned, a `MultiLock`'s members), through `FCALL`
//! and `EVALSHA`, with plain and hash-tagged names, on one server and on a Redis Cluster
//! (each node behind a proxy it announces as its address, so that the client's every
//! connection, after a redirection or a slot map refresh too, can be slowed).

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redmutex::{
    CancellationToken, Client, Error, Fair, Fenced, LockGuard, LockOptions, MultiLock,
    MultiLockGuard, OwnedGuard, Permit, Read, Upgradeable, Write,
};
use support::clients::Clients;
use support::keys::Keys;
use support::topology::Cluster;
use support::{FaultProxy, RedisServer};

const PREFIX: &str = "late:";

// Calls give up after 600 ms (the calls not delayed answer well within that on a loaded
// machine), and the delayed request reaches Redis 2 s after it was sent: well after the
// call failed and the thread went on, well before any lease (the watchdog's is 30 s, and
// no renewal runs within a test) ends.
const CLIENTS: Clients = Clients::new(PREFIX)
    .command(Duration::from_millis(600))
    .connect(Duration::from_millis(1_000))
    .watchdog(Duration::from_secs(30));
const LATE: Duration = Duration::from_millis(2_000);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Functions,
    Evalsha,
}

#[derive(Clone, Copy, Debug)]
enum Case {
    Plain,
    Fair,
    Fenced,
    Read,
    Write,
    Upgradeable,
    Permit,
    Owned,
    Multi,
}

const CASES: [Case; 9] = [
    Case::Plain,
    Case::Fair,
    Case::Fenced,
    Case::Read,
    Case::Write,
    Case::Upgradeable,
    Case::Permit,
    Case::Owned,
    Case::Multi,
];

/// A hold of any kind and form.
enum Held {
    Plain(LockGuard),
    Fair(LockGuard<Fair>),
    Fenced(LockGuard<Fenced>),
    Read(LockGuard<Read>),
    Write(LockGuard<Write>),
    Upgradeable(LockGuard<Upgradeable>),
    Permit(Permit),
    Owned(OwnedGuard),
    Multi(MultiLockGuard),
}

impl Held {
    fn unlock(self) -> Result<(), Error> {
        match self {
            Held::Plain(g) => g.unlock(),
            Held::Fair(g) => g.unlock(),
            Held::Fenced(g) => g.unlock(),
            Held::Read(g) => g.unlock(),
            Held::Write(g) => g.unlock(),
            Held::Upgradeable(g) => g.unlock(),
            Held::Permit(g) => g.release(),
            Held::Owned(g) => g.unlock(),
            Held::Multi(g) => g.unlock(),
        }
    }

    fn is_lease_lost(&self) -> bool {
        match self {
            Held::Plain(g) => g.is_lease_lost(),
            Held::Fair(g) => g.is_lease_lost(),
            Held::Fenced(g) => g.is_lease_lost(),
            Held::Read(g) => g.is_lease_lost(),
            Held::Write(g) => g.is_lease_lost(),
            Held::Upgradeable(g) => g.is_lease_lost(),
            Held::Permit(g) => g.is_lease_lost(),
            Held::Owned(g) => g.is_lease_lost(),
            Held::Multi(g) => g.is_lease_lost(),
        }
    }
}

impl Case {
    /// The script whose late run the test injects: this kind's release or cancel.
    fn script(self, op: &str) -> String {
        match self {
            Case::Read | Case::Write | Case::Upgradeable => format!("rw_{op}"),
            Case::Permit => format!("sem_{op}"),
            _ => op.to_owned(),
        }
    }

    /// Takes the case's hold of `name` through `client`.
    fn take(
        self,
        client: &Client,
        name: &str,
        options: LockOptions,
    ) -> Result<Option<Held>, Error> {
        let rw = || client.read_write_lock(name);
        Ok(match self {
            Case::Plain => client.lock(name).try_lock_with(options)?.map(Held::Plain),
            Case::Fair => client
                .fair_lock(name)
                .try_lock_with(options)?
                .map(Held::Fair),
            Case::Fenced => client
                .fenced_lock(name)
                .try_lock_with(options)?
                .map(Held::Fenced),
            Case::Read => rw().read_lock().try_lock_with(options)?.map(Held::Read),
            Case::Write => rw().write_lock().try_lock_with(options)?.map(Held::Write),
            Case::Upgradeable => rw()
                .upgradeable_lock()
                .try_lock_with(options)?
                .map(Held::Upgradeable),
            Case::Permit => client
                .semaphore(name, 1)
                .try_acquire_with(options)?
                .map(Held::Permit),
            Case::Owned => client
                .lock(name)
                .owned()
                .try_lock_with(options)?
                .map(Held::Owned),
            Case::Multi => {
                let members = [
                    client.lock(format!("{name}:a")),
                    client.lock(format!("{name}:b")),
                ];
                MultiLock::new(members)?
                    .try_lock_with(options)?
                    .map(Held::Multi)
            }
        })
    }

    /// How late the injected call reaches Redis. A `MultiLock` skips a server that failed
    /// a call a moment ago (for 1 s): its late call comes later, so that the thread's next
    /// hold, taken once the server is asked again, is there when it runs.
    fn late(self) -> Duration {
        match self {
            Case::Multi => LATE * 2,
            _ => LATE,
        }
    }

    /// The thread takes the lock again, once it is free: at once, or once the late call
    /// (or the clean-up of the call in doubt) freed the earlier hold. A `MultiLock` whose
    /// server failed a call a moment ago skips it for 1 s, which fails the call
    /// (`NoQuorum`): it is called again until then.
    fn take_again(self, client: &Client, name: &str) -> Held {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let options = LockOptions::new().wait_until(until);
            match self.take(client, name, options) {
                Ok(Some(held)) => return held,
                Err(Error::NoQuorum { .. })
                    if matches!(self, Case::Multi) && Instant::now() < until =>
                {
                    thread::sleep(Duration::from_millis(100));
                }
                other => panic!(
                    "{self:?} {name}: the thread's next hold: {:?}",
                    other.map(|h| h.is_some())
                ),
            }
        }
    }

    /// A hold that excludes the case's: what another client must never get while the
    /// case's hold stands (a reader excludes writers, a `MultiLock` each member).
    fn exclusive(self, other: &Client, name: &str, options: LockOptions) -> Option<Held> {
        let got = match self {
            Case::Read => Case::Write.take(other, name, options),
            Case::Multi => Case::Plain.take(other, &format!("{name}:a"), options),
            _ => self.take(other, name, options),
        };
        got.unwrap_or_else(|e| panic!("{self:?}: the other client's try: {e}"))
    }

    /// The queue the case's waiter joins.
    fn queue(self, name: &str) -> String {
        match self {
            Case::Read | Case::Write | Case::Upgradeable => Keys::rw(PREFIX, name).queue(),
            Case::Permit => Keys::sem(PREFIX, name).queue(),
            Case::Multi => Keys::lock(PREFIX, &format!("{name}:a")).queue(),
            _ => Keys::lock(PREFIX, name).queue(),
        }
    }
}

fn clients(way: Way, on: On) -> Clients {
    let clients = match on {
        On::Single => CLIENTS,
        // A cluster node whose command timed out is not asked again for a while (the
        // client's quiet time for a silent node: each delayed call, the clean-ups' too,
        // begins one), and a call for its slots waits that out as it does a node that is
        // down, for up to the connect timeout. With 500 ms the thread's next hold failed
        // at times ("timed out lately; not tried again yet"); 5 s is the library's default.
        On::Cluster => CLIENTS.connect(Duration::from_secs(5)),
    };
    match way {
        Way::Functions => clients,
        Way::Evalsha => clients.functions(false),
    }
}

/// Where a test's cases run.
#[derive(Clone, Copy, Debug)]
enum On {
    /// A server of its own for each case.
    Single,
    /// One cluster of three primaries for all the cases of a test (a cluster takes
    /// seconds to form), each case on names of its own.
    Cluster,
}

/// Servers reached through fault proxies, with what a case needs of them.
enum Deployment {
    Single {
        server: RedisServer,
        proxy: FaultProxy,
    },
    /// Every node behind a proxy it announces as its address.
    Cluster(Cluster),
}

impl Deployment {
    fn start(on: On) -> Deployment {
        match on {
            On::Single => {
                let server = RedisServer::new();
                let proxy = FaultProxy::new(server.port());
                Deployment::Single { server, proxy }
            }
            On::Cluster => Deployment::Cluster(Cluster::builder().through_proxies().start()),
        }
    }

    fn on(&self) -> On {
        match self {
            Deployment::Single { .. } => On::Single,
            Deployment::Cluster(_) => On::Cluster,
        }
    }

    /// A client that reaches the servers only through the proxies.
    fn client(&self, way: Way) -> Client {
        match self {
            Deployment::Single { proxy, .. } => clients(way, self.on()).at(&proxy.url()),
            Deployment::Cluster(cluster) => {
                clients(way, self.on()).cluster_at(cluster.proxy_urls())
            }
        }
    }

    /// Another client, none of whose calls is delayed (none carries a marker the cases
    /// delay). A cluster's reaches the nodes through the proxies too: the slot map names
    /// them.
    fn other(&self, way: Way) -> Client {
        match self {
            Deployment::Single { server, .. } => clients(way, self.on()).at(server),
            Deployment::Cluster(cluster) => clients(way, self.on()).cluster_at(cluster.seed_urls()),
        }
    }

    fn proxies(&self) -> Vec<&FaultProxy> {
        match self {
            Deployment::Single { proxy, .. } => vec![proxy],
            Deployment::Cluster(cluster) => cluster.proxies(),
        }
    }

    /// From now on, requests containing `marker` reach Redis `delay` late (`ZERO` lifts
    /// it): on every proxy, so on whichever node serves the lock's slot (each member's,
    /// for a `MultiLock`).
    fn delay(&self, marker: &str, delay: Duration) {
        for proxy in self.proxies() {
            proxy.delay_requests_containing(marker, delay);
        }
    }

    /// Requests containing `marker` read from clients so far, on every proxy (counted since
    /// the marker was first delayed; a cluster's proxies count every case's).
    fn seen(&self, marker: &str) -> usize {
        self.proxies().iter().map(|p| p.seen(marker)).sum()
    }

    /// Whether every request containing `marker` seen so far has reached Redis. (The
    /// forwarded ones are counted first: a request forwarded is seen already, so this
    /// is never true while one counted as seen is still held back.)
    fn all_forwarded(&self, marker: &str) -> bool {
        let forwarded: usize = self.proxies().iter().map(|p| p.forwarded(marker)).sum();
        forwarded >= self.seen(marker)
    }

    /// What the requests of `script` carry, the way `way`'s clients send it, with the
    /// script on every server: as `EVALSHA`'s SHA-1, loaded on each (else a late call
    /// of a script the client had not run there yet would find none and run nothing); as
    /// `FCALL`'s function name, looked up on the server, on a cluster on the node serving
    /// `key` (a key the case's calls touched, which loaded the library there).
    fn marker(&self, way: Way, script: &str, key: &str) -> String {
        match (way, self) {
            (Way::Evalsha, Deployment::Single { server, .. }) => {
                support::load_script(&mut server.connection(), script)
            }
            (Way::Evalsha, Deployment::Cluster(cluster)) => {
                for node in cluster.nodes() {
                    support::load_script(&mut node.connection(), script);
                }
                support::script_sha(script)
            }
            (Way::Functions, Deployment::Single { server, .. }) => {
                support::function_name(&server.url(), script)
            }
            (Way::Functions, Deployment::Cluster(cluster)) => {
                support::loaded_function_name(&mut cluster.connection_for_key(key), script)
            }
        }
    }

    /// The length of the list `key`, read on the server (node) that has it.
    fn llen(&self, key: &str) -> i64 {
        match self {
            Deployment::Single { server, .. } => support::llen(&mut server.connection(), key),
            Deployment::Cluster(cluster) => {
                support::llen(&mut cluster.connection_for_key(key), key)
            }
        }
    }
}

fn names(case: Case, op: &str) -> [String; 2] {
    let base = format!("{op}-{case:?}").to_lowercase();
    [base.clone(), format!("{{{base}}}:tagged")]
}

/// Runs `check` for every case, each with a plain and a hash-tagged name, on `on`'s
/// deployment, and fails with every case that failed (not only the first).
fn each_case(on: On, op: &str, check: impl Fn(&Deployment, Case, &str)) {
    let cluster = matches!(on, On::Cluster).then(|| Deployment::start(on));
    let mut failed = Vec::new();
    for case in CASES {
        for name in names(case, op) {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let own;
                let at = match &cluster {
                    Some(cluster) => cluster,
                    None => {
                        own = Deployment::start(on);
                        &own
                    }
                };
                check(at, case, &name)
            }));
            if let Err(panic) = run {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failed.push(why);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Nobody else gets the lock for `watch` after the late call reached Redis (it ran there
/// at once, Redis being idle), and the thread's hold stands.
fn assert_still_held(case: Case, other: &Client, name: &str, held: &Held, watch: Duration) {
    let until = Instant::now() + watch;
    while Instant::now() < until {
        if let Some(theirs) =
            case.exclusive(other, name, LockOptions::new().wait_for(Duration::ZERO))
        {
            let _ = theirs.unlock();
            panic!(
                "{case:?} {name}: another client took the lock the thread holds (its guard \
                 says lost: {})",
                held.is_lease_lost()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !held.is_lease_lost(),
        "{case:?} {name}: the hold was reported lost"
    );
}

/// A thread's `unlock()` fails with `Timeout` (its request is slow on the wire, so the
/// client cannot know whether it ran); the thread locks again at once; then the first
/// release reaches Redis. It must not free the new hold.
fn late_release(way: Way, on: On) {
    each_case(on, "release", |at, case, name| {
        let client = at.client(way);
        let other = at.other(way);
        let wait = || LockOptions::new().wait_for(Duration::from_secs(10));
        case.take(&client, name, wait())
            .unwrap()
            .expect("warm-up")
            .unlock()
            .unwrap();
        let marker = at.marker(way, &case.script("release"), &case.queue(name));
        let held = case
            .take(&client, name, wait())
            .unwrap()
            .expect("first hold");
        at.delay(&marker, case.late());
        let sent = at.seen(&marker);
        let released = held.unlock();
        // (A `MultiLock` reports its members' timeouts as a quorum not reached.)
        assert!(
            matches!(
                released,
                Err(Error::Timeout { .. } | Error::NoQuorum { .. })
            ),
            "{case:?} {name}: {released:?}"
        );
        assert!(
            support::wait_until(Duration::from_secs(5), || at.seen(&marker) > sent),
            "{case:?} {name}: the release was never sent"
        );
        at.delay(&marker, Duration::ZERO);
        let again = case.take_again(&client, name);
        assert!(
            support::wait_until(Duration::from_secs(10), || at.all_forwarded(&marker)),
            "{case:?} {name}: the late release never reached Redis"
        );
        assert_still_held(case, &other, name, &again, Duration::from_millis(1_000));
        again
            .unlock()
            .unwrap_or_else(|e| panic!("{case:?} {name}: {e}"));
    });
}

/// A cancelled wait whose cancel is slow fails with `Timeout`; the thread later holds the
/// lock; the old cancel (and the clean-up's, for the same wait) reach Redis then. They must
/// not free the hold.
fn late_cancel(way: Way, on: On) {
    each_case(on, "cancel", |at, case, name| {
        let client = at.client(way);
        let other = at.other(way);
        let wait = || LockOptions::new().wait_for(Duration::from_secs(10));
        case.take(&client, name, wait())
            .unwrap()
            .expect("warm-up")
            .unlock()
            .unwrap();
        let theirs = case
            .exclusive(&other, name, wait())
            .expect("the other client's hold");
        let queue = case.queue(name);
        let marker = at.marker(way, &case.script("cancel"), &queue);
        at.delay(&marker, case.late());
        let sent = at.seen(&marker);
        let token = CancellationToken::new();
        let waited = thread::scope(|s| {
            s.spawn(|| {
                assert!(
                    support::wait_until(Duration::from_secs(10), || at.llen(&queue) >= 1),
                    "{case:?} {name}: the waiter never queued"
                );
                token.cancel();
            });
            case.take(&client, name, wait().cancellable(&token))
        });
        // The cancel timed out (`Timeout`); a `MultiLock` reports the cancellation and
        // leaves its members' queues to the clean-up (`Cancelled`).
        assert!(
            matches!(waited, Err(Error::Timeout { .. } | Error::Cancelled { .. })),
            "{case:?} {name}: {:?}",
            waited.map(|h| h.is_some())
        );
        assert!(
            support::wait_until(Duration::from_secs(5), || at.seen(&marker) > sent),
            "{case:?} {name}: the cancel was never sent"
        );
        theirs.unlock().unwrap();
        let again = case.take_again(&client, name);
        // Every cancel sent so far (the call's, and the watchdog's clean-ups of it, each
        // delayed) reaches Redis while the thread holds the lock. Those sent from now on
        // pass at once: the clean-ups go on while some are in doubt, and a stream of
        // delayed ones would keep this wait from ending on a loaded machine.
        at.delay(&marker, Duration::ZERO);
        assert!(
            support::wait_until(Duration::from_secs(20), || at.all_forwarded(&marker)),
            "{case:?} {name}: the late cancels never reached Redis"
        );
        assert_still_held(case, &other, name, &again, Duration::from_millis(1_000));
        again
            .unlock()
            .unwrap_or_else(|e| panic!("{case:?} {name}: {e}"));
    });
}

#[test]
fn a_late_release_never_frees_the_threads_next_hold() {
    late_release(Way::Functions, On::Single);
}

#[test]
fn a_late_release_never_frees_the_threads_next_hold_evalsha() {
    late_release(Way::Evalsha, On::Single);
}

#[test]
fn a_late_cancel_never_frees_the_threads_next_hold() {
    late_cancel(Way::Functions, On::Single);
}

#[test]
fn a_late_cancel_never_frees_the_threads_next_hold_evalsha() {
    late_cancel(Way::Evalsha, On::Single);
}

#[test]
fn a_late_release_never_frees_the_threads_next_hold_on_a_cluster() {
    late_release(Way::Functions, On::Cluster);
}

#[test]
fn a_late_release_never_frees_the_threads_next_hold_on_a_cluster_evalsha() {
    late_release(Way::Evalsha, On::Cluster);
}

#[test]
fn a_late_cancel_never_frees_the_threads_next_hold_on_a_cluster() {
    late_cancel(Way::Functions, On::Cluster);
}

#[test]
fn a_late_cancel_never_frees_the_threads_next_hold_on_a_cluster_evalsha() {
    late_cancel(Way::Evalsha, On::Cluster);
}

/// An upgrade (a write asked by the thread that holds the upgradeable side) waits for the
/// others' read holds under the token of the thread's upgradeable hold, which stays: a
/// cancel of that wait that runs late must not free the thread's next upgrade.
fn late_upgrade_cancel(way: Way) {
    let (server, proxy, client) = clients(way, On::Single).serve_through_proxy();
    let other = clients(way, On::Single).at(&server);
    let name = "cancel-upgrade";
    let rw = client.read_write_lock(name);
    let wait = || LockOptions::new().wait_for(Duration::from_secs(10));
    rw.write_lock().lock().unwrap().unlock().unwrap();
    let upgradeable = rw.upgradeable_lock().lock().expect("the upgradeable hold");
    let reader = other.read_write_lock(name).read_lock().lock().unwrap();
    let marker = match way {
        Way::Evalsha => support::load_script(&mut server.connection(), "rw_cancel"),
        Way::Functions => support::function_name(&server.url(), "rw_cancel"),
    };
    proxy.watch(&marker);
    proxy.delay_requests_containing(&marker, LATE);
    let token = CancellationToken::new();
    let queue = Keys::rw(PREFIX, name).queue();
    let waited = thread::scope(|s| {
        s.spawn(|| {
            let mut con = server.connection();
            assert!(support::wait_until(Duration::from_secs(10), || {
                support::llen(&mut con, &queue) >= 1
            }));
            token.cancel();
        });
        rw.write_lock().try_lock_with(wait().cancellable(&token))
    });
    let waited = waited.map(|g| g.is_some());
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    reader.unlock().unwrap();
    // The upgradeable hold goes on under the token the late cancel names: an upgrade taken
    // under it now would be undone when the cancel runs. It is refused, nothing written.
    let refused = rw.write_lock().try_lock_with(wait());
    let refused = refused.map(|g| g.is_some());
    assert!(matches!(refused, Err(Error::InDoubt { .. })), "{refused:?}");
    assert!(!upgradeable.is_lease_lost());
    // A new upgradeable hold is a new holder: its upgrade is never touched by the cancel.
    upgradeable.unlock().unwrap();
    let upgradeable = rw
        .upgradeable_lock()
        .lock()
        .expect("the upgradeable hold again");
    let upgraded = match rw.write_lock().try_lock_with(wait()) {
        Ok(Some(guard)) => guard,
        other => panic!("the next upgrade: {:?}", other.map(|g| g.is_some())),
    };
    assert!(support::wait_until(Duration::from_secs(10), || {
        proxy.forwarded(&marker) >= proxy.seen(&marker)
    }));
    proxy.delay_requests_containing(&marker, Duration::ZERO);
    let held = Held::Write(upgraded);
    assert_still_held(
        Case::Write,
        &other,
        name,
        &held,
        Duration::from_millis(1_000),
    );
    let readers = other.read_write_lock(name).read_lock();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        if let Some(r) = readers.try_lock().unwrap() {
            r.unlock().unwrap();
            panic!(
                "another client read while the thread writes (lost: {})",
                held.is_lease_lost()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    held.unlock().unwrap();
    upgradeable.unlock().unwrap();
}

#[test]
fn a_late_cancel_of_an_upgrade_never_frees_the_next_upgrade() {
    late_upgrade_cancel(Way::Functions);
}

#[test]
fn a_late_cancel_of_an_upgrade_never_frees_the_next_upgrade_evalsha() {
    late_upgrade_cancel(Way::Evalsha);
}
