//! A name is one kind of object at a time (issue 26, item 7): while a lock (plain, fair
//! or fenced: one object), a read-write lock, a semaphore or a counting count-down latch
//! holds a name, every other kind is refused it, atomically and with
//! `Error::WrongKind` naming the kind in use; nothing is written by the refused call. On
//! both ways of running the scripts (FCALL and EVALSHA), with plain names and hash tags.

mod support;

use std::time::{Duration, Instant};

use redmutex::{
    Client, CountDownLatch, Error, FencedGuard, LockGuard, LockKind, Permit, ReadGuard,
    UpgradeableGuard, WriteGuard,
};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const PREFIX: &str = "kinds:";

const CLIENTS: Clients = Clients::new(PREFIX).watchdog(Duration::from_secs(5));

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Fair,
    Fenced,
    Read,
    Write,
    Upgradeable,
    Semaphore,
    Latch,
}

const KINDS: [Kind; 8] = [
    Kind::Plain,
    Kind::Fair,
    Kind::Fenced,
    Kind::Read,
    Kind::Write,
    Kind::Upgradeable,
    Kind::Semaphore,
    Kind::Latch,
];

impl Kind {
    /// The kind of object, as `Error::WrongKind::in_use` and `LockInfo::kind` name it.
    fn object(self) -> &'static str {
        match self {
            Kind::Plain | Kind::Fair | Kind::Fenced => "lock",
            Kind::Read | Kind::Write | Kind::Upgradeable => "read-write lock",
            Kind::Semaphore => "semaphore",
            Kind::Latch => "count-down latch",
        }
    }
}

/// What a kind holds the name with.
#[allow(dead_code)]
enum Held {
    Lock(LockGuard),
    Fair(LockGuard<redmutex::Fair>),
    Fenced(FencedGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Upgradeable(UpgradeableGuard),
    Permit(Permit),
    Latch(CountDownLatch),
}

impl Held {
    fn release(self) {
        match self {
            Held::Lock(g) => g.unlock().unwrap(),
            Held::Fair(g) => g.unlock().unwrap(),
            Held::Fenced(g) => g.unlock().unwrap(),
            Held::Read(g) => g.unlock().unwrap(),
            Held::Write(g) => g.unlock().unwrap(),
            Held::Upgradeable(g) => g.unlock().unwrap(),
            Held::Permit(p) => p.release().unwrap(),
            Held::Latch(l) => {
                l.count_down().unwrap();
                assert_eq!(l.count_down().unwrap(), 0, "opened");
            }
        }
    }
}

/// Takes `name` as `kind`, waiting at most `wait`: `None` when another holder of the same
/// kind kept it.
fn take(c: &Client, kind: Kind, name: &str, wait: Duration) -> Result<Option<Held>, Error> {
    Ok(match kind {
        Kind::Plain => c.lock(name).try_lock_for(wait)?.map(Held::Lock),
        Kind::Fair => c.fair_lock(name).try_lock_for(wait)?.map(Held::Fair),
        Kind::Fenced => c.fenced_lock(name).try_lock_for(wait)?.map(Held::Fenced),
        Kind::Read => c
            .read_write_lock(name)
            .read_lock()
            .try_lock_for(wait)?
            .map(Held::Read),
        Kind::Write => c
            .read_write_lock(name)
            .write_lock()
            .try_lock_for(wait)?
            .map(Held::Write),
        Kind::Upgradeable => c
            .read_write_lock(name)
            .upgradeable_lock()
            .try_lock_for(wait)?
            .map(Held::Upgradeable),
        Kind::Semaphore => c
            .semaphore(name, 2)
            .try_acquire_for(wait)?
            .map(Held::Permit),
        Kind::Latch => {
            let latch = c.count_down_latch(name);
            latch.try_set_count(2)?.then_some(Held::Latch(latch))
        }
    })
}

/// The keys under the prefix, sorted.
fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}*"))
        .query(&mut server.connection())
        .unwrap();
    keys.sort();
    keys
}

/// Names of the three key forms: wrapped in a tag, with the user's own tag, with braces
/// that make no tag (a digest is the tag).
const NAMES: [&str; 3] = ["job", "user:{42}:cart", "}odd{"];

