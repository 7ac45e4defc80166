//! Issue 26 (Safety 3), items 3 and 4: a loss is told as soon as any call learns of it.
//!
//! A release (of an inner level or of the outermost one) that finds the hold gone marks it
//! lost at once: every guard's `lost()` fires, the `on_lease_lost` hook is called once, and
//! `unlock()` of a hold the guard really had says `LeaseLost` (not `NotHeld`). A
//! `force_unlock` tells the holders' clients at once (a message on each holder client's
//! own channel), not at their next renewal: the watchdog here is the default 30 s, whose
//! renewal comes 10 s later, so each bound below (2 s) tells the two apart on a busy
//! machine.

mod support;

use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, RecvTimeoutError, TryRecvError};
use redmutex::{
    Client, Error, Kind, LockGuard, LockOptions, LossReason, LostLease, MultiLock, OwnedGuard,
    Permit,
};
use support::clients::{with_hook, Clients, Heard, Told};
use support::keys::{self, Keys, DEFAULT_PREFIX};
use support::topology::Cluster;
use support::RedisServer;

const CLIENTS: Clients = Clients::DEFAULT
    .watchdog(WATCHDOG)
    .command(Duration::from_millis(2000));

/// The default watchdog timeout: its renewal comes a third of it (10 s) after a grant.
const WATCHDOG: Duration = Duration::from_secs(30);
/// How soon a loss must be told: far under the 10 s renewal, ample on a loaded machine.
const TOLD_WITHIN: Duration = Duration::from_secs(2);

impl Heard {
    /// Waits until the hook was told `n` losses in all (up to `TOLD_WITHIN`), then a
    /// little longer for any extra one, and returns what it was told.
    fn told(&self, n: usize) -> Vec<Told> {
        let until = Instant::now() + TOLD_WITHIN;
        while self.all.lock().unwrap().len() < n {
            if self
                .each
                .recv_deadline(until)
                .is_err_and(|e| e == RecvTimeoutError::Timeout)
            {
                break;
            }
        }
        // A second call for the same hold would come right after the first.
        let _ = self.each.recv_timeout(Duration::from_millis(100));
        self.all.lock().unwrap().clone()
    }
}

/// Waits for `lost` to be told of the loss, up to `TOLD_WITHIN` from `since`: how long
/// after `since` it was.
fn told_after(lost: &Receiver<LostLease>, since: Instant) -> Option<Duration> {
    select! {
        recv(lost) -> r => {
            assert!(r.is_ok(), "a loss sends what was lost: {r:?}");
            Some(since.elapsed())
        }
        recv(crossbeam_channel::at(since + TOLD_WITHIN)) -> _ => None,
    }
}

fn not_ready(lost: &Receiver<LostLease>) -> bool {
    matches!(lost.try_recv(), Err(TryRecvError::Empty))
}

/// Deletes every key of `prefix`: the holds are gone behind their holders' backs, and
/// nobody tells them (unlike `force_unlock`).
fn delete_all(server: &RedisServer, prefix: &str) {
    let mut con = server.connection();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut con)
        .unwrap();
    assert!(!keys.is_empty(), "something of {prefix} is held");
    let _: () = redis::cmd("DEL").arg(keys).query(&mut con).unwrap();
}

/// `unlock()`, or `release()` for permits.
trait Give {
    fn give(self) -> Result<(), Error>;
}

impl<K: Kind> Give for LockGuard<K> {
    fn give(self) -> Result<(), Error> {
        self.unlock()
    }
}

impl<K: Kind> Give for OwnedGuard<K> {
    fn give(self) -> Result<(), Error> {
        self.unlock()
    }
}

impl Give for Permit {
    fn give(self) -> Result<(), Error> {
        self.release()
    }
}

fn is_lease_lost<T>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::LeaseLost { .. }))
}

/// A nested hold of each reentrant kind, its keys deleted: the release of the inner level
/// finds it gone and tells the outer guard and the hook at once; the outer `unlock()`
/// says `LeaseLost`, and the hook is not called again.
#[test]
fn an_inner_release_that_finds_the_hold_gone_tells_the_outer_guard_and_the_hook_at_once() {
    let server = RedisServer::new();
    macro_rules! case {
        ($kind:literal, $prefix:literal, $name:literal, |$c:ident| $lock:expr) => {{
            let (client, heard) = CLIENTS
                .prefix($prefix)
                .functions(true)
                .heard_at(&server.url());
            let $c = &client;
            let lock = $lock;
            let outer = lock.lock().unwrap();
            let inner = lock.lock().unwrap();
            let lost = outer.lost();
            delete_all(&server, $prefix);
            assert!(not_ready(&lost), "{}: told before any call found it", $kind);
            let released = Instant::now();
            let inner_said = inner.unlock();
            let after = told_after(&lost, released);
            assert!(
                after.is_some(),
                "{}: the outer guard was not told by the release that found the hold gone",
                $kind
            );
            assert!(is_lease_lost(&inner_said), "{}: {inner_said:?}", $kind);
            assert!(outer.is_lease_lost());
            let outer_said = outer.unlock();
            assert!(is_lease_lost(&outer_said), "{}: {outer_said:?}", $kind);
            assert_eq!(
                heard.told(1),
                [($name.to_owned(), $kind, LossReason::Deleted)],
                "{}: the hook, once",
                $kind
            );
            println!("{}: told {:?} after the release", $kind, after.unwrap());
        }};
    }
    case!("Lock", "told:in:lock:", "a", |c| c.lock("a"));
    case!("FairLock", "told:in:fair:", "b", |c| c.fair_lock("b"));
    case!("FencedLock", "told:in:fenced:", "c", |c| c.fenced_lock("c"));
    case!("ReadLock", "told:in:read:", "d", |c| c
        .read_write_lock("d")
        .read_lock());
    case!("WriteLock", "told:in:write:", "e", |c| c
        .read_write_lock("e")
        .write_lock());
    case!("UpgradeableLock", "told:in:upg:", "f", |c| c
        .read_write_lock("f")
        .upgradeable_lock());
}

