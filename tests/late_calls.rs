//! Calls that run late never touch a later hold: a release or a cancel whose outcome the
//! client could not learn (its request slow on the wire, the call timed out) may still
//! reach Redis after the same thread took the lock again. Every kind (lock, fair, fenced,
//! read, write, upgradeable, permits, owned, a `MultiLock`'s members), through `FCALL`
//! and `EVALSHA`, with plain and hash-tagged names.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redmutex::{
    CancellationToken, Client, Error, Fair, Fenced, LockGuard, LockOptions, MultiLock,
    MultiLockGuard, OwnedGuard, Permit, Read, Upgradeable, Write,
};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const PREFIX: &str = "late:";

// Calls give up after 300 ms, and the delayed request reaches Redis 1.5 s after it was
// sent: well after the call failed and the thread went on, well before any lease (the
// watchdog's is 30 s, and no renewal runs within a test) ends.
const CLIENTS: Clients = Clients::new(PREFIX)
    .command(Duration::from_millis(300))
    .connect(Duration::from_millis(500))
    .watchdog(Duration::from_secs(30));
const LATE: Duration = Duration::from_millis(1_500);

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

fn clients(way: Way) -> Clients {
    match way {
        Way::Functions => CLIENTS,
        Way::Evalsha => CLIENTS.functions(false),
    }
}

/// What the requests of `script` carry, the way `way`'s clients send it.
fn marker(server: &RedisServer, way: Way, script: &str) -> String {
    if way == Way::Evalsha {
        support::load_script_sha(&mut server.connection(), script)
    } else {
        support::function_name(&server.url(), script)
    }
}

fn names(case: Case, op: &str) -> [String; 2] {
    let base = format!("{op}-{case:?}").to_lowercase();
    [base.clone(), format!("{{{base}}}:tagged")]
}

/// Runs `check` for every case, each with a plain and a hash-tagged name, and fails with
/// every case that failed (not only the first).
fn each_case(op: &str, check: impl Fn(Case, &str)) {
    let mut failed = Vec::new();
    for case in CASES {
        for name in names(case, op) {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(case, &name)));
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
fn late_release(way: Way) {
    each_case("release", |case, name| {
        let (server, proxy, client) = clients(way).serve_through_proxy();
        let other = clients(way).at(&server);
        let wait = || LockOptions::new().wait_for(Duration::from_secs(10));
        case.take(&client, name, wait())
            .unwrap()
            .expect("warm-up")
            .unlock()
            .unwrap();
        let marker = marker(&server, way, &case.script("release"));
        let held = case
            .take(&client, name, wait())
            .unwrap()
            .expect("first hold");
        proxy.watch(&marker);
        proxy.delay_requests_containing(&marker, case.late());
        let released = held.unlock();
        // (A `MultiLock` reports its members' timeouts as a quorum not reached.)
        assert!(
            matches!(
                released,
                Err(Error::Timeout { .. } | Error::NoQuorum { .. })
            ),
            "{case:?} {name}: {released:?}"
        );
        assert!(proxy.wait_seen(&marker, 1, Duration::from_secs(5)));
        proxy.delay_requests_containing(&marker, Duration::ZERO);
        let again = case.take_again(&client, name);
        assert!(
            proxy.wait_forwarded(&marker, 1, Duration::from_secs(10)),
            "{case:?} {name}: the late release never reached Redis"
        );
        assert_still_held(case, &other, name, &again, Duration::from_millis(1_000));
        again
            .unlock()
            .unwrap_or_else(|e| panic!("{case:?} {name}: {e}"));
        drop(proxy);
    });
}

/// A cancelled wait whose cancel is slow fails with `Timeout`; the thread later holds the
/// lock; the old cancel (and the clean-up's, for the same wait) reach Redis then. They must
/// not free the hold.
fn late_cancel(way: Way) {
    each_case("cancel", |case, name| {
        {
            let (server, proxy, client) = clients(way).serve_through_proxy();
            let other = clients(way).at(&server);
            let wait = || LockOptions::new().wait_for(Duration::from_secs(10));
            case.take(&client, name, wait())
                .unwrap()
                .expect("warm-up")
                .unlock()
                .unwrap();
            let theirs = case
                .exclusive(&other, name, wait())
                .expect("the other client's hold");
            let marker = marker(&server, way, &case.script("cancel"));
            proxy.watch(&marker);
            proxy.delay_requests_containing(&marker, case.late());
            let token = CancellationToken::new();
            let queue = case.queue(name);
            let waited = thread::scope(|s| {
                s.spawn(|| {
                    let mut con = server.connection();
                    assert!(
                        support::wait_until(Duration::from_secs(10), || {
                            support::llen(&mut con, &queue) >= 1
                        }),
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
            assert!(proxy.wait_seen(&marker, 1, Duration::from_secs(5)));
            theirs.unlock().unwrap();
            let again = case.take_again(&client, name);
            // Every cancel sent so far (the call's, and the watchdog's clean-ups of it,
            // each delayed) reaches Redis while the thread holds the lock.
            assert!(
                support::wait_until(Duration::from_secs(10), || {
                    proxy.forwarded(&marker) >= proxy.seen(&marker)
                }),
                "{case:?} {name}: the late cancels never reached Redis"
            );
            proxy.delay_requests_containing(&marker, Duration::ZERO);
            assert_still_held(case, &other, name, &again, Duration::from_millis(1_000));
            again
                .unlock()
                .unwrap_or_else(|e| panic!("{case:?} {name}: {e}"));
        }
    });
}

#[test]
fn a_late_release_never_frees_the_threads_next_hold() {
    late_release(Way::Functions);
}

#[test]
fn a_late_release_never_frees_the_threads_next_hold_evalsha() {
    late_release(Way::Evalsha);
}

#[test]
fn a_late_cancel_never_frees_the_threads_next_hold() {
    late_cancel(Way::Functions);
}

#[test]
fn a_late_cancel_never_frees_the_threads_next_hold_evalsha() {
    late_cancel(Way::Evalsha);
}

/// An upgrade (a write asked by the thread that holds the upgradeable side) waits for the
/// others' read holds under the token of the thread's upgradeable hold, which stays: a
/// cancel of that wait that runs late must not free the thread's next upgrade.
fn late_upgrade_cancel(way: Way) {
    let (server, proxy, client) = clients(way).serve_through_proxy();
    let other = clients(way).at(&server);
    let name = "cancel-upgrade";
    let rw = client.read_write_lock(name);
    let wait = || LockOptions::new().wait_for(Duration::from_secs(10));
    rw.write_lock().lock().unwrap().unlock().unwrap();
    let upgradeable = rw.upgradeable_lock().lock().expect("the upgradeable hold");
    let reader = other.read_write_lock(name).read_lock().lock().unwrap();
    let marker = marker(&server, way, "rw_cancel");
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
