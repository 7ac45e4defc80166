//! MultiLock and RedLock under contention for free locks, and after a server's call timed
//! out: each try on free locks has exactly one winner, and releases always reach every
//! server.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, MultiLock};
use support::clients::Clients;
use support::keys::Keys;
use support::{FaultProxy, RedisServer};

const PREFIX: &str = "multi:";

const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_secs(5))
    .command(Duration::from_secs(2));
const ROUNDS: usize = 30;
const THREADS: usize = 10;

/// `ROUNDS` rounds of `THREADS` threads that each call `try_lock` once, all at the same
/// moment, on free locks (`make(thread, round)` builds the thread's MultiLock); the
/// winners keep their guard until every thread has tried. Returns the winners of each
/// round.
fn race(make: impl Fn(usize, usize) -> MultiLock + Sync) -> Vec<usize> {
    let mut winners = Vec::new();
    for round in 0..ROUNDS {
        let won = AtomicUsize::new(0);
        let start = Barrier::new(THREADS);
        let tried = Barrier::new(THREADS);
        thread::scope(|s| {
            for t in 0..THREADS {
                let (make, won, start, tried) = (&make, &won, &start, &tried);
                s.spawn(move || {
                    let lock = make(t, round);
                    start.wait();
                    let guard = lock.try_lock().expect("try_lock");
                    if guard.is_some() {
                        won.fetch_add(1, Ordering::SeqCst);
                    }
                    tried.wait();
                    if let Some(g) = guard {
                        g.unlock().expect("unlock");
                    }
                });
            }
        });
        winners.push(won.into_inner());
    }
    winners
}

fn assert_one_winner_each_round(what: &str, winners: &[usize]) {
    eprintln!("{what}: winners per round {winners:?}");
    assert!(
        winners.iter().all(|&w| w == 1),
        "{what}: every round on free locks must have exactly one winner: {winners:?}"
    );
}

/// Issue 17 item 6: three free locks on one server, one client shared by ten threads.
#[test]
fn try_lock_on_free_locks_of_one_shared_client_has_exactly_one_winner() {
    let (server, c) = CLIENTS.serve();
    let winners = race(|_, round| {
        MultiLock::new((0..3).map(|i| c.lock(format!("shared-{round}-{i}")))).unwrap()
    });
    assert_one_winner_each_round("one shared client", &winners);
    for round in 0..ROUNDS {
        for i in 0..3 {
            assert!(!support::exists(
                &mut server.connection(),
                Keys::lock(PREFIX, &format!("shared-{round}-{i}")).key()
            ));
        }
    }
}

/// The same with a new client per thread and round: no pooled connection yet, so the
/// calls take the clients' ordinary path.
#[test]
fn try_lock_on_free_locks_of_one_server_with_new_clients_has_exactly_one_winner() {
    let server = RedisServer::new();
    let winners = race(|_, round| {
        let c = CLIENTS.at(&server);
        MultiLock::new((0..3).map(|i| c.lock(format!("own-{round}-{i}")))).unwrap()
    });
    assert_one_winner_each_round("new clients", &winners);
}

/// Clients of `servers`, one set per thread, each with a connection open already: the
/// question here is who wins, not how fast a loaded machine connects (a member's first
/// connection counts against its member timeout).
fn connected_sets(servers: &[RedisServer]) -> Vec<Vec<Client>> {
    (0..THREADS)
        .map(|_| {
            servers
                .iter()
                .map(|s| {
                    let c = CLIENTS.at(s);
                    c.lock("warm-up").is_locked().expect("warm-up");
                    c
                })
                .collect()
        })
        .collect()
}

/// Room for a loaded machine in each member's round: a slow reply is not what is tested.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(2);

/// Several names on each of three servers, all of them needed: one winner each round.
#[test]
fn try_lock_on_several_names_on_three_servers_has_exactly_one_winner() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let sets = connected_sets(&servers);
    let winners = race(|t, round| {
        MultiLock::new(
            sets[t]
                .iter()
                .flat_map(|c| (0..2).map(move |i| c.lock(format!("names-{round}-{i}")))),
        )
        .unwrap()
        .with_member_timeout(MEMBER_TIMEOUT)
        .unwrap()
    });
    assert_one_winner_each_round("two names on three servers", &winners);
}

/// RedLock over three masters: contenders that split the masters retry within the call.
#[test]
fn red_lock_try_lock_on_free_masters_has_exactly_one_winner() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let sets = connected_sets(&servers);
    let winners = race(|t, round| {
        MultiLock::red_lock(sets[t].iter().map(|c| c.lock(format!("red-{round}"))))
            .unwrap()
            .with_member_timeout(MEMBER_TIMEOUT)
            .unwrap()
    });
    assert_one_winner_each_round("RedLock on three masters", &winners);
}