/// The outermost (only) level's release finds the hold gone: `LeaseLost`, and the hook is
/// called once; for guards, owned guards and permits.
#[test]
fn an_outermost_release_that_finds_the_hold_gone_says_lease_lost_and_calls_the_hook() {
    let server = RedisServer::new();
    macro_rules! case {
        ($kind:literal, $prefix:literal, $name:literal, |$c:ident| $guard:expr) => {{
            let (client, heard) = CLIENTS
                .prefix($prefix)
                .functions(true)
                .heard_at(&server.url());
            let $c = &client;
            let guard = $guard;
            let lost = guard.lost();
            delete_all(&server, $prefix);
            let said = guard.give();
            assert!(is_lease_lost(&said), "{}: {said:?}", $kind);
            // (Released, and the release found it lost: closed, said by the release.)
            assert!(matches!(lost.try_recv(), Err(TryRecvError::Disconnected)));
            assert_eq!(
                heard.told(1),
                [($name.to_owned(), $kind, LossReason::Deleted)],
                "{}: the hook, once",
                $kind
            );
        }};
    }
    case!("Lock", "told:out:lock:", "a", |c| c
        .lock("a")
        .lock()
        .unwrap());
    case!("FencedLock", "told:out:fenced:", "b", |c| c
        .fenced_lock("b")
        .lock()
        .unwrap());
    case!("ReadLock", "told:out:read:", "c", |c| c
        .read_write_lock("c")
        .read_lock()
        .lock()
        .unwrap());
    case!("WriteLock", "told:out:write:", "d", |c| c
        .read_write_lock("d")
        .write_lock()
        .lock()
        .unwrap());
    case!("UpgradeableLock", "told:out:upg:", "e", |c| c
        .read_write_lock("e")
        .upgradeable_lock()
        .lock()
        .unwrap());
    case!("Lock", "told:out:owned:", "f", |c| c
        .lock("f")
        .owned()
        .lock()
        .unwrap());
    case!("Semaphore", "told:out:sem:", "g", |c| c
        .semaphore("g", 2)
        .acquire()
        .unwrap());

    // A MultiLock's member found gone by the release: the multi guard says LeaseLost and
    // the member's loss reaches the hook, once.
    let prefix = "told:out:multi:";
    let (client, heard) = CLIENTS
        .prefix(prefix)
        .functions(true)
        .heard_at(&server.url());
    let multi = MultiLock::new([client.lock("m1"), client.lock("m2"), client.lock("m3")]).unwrap();
    let held = multi.lock().unwrap();
    let mut con = server.connection();
    let _: () = redis::cmd("DEL")
        .arg(format!("{prefix}{{m2}}"))
        .query(&mut con)
        .unwrap();
    let said = held.unlock();
    assert!(is_lease_lost(&said), "{said:?}");
    assert_eq!(
        heard.told(1),
        [("m2".to_owned(), "Lock", LossReason::Deleted)]
    );
}

/// Waits until `client` listens on its own channel (its pub/sub connection subscribed),
/// so that a force_unlock from now on is told to it.
fn await_listening(server: &RedisServer, prefix: &str, client: &Client) {
    support::await_own_channel(server, prefix, client);
}

/// A client's first hold returns once the client listens on its own channel, so a
/// `force_unlock` at once after it is told as well. (Before, the reader subscribed a
/// moment later on its own thread, and a force_unlock in that moment went unheard until
/// a renewal, 10 s later by default.) Fresh clients each time: it is the first hold.
#[test]
fn a_force_unlock_right_after_the_first_hold_is_told() {
    let server = RedisServer::new();
    let prefix = "told:first:";
    let other = Clients::DEFAULT.prefix(prefix).at(&server);
    for i in 0..5 {
        let name = format!("first-{i}");
        let (client, heard) = CLIENTS
            .prefix(prefix)
            .functions(true)
            .heard_at(&server.url());
        let guard = client.lock(&name).lock().unwrap();
        let forced = Instant::now();
        assert!(other.lock(&name).force_unlock().unwrap());
        let after = told_after(&guard.lost(), forced);
        assert!(
            after.is_some(),
            "run {i}: a force_unlock right after the client's first hold was not told \
             within {TOLD_WITHIN:?}"
        );
        assert_eq!(heard.told(1).len(), 1, "run {i}: the hook, once");
        assert!(is_lease_lost(&guard.unlock()));
    }
}

