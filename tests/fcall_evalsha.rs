//! How the bundled scripts reach the server: as the functions of one library (`FCALL`) on
//! servers that have functions, as scripts of their own (`EVALSHA`) on Redis 6.2 or when
//! the client is told so. Every scripted operation runs on each path, and `INFO
//! commandstats` shows which one carried it. Redis 6.2 comes from `REDIS_6_SERVER_BIN`
//! (CI sets it; without it those tests say so and pass).

mod support;

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, MultiLock};
use support::clients::Clients;
use support::{wait_until, RedisServer};

const CLIENTS: Clients = Clients::DEFAULT
    .watchdog(WATCHDOG)
    .command(Duration::from_millis(700));

const WATCHDOG: Duration = Duration::from_millis(1_500);

fn calls(stats: &HashMap<String, u64>, command: &str) -> u64 {
    stats.get(command).copied().unwrap_or(0)
}

/// `SCRIPT LOAD`s in `stats`, of a server that was also sent `flushes` `SCRIPT FLUSH`es:
/// before Redis 7.0 `INFO commandstats` counts every `SCRIPT` subcommand as one.
fn script_loads(stats: &HashMap<String, u64>, flushes: u64) -> u64 {
    if support::server_kind().has_functions() {
        calls(stats, "script|load")
    } else {
        calls(stats, "script") - flushes
    }
}

/// Waits (a bounded while) until `name`'s lock (or read-write lock, `kind`) has `n`
/// waiters queued: another thread's call reached the queue.
fn await_waiters(client: &Client, name: &str, kind: &str, n: usize) {
    assert!(
        wait_until(Duration::from_secs(5), || {
            client
                .inspect(name)
                .unwrap()
                .iter()
                .any(|i| i.kind.to_string() == kind && i.waiters.len() == n)
        }),
        "{n} waiter(s) never queued on {kind} {name}"
    );
}