/// Issue 17 item 7: a call to a master times out (it is frozen for a moment), the master
/// comes back, and the hold is released at once: the release must reach that master too,
/// though its server failed a call well within the second that acquisitions skip it.
/// With every lock needed (`new`), a release skipped there would also make `unlock` fail.
#[test]
fn a_release_reaches_a_master_whose_call_just_timed_out() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let cs: Vec<Client> = servers.iter().map(|s| CLIENTS.at(s)).collect();
    // A short bound for the call that times out; a long one for the release, which may
    // need a new connection to the master just thawed on a busy machine.
    let short = Duration::from_millis(150);
    let probe = MultiLock::red_lock(cs.iter().map(|c| c.lock("probe")))
        .unwrap()
        .with_member_timeout(short)
        .unwrap();
    let red = MultiLock::red_lock(cs.iter().map(|c| c.lock("thawed-red")))
        .unwrap()
        .with_member_timeout(Duration::from_secs(1))
        .unwrap();
    let all = MultiLock::new(cs.iter().map(|c| c.lock("thawed-all")))
        .unwrap()
        .with_member_timeout(Duration::from_secs(1))
        .unwrap();
    for (lock, name) in [(&red, "thawed-red"), (&all, "thawed-all")] {
        let guard = lock.lock().expect("lock");
        assert_eq!(guard.held_on(), 3);
        servers[0].freeze();
        let t = Instant::now();
        // Answered by the two others; the frozen master's call times out.
        let locked = probe.is_locked();
        let took = t.elapsed();
        servers[0].thaw();
        assert!(
            took >= short,
            "{name}: the frozen master answered ({took:?})"
        );
        assert!(matches!(locked, Ok(false)), "{name}: {locked:?}");
        // Sent well within the second a failed master is skipped by acquisitions.
        let since = t.elapsed();
        assert!(since < Duration::from_millis(800), "{name}: {since:?}");
        let unlocked = guard.unlock();
        assert!(
            !support::exists(&mut servers[0].connection(), Keys::lock(PREFIX, name).key()),
            "{name}: the release did not reach the master that had timed out (unlock said \
             {unlocked:?})"
        );
        assert!(
            servers
                .iter()
                .all(|s| !support::exists(&mut s.connection(), Keys::lock(PREFIX, name).key())),
            "{name}"
        );
        unlocked.unwrap_or_else(|e| panic!("{name}: unlock failed: {e}"));
    }
}

/// Queue-leaving is sent to a master that just failed a call too: a waiter that gives up
/// leaves no entry behind there.
#[test]
fn a_waiter_leaves_the_queue_of_a_master_whose_call_just_timed_out() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let holders: Vec<Client> = servers.iter().map(|s| CLIENTS.at(s)).collect();
    let waiters: Vec<Client> = servers.iter().map(|s| CLIENTS.at(s)).collect();
    let make = |cs: &[Client], name: &str, timeout: u64| {
        MultiLock::red_lock(cs.iter().map(|c| c.lock(name)))
            .unwrap()
            .with_member_timeout(Duration::from_millis(timeout))
            .unwrap()
    };
    let held = make(&holders, "queue-left", 150).lock().expect("hold");
    // Leaving the queue may need a new connection to the master just thawed.
    let waiting = make(&waiters, "queue-left", 1000);
    let probe = make(&waiters, "probe", 150);
    let queue = Keys::lock(PREFIX, "queue-left").queue();
    let queued = |s: &RedisServer| -> i64 {
        redis::cmd("LLEN")
            .arg(&queue)
            .query(&mut s.connection())
            .expect("LLEN")
    };
    thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let got = waiting.try_lock_for(Duration::from_secs(1));
            (format!("{:?}", got.map(|g| g.is_some())), Instant::now())
        });
        assert!(support::wait_until(Duration::from_secs(5), || servers
            .iter()
            .all(|s| queued(s) == 1)));
        servers[0].freeze();
        // The waiter's client fails a call to the frozen master.
        assert!(!probe.is_locked().unwrap());
        let failed = Instant::now();
        servers[0].thaw();
        let (got, gave_up) = waiter.join().unwrap();
        assert_eq!(got, "Ok(false)");
        // It left the queues within the second that acquisitions skip the master.
        let after = gave_up.checked_duration_since(failed);
        assert!(
            after.is_some_and(|a| a < Duration::from_millis(900)),
            "gave up {after:?} after the failure (None: before it)"
        );
    });
    assert_eq!(queued(&servers[0]), 0, "the entry was left on the master");
    held.unlock().expect("unlock");
}