/// `force_unlock` by another client reaches the holder's `lost()` and hook at once, for
/// every kind it frees, on the FCALL and the EVALSHA paths; a hold of the same client on
/// another lock is not touched.
#[test]
fn a_force_unlock_is_told_to_the_holder_at_once() {
    let server = RedisServer::new();
    let mut figures = Vec::new();
    for functions in [true, false] {
        if functions && !support::server_kind().has_functions() {
            continue;
        }
        let path = if functions { "fcall" } else { "evalsha" };
        macro_rules! case {
            ($kind:literal, $name:literal, |$c:ident| $guard:expr) => {{
                let prefix = format!("told:forced:{path}:{}:", $kind);
                let (client, heard) = CLIENTS
                    .prefix(&prefix)
                    .functions(functions)
                    .heard_at(&server.url());
                let other = Clients::DEFAULT
                    .prefix(&prefix)
                    .functions(functions)
                    .at(&server);
                let $c = &client;
                let guard = $guard;
                let bystander = client.lock("bystander").lock().unwrap();
                let lost = guard.lost();
                let bystander_lost = bystander.lost();
                await_listening(&server, &prefix, &client);
                assert!(
                    not_ready(&lost),
                    "{path} {}: told before the force_unlock",
                    $kind
                );
                // Counted from before the call: its round trip is in the figure.
                let forced = Instant::now();
                let freed = other.force_unlock($name).unwrap();
                assert!(!freed.is_empty());
                let after = told_after(&lost, forced);
                let Some(after) = after else {
                    panic!(
                        "{path} {}: not told within {TOLD_WITHIN:?} of the force_unlock",
                        $kind
                    );
                };
                figures.push(after);
                println!("{path} {}: lost() {after:?} after the force_unlock", $kind);
                assert!(guard.is_lease_lost());
                assert_eq!(
                    heard.told(1),
                    [($name.to_owned(), $kind, LossReason::Deleted)],
                    "{path} {}: the hook, once",
                    $kind
                );
                assert!(not_ready(&bystander_lost), "only the holds freed are told");
                assert!(!bystander.is_lease_lost());
                let said = guard.give();
                assert!(is_lease_lost(&said), "{path} {}: {said:?}", $kind);
                bystander.unlock().unwrap();
            }};
        }
        case!("Lock", "a", |c| c.lock("a").lock().unwrap());
        case!("FencedLock", "b", |c| c.fenced_lock("b").lock().unwrap());
        case!("FairLock", "c", |c| c.fair_lock("c").lock().unwrap());
        case!("ReadLock", "d", |c| c
            .read_write_lock("d")
            .read_lock()
            .lock()
            .unwrap());
        case!("WriteLock", "e", |c| c
            .read_write_lock("e")
            .write_lock()
            .lock()
            .unwrap());
        case!("UpgradeableLock", "f", |c| c
            .read_write_lock("f")
            .upgradeable_lock()
            .lock()
            .unwrap());
        case!("Semaphore", "g", |c| c.semaphore("g", 3).acquire().unwrap());
        case!("Lock", "h", |c| c.lock("h").owned().lock().unwrap());
    }
    figures.sort();
    println!(
        "force_unlock -> lost(): median {:?}, max {:?} over {} cases",
        figures[figures.len() / 2],
        figures[figures.len() - 1],
        figures.len()
    );
}

/// Every holder the force_unlock frees is told, each on its own client: two readers of a
/// read-write lock in two clients, and a nested hold's every level.
#[test]
fn a_force_unlock_tells_every_holder_and_every_level() {
    let server = RedisServer::new();
    let prefix = "told:many:";
    let (a, heard_a) = CLIENTS
        .prefix(prefix)
        .functions(true)
        .heard_at(&server.url());
    let (b, heard_b) = CLIENTS
        .prefix(prefix)
        .functions(true)
        .heard_at(&server.url());
    let ra = a.read_write_lock("rw").read_lock().lock().unwrap();
    let ra2 = a.read_write_lock("rw").read_lock().lock().unwrap();
    let rb = b.read_write_lock("rw").read_lock().lock().unwrap();
    let outer = a.lock("nested").lock().unwrap();
    let inner = a.lock("nested").lock().unwrap();
    let (la, la2, lb) = (ra.lost(), ra2.lost(), rb.lost());
    let (lo, li) = (outer.lost(), inner.lost());
    await_listening(&server, prefix, &a);
    await_listening(&server, prefix, &b);
    assert!(not_ready(&la) && not_ready(&lb) && not_ready(&lo));

    assert_eq!(a.force_unlock("rw").unwrap(), ["read-write lock"]);
    let forced = Instant::now();
    for lost in [&la, &la2, &lb] {
        assert!(told_after(lost, forced).is_some());
    }
    assert!(not_ready(&lo), "the other lock's hold stands");
    assert_eq!(a.force_unlock("nested").unwrap(), ["lock"]);
    let forced = Instant::now();
    assert!(told_after(&lo, forced).is_some() && told_after(&li, forced).is_some());

    let mut told_a = heard_a.told(2);
    told_a.sort_by_key(|t| t.0.clone());
    assert_eq!(
        told_a,
        [
            ("nested".to_owned(), "Lock", LossReason::Deleted),
            ("rw".to_owned(), "ReadLock", LossReason::Deleted),
        ]
    );
    assert_eq!(
        heard_b.told(1),
        [("rw".to_owned(), "ReadLock", LossReason::Deleted)]
    );
    for r in [
        ra.unlock(),
        ra2.unlock(),
        rb.unlock(),
        inner.unlock(),
        outer.unlock(),
    ] {
        assert!(is_lease_lost(&r), "{r:?}");
    }
}