/// Runs every scripted operation once or more through `client`, checking each did its job.
fn exercise(client: &Client) {
    // A lock: taken, re-entered, inspected, released.
    let lock = client.lock("plain");
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_locked().unwrap());
    let lease = lock.remaining_lease().unwrap().expect("a lease");
    assert!(lease > Duration::ZERO && lease <= WATCHDOG, "{lease:?}");
    let info = client.inspect("plain").unwrap();
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].holders.len(), 1);
    assert_eq!(info[0].holders[0].1, 2);
    inner.unlock().unwrap();
    outer.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());

    // A fair lock handed from this thread to a waiting one (the release grants it, the
    // waiter confirms it with the renewal script; the watchdog kicks the handoff later).
    let fair = client.fair_lock("fair");
    let held = fair.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let fair = fair.clone();
        thread::spawn(move || {
            let guard = fair.lock().unwrap();
            tx.send(fair.hold_count().unwrap()).unwrap();
            guard.unlock().unwrap();
        })
    };
    await_waiters(client, "fair", "lock", 1);
    held.unlock().unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
    waiter.join().unwrap();

    // Fenced: every hold a greater token.
    let fenced = client.fenced_lock("fenced");
    let first = fenced.lock().unwrap();
    let token = first.token();
    assert!(token > 0);
    first.unlock().unwrap();
    let second = fenced.lock().unwrap();
    assert!(second.token() > token);
    second.unlock().unwrap();

    // A wait that times out leaves the queue (the cancel script).
    let held = lock.lock().unwrap();
    let other = lock.clone();
    let timed_out = thread::spawn(move || {
        other
            .try_lock_for(Duration::from_millis(300))
            .unwrap()
            .is_none()
    })
    .join()
    .unwrap();
    assert!(timed_out);
    let info = client.inspect("plain").unwrap();
    assert!(info[0].waiters.is_empty(), "{info:?}");

    // The watchdog renews the hold past its lease (the renewal script).
    thread::sleep(WATCHDOG * 2);
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "the watchdog let the lease lapse"
    );

    // Force-unlocked: the holder learns it lost the lock.
    assert!(client.lock("plain").force_unlock().unwrap());
    assert!(matches!(
        held.unlock(),
        Err(Error::NotHeld { .. } | Error::LeaseLost { .. })
    ));

    // A read-write lock: readers share, a writer waits for them and is handed the lock.
    let rw = client.read_write_lock("rw");
    let read = rw.read_lock().lock().unwrap();
    let refused = {
        let rw = rw.clone();
        thread::spawn(move || {
            let writing = rw.write_lock().try_lock_for(Duration::from_millis(200));
            writing.unwrap().is_none()
        })
    };
    assert!(refused.join().unwrap(), "a writer got in beside a reader");
    let (tx, rx) = mpsc::channel();
    let writer = {
        let rw = rw.clone();
        thread::spawn(move || {
            let guard = rw.write_lock().lock().unwrap();
            tx.send(rw.write_lock().hold_count().unwrap()).unwrap();
            guard.unlock().unwrap();
        })
    };
    await_waiters(client, "rw", "read-write lock", 1);
    read.unlock().unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
    writer.join().unwrap();

    // A semaphore: permits taken, refused, released, added.
    let sem = client.semaphore("sem", 2);
    let two = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    assert!(sem
        .try_acquire_for(Duration::from_millis(100))
        .unwrap()
        .is_none());
    two.release().unwrap();
    assert_eq!(sem.add_permits(1).unwrap(), 3);
    assert_eq!(sem.available_permits().unwrap(), 3);
    let one = sem.acquire().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 2);
    one.release().unwrap();

    // A count-down latch.
    let latch = client.count_down_latch("latch");
    assert!(latch.try_set_count(2).unwrap());
    assert_eq!(latch.count_down().unwrap(), 1);
    assert_eq!(latch.count().unwrap(), 1);
    assert_eq!(latch.count_down().unwrap(), 0);
    assert!(latch.wait_for(Duration::from_secs(1)).unwrap());

    // Each kind force-unlocked (each kind's script; a name is one kind at a time).
    let _lock = client.lock("all").lock().unwrap();
    assert_eq!(client.force_unlock("all").unwrap(), ["lock"]);
    let _write = client.read_write_lock("all").write_lock().lock().unwrap();
    assert_eq!(client.force_unlock("all").unwrap(), ["read-write lock"]);
    let _permit = client.semaphore("all", 1).acquire().unwrap();
    assert_eq!(client.force_unlock("all").unwrap(), ["semaphore"]);

    // A MultiLock over two locks of one server: their calls go as one transaction.
    multilock(client);
}

/// A MultiLock over two locks of `client`'s server: taken, seen, released, force-unlocked.
fn multilock(client: &Client) {
    let both = MultiLock::new([client.lock("m1"), client.lock("m2")]).unwrap();
    let guard = both.lock().unwrap();
    assert_eq!(guard.held_on(), 2);
    assert!(both.is_locked().unwrap());
    guard.unlock().unwrap();
    let guard = both.lock().unwrap();
    assert!(both.force_unlock().unwrap());
    assert!(matches!(
        guard.unlock(),
        Err(Error::NotHeld { .. } | Error::LeaseLost { .. } | Error::NoQuorum { .. })
    ));
    assert!(!both.is_locked().unwrap());
}

/// Asserts that the scripts ran as functions on `server` (and never as EVALSHA).
fn assert_functions(stats: &HashMap<String, u64>) {
    assert!(calls(stats, "fcall") > 0, "no FCALL: {stats:?}");
    assert_eq!(calls(stats, "evalsha"), 0, "EVALSHA sent: {stats:?}");
    assert_eq!(calls(stats, "eval"), 0, "EVAL sent: {stats:?}");
}

/// Asserts that the scripts ran with EVALSHA on `server` (and never as functions).
fn assert_evalsha(stats: &HashMap<String, u64>) {
    assert!(calls(stats, "evalsha") > 0, "no EVALSHA: {stats:?}");
    assert_eq!(calls(stats, "fcall"), 0, "FCALL sent: {stats:?}");
    assert_eq!(
        calls(stats, "function|load"),
        0,
        "FUNCTION LOAD sent: {stats:?}"
    );
}