/// A try that splits the masters with a holder of a quorum (one master freed under it)
/// gives up: after a few rounds when the holder's lease looks just granted (it may be
/// another try of the same moment), after one when it is clearly older. Either way it
/// returns `None` quickly and leaves the free master free.
#[test]
fn a_try_that_splits_with_a_real_holder_gives_up_soon() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let with_watchdog = |watchdog: Duration| -> Vec<Client> {
        servers
            .iter()
            .map(|s| {
                Clients::new(PREFIX)
                    .watchdog(watchdog)
                    .command(Duration::from_secs(2))
                    .at(&s.url())
            })
            .collect()
    };
    let holders = with_watchdog(Duration::from_secs(5));
    let red = |cs: &[Client]| MultiLock::red_lock(cs.iter().map(|c| c.lock("split"))).unwrap();
    let held = red(&holders).lock().expect("hold");
    // Freed on one master: the holder keeps a quorum of two.
    assert!(holders[2].lock("split").force_unlock().unwrap());
    for (watchdog, at_most) in [(Duration::from_secs(5), 7), (Duration::from_secs(60), 1)] {
        let tries = with_watchdog(watchdog);
        let lock = red(&tries);
        // Warm: scripts loaded, connections pooled (a failed try, not counted).
        assert!(lock.try_lock().unwrap().is_none());
        let before = servers[2].command_calls();
        let t = Instant::now();
        assert!(lock.try_lock().unwrap().is_none());
        let took = t.elapsed();
        let after = servers[2].command_calls();
        let scripts = support::script_calls(&after) - support::script_calls(&before);
        // Each round: an acquisition and its giving back.
        let rounds = scripts / 2;
        eprintln!("a try with a lease of {watchdog:?}: {rounds} rounds in {took:?}");
        assert!(
            (1..=at_most).contains(&rounds),
            "{rounds} rounds against a holder (try's lease {watchdog:?})"
        );
        assert!(took < Duration::from_millis(250), "{took:?}");
        assert!(
            !support::exists(
                &mut servers[2].connection(),
                Keys::lock(PREFIX, "split").key()
            ),
            "the free master was left held"
        );
    }
    held.unlock().expect("unlock");
}

// ---------------------------------------------------------------------------------------
// Issue 17, item 1: a nested call of a thread that holds the MultiLock
// ---------------------------------------------------------------------------------------

/// A thread holds `lock` (its members on `servers`, `name` on each, or `names` on the one
/// server) while another thread of the same clients waits for it, queued on every member
/// (so each client listens on the locks' channels). The holder's nested try fails: its
/// fixed lease of 1 ms leaves no validity, so every round gives its re-entries back until
/// the wait is over. The outer hold must still stand on every member, once, and keep
/// everyone else out; the waiter gets the lock only from the outer guard's release.
fn nested_failure_keeps_the_outer_hold(
    what: &str,
    lock: &MultiLock,
    others: &MultiLock,
    queues: &[(&RedisServer, &str)],
) {
    let outer = lock.lock().expect("outer");
    let (tx, got) = std::sync::mpsc::channel();
    let waiting = lock.clone();
    let waiter = thread::spawn(move || {
        let g = waiting.lock();
        tx.send(()).unwrap();
        g.map(|g| g.unlock())
    });
    assert!(
        support::wait_until(Duration::from_secs(5), || queues.iter().all(
            |(s, name)| support::llen(&mut s.connection(), &Keys::lock(PREFIX, name).queue()) == 1
        )),
        "{what}: the other thread never queued on every member"
    );

    let nested = lock.try_lock_with(
        redmutex::LockOptions::new()
            .wait_for(Duration::from_millis(300))
            .lease(Duration::from_millis(1)),
    );
    assert!(matches!(nested, Ok(None)), "{what}: nested {nested:?}");

    assert!(
        got.recv_timeout(Duration::from_millis(1_500)).is_err(),
        "{what}: the waiting thread got the lock while the outer guard held it"
    );
    for (i, m) in lock.locks().iter().enumerate() {
        assert_eq!(
            m.hold_count().unwrap(),
            1,
            "{what}: member {i} is not held once by the outer guard"
        );
    }
    assert!(
        others.try_lock().unwrap().is_none(),
        "{what}: another client got in"
    );
    assert!(
        !outer.is_lease_lost(),
        "{what}: the outer guard lost its hold"
    );
    assert_eq!(outer.held_on(), lock.locks().len(), "{what}");
    assert!(
        queues.iter().all(|(s, name)| support::llen(
            &mut s.connection(),
            &Keys::lock(PREFIX, name).queue()
        ) == 1),
        "{what}: the waiter lost its place"
    );

    outer.unlock().expect("outer unlock");
    got.recv_timeout(Duration::from_secs(3))
        .unwrap_or_else(|_| panic!("{what}: the waiter never got the released lock"));
    waiter
        .join()
        .unwrap()
        .expect("waiter lock")
        .expect("waiter unlock");
}

#[test]
fn a_failed_nested_try_keeps_the_outer_hold_on_every_member() {
    let long = |s: &RedisServer| {
        Clients::new(PREFIX)
            .watchdog(Duration::from_secs(30))
            .command(Duration::from_secs(2))
            .at(&s.url())
    };
    // Three locks on one server, of one client.
    let server = RedisServer::new();
    let (c, x) = (long(&server), long(&server));
    let names = ["nested-1", "nested-2", "nested-3"];
    let make = |c: &Client| MultiLock::new(names.iter().map(|n| c.lock(*n))).unwrap();
    let queues: Vec<(&RedisServer, &str)> = names.iter().map(|n| (&server, *n)).collect();
    nested_failure_keeps_the_outer_hold("new, one server", &make(&c), &make(&x), &queues);

    // RedLock over three servers.
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let cs: Vec<Client> = servers.iter().map(long).collect();
    let xs: Vec<Client> = servers.iter().map(long).collect();
    let red = |cs: &[Client]| MultiLock::red_lock(cs.iter().map(|c| c.lock("nested-red"))).unwrap();
    let queues: Vec<(&RedisServer, &str)> = servers.iter().map(|s| (s, "nested-red")).collect();
    nested_failure_keeps_the_outer_hold("red_lock", &red(&cs), &red(&xs), &queues);
}