/// On a Redis Cluster the holder's client listens on one node (its pub/sub connection's)
/// while the lock lives on another: the force_unlock's classic PUBLISH reaches it there.
#[test]
fn a_force_unlock_on_a_cluster_is_told_across_nodes() {
    let cluster = Cluster::new(3, 0);
    let name = (0..)
        .map(|i| format!("forced-{i}"))
        .find(|n| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, n).key()) != 0)
        .unwrap();
    // Its only seed is node 0: its pub/sub connection goes there.
    let (holder, heard) = with_hook(
        CLIENTS
            .command(Duration::from_millis(1500))
            .connect(Duration::from_secs(10))
            .builder()
            .cluster(vec![format!("redis://{}/", cluster.node(0).addr())]),
    );
    let other = Clients::DEFAULT
        .connect(Duration::from_secs(10))
        .cluster_at(cluster.seed_urls());
    let guard = holder.lock(&name).lock().unwrap();
    let lost = guard.lost();
    let own = keys::control_channel(DEFAULT_PREFIX, &holder);
    let mut con = cluster.node(0).connection();
    assert!(
        support::wait_until(Duration::from_secs(5), || support::subscribers(
            &mut con, &own
        ) == 1),
        "the holder's client listens on node 0"
    );
    assert!(not_ready(&lost));
    let forced = Instant::now();
    assert!(other.lock(&name).force_unlock().unwrap());
    let after = told_after(&lost, forced).expect("told across nodes");
    println!("cluster: lost() {after:?} after the force_unlock");
    assert_eq!(heard.told(1), [(name.clone(), "Lock", LossReason::Deleted)]);
    let said = guard.unlock();
    assert!(is_lease_lost(&said), "{said:?}");
}

/// A re-entry and an `extend` that find the hold gone tell at once too: the outer guard's
/// `lost()` fires and the hook is called once, well before a renewal.
#[test]
fn a_re_entry_or_an_extend_that_finds_the_hold_gone_tells_at_once() {
    let server = RedisServer::new();
    let prefix = "told:again:";
    let (client, heard) = CLIENTS
        .prefix(prefix)
        .functions(true)
        .heard_at(&server.url());
    let lock = client.lock("again");
    let outer = lock.lock().unwrap();
    let lost = outer.lost();
    delete_all(&server, prefix);
    assert!(not_ready(&lost));
    let entered = Instant::now();
    let fresh = lock.lock().unwrap();
    assert!(told_after(&lost, entered).is_some(), "the re-entry told it");
    assert!(!fresh.is_lease_lost(), "the new hold stands");
    fresh.unlock().unwrap();
    assert!(is_lease_lost(&outer.unlock()));

    let fixed = support::leased(&client.lock("fixed"), Duration::from_secs(20), "acquire");
    let fixed_lost = fixed.lost();
    delete_all(&server, prefix);
    let extending = Instant::now();
    assert!(is_lease_lost(&fixed.extend(Duration::from_secs(20))));
    assert!(
        told_after(&fixed_lost, extending).is_some(),
        "the extend told it"
    );
    assert!(is_lease_lost(&fixed.unlock()));

    let mut told = heard.told(2);
    told.sort_by_key(|t| t.0.clone());
    assert_eq!(
        told,
        [
            ("again".to_owned(), "Lock", LossReason::Deleted),
            ("fixed".to_owned(), "Lock", LossReason::Deleted),
        ]
    );
}

/// A `MultiLock`'s member force-unlocked: the multi guard's `lost()` fires at once (all
/// of its locks must stand), and the member's loss reaches the hook.
#[test]
fn a_force_unlock_of_a_multilock_member_is_told_at_once() {
    let server = RedisServer::new();
    let prefix = "told:multi:";
    let (client, heard) = CLIENTS
        .prefix(prefix)
        .functions(true)
        .heard_at(&server.url());
    let multi = MultiLock::new([client.lock("m1"), client.lock("m2")]).unwrap();
    let held = multi.lock().unwrap();
    let lost = held.lost();
    await_listening(&server, prefix, &client);
    assert!(not_ready(&lost));
    let forced = Instant::now();
    assert_eq!(client.force_unlock("m2").unwrap(), ["lock"]);
    let after = told_after(&lost, forced).expect("the multi guard was told");
    println!("multilock: lost() {after:?} after the force_unlock");
    assert!(held.is_lease_lost());
    assert_eq!(
        heard.told(1),
        [("m2".to_owned(), "Lock", LossReason::Deleted)]
    );
    assert!(is_lease_lost(&held.unlock()));
}