/// Every ordered pair of different kinds, on each key form, on one way of running the
/// scripts: the second is refused while the first holds the name, at once even when it
/// would wait, and takes it once the first let go.
fn every_pair_refuses_the_other(server: &RedisServer, functions: bool) {
    let holder = CLIENTS.functions(functions).at(server);
    let other = CLIENTS.functions(functions).at(server);
    let mut pairs = 0;
    for name in NAMES {
        for first in KINDS {
            for second in KINDS {
                if first.object() == second.object() {
                    continue;
                }
                let what =
                    format!("{first:?} then {second:?} on {name:?} (functions: {functions})");
                let held = take(&holder, first, name, Duration::ZERO)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .unwrap_or_else(|| panic!("{what}: the first kind was not taken"));
                let before = keys(server);
                // A wait of 5 s: refused at once, not after waiting.
                let started = Instant::now();
                let err = match take(&other, second, name, Duration::from_secs(5)) {
                    Err(e) => e,
                    Ok(Some(_)) => panic!("{what}: taken beside the first kind"),
                    Ok(None) => panic!("{what}: waited instead of being refused"),
                };
                let took = started.elapsed();
                match &err {
                    Error::WrongKind { in_use, .. } => {
                        assert_eq!(*in_use, first.object(), "{what}")
                    }
                    e => panic!("{what}: {e:?}"),
                }
                assert_eq!(err.lock_name(), Some(name), "{what}");
                assert_eq!(
                    err.to_string(),
                    format!(
                        "lock \"{name}\": the name is in use as a {}; it cannot be taken as \
                         another kind meanwhile",
                        first.object()
                    ),
                    "{what}"
                );
                assert!(took < Duration::from_secs(2), "{what}: {took:?}");
                // Nothing was written: no hold, no queue, no semaphore defined.
                assert_eq!(keys(server), before, "{what}");
                held.release();
                let second_held = take(&other, second, name, Duration::ZERO)
                    .unwrap_or_else(|e| panic!("{what}, once free: {e}"))
                    .unwrap_or_else(|| panic!("{what}: not taken once free"));
                second_held.release();
                pairs += 1;
            }
        }
    }
    // 44 ordered pairs of kinds of different objects, on each name.
    assert_eq!(pairs, 44 * NAMES.len());
    eprintln!("{pairs} refusals checked (functions: {functions})");
}

#[test]
fn every_pair_of_kinds_refuses_the_other_with_functions() {
    let server = RedisServer::new();
    every_pair_refuses_the_other(&server, true);
}

#[test]
fn every_pair_of_kinds_refuses_the_other_with_evalsha() {
    let server = RedisServer::new();
    every_pair_refuses_the_other(&server, false);
    // Only EVALSHA ran: the scripts took the other kinds' keys that way too.
    let calls = server.command_calls();
    assert!(!calls.contains_key("fcall"), "{calls:?}");
}

/// Plain, fair and fenced locks are one object (one hash): they exclude each other as
/// holders of one lock do, not as kinds; and so do a read-write lock's sides.
#[test]
fn the_kinds_of_one_object_exclude_each_other_as_holders() {
    let server = RedisServer::new();
    let holder = CLIENTS.functions(true).at(&server);
    let other = CLIENTS.functions(true).at(&server);
    for group in [
        [Kind::Plain, Kind::Fair, Kind::Fenced],
        [Kind::Write, Kind::Upgradeable, Kind::Upgradeable],
    ] {
        for first in group {
            for second in group {
                let held = take(&holder, first, "one", Duration::ZERO)
                    .unwrap()
                    .unwrap();
                let taken = take(&other, second, "one", Duration::from_millis(50))
                    .unwrap_or_else(|e| panic!("{first:?} then {second:?}: {e}"));
                assert!(taken.is_none(), "{first:?} then {second:?}: held together");
                held.release();
            }
        }
    }
    // Readers share with each other, and with the upgradeable reader.
    let r = take(&holder, Kind::Read, "shared", Duration::ZERO)
        .unwrap()
        .unwrap();
    let u = take(&other, Kind::Upgradeable, "shared", Duration::ZERO)
        .unwrap()
        .unwrap();
    let r2 = take(&other, Kind::Read, "shared", Duration::ZERO)
        .unwrap()
        .unwrap();
    for h in [r, u, r2] {
        h.release();
    }
}

/// Waits (up to 5 s) until `queue` holds `n` waiters; false if it never does.
fn queue_reaches(con: &mut redis::Connection, queue: &str, n: i64) -> bool {
    support::wait_until(Duration::from_secs(5), || support::llen(con, queue) == n)
}