/// A nested call whose re-entry on a member is refused (the hold is gone there: the
/// server lost it, and another client took the lock) learns that the outer hold is gone
/// on that member: its guard says so at once, rather than at the next renewal (a third of
/// the lease, 10 s here), and a later grant there is a new hold, not the old one brought
/// back. With every lock needed (`new`) the outer guard is then lost; a RedLock keeps its
/// quorum on the others.
#[test]
fn a_refused_nested_re_entry_marks_that_member_lost() {
    let long = |s: &RedisServer| {
        Clients::new(PREFIX)
            .watchdog(Duration::from_secs(30))
            .command(Duration::from_secs(2))
            .at(&s.url())
    };
    let del = |s: &RedisServer, name: &str| {
        let n: i64 = redis::cmd("DEL")
            .arg(Keys::lock(PREFIX, name).key())
            .query(&mut s.connection())
            .expect("DEL");
        assert_eq!(n, 1, "{name} was held");
    };

    // Every lock needed, on one server.
    let server = RedisServer::new();
    let (c, x) = (long(&server), long(&server));
    let all = MultiLock::new([c.lock("refused-1"), c.lock("refused-2")]).unwrap();
    let outer = all.lock().expect("outer");
    del(&server, "refused-2");
    let taken = x
        .lock("refused-2")
        .lock()
        .expect("the other client takes it");
    let nested = all.try_lock_for(Duration::from_millis(300));
    assert!(matches!(nested, Ok(None)), "{nested:?}");
    assert!(
        outer.is_lease_lost(),
        "the outer guard still says it holds every lock (held on {})",
        outer.held_on()
    );
    assert_eq!(outer.held_on(), 1);
    taken.unlock().expect("the other client's unlock");
    // The lock is free now: a new hold of this thread, one level, on each member.
    let again = all
        .try_lock_for(Duration::from_secs(2))
        .unwrap()
        .expect("again");
    assert_eq!(
        all.locks()[1].hold_count().unwrap(),
        1,
        "a new hold, not two levels"
    );
    assert_eq!(
        all.locks()[0].hold_count().unwrap(),
        2,
        "re-entered where still held"
    );
    again.unlock().expect("unlock again");
    assert!(matches!(
        outer.unlock(),
        Err(redmutex::Error::LeaseLost { .. })
    ));
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "refused-1").key()
        ) && !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "refused-2").key()
        )
    );

    // RedLock over three servers: the loss of one leaves the quorum.
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let cs: Vec<Client> = servers.iter().map(long).collect();
    // Every master must grant the outer hold, however loaded the machine.
    let red = MultiLock::red_lock(cs.iter().map(|c| c.lock("refused-red")))
        .unwrap()
        .with_member_timeout(MEMBER_TIMEOUT)
        .unwrap();
    let outer = red.lock().expect("outer");
    assert_eq!(outer.held_on(), 3);
    del(&servers[2], "refused-red");
    let other = long(&servers[2]);
    let taken = other
        .lock("refused-red")
        .lock()
        .expect("taken on one master");
    let nested = red
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .expect("nested: a quorum of re-entries");
    assert_eq!(nested.held_on(), 2);
    assert_eq!(
        outer.held_on(),
        2,
        "the outer guard still counts the lost master"
    );
    assert!(!outer.is_lease_lost());
    nested.unlock().expect("nested unlock");
    for (i, m) in red.locks().iter().enumerate().take(2) {
        assert_eq!(m.hold_count().unwrap(), 1, "master {i}");
    }
    taken.unlock().expect("unlock on one master");
    outer.unlock().expect("outer unlock");
    assert!(servers
        .iter()
        .all(|s| !support::exists(&mut s.connection(), Keys::lock(PREFIX, "refused-red").key())));
}

// ---------------------------------------------------------------------------------------
// Issue 17, item 2: a lock handed over while the call leaves its queue
// ---------------------------------------------------------------------------------------

/// How the cancel script answers a caller the lock was handed to meanwhile (`{1, count,
/// token}`, one level): the bytes the proxy holds back.
const HANDED_REPLY: &str = "*3\r\n:1\r\n:1\r\n";

/// What the waiting thread is asked to do with its guard.
enum Ask {
    Report,
    Unlock,
}

/// The stage of the handoff-while-leaving tests: a `MultiLock` of three locks on one
/// server with a quorum of two (`a`, `b`, `c`), its client behind a proxy that holds each
/// cancel (the library loaded beforehand: one FCALL it can hold up) for `cancel_delay`, members
/// given 5 s (the replies are late, not lost); `b` and `c` held by another client.
struct Scene {
    server: RedisServer,
    proxy: FaultProxy,
    _holder: Client,
    other: Client,
    names: Vec<String>,
    cancel: String,
    multi: MultiLock,
    b: redmutex::LockGuard,
    c: redmutex::LockGuard,
}