/// While the guard lives, `con`'s server takes no new connection (`maxclients` 1: those
/// open stay, new ones are refused with "max number of clients reached"); dropped, it
/// takes them again.
struct Refusing(redis::Connection);

impl Refusing {
    fn new(mut con: redis::Connection) -> Refusing {
        max_clients(&mut con, 1);
        Refusing(con)
    }

    /// Connections the server refused so far (`INFO stats`).
    fn refused(&mut self) -> u64 {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut self.0).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("rejected_connections:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO stats: rejected_connections")
    }

    /// Blocks until the server refused another connection (the holder's pub/sub reader
    /// trying again: it backs off to once a second), so that what happened before is
    /// known to have happened while the reader could not listen.
    fn await_refusal(&mut self) {
        let before = self.refused();
        assert!(
            support::wait_until(Duration::from_secs(5), || self.refused() > before),
            "no connection was tried (and refused) within 5 s"
        );
    }
}

impl Drop for Refusing {
    fn drop(&mut self) {
        max_clients(&mut self.0, 10_000);
    }
}

fn max_clients(con: &mut redis::Connection, n: u32) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(n)
        .exec(con)
        .expect("CONFIG SET maxclients");
}

/// How soon after its pub/sub connection can be made again a client is told of a
/// force_unlock it missed meanwhile: its reader's reconnect comes within its backoff (at
/// most a second), then one check of its holds; ample on a loaded machine, and far under
/// the watchdog's renewal (10 s) and the fixed leases (20 s).
const TOLD_AFTER_RECONNECT_WITHIN: Duration = Duration::from_secs(3);

/// Issue 38, "told late, or never": a `force_unlock` published while the holder's pub/sub
/// connection is down (killed, and its reconnects refused: the server at `maxclients`)
/// reaches nobody. Once the client listens again it checks its holds against Redis at
/// once, so a fixed-lease hold (20 s), a watchdog hold (renewed 10 s after its grant) and
/// a read hold with a lease of its own (renew.lua's other mode) are told within seconds of
/// the reconnect, not at their lease's end or next renewal. A hold that was not freed is
/// left as it was: the check extends no fixed lease. `pubsub` is the server the holder's
/// pub/sub connection goes to; `other` frees the locks.
fn told_after_the_reconnect(
    pubsub: &dyn Fn() -> redis::Connection,
    holder: &Client,
    heard: &Heard,
    other: &Client,
    names: [&str; 4],
    what: &str,
) {
    let [fixed_name, watched_name, read_name, bystander_name] = names;
    const FIXED: Duration = Duration::from_secs(20);
    let fixed = support::leased(&holder.lock(fixed_name), FIXED, "fixed");
    let watched = holder.lock(watched_name).lock().unwrap();
    let read = holder
        .read_write_lock(read_name)
        .read_lock()
        .try_lock_with(LockOptions::new().lease(FIXED))
        .unwrap()
        .expect("read");
    let bystander = support::leased(&holder.lock(bystander_name), FIXED, "bystander");
    let granted = Instant::now();
    let losts = [fixed.lost(), watched.lost(), read.lost(), bystander.lost()];
    let own = keys::control_channel(DEFAULT_PREFIX, holder);
    assert!(
        support::wait_until(Duration::from_secs(5), || {
            support::subscribers(&mut pubsub(), &own) == 1
        }),
        "{what}: the holder listens"
    );
    // The other client's command connections open now: the server refuses new ones
    // below (the holder's are open: they took the locks).
    assert!(other.lock(fixed_name).is_locked().unwrap(), "{what}");
    let mut refusing = Refusing::new(pubsub());
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut refusing.0)
        .unwrap();
    assert_eq!(killed, 1, "{what}: the holder's pub/sub connection");
    refusing.await_refusal();
    for name in [fixed_name, watched_name, read_name] {
        assert!(!other.force_unlock(name).unwrap().is_empty(), "{what}");
    }
    // Still reconnecting after the force_unlocks, and nothing told it.
    refusing.await_refusal();
    for lost in &losts {
        assert!(not_ready(lost), "{what}: told while its pub/sub was down");
    }
    drop(refusing);
    let back = Instant::now();
    for (lost, name) in losts[..3].iter().zip(names) {
        let after = select! {
            recv(lost) -> _ => back.elapsed(),
            recv(crossbeam_channel::at(back + TOLD_AFTER_RECONNECT_WITHIN)) -> _ => panic!(
                "{what}: {name} not told within {TOLD_AFTER_RECONNECT_WITHIN:?} of the \
                 pub/sub connection being possible again"
            ),
        };
        println!("{what}: {name} told {after:?} after the server took connections again");
    }
    assert!(fixed.is_lease_lost() && watched.is_lease_lost() && read.is_lease_lost());
    let mut told = heard.told(3);
    told.sort_by_key(|t| t.0.clone());
    let mut expected = vec![
        (fixed_name.to_owned(), "Lock", LossReason::Deleted),
        (watched_name.to_owned(), "Lock", LossReason::Deleted),
        (read_name.to_owned(), "ReadLock", LossReason::Deleted),
    ];
    expected.sort_by_key(|t| t.0.clone());
    assert_eq!(told, expected, "{what}");
    // The hold nobody freed stands, its lease as it was: counted from its grant.
    assert!(not_ready(&losts[3]) && !bystander.is_lease_lost(), "{what}");
    let left = other
        .lock(bystander_name)
        .remaining_lease()
        .unwrap()
        .expect("held");
    assert!(
        left <= FIXED.saturating_sub(granted.elapsed()) + Duration::from_millis(5),
        "{what}: the bystander's lease was extended to {left:?}"
    );
    for said in [fixed.unlock(), watched.unlock(), read.unlock()] {
        assert!(is_lease_lost(&said), "{what}: {said:?}");
    }
    bystander.unlock().unwrap();
}