/// A waiter queued for a lock whose hold lapsed (no release to hand it on), while another
/// kind took the name meanwhile: its next attempt is refused, and it leaves the queue.
#[test]
fn a_waiter_whose_name_another_kind_took_is_refused_and_leaves_the_queue() {
    let server = RedisServer::new();
    let holder = CLIENTS.functions(true).at(&server);
    let waiter = CLIENTS.functions(true).at(&server);
    let other = CLIENTS.functions(true).at(&server);
    let lock_key = Keys::lock(PREFIX, "gone").key();
    let queue = Keys::lock(PREFIX, "gone").queue();
    let guard = support::leased(&holder.lock("gone"), Duration::from_secs(2), "acquire");
    let waiting = std::thread::spawn(move || {
        waiter
            .lock("gone")
            .try_lock_for(Duration::from_secs(20))
            .map(|g| g.is_some())
    });
    let mut con = server.connection();
    assert!(queue_reaches(&mut con, &queue, 1));
    // The hold vanishes as a lapse would (nothing tells the waiter), and a reader comes.
    redis::cmd("DEL")
        .arg(&lock_key)
        .query::<()>(&mut con)
        .unwrap();
    let reader = other
        .read_write_lock("gone")
        .read_lock()
        .try_lock()
        .unwrap()
        .expect("free");
    // The waiter tries again when the lease it saw ends.
    let started = Instant::now();
    let outcome = waiting.join().unwrap();
    match outcome {
        Err(Error::WrongKind { in_use, .. }) => assert_eq!(in_use, "read-write lock"),
        other => panic!("{other:?}"),
    }
    eprintln!("refused {:?} after the reader came", started.elapsed());
    assert_eq!(support::llen(&mut con, &queue), 0, "still queued");
    reader.unlock().unwrap();
    drop(guard);
}

/// An object found free by a script that did not free it (a waiter's cancel, a kick) is
/// not handed to a queued waiter without a look at the name: another kind may have taken
/// the name meanwhile (a hold lapsed, nothing told the waiters). The waiter at the head is
/// told its turn, and its own attempt is refused, so the object is never held beside the
/// other kind; before, the cancel made it the holder. A fair lock (a reader takes the
/// name) and a read-write lock's write side (a lock takes it), both ways of running the
/// scripts.
fn a_cancel_that_finds_it_free_looks_at_the_name<K: redmutex::Kind>(
    side: fn(&Client) -> redmutex::Lock<K>,
    keys: Keys,
    take_other: fn(&Client) -> Box<dyn FnOnce()>,
    in_use: &str,
) {
    const DEADLINE: Duration = Duration::from_secs(3);
    for functions in [true, false] {
        let server = RedisServer::new();
        let holder = CLIENTS.functions(functions).at(&server);
        let first = CLIENTS.functions(functions).at(&server);
        let second = CLIENTS.functions(functions).at(&server);
        let other = CLIENTS.functions(functions).at(&server);
        let (own_key, queue) = (keys.key(), keys.queue());
        // A lease twice the second waiter's deadline: the first one waits for it (nothing
        // tells it of the lapse below) unless the second one's cancel tells it first.
        let guard = support::leased(&side(&holder), DEADLINE * 2, "acquire");
        let started = Instant::now();
        let waiting = std::thread::spawn(move || {
            let got = side(&first).try_lock_for(Duration::from_secs(60));
            let held = matches!(got, Ok(Some(_)));
            (got.map(|g| g.is_some()), held)
        });
        let mut con = server.connection();
        assert!(queue_reaches(&mut con, &queue, 1));
        let cancelling =
            std::thread::spawn(move || side(&second).try_lock_for(DEADLINE).map(|g| g.is_some()));
        assert!(queue_reaches(&mut con, &queue, 2));
        // The hold vanishes as a lapse would (nothing tells the waiters), and another kind
        // takes the name.
        redis::cmd("DEL")
            .arg(&own_key)
            .query::<()>(&mut con)
            .unwrap();
        let release_other = take_other(&other);
        assert!(
            started.elapsed() < DEADLINE,
            "the other kind came after the second waiter's deadline ({:?}): nothing was tested",
            started.elapsed()
        );
        // The second waiter gives up (its cancel finds the object free and the first waiter
        // at the head) or is itself refused the name.
        let second_got = cancelling.join().unwrap();
        assert!(
            matches!(second_got, Ok(false) | Err(Error::WrongKind { .. })),
            "{second_got:?}"
        );
        let (outcome, held) = waiting.join().unwrap();
        assert!(!held, "held beside the other kind (functions: {functions})");
        match outcome {
            Err(Error::WrongKind { in_use: used, .. }) => assert_eq!(used, in_use),
            other => panic!("{other:?}"),
        }
        assert_eq!(support::llen(&mut con, &queue), 0, "still queued");
        release_other();
        drop(guard);
    }
}