impl Scene {
    fn new(name: &str, cancel_delay: Duration) -> Scene {
        let server = RedisServer::new();
        let proxy = FaultProxy::new(server.port());
        let long = |url: &str| {
            Clients::new(PREFIX)
                .watchdog(Duration::from_secs(10))
                .command(Duration::from_secs(5))
                .at(url)
        };
        let (holder, other, waiter) =
            (long(&server.url()), long(&server.url()), long(&proxy.url()));
        let names: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|m| format!("{name}-{m}"))
            .collect();
        let cancel = support::function_name(&server.url(), "cancel");
        proxy.delay_requests_containing(&cancel, cancel_delay);
        let multi = MultiLock::new(names.iter().map(|n| waiter.lock(n.as_str())))
            .unwrap()
            .with_quorum(2)
            .unwrap()
            .with_member_timeout(Duration::from_secs(5))
            .unwrap();
        let b = holder.lock(names[1].as_str()).lock().expect("b");
        let c = holder.lock(names[2].as_str()).lock().expect("c");
        Scene {
            server,
            proxy,
            _holder: holder,
            other,
            names,
            cancel,
            multi,
            b,
            c,
        }
    }
}

/// A third client that wants `lock`, on a thread of its own: once it holds it, it sets
/// `holds` and sends `None`; then, told to (the returned sender), it sends whether its
/// guard said lost and whether its unlock succeeded.
fn wants(
    lock: redmutex::Lock,
    holds: Arc<AtomicBool>,
) -> (mpsc::Receiver<Option<(bool, bool)>>, mpsc::Sender<()>) {
    let (got, other_got) = mpsc::channel();
    let (free, other_free) = mpsc::channel::<()>();
    thread::spawn(move || {
        let guard = lock.lock().expect("the other client's lock()");
        holds.store(true, Ordering::SeqCst);
        let _ = got.send(None);
        let _ = other_free.recv_timeout(Duration::from_secs(20));
        let lost = guard.is_lease_lost();
        let _ = got.send(Some((lost, guard.unlock().is_ok())));
    });
    (other_got, free)
}

/// A `MultiLock` of three locks on one server with a quorum of two (`a`, `b`, `c`), its
/// client behind a proxy, waits queued on `b` and `c`, both held by another client. `b` is
/// released and handed to it: with the free `a`, a quorum, so it leaves `c`'s queue. The
/// proxy holds that cancel up 600 ms, and meanwhile `c` is released too and handed to the
/// waiter: the cancel finds it handed over. With `late`, the cancel's reply reaches the
/// client 1.5 s after that: the handed hold's pickup window (1 s from the release, on the
/// server) is over by then, and a third client takes `c`. The returned guard must not
/// count `c` then, and must count it, for a full lease, when the reply comes in time.
fn handed_while_leaving(name: &str, late: bool) {
    let Scene {
        server,
        proxy,
        _holder,
        other,
        names,
        cancel,
        multi,
        b,
        c,
    } = Scene::new(name, Duration::from_millis(600));

    let other_holds = Arc::new(AtomicBool::new(false));
    let (report, reported) = mpsc::channel();
    let (ask, asked) = mpsc::channel();
    let flag = other_holds.clone();
    thread::spawn(move || {
        let guard = multi.lock().expect("the waiter's lock()");
        let beside_other = flag.load(Ordering::SeqCst);
        let _ = report.send((guard.held_on(), guard.is_lease_lost(), beside_other));
        while let Ok(Ask::Report) = asked.recv_timeout(Duration::from_secs(20)) {
            let _ = report.send((guard.held_on(), guard.is_lease_lost(), false));
        }
        let _ = report.send((usize::from(guard.unlock().is_ok()), false, false));
    });
    assert!(
        support::wait_until(Duration::from_secs(5), || {
            support::llen(
                &mut server.connection(),
                &Keys::lock(PREFIX, &names[1]).queue(),
            ) == 1
                && support::llen(
                    &mut server.connection(),
                    &Keys::lock(PREFIX, &names[2]).queue(),
                ) == 1
        }),
        "the waiter never queued on b and c"
    );
    // A plain lock is handed to a waiter that waited 2 ms (its starvation bound), and
    // only woken before that.
    thread::sleep(Duration::from_millis(50));
    b.unlock().expect("b's release");
    assert!(
        proxy.wait_seen(&cancel, 1, Duration::from_secs(5)),
        "the waiter never left c's queue"
    );
    if late {
        proxy.delay_replies_containing(HANDED_REPLY, Duration::from_millis(1_500));
    }
    c.unlock().expect("c's release");
    assert_eq!(
        proxy.forwarded(&cancel),
        0,
        "the cancel ran before c was released: nothing was handed over"
    );
    assert!(
        support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, &names[2]).key()
        ),
        "c was not handed to the waiter"
    );

    // A third client wants c: it gets it once the waiter's hold lapses, or is released.
    let (other_got, free) = wants(other.lock(names[2].as_str()), other_holds);

    let (held_on, lost, beside_other) = reported
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter's lock() never returned");
    proxy.delay_replies_containing(HANDED_REPLY, Duration::ZERO);
    proxy.delay_requests_containing(&cancel, Duration::ZERO);
    assert!(!lost, "a quorum (a and b) was held");
    if late {
        assert!(
            beside_other,
            "the other client did not take c before the late reply came in"
        );
        assert_eq!(
            held_on, 2,
            "the guard counts c, which the other client holds since its pickup window ended"
        );
        assert_eq!(other_got.recv_timeout(Duration::from_secs(1)), Ok(None));
    } else {
        assert!(!beside_other, "the other client got c beside the waiter");
        assert_eq!(held_on, 3, "c, handed over in time, is not counted");
        // Past the pickup window: the waiter's hold of c stands, the other still waits.
        assert!(
            other_got
                .recv_timeout(Duration::from_millis(1_500))
                .is_err(),
            "the other client got c while the waiter's guard held it"
        );
        ask.send(Ask::Report).unwrap();
        let (held_on, lost, _) = reported.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (held_on, lost),
            (3, false),
            "c's hold lapsed after its handoff"
        );
    }
    ask.send(Ask::Unlock).unwrap();
    let (unlocked, _, _) = reported.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(unlocked, 1, "the waiter's unlock failed");
    if !late {
        assert_eq!(
            other_got.recv_timeout(Duration::from_secs(5)),
            Ok(None),
            "the other client never got c after the waiter's release"
        );
    }
    // The other client's hold of c was never touched.
    assert!(support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, &names[2]).key()
    ));
    free.send(()).unwrap();
    let done = other_got.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        done,
        Some((false, true)),
        "the other client's hold of c (lost, unlocked)"
    );
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, &names[0]).key()
        ) && !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, &names[1]).key()
        )
    );
}