/// The default client on the server under test (`REDIS_SERVER_BIN`): functions where it
/// has them (Redis 7.0 and later, Valkey), loaded once; EVALSHA where it has none.
#[test]
fn the_default_client_runs_every_script_the_servers_way() {
    let server = RedisServer::new();
    let client = CLIENTS.functions(true).at(&server);
    exercise(&client);
    let stats = server.command_calls();
    if support::server_kind().has_functions() {
        assert_functions(&stats);
        // Loaded once, on the first call.
        assert_eq!(calls(&stats, "function|load"), 1, "{stats:?}");
    } else {
        assert_evalsha(&stats);
    }
}

#[test]
fn a_client_told_to_runs_every_script_with_evalsha() {
    let server = RedisServer::new();
    let client = CLIENTS.functions(false).at(&server);
    exercise(&client);
    assert_evalsha(&server.command_calls());
    if support::server_kind().has_functions() {
        let functions: Vec<redis::Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .query(&mut server.connection())
            .unwrap();
        assert!(functions.is_empty(), "a library was loaded: {functions:?}");
    }
}

/// The Redis 6.2 server, or `None` (with a note) when the environment names none.
fn redis6() -> Option<RedisServer> {
    match support::redis6_binary() {
        Some(bin) => Some(RedisServer::with_binary(&bin, &[])),
        None => {
            eprintln!(
                "note: REDIS_6_SERVER_BIN is not set; the Redis 6.2 (EVALSHA) path is not \
                 tested here (.ci/run sets it)"
            );
            None
        }
    }
}

#[test]
fn redis6_runs_every_script_with_evalsha() {
    let Some(server) = redis6() else { return };
    assert!(support::redis_version(&mut server.connection()).starts_with("6."));
    // The default client: it tries FCALL once, and is refused.
    let client = CLIENTS.functions(true).at(&server);
    exercise(&client);
    assert_evalsha(&server.command_calls());
}

/// A server restarted on an older version (a failover to a Redis 6.2 replica): the first
/// FCALL it refuses is sent again as EVALSHA, as every call after it is.
#[test]
fn a_server_without_functions_after_one_with_them_gets_evalsha() {
    if !support::server_kind().has_functions() {
        return support::skip(
            "a_server_without_functions_after_one_with_them_gets_evalsha",
            "FUNCTION (needed beside the Redis 6.2 of REDIS_6_SERVER_BIN)",
        );
    }
    let Some(_) = support::redis6_binary() else {
        let _ = redis6();
        return;
    };
    let mut server = RedisServer::new();
    let client = CLIENTS.functions(true).at(&server);
    let lock = client.lock("moving");
    lock.lock().unwrap().unlock().unwrap();
    assert!(calls(&server.command_calls(), "fcall") > 0);
    let port = server.port().to_string();
    server.kill();
    let old = RedisServer::with_binary(&support::redis6_binary().unwrap(), &["--port", &port]);
    let guard = lock.lock().unwrap();
    assert!(lock.is_locked().unwrap());
    guard.unlock().unwrap();
    multilock(&client);
    assert_evalsha(&old.command_calls());
}

/// RedLock over masters of different versions: each client runs the scripts its own
/// server's way, the fan-out's transactions included.
#[test]
fn redlock_over_masters_of_different_versions() {
    if !support::server_kind().has_functions() {
        return support::skip(
            "redlock_over_masters_of_different_versions",
            "FUNCTION (needed beside the Redis 6.2 of REDIS_6_SERVER_BIN)",
        );
    }
    let Some(old) = redis6() else { return };
    let (a, b) = (RedisServer::new(), RedisServer::new());
    let clients = [
        CLIENTS.functions(true).at(&a),
        CLIENTS.functions(false).at(&b),
        CLIENTS.functions(true).at(&old),
    ];
    let red = MultiLock::red_lock(clients.iter().map(|c| c.lock("red"))).unwrap();
    for _ in 0..2 {
        let guard = red.lock().unwrap();
        assert_eq!(guard.held_on(), 3);
        guard.unlock().unwrap();
    }
    assert!(!red.is_locked().unwrap());
    assert_functions(&a.command_calls());
    assert_evalsha(&b.command_calls());
    assert_evalsha(&old.command_calls());
}