#[test]
fn a_cancel_that_finds_a_fair_lock_free_looks_at_the_name() {
    a_cancel_that_finds_it_free_looks_at_the_name(
        |c| c.fair_lock("handed"),
        Keys::lock(PREFIX, "handed"),
        |c| {
            let g = c
                .read_write_lock("handed")
                .read_lock()
                .try_lock()
                .unwrap()
                .expect("free");
            Box::new(move || g.unlock().unwrap())
        },
        "read-write lock",
    );
}

#[test]
fn a_cancel_that_finds_a_write_side_free_looks_at_the_name() {
    a_cancel_that_finds_it_free_looks_at_the_name(
        |c| c.read_write_lock("handed-rw").write_lock(),
        Keys::rw(PREFIX, "handed-rw"),
        |c| {
            let g = c.lock("handed-rw").try_lock().unwrap().expect("free");
            Box::new(move || g.unlock().unwrap())
        },
        "lock",
    );
}

/// A semaphore refused its name does not define its number of permits, and a latch refused
/// its name is not set: the refusal comes before anything is written.
#[test]
fn a_refused_semaphore_defines_nothing_and_a_refused_latch_is_not_set() {
    let server = RedisServer::new();
    let c = CLIENTS.functions(true).at(&server);
    let g = c.lock("x").lock().unwrap();
    let before = keys(&server);
    let err = c.semaphore("x", 3).try_acquire().unwrap_err();
    assert!(
        matches!(err, Error::WrongKind { in_use: "lock", .. }),
        "{err:?}"
    );
    let err = c.count_down_latch("x").try_set_count(3).unwrap_err();
    assert!(
        matches!(err, Error::WrongKind { in_use: "lock", .. }),
        "{err:?}"
    );
    assert_eq!(keys(&server), before);
    assert_eq!(c.count_down_latch("x").count().unwrap(), 0);
    g.unlock().unwrap();
    // A semaphore's number of permits outlives its holds: it does not hold the name.
    drop(c.semaphore("y", 3).acquire().unwrap());
    drop(c.lock("y").lock().unwrap());
}

/// On a Redis Cluster the other kinds' keys are in the name's slot (its tag), so the one
/// EXISTS that refuses a name runs there: every pair on every key form, on names spread
/// over the nodes.
#[test]
fn on_a_cluster_the_kinds_of_a_name_refuse_each_other() {
    let cluster = support::topology::Cluster::new(3, 0);
    let client = || {
        Clients::new(PREFIX)
            .command(Duration::from_millis(1500))
            .connect(Duration::from_secs(10))
            .cluster_at(cluster.seed_urls())
    };
    let (holder, other) = (client(), client());
    let mut nodes = std::collections::BTreeSet::new();
    for i in 0..4 {
        for name in NAMES.map(|n| format!("{n}{i}")) {
            for first in [Kind::Plain, Kind::Read, Kind::Semaphore, Kind::Latch] {
                let held = take(&holder, first, &name, Duration::ZERO)
                    .unwrap()
                    .expect("taken");
                for second in KINDS.into_iter().filter(|k| k.object() != first.object()) {
                    match take(&other, second, &name, Duration::ZERO) {
                        Err(Error::WrongKind { in_use, .. }) => {
                            assert_eq!(in_use, first.object(), "{first:?} {second:?} {name}")
                        }
                        Err(e) => panic!("{first:?} then {second:?} on {name}: {e}"),
                        Ok(_) => panic!("{first:?} then {second:?} on {name}: taken"),
                    }
                }
                held.release();
            }
            // Nothing held: at most the semaphore, whose number of permits outlives its
            // holds (`inspect` shows it, with no holder).
            let key = holder.inspect(name.as_str()).unwrap();
            assert!(
                key.iter().all(|i| i.kind == LockKind::Semaphore
                    && i.holders.is_empty()
                    && i.waiters.is_empty()
                    && i.count == Some(2)),
                "{key:?}"
            );
            nodes.insert(cluster.node_for_key(Keys::lock(PREFIX, &name).key()));
        }
    }
    assert!(nodes.len() > 1, "the names spread over nodes: {nodes:?}");
}