/// The handed hold's pickup window ran out before the cancel's reply came in, and another
/// client took the lock: the `MultiLock` guard must not count it (it holds `a` and `b`).
#[test]
fn a_member_handed_over_too_late_while_leaving_its_queue_is_not_counted() {
    handed_while_leaving("handed-late", true);
}

/// The handed hold is confirmed in time: the guard counts it, and it outlasts the pickup
/// window.
#[test]
fn a_member_handed_over_while_leaving_its_queue_is_counted_and_kept() {
    handed_while_leaving("handed-in-time", false);
}

/// As `handed_while_leaving`, but the waiter gives up at its deadline: its cancel (of `b`'s
/// and `c`'s queues, held up 300 ms by the proxy) finds `c` handed over, and gives it back
/// unconfirmed. In time, the release hands `c` on at once (the other client gets it well
/// before the pickup window would have run out); with `late`, the hold lapsed and the
/// other client took `c` before the reply came, and the release must leave that hold alone.
fn handed_while_giving_up(name: &str, late: bool) {
    let Scene {
        server,
        proxy,
        _holder,
        other,
        names,
        cancel,
        multi,
        b,
        c,
    } = Scene::new(name, Duration::from_millis(300));

    let other_holds = Arc::new(AtomicBool::new(false));
    let (report, reported) = mpsc::channel();
    let flag = other_holds.clone();
    thread::spawn(move || {
        let got = multi.try_lock_for(Duration::from_secs(1));
        let _ = report.send((
            format!("{:?}", got.map(|g| g.is_some())),
            flag.load(Ordering::SeqCst),
        ));
    });
    assert!(
        support::wait_until(Duration::from_secs(5), || {
            support::llen(
                &mut server.connection(),
                &Keys::lock(PREFIX, &names[1]).queue(),
            ) == 1
                && support::llen(
                    &mut server.connection(),
                    &Keys::lock(PREFIX, &names[2]).queue(),
                ) == 1
        }),
        "the waiter never queued on b and c"
    );
    assert!(
        proxy.wait_seen(&cancel, 1, Duration::from_secs(5)),
        "the waiter never left the queues"
    );
    if late {
        proxy.delay_replies_containing(HANDED_REPLY, Duration::from_millis(1_500));
    }
    c.unlock().expect("c's release");
    let released = Instant::now();
    assert_eq!(
        proxy.forwarded(&cancel),
        0,
        "the cancel ran before c was released: nothing was handed over"
    );
    assert!(
        support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, &names[2]).key()
        ),
        "c was not handed to the waiter"
    );

    let (other_got, free) = wants(other.lock(names[2].as_str()), other_holds);

    let (outcome, beside_other) = reported
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter's try_lock_for never returned");
    proxy.delay_replies_containing(HANDED_REPLY, Duration::ZERO);
    proxy.delay_requests_containing(&cancel, Duration::ZERO);
    assert_eq!(outcome, "Ok(false)");
    assert_eq!(
        other_got.recv_timeout(Duration::from_secs(5)),
        Ok(None),
        "the other client never got c"
    );
    let took = released.elapsed();
    if late {
        assert!(
            beside_other,
            "the other client did not take c before the late reply came in"
        );
    } else {
        // Given back by the waiter (after about the proxy's 300 ms), not left to lapse
        // (1 s from the release, then the releasing client's check 50 ms later).
        eprintln!("c reached the other client {took:?} after its release");
        assert!(
            took < Duration::from_millis(900),
            "c was not given back: the other client got it {took:?} after its release"
        );
    }
    // The other client's hold of c stands, untouched by the waiter's release.
    assert!(support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, &names[2]).key()
    ));
    free.send(()).unwrap();
    assert_eq!(
        other_got.recv_timeout(Duration::from_secs(5)).unwrap(),
        Some((false, true)),
        "the other client's hold of c (lost, unlocked)"
    );
    b.unlock().expect("b's release");
    assert!(!names
        .iter()
        .any(|n| support::exists(&mut server.connection(), Keys::lock(PREFIX, n).key())));
}