/// The library gone mid-run (`FUNCTION FLUSH`, as after a restart without persistence):
/// the next call loads it again and goes on, a single call and a transaction alike.
#[test]
fn a_flushed_library_is_loaded_again() {
    if !support::server_kind().has_functions() {
        return support::skip("a_flushed_library_is_loaded_again", "FUNCTION");
    }
    let server = RedisServer::new();
    let client = CLIENTS.functions(true).at(&server);
    let lock = client.lock("flushed");
    lock.lock().unwrap().unlock().unwrap();
    let flush = |server: &RedisServer| {
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query(&mut server.connection())
            .unwrap();
    };
    flush(&server);
    let guard = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 1);
    guard.unlock().unwrap();
    assert_eq!(calls(&server.command_calls(), "function|load"), 2);
    // The MultiLock's two calls go as one transaction, refused as a whole.
    let both = MultiLock::new([client.lock("t1"), client.lock("t2")]).unwrap();
    both.lock().unwrap().unlock().unwrap();
    flush(&server);
    let guard = both.lock().unwrap();
    assert_eq!(guard.held_on(), 2);
    guard.unlock().unwrap();
    let stats = server.command_calls();
    assert_eq!(calls(&stats, "function|load"), 3, "{stats:?}");
    assert_functions(&stats);
}

/// The scripts gone mid-run (`SCRIPT FLUSH`) from a client running them with EVALSHA:
/// the next call loads them again and goes on, a single call and a transaction alike.
#[test]
fn flushed_scripts_are_loaded_again() {
    let server = RedisServer::new();
    let evalsha = CLIENTS.functions(false).at(&server);
    let lock = evalsha.lock("flushed");
    lock.lock().unwrap().unlock().unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    lock.lock().unwrap().unlock().unwrap();
    let both = MultiLock::new([evalsha.lock("t1"), evalsha.lock("t2")]).unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    both.lock().unwrap().unlock().unwrap();
    let stats = server.command_calls();
    assert_evalsha(&stats);
    // Loaded on the first call, and again after each flush (the MultiLock's scripts too).
    assert!(script_loads(&stats, 3) >= 3, "{stats:?}");
}

/// Two versions of redmutex on one server: each loads and calls its own library, named
/// after its text, and neither replaces the other's.
#[test]
fn two_library_versions_share_a_server() {
    if !support::server_kind().has_functions() {
        return support::skip("two_library_versions_share_a_server", "FUNCTION");
    }
    let server = RedisServer::new();
    let mut admin = server.connection();
    // Another version's library: another text, so another name, also for its functions.
    let other = "#!lua name=redmutex_000000000000\n\
        redis.register_function('redmutex_000000000000_acquire', function() return 'other' end)";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(other)
        .query(&mut admin)
        .unwrap();
    let client = CLIENTS.functions(true).at(&server);
    let lock = client.lock("shared");
    let guard = lock.lock().unwrap();
    assert!(lock.is_locked().unwrap());
    guard.unlock().unwrap();
    let libraries: Vec<Vec<redis::Value>> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut admin)
        .unwrap();
    assert_eq!(libraries.len(), 2, "{libraries:?}");
    let theirs: String = redis::cmd("FCALL")
        .arg("redmutex_000000000000_acquire")
        .arg(0)
        .query(&mut admin)
        .unwrap();
    assert_eq!(theirs, "other");
    // A second client of this version finds its library there and loads nothing: the
    // loads were the other version's and the first client's.
    let again = CLIENTS.functions(true).at(&server);
    again.lock("shared").lock().unwrap().unlock().unwrap();
    assert_eq!(calls(&server.command_calls(), "function|load"), 2);
}