#[test]
fn a_force_unlock_while_the_holders_pubsub_connection_is_down_is_told_once_it_is_back() {
    for functions in [true, false] {
        if functions && !support::server_kind().has_functions() {
            continue;
        }
        // A server each: the pub/sub connection killed must be this holder's alone.
        let server = RedisServer::new();
        let path = if functions { "fcall" } else { "evalsha" };
        let (holder, heard) = CLIENTS.functions(functions).heard_at(&server.url());
        let other = Clients::DEFAULT.functions(functions).at(&server);
        told_after_the_reconnect(
            &|| server.connection(),
            &holder,
            &heard,
            &other,
            ["fixed", "watched", "read", "bystander"],
            path,
        );
    }
}

/// The same on a Redis Cluster: the holder's pub/sub connection goes to node 0 (its only
/// seed), the locks live on other nodes, and node 0 alone refuses new connections.
#[test]
fn a_force_unlock_on_a_cluster_while_the_holders_pubsub_connection_is_down_is_told_once_it_is_back()
{
    let cluster = Cluster::new(3, 0);
    // One hash tag for the four locks: one node, not 0.
    let tag = (0..)
        .map(|i| format!("{{t{i}}}"))
        .find(|t| cluster.node_for_key(Keys::lock(DEFAULT_PREFIX, t).key()) != 0)
        .unwrap();
    let (holder, heard) = with_hook(
        CLIENTS
            .connect(Duration::from_secs(10))
            .builder()
            .cluster(vec![format!("redis://{}/", cluster.node(0).addr())]),
    );
    let other = Clients::DEFAULT
        .connect(Duration::from_secs(10))
        .cluster_at(cluster.seed_urls());
    let names = ["fixed", "watched", "read", "bystander"].map(|n| format!("{tag}-{n}"));
    told_after_the_reconnect(
        &|| cluster.node(0).connection(),
        &holder,
        &heard,
        &other,
        [&names[0], &names[1], &names[2], &names[3]].map(String::as_str),
        "cluster",
    );
}

/// How long past its deadline a bounded call may return (documented: 250 ms), with a
/// margin for a loaded machine. The calls below took 3 s before (the command timeout).
const PAST_DEADLINE_WITHIN: Duration = Duration::from_millis(250 + 750);