/// Given up at its deadline with `c` handed over meanwhile: what was handed over goes back.
#[test]
fn a_member_handed_over_as_the_call_gives_up_is_given_back() {
    handed_while_giving_up("given-back", false);
}

/// Given up with `c` handed over too late: the other client that took it keeps it.
#[test]
fn a_member_handed_over_too_late_as_the_call_gives_up_is_left_to_its_new_holder() {
    handed_while_giving_up("given-back-late", true);
}

// ---------------------------------------------------------------------------------------
// Issue 26, item 2: a grant that took longer than its lease
// ---------------------------------------------------------------------------------------

/// Pauses every client of `server` for `ms` (writes and reads alike).
fn pause(server: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query(&mut server.connection())
        .expect("CLIENT PAUSE");
}

/// DistributedLock's `TestAcquireFailsIfItTakesTooLong`: the server is paused longer
/// than the lease asked for, so the grant arrives with no validity left. The call must
/// not return it as held: it gives it back and returns `None` (its wait is zero).
#[test]
fn a_grant_that_took_longer_than_its_lease_is_not_returned() {
    let (server, c) = CLIENTS.serve();
    let lock = MultiLock::new([c.lock("too-long")]).unwrap();
    // Warm: scripts loaded, a connection pooled.
    lock.try_lock().unwrap().unwrap().unlock().unwrap();
    pause(&server, 150);
    let (got, took) = support::timed(|| {
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::ZERO)
                .lease(Duration::from_millis(100)),
        )
        .expect("try_lock_with(wait, lease)")
    });
    let held = got.as_ref().map(|g| g.is_lease_lost());
    assert!(
        got.is_none(),
        "a grant that came after {took:?}, past its 100 ms lease, was returned (lost: {held:?})"
    );
    assert!(took >= Duration::from_millis(140), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "too-long").key()
        ),
        "the late grant was not given back"
    );
}

/// The same with the watchdog's lease: a quorum granted after the watchdog timeout (less
/// the drift allowance) is no hold either. A wait that ends during the pause returns
/// `None`; a wait that outlasts it gets the lock in a later round, its validity whole.
#[test]
fn a_grant_that_took_longer_than_the_watchdog_lease_is_not_returned() {
    let server = RedisServer::new();
    let c = Clients::new(PREFIX)
        .watchdog(Duration::from_millis(300))
        .command(Duration::from_millis(250))
        .at(&server.url());
    let lock = MultiLock::new([c.lock("too-long-watchdog")])
        .unwrap()
        .with_member_timeout(Duration::from_secs(1))
        .unwrap();
    lock.try_lock().unwrap().unwrap().unlock().unwrap();
    pause(&server, 400);
    let t = Instant::now();
    // A wait that ends during the pause: its one round is bounded by the member timeout.
    let got = lock
        .try_lock_for(Duration::from_millis(50))
        .expect("try_lock_for");
    let took = t.elapsed();
    assert!(
        got.is_none(),
        "a grant that came after {took:?}, past its 300 ms lease, was returned"
    );
    assert!(took >= Duration::from_millis(390), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(!support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, "too-long-watchdog").key()
    ));

    // Within a wait: tried again once the server answers in time.
    pause(&server, 400);
    let (guard, took) = support::timed(|| {
        lock.try_lock_for(Duration::from_secs(5))
            .expect("try_lock_for")
            .expect("acquired within the wait")
    });
    assert!(took >= Duration::from_millis(390), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(!guard.is_lease_lost());
    assert_eq!(guard.held_on(), 1);
    guard.unlock().expect("unlock");
}

/// RedLock over three masters, all paused past the lease: the majority's grants are
/// given back on every master; a wait longer than the pause gets a hold whose validity
/// counts from the round that got it.
#[test]
fn a_red_lock_granted_after_its_lease_is_given_back_on_every_master() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::new()).collect();
    let cs: Vec<Client> = servers.iter().map(|s| CLIENTS.at(s)).collect();
    let lock = MultiLock::red_lock(cs.iter().map(|c| c.lock("too-long-red"))).unwrap();
    lock.try_lock().unwrap().unwrap().unlock().unwrap();
    for s in &servers {
        pause(s, 150);
    }
    let t = Instant::now();
    let got = lock
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::ZERO)
                .lease(Duration::from_millis(100)),
        )
        .expect("try_lock_with(wait, lease)");
    let took = t.elapsed();
    let lost = got.as_ref().map(|g| g.is_lease_lost());
    assert!(
        got.is_none(),
        "a quorum granted after {took:?}, past its 100 ms lease, was returned (lost: {lost:?})"
    );
    assert!(took >= Duration::from_millis(140), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(servers.iter().all(|s| !support::exists(
        &mut s.connection(),
        Keys::lock(PREFIX, "too-long-red").key()
    )));

    for s in &servers {
        pause(s, 400);
    }
    let (guard, took) = support::timed(|| {
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::from_secs(5))
                .lease(Duration::from_millis(300)),
        )
        .expect("try_lock_with(wait, lease)")
        .expect("acquired within the wait")
    });
    assert!(took >= Duration::from_millis(390), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(
        !guard.is_lease_lost(),
        "returned already lost after {took:?}"
    );
    guard.unlock().expect("unlock");
}