/// A user whose ACL allows EVALSHA but not FCALL: the client notices the refusal once and
/// runs its scripts with EVALSHA. (On a server without functions there is no FCALL to
/// deny: the user may run everything, and still gets EVALSHA.)
#[test]
fn a_user_without_fcall_gets_evalsha() {
    let server = RedisServer::new();
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg("locks")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    if support::server_kind().has_functions() {
        setuser.arg("-fcall").arg("-function");
    }
    let _: () = setuser.query(&mut server.connection()).unwrap();
    let client = Client::builder()
        .url(format!("redis://locks:pw@127.0.0.1:{}/", server.port()))
        .build()
        .unwrap();
    let started = Instant::now();
    let lock = client.lock("acl");
    lock.lock().unwrap().unlock().unwrap();
    multilock(&client);
    assert!(started.elapsed() < Duration::from_secs(5));
    let stats = server.command_calls();
    assert!(calls(&stats, "evalsha") > 0, "{stats:?}");
    assert_eq!(calls(&stats, "function|load"), 0, "{stats:?}");
}

/// A cluster: each primary loads the library when a call first finds it missing there (a
/// load goes to the node of the call's keys only), and again after it lost it.
#[test]
fn each_cluster_node_loads_the_library_when_it_lacks_it() {
    let cluster = support::topology::Cluster::new(3, 0);
    let client = Client::builder()
        .cluster(cluster.seed_urls())
        .watchdog_timeout(Duration::from_secs(6))
        .command_timeout(Duration::from_millis(1_500))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // Names whose slots fall on every node (fixed: slots are a hash of the name).
    let names: Vec<String> = (0..30).map(|i| format!("spread-{i}")).collect();
    let run = || {
        for name in &names {
            let lock = client.lock(name.as_str());
            let guard = lock.lock().unwrap();
            assert!(lock.is_locked().unwrap());
            guard.unlock().unwrap();
        }
    };
    // Without functions (before Redis 7.0) the scripts are loaded instead, each where a
    // call of it first found it missing: at least once per node, and once more after
    // the flush.
    let functions = support::server_kind().has_functions();
    let loads = |n: u64, flushes: u64| -> Vec<u64> {
        let mut per_node = Vec::new();
        for node in cluster.nodes() {
            let stats = node.server().command_calls();
            if functions {
                assert_functions(&stats);
                assert_eq!(calls(&stats, "function|load"), n, "{stats:?}");
            } else {
                assert_evalsha(&stats);
                assert!(script_loads(&stats, flushes) >= n, "{stats:?}");
            }
            per_node.push(script_loads(&stats, flushes));
        }
        per_node
    };
    run();
    let first = loads(1, 0);
    for node in cluster.nodes() {
        let _: () = redis::cmd(if functions { "FUNCTION" } else { "SCRIPT" })
            .arg("FLUSH")
            .query(&mut node.server().connection())
            .unwrap();
    }
    run();
    let second = loads(2, 1);
    if !functions {
        for (before, after) in first.iter().zip(&second) {
            assert!(
                after > before,
                "no script loaded after the flush: {first:?} {second:?}"
            );
        }
    }
}

/// A server at its memory limit (`maxmemory` with `noeviction`) refuses every write that
/// may grow memory, but what is held must still be renewed and released, or holds are
/// lost just when the server is busiest. The library's functions carry `allow-oom` for
/// that: on the server under test, a reentrant lock's inner level released, a read hold
/// and a permit renewed past two leases and released. (Reads that are functions without
/// `allow-oom`, such as `available_permits`, are refused meanwhile.)
#[test]
fn holds_are_renewed_and_released_at_the_memory_limit_with_functions() {
    if !support::server_kind().has_functions() {
        return support::skip(
            "holds_are_renewed_and_released_at_the_memory_limit_with_functions",
            "FUNCTION",
        );
    }
    at_the_memory_limit(true);
}