/// Issue 38, "a first hold waits for its subscription past its deadline": with the server
/// at `maxclients` (the pooled command connection still works, the pub/sub connection
/// cannot be made) a client's first `try_lock()` took 3 s, the command timeout it waited
/// for its own channel's subscription, and `try_lock_with(wait_for(0).lease(1 s))`
/// returned after 3 s a guard whose lease had ended 2 s before. Bounded calls stay within
/// their deadline plus the grace, and a guard returned has its lease. A hold taken while
/// the client cannot listen is still told of a `force_unlock` once it can.
#[test]
fn a_first_hold_stays_within_its_deadline_while_the_client_cannot_listen() {
    let server = RedisServer::new();
    for functions in [true, false] {
        if functions && !support::server_kind().has_functions() {
            continue;
        }
        let path = if functions { "fcall" } else { "evalsha" };
        // The default command timeout (3 s), a fresh client: its first hold is below.
        let (client, heard) = Clients::DEFAULT
            .functions(functions)
            .heard_at(&server.url());
        let other = Clients::DEFAULT.functions(functions).at(&server);
        let (plain, leased) = (format!("{path}-plain"), format!("{path}-leased"));
        // Their command connections open before the server refuses new ones.
        assert!(!client.lock(&plain).is_locked().unwrap());
        assert!(!other.lock(&plain).is_locked().unwrap());
        let mut refusing = Refusing::new(server.connection());

        let (got, took) = support::timed(|| client.lock(&plain).try_lock());
        println!(
            "{path}: try_lock() took {took:?}: {:?}",
            got.as_ref().map(Option::is_some)
        );
        assert!(
            took < PAST_DEADLINE_WITHIN,
            "{path}: try_lock() took {took:?}"
        );
        let first = match got {
            Ok(Some(guard)) => {
                assert!(!guard.is_lease_lost(), "{path}: returned lost");
                Some(guard)
            }
            Ok(None) => panic!("{path}: the lock is free"),
            Err(e) => {
                println!("{path}: try_lock() failed: {e}");
                None
            }
        };

        let options = LockOptions::new()
            .wait_for(Duration::ZERO)
            .lease(Duration::from_secs(1));
        let (got, took) = support::timed(|| client.lock(&leased).try_lock_with(options.clone()));
        println!("{path}: try_lock_with(wait_for(0).lease(1 s)) took {took:?}");
        assert!(
            took < PAST_DEADLINE_WITHIN,
            "{path}: try_lock_with(wait_for(0).lease(1 s)) took {took:?}"
        );
        match got {
            Ok(Some(guard)) => {
                assert!(
                    !guard.is_lease_lost(),
                    "{path}: a guard whose lease is over"
                );
                let left = other.lock(&leased).remaining_lease().unwrap();
                assert!(left.is_some_and(|l| !l.is_zero()), "{path}: {left:?}");
                guard.unlock().unwrap();
            }
            Ok(None) => panic!("{path}: the lock is free"),
            Err(e) => println!("{path}: try_lock_with failed: {e}"),
        }

        // The first hold, taken while the client could not listen, freed meanwhile: told
        // once the client listens.
        if let Some(guard) = first {
            let lost = guard.lost();
            assert!(!other.force_unlock(&plain).unwrap().is_empty());
            refusing.await_refusal();
            assert!(not_ready(&lost), "{path}: told while it could not listen");
            drop(refusing);
            let back = Instant::now();
            let after = select! {
                recv(lost) -> _ => back.elapsed(),
                recv(crossbeam_channel::at(back + TOLD_AFTER_RECONNECT_WITHIN)) -> _ => panic!(
                    "{path}: not told within {TOLD_AFTER_RECONNECT_WITHIN:?} of the server \
                     taking connections again"
                ),
            };
            println!("{path}: told {after:?} after the server took connections again");
            assert_eq!(
                heard.told(1),
                [(plain.clone(), "Lock", LossReason::Deleted)],
                "{path}"
            );
            assert!(is_lease_lost(&guard.unlock()));
        }
    }
}

/// The same with a subscription that is slow rather than refused: the holder's pub/sub
/// requests reach Redis 2 s late (a proxy holds them back), its command connection is as
/// fast as ever. The first `try_lock()` waits for the answer no longer than its deadline
/// plus the grace (it waited the command timeout, 3 s, before), nor past half a short
/// lease; the guards it returns have their leases.
#[test]
fn a_first_hold_stays_within_its_deadline_while_its_subscription_is_slow() {
    let (server, proxy, client) = Clients::DEFAULT.serve_through_proxy();
    let other = Clients::DEFAULT.at(&server);
    assert!(!client.lock("plain").is_locked().unwrap());
    // Its own channel's SUBSCRIBE: the first thing its pub/sub reader sends.
    let own = keys::control_channel(DEFAULT_PREFIX, &client);
    proxy.delay_requests_containing(&own, Duration::from_secs(2));

    let (got, took) = support::timed(|| client.lock("plain").try_lock());
    println!("try_lock() took {took:?}");
    assert!(took < PAST_DEADLINE_WITHIN, "try_lock() took {took:?}");
    let guard = got.unwrap().expect("free");
    assert!(!guard.is_lease_lost());
    assert!(proxy.seen(&own) >= 1, "the client's reader subscribes");
    assert_eq!(proxy.forwarded(&own), 0, "{took:?}: not answered yet");

    let options = LockOptions::new()
        .wait_for(Duration::ZERO)
        .lease(Duration::from_millis(400));
    let (got, took) = support::timed(|| client.lock("short").try_lock_with(options.clone()));
    println!("try_lock_with(wait_for(0).lease(400 ms)) took {took:?}");
    assert!(took < PAST_DEADLINE_WITHIN, "took {took:?}");
    let short = got.unwrap().expect("free");
    assert!(
        !short.is_lease_lost(),
        "a guard whose lease is over, after {took:?}"
    );
    let left = other.lock("short").remaining_lease().unwrap();
    assert!(left.is_some_and(|l| !l.is_zero()), "{left:?}");
    short.unlock().unwrap();

    // Once the subscription goes through, the hold taken meanwhile is checked: freed,
    // it is told.
    let lost = guard.lost();
    assert!(!other.force_unlock("plain").unwrap().is_empty());
    assert!(not_ready(&lost));
    proxy.delay_requests_containing(&own, Duration::ZERO);
    let lifted = Instant::now();
    // A SUBSCRIBE held back already arrives late; the reader's next one is not held.
    let after = select! {
        recv(lost) -> _ => lifted.elapsed(),
        recv(crossbeam_channel::at(lifted + Duration::from_secs(5))) -> _ => panic!(
            "not told within 5 s of the subscription being let through"
        ),
    };
    println!("told {after:?} after the subscription was let through");
    assert!(is_lease_lost(&guard.unlock()));
}