/// A plain `Lock` and its owned form in the same case: a guard already marked lost, or
/// nothing, never a hold said to stand.
#[test]
fn a_lock_granted_after_its_lease_is_not_said_held() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("too-long-plain");
    lock.try_lock().unwrap().unwrap().unlock().unwrap();
    pause(&server, 150);
    let got = lock
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::ZERO)
                .lease(Duration::from_millis(100)),
        )
        .expect("try_lock_with(wait, lease)");
    assert!(got.as_ref().is_none_or(|g| g.is_lease_lost()));
    drop(got);
    pause(&server, 150);
    let got = lock
        .owned()
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::ZERO)
                .lease(Duration::from_millis(100)),
        )
        .expect("owned try_lock_with(wait, lease)");
    assert!(got.as_ref().is_none_or(|g| g.is_lease_lost()));
}

/// Issue 38: one key on one server, reached through two clients (`localhost` and
/// `127.0.0.1`, or a proxy's port), is the same lock twice: such a MultiLock could never be
/// acquired (each member waits for the other). It cannot be told without asking the
/// servers, so `new` and `red_lock` take it, and its first acquisition refuses it with
/// the error `new` gives one client's lock twice (`InvalidArgument`), at once, holding
/// and leaving nothing.
#[test]
fn one_key_reached_through_two_clients_is_refused_at_the_first_acquisition() {
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let numeric = CLIENTS.at(&format!("redis://127.0.0.1:{}/", server.port()));
    let named = CLIENTS.at(&format!("redis://localhost:{}", server.port()));
    let proxied = CLIENTS.at(&proxy.url());
    let other = RedisServer::new();
    let elsewhere = CLIENTS.at(&other);
    let same_twice = |what: &str, lock: &MultiLock| {
        let (got, took) = support::timed(|| lock.try_lock_for(Duration::from_secs(2)));
        let err = got.expect_err(what);
        assert!(
            matches!(err, redmutex::Error::InvalidArgument { .. }),
            "{what}: {err:?}"
        );
        assert!(err.to_string().contains("same lock twice"), "{what}: {err}");
        assert!(
            took < Duration::from_secs(1),
            "{what}: refused after {took:?}"
        );
        // Refused again, whatever the call: never a wait.
        let (got, took) = support::timed(|| lock.lock());
        assert!(
            got.is_err() && took < Duration::from_secs(1),
            "{what}: {took:?}"
        );
    };
    same_twice(
        "localhost and 127.0.0.1",
        &MultiLock::new([numeric.lock("x"), named.lock("y"), named.lock("x")]).unwrap(),
    );
    same_twice(
        "a proxy's port",
        &MultiLock::new([numeric.lock("x"), proxied.lock("x")]).unwrap(),
    );
    same_twice(
        "RedLock with two masters one server",
        &MultiLock::red_lock([numeric.lock("r"), elsewhere.lock("r"), named.lock("r")]).unwrap(),
    );
    // Nothing held or left behind, on either server.
    for s in [&server, &other] {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut s.connection())
            .unwrap();
        assert!(keys.is_empty(), "{keys:?}");
    }

    // Asked of the servers once per MultiLock (its clones included), and only where two
    // clients' locks share a key: one SET per member (with an EXISTS and a DEL, which the
    // lock's own scripts call too), then nothing.
    let lock = MultiLock::new([numeric.lock("q"), elsewhere.lock("q")]).unwrap();
    let before = [server.command_calls(), other.command_calls()];
    let (first, took) = support::timed(|| lock.try_lock().unwrap().unwrap());
    println!("first acquisition, servers asked: {took:?}");
    first.unlock().unwrap();
    let asked = |s: &RedisServer, before| s.calls_since(before, |c| c != "set");
    for (s, before) in [&server, &other].into_iter().zip(&before) {
        let calls = asked(s, before);
        assert_eq!(calls.get("set"), Some(&1), "{calls:?}");
    }
    let before = [server.command_calls(), other.command_calls()];
    let (second, took) = support::timed(|| lock.clone().try_lock().unwrap().unwrap());
    println!("second acquisition: {took:?}");
    second.unlock().unwrap();
    for (s, before) in [&server, &other].into_iter().zip(&before) {
        let calls = asked(s, before);
        assert_eq!(calls.get("set"), None, "asked again: {calls:?}");
    }

    // Not the same lock: another database of the server, another prefix, another server.
    let db1 = CLIENTS.at(&format!("redis://localhost:{}/1", server.port()));
    let prefixed = Clients::new("multi-other:").at(&server);
    for (what, lock) in [
        (
            "another database",
            MultiLock::new([numeric.lock("x"), db1.lock("x")]),
        ),
        (
            "another prefix",
            MultiLock::new([numeric.lock("x"), prefixed.lock("x")]),
        ),
        (
            "another server",
            MultiLock::new([numeric.lock("x"), elsewhere.lock("x")]),
        ),
    ] {
        let guard = lock.unwrap().try_lock().unwrap();
        assert!(guard.is_some(), "{what}: not acquired");
        guard.unwrap().unlock().unwrap();
    }
}