/// The same with the scripts sent with EVALSHA (Redis 6.2's only way). A script carries
/// no `allow-oom` flag there: the server refuses its first write that may grow memory
/// unless it already wrote, so a renewal whose first write was a lease's ZADD, or a
/// release of an inner level (HSET first), was refused and the holds lapsed (found
/// running the suite on Redis 6.2).
#[test]
fn holds_are_renewed_and_released_at_the_memory_limit_with_evalsha() {
    at_the_memory_limit(false);
}

fn at_the_memory_limit(functions: bool) {
    let server = RedisServer::new();
    let client = CLIENTS.functions(functions).at(&server);
    let lock = client.lock("full");
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let rw = client.read_write_lock("full-rw");
    let read = rw.read_lock().lock().unwrap();
    let sem = client.semaphore("full-sem", 2);
    let permit = sem.acquire().unwrap();

    let mut admin = server.connection();
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .exec(&mut admin)
            .unwrap();
    }
    let refused = redis::cmd("SET")
        .arg("probe")
        .arg("x")
        .exec(&mut admin)
        .unwrap_err();
    assert_eq!(refused.code(), Some("OOM"), "{refused}");

    // Two leases: each hold lives on only if the watchdog's renewals were taken.
    thread::sleep(WATCHDOG * 2);
    let way = if functions { "default" } else { "EVALSHA" };
    assert_eq!(
        lock.hold_count().unwrap(),
        2,
        "{way}: the lock's lease lapsed"
    );
    assert_eq!(
        rw.read_lock().hold_count().unwrap(),
        1,
        "{way}: the read hold lapsed"
    );

    inner
        .unlock()
        .unwrap_or_else(|e| panic!("{way}: inner level: {e}"));
    assert_eq!(lock.hold_count().unwrap(), 1, "{way}");
    outer.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "{way}");
    read.unlock()
        .unwrap_or_else(|e| panic!("{way}: read hold: {e}"));
    assert_eq!(rw.read_lock().hold_count().unwrap(), 0, "{way}");
    // A permit that lapsed is not given back but reported lost.
    permit
        .release()
        .unwrap_or_else(|e| panic!("{way}: permit: {e}"));
    let left = client.inspect("full-sem").unwrap();
    assert!(left.iter().all(|i| i.holders.is_empty()), "{way}: {left:?}");
}

/// A client's first call names a lock whose name is not UTF-8. A server without
/// functions refuses the FCALL with "unknown command", echoing the call's first
/// arguments, the name's bytes among them: redis-rs cannot read that reply as text, so
/// the refusal was never seen as one and the call failed (a parse error) instead of
/// falling back to EVALSHA (found running the suite on Redis 6.2). Each server runs it
/// its way: the server under test, and Redis 6.2 where CI names one.
#[test]
fn a_first_call_with_a_name_that_is_not_utf8_runs_on_any_server() {
    let mut servers = vec![RedisServer::new()];
    servers.extend(redis6());
    for server in &servers {
        let functions = support::redis_version(&mut server.connection())
            .split('.')
            .next()
            .and_then(|major| major.parse::<u32>().ok())
            .is_some_and(|major| major >= 7);
        let client = CLIENTS.functions(true).at(server);
        let name = b"bin\xff\xfe".to_vec();
        let lock = client.lock(name.clone());
        let guard = lock
            .lock()
            .expect("the first call, with a name that is not UTF-8");
        assert_eq!(lock.hold_count().unwrap(), 1);
        guard.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());
        // Afterwards every call goes the server's way, names of either kind.
        client.lock("text").lock().unwrap().unlock().unwrap();
        let before = server.command_calls();
        lock.lock().unwrap().unlock().unwrap();
        client.lock("text").lock().unwrap().unlock().unwrap();
        let after = server.command_calls();
        let ran = |c: &str| calls(&after, c) - calls(&before, c);
        if functions {
            assert!(ran("fcall") >= 2, "{before:?} {after:?}");
        } else {
            assert!(ran("evalsha") >= 4, "{before:?} {after:?}");
            assert_eq!(calls(&after, "fcall"), 0, "{after:?}");
        }
    }
}