/// Finding 1 of the model (docs/protocol.md): a `force_unlock` whose notice reaches the
/// holder's client before the reply of the acquisition it frees. The reply (it carries
/// `:1`, the grant) is held back by the proxy after the script ran; meanwhile another
/// client force-unlocks the name and its notice comes on the holder's pub/sub connection
/// first, while the acquiring thread has not registered the hold. The guard the call then
/// returns must be told at once (not at the renewal, 10 s after the grant), the hook hears
/// of it once, and giving it back says `LeaseLost`; a later hold of the name is not lost.
/// Every kind, on the FCALL and the EVALSHA paths.
#[test]
fn a_force_unlock_notice_before_the_acquires_reply_is_told_at_once() {
    const REPLY_DELAY: Duration = Duration::from_millis(1500);
    let server = RedisServer::new();
    let mut figures = Vec::new();
    for functions in [true, false] {
        if functions && !support::server_kind().has_functions() {
            continue;
        }
        let path = if functions { "fcall" } else { "evalsha" };
        macro_rules! case {
            ($kind:literal, $name:literal, |$c:ident| $guard:expr) => {{
                let prefix = format!("told:early:{path}:{}:", $kind);
                let proxy = support::FaultProxy::new(server.port());
                // Room for the held-back reply: the command timeout is well above its delay.
                let (client, heard) = CLIENTS
                    .command(Duration::from_secs(5))
                    .prefix(&prefix)
                    .functions(functions)
                    .heard_at(&proxy.url());
                let other = Clients::DEFAULT
                    .prefix(&prefix)
                    .functions(functions)
                    .at(&server);
                // The client's own channel subscribed first: the notice can reach it.
                client.lock("warm").lock().unwrap().unlock().unwrap();
                await_listening(&server, &prefix, &client);
                // From here the only chunk carrying `:1\r\n` is the grant's reply (the
                // notice's payload ends with the lock's key, a letter).
                proxy.delay_replies_containing(":1\r\n", REPLY_DELAY);
                let started = Instant::now();
                // Another thread frees the name once the acquire script ran (a
                // force_unlock before it finds nothing and changes nothing).
                let forcing = std::thread::spawn({
                    let path = path.to_owned();
                    move || loop {
                        if !other.force_unlock($name).unwrap().is_empty() {
                            return Instant::now();
                        }
                        assert!(
                            started.elapsed() < REPLY_DELAY,
                            "{path} {}: the acquire script did not run",
                            $kind
                        );
                        std::thread::sleep(Duration::from_millis(5));
                    }
                });
                let $c = &client;
                let guard = $guard;
                let returned = Instant::now();
                let forced = forcing.join().unwrap();
                proxy.delay_replies_containing(":1\r\n", Duration::ZERO);
                // The race this test is about: the force_unlock was over (its notice on
                // its way) before the held-back reply reached the client.
                assert!(
                    forced < returned && returned >= started + REPLY_DELAY,
                    "{path} {}: the reply was not held back past the force_unlock \
                     ({:?} / {:?})",
                    $kind,
                    forced - started,
                    returned - started
                );
                let Some(after) = told_after(&guard.lost(), returned) else {
                    panic!(
                        "{path} {}: a force_unlock told before the acquire's reply was not \
                         told within {TOLD_WITHIN:?} of the call returning",
                        $kind
                    );
                };
                figures.push(after);
                println!("{path} {}: lost() {after:?} after the call returned", $kind);
                assert!(guard.is_lease_lost(), "{path} {}", $kind);
                assert_eq!(
                    heard.told(1),
                    [($name.to_owned(), $kind, LossReason::Deleted)],
                    "{path} {}: the hook, once",
                    $kind
                );
                let said = guard.give();
                assert!(is_lease_lost(&said), "{path} {}: {said:?}", $kind);
                // A later hold is a new hold (a token of its own): not lost.
                let again = $guard;
                assert!(
                    not_ready(&again.lost()) && !again.is_lease_lost(),
                    "{path} {}: a later hold is told the earlier one's loss",
                    $kind
                );
                again.give().unwrap();
            }};
        }
        case!("Lock", "a", |c| c.lock("a").lock().unwrap());
        case!("FencedLock", "b", |c| c.fenced_lock("b").lock().unwrap());
        case!("FairLock", "c", |c| c.fair_lock("c").lock().unwrap());
        case!("ReadLock", "d", |c| c
            .read_write_lock("d")
            .read_lock()
            .lock()
            .unwrap());
        case!("WriteLock", "e", |c| c
            .read_write_lock("e")
            .write_lock()
            .lock()
            .unwrap());
        case!("UpgradeableLock", "f", |c| c
            .read_write_lock("f")
            .upgradeable_lock()
            .lock()
            .unwrap());
        case!("Semaphore", "g", |c| c.semaphore("g", 3).acquire().unwrap());
        case!("Lock", "h", |c| c.lock("h").owned().lock().unwrap());
    }
    figures.sort();
    println!(
        "notice before the reply -> lost(): median {:?}, max {:?} over {} cases",
        figures[figures.len() / 2],
        figures[figures.len() - 1],
        figures.len()
    );
}
