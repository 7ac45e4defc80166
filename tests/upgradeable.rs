//! The upgradeable read side of a `ReadWriteLock` (issue 19, item 5) against real
//! redis-server processes: it shares the lock with readers and excludes writers and other
//! upgradeable readers; those wait and are served in turn; an upgrade waits for the plain
//! readers only, ahead of a waiting writer, and readers that come meanwhile queue behind
//! it (no starvation, no deadlock, with readers streaming in from other clients); write
//! exclusion after an upgrade is witnessed inside Redis across processes; a holder whose
//! process dies frees the upgradeable slot when its lease ends, and a pending upgrade of a
//! dead process does not block anyone; bad input is refused, typed, changing nothing.
//!
//! Other processes are this test binary re-executed (`upgradeable_entry`).

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, LockKind};
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, RedisServer};

const ROLE: &str = "REDMUTEX_UP_ROLE";
const URL: &str = "REDMUTEX_UP_URL";
const NAME: &str = "REDMUTEX_UP_NAME";
const PREFIX: &str = "upt:";

const CLIENTS: Clients = Clients::new(PREFIX);
/// How long setup steps (a waiter showing in the queue) may take before the test fails.
const SETUP: Duration = Duration::from_secs(5);
/// Long enough that a waiter that is not going to be served shows it, on a loaded machine.
const STILL_WAITING: Duration = Duration::from_millis(300);

fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connection")
}

/// The hold fields of the lock's hash (not the scripts' `~` fields), sorted.
fn hold_fields(con: &mut redis::Connection, name: &str) -> Vec<String> {
    let all: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(Keys::rw(PREFIX, name).key())
        .query(con)
        .expect("HGETALL");
    let mut f: Vec<String> = all.into_keys().filter(|f| !f.starts_with('~')).collect();
    f.sort();
    f
}

/// The holder ids queued, in order.
fn queue(con: &mut redis::Connection, name: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(Keys::rw(PREFIX, name).queue())
        .arg(0)
        .arg(-1)
        .query(con)
        .expect("LRANGE")
}

fn await_queue_len(con: &mut redis::Connection, name: &str, n: usize, who: &str) {
    let mut seen = Vec::new();
    assert!(
        wait_until(SETUP, || {
            seen = queue(con, name);
            seen.len() == n
        }),
        "{who}: the queue is {seen:?}, expected {n} entries within {SETUP:?}"
    );
}

/// A thread of its own that takes a side of the lock with `lock()` and reports on `tx`;
/// it holds until `release` says so, then unlocks and reports again.
fn holder_thread(
    client: &Client,
    name: &str,
    side: &'static str,
    tx: mpsc::Sender<(&'static str, Instant)>,
) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let rw = client.read_write_lock(name);
    let (release, rx) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let guard: Box<dyn std::any::Any> = match side {
            "read" => Box::new(rw.read_lock().lock().expect("read")),
            "write" => Box::new(rw.write_lock().lock().expect("write")),
            "upgradeable" => Box::new(rw.upgradeable_lock().lock().expect("upgradeable")),
            other => panic!("side {other}"),
        };
        tx.send((side, Instant::now())).unwrap();
        rx.recv().unwrap();
        drop(guard);
        tx.send(("released", Instant::now())).unwrap();
    });
    (release, t)
}

/// An upgradeable hold shares the lock with readers of other clients, and excludes a
/// second upgradeable reader and a writer (one attempt each gets `None`, and nothing of
/// theirs is left in Redis).
#[test]
fn upgradeable_shares_with_readers_and_excludes_writers_and_upgradeables() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "share";
    let (a, b, c) = (
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
    );
    let mut con = connect(&url);
    let up = a
        .read_write_lock(name)
        .upgradeable_lock()
        .lock()
        .expect("upgradeable");
    let r1 = b
        .read_write_lock(name)
        .read_lock()
        .try_lock()
        .expect("read b");
    assert!(
        r1.is_some(),
        "a reader shares the lock with the upgradeable reader"
    );
    let r2 = c
        .read_write_lock(name)
        .read_lock()
        .try_lock()
        .expect("read c");
    assert!(r2.is_some(), "so does a second one");
    let fields = hold_fields(&mut con, name);
    assert_eq!(fields.len(), 3, "{fields:?}");
    assert!(fields
        .iter()
        .any(|f| f.starts_with(&format!("u:{}:", a.id()))));

    // (From a client this thread does not read with: that would be `WouldDeadlock`.)
    let d = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let other = d
        .read_write_lock(name)
        .upgradeable_lock()
        .try_lock()
        .expect("try");
    assert!(other.is_none(), "a second upgradeable reader is excluded");
    let w = d
        .read_write_lock(name)
        .write_lock()
        .try_lock()
        .expect("try write");
    assert!(w.is_none(), "a writer is excluded");
    assert_eq!(
        hold_fields(&mut con, name),
        fields,
        "the refusals wrote nothing"
    );
    assert!(queue(&mut con, name).is_empty());

    // The readers leaving do not free the upgradeable slot; its release does.
    drop((r1, r2));
    assert!(d
        .read_write_lock(name)
        .upgradeable_lock()
        .try_lock()
        .unwrap()
        .is_none());
    assert_eq!(
        a.read_write_lock(name)
            .upgradeable_lock()
            .hold_count()
            .unwrap(),
        1
    );
    up.unlock().expect("unlock");
    let next = d
        .read_write_lock(name)
        .upgradeable_lock()
        .try_lock()
        .unwrap();
    assert!(next.is_some(), "free once released");
}

/// A second upgradeable reader and a writer that come while the upgradeable hold is
/// taken wait, in order: its release hands the slot to the second upgradeable reader (the
/// writer still waits for it), whose release lets the writer in.
#[test]
fn a_second_upgradeable_and_a_writer_wait_in_turn() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "turns";
    let (a, b, c) = (
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
    );
    let mut con = connect(&url);
    let up = a
        .read_write_lock(name)
        .upgradeable_lock()
        .lock()
        .expect("upgradeable");
    let (tx, rx) = mpsc::channel();
    let (release_b, tb) = holder_thread(&b, name, "upgradeable", tx.clone());
    await_queue_len(&mut con, name, 1, "second upgradeable");
    let (release_c, tc) = holder_thread(&c, name, "write", tx);
    await_queue_len(&mut con, name, 2, "writer");
    assert!(
        rx.recv_timeout(STILL_WAITING).is_err(),
        "both wait while the upgradeable hold is taken"
    );
    // Readers still come in? Not past the queue: first come, first served.
    assert!(b
        .read_write_lock(name)
        .read_lock()
        .try_lock()
        .unwrap()
        .is_none());

    let released = Instant::now();
    up.unlock().expect("unlock");
    let (side, at) = rx
        .recv_timeout(SETUP)
        .expect("the second upgradeable is served");
    assert_eq!(side, "upgradeable");
    let handoff = at - released;
    assert!(
        handoff < Duration::from_secs(1),
        "handed over in {handoff:?}"
    );
    assert!(
        rx.recv_timeout(STILL_WAITING).is_err(),
        "the writer waits for the second upgradeable reader"
    );
    release_b.send(()).unwrap();
    // (The writer may say it holds before the releasing thread says it released.)
    let mut next = [
        rx.recv_timeout(SETUP).unwrap().0,
        rx.recv_timeout(SETUP).unwrap().0,
    ];
    next.sort();
    assert_eq!(next, ["released", "write"], "then the writer");
    release_c.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
    tb.join().unwrap();
    tc.join().unwrap();
}

/// An upgrade waits for the plain readers, goes ahead of a writer that waits, holds
/// readers that come meanwhile behind it, and is handed the write hold by the last
/// reader's release; releasing the write guard goes back to upgradeable reading.
#[test]
fn upgrade_waits_for_readers_and_gets_the_write_hold() {
    let server = RedisServer::new();
    upgrade_scenario(&server.url());
}

/// The README's minimal ACL rule (see tests/security.rs), for this test's prefix.
const ACL_RULE: &str = "on >s3cret-pw resetchannels ~upt:* &upt:* -@all \
    +fcall +function|load +evalsha +script|load +exists +hget +hmget +hgetall +pttl +subscribe \
    +unsubscribe +publish +ping +wait +hincrby +hset +hexists +pexpire +del +incr +time +type \
    +hkeys +hdel +rpush +lindex +lpop +lrem +lrange +get +set +decr +zadd +zscore +zrem +zcard \
    +zrange +zrangebyscore";

/// The same, as a user confined by the README's ACL rule: the upgrade (its move to the
/// head of the queue included) needs no command beyond it.
#[test]
fn an_acl_user_confined_to_the_prefix_can_upgrade() {
    let server = RedisServer::new();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg("locker");
    for part in support::acl_rule_words(ACL_RULE) {
        cmd.arg(part);
    }
    cmd.exec(&mut server.connection()).expect("ACL SETUSER");
    upgrade_scenario(&format!(
        "redis://locker:s3cret-pw@127.0.0.1:{}/",
        server.port()
    ));
}

fn upgrade_scenario(url: &str) {
    let url = url.to_owned();
    let name = "upgrade";
    let (a, b, c) = (
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
    );
    let mut con = connect(&url);
    let (tx, rx) = mpsc::channel();
    let (release_r, tr) = holder_thread(&b, name, "read", tx.clone());
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "read");

    // The upgrader: takes the upgradeable side, then upgrades on the same thread.
    let (utx, urx) = mpsc::channel::<(&'static str, Instant, Vec<String>)>();
    let (go, go_rx) = mpsc::channel::<&'static str>();
    let rw = a.read_write_lock(name);
    let url2 = url.clone();
    let tu = thread::spawn(move || {
        let mut con = connect(&url2);
        let up = rw.upgradeable_lock().lock().expect("upgradeable");
        utx.send(("upgradeable", Instant::now(), vec![])).unwrap();
        go_rx.recv().unwrap();
        let w = up.upgrade().expect("upgrade");
        utx.send(("upgraded", Instant::now(), hold_fields(&mut con, name)))
            .unwrap();
        assert_eq!(go_rx.recv().unwrap(), "downgrade");
        w.unlock().expect("unlock write");
        utx.send(("downgraded", Instant::now(), hold_fields(&mut con, name)))
            .unwrap();
        assert_eq!(go_rx.recv().unwrap(), "end");
        up.unlock().expect("unlock upgradeable");
    });
    assert_eq!(urx.recv_timeout(SETUP).unwrap().0, "upgradeable");
    // A writer waits behind the upgradeable hold.
    let (release_w, tw) = holder_thread(&c, name, "write", tx.clone());
    await_queue_len(&mut con, name, 1, "writer");
    go.send("upgrade").unwrap();
    let mut q = Vec::new();
    assert!(
        wait_until(SETUP, || {
            q = queue(&mut con, name);
            q.len() == 2
        }),
        "the upgrade queues: {q:?}"
    );
    assert!(
        q[0].starts_with(&format!("{}:", a.id())),
        "the upgrade queues ahead of the writer: {q:?}"
    );
    assert!(
        urx.recv_timeout(STILL_WAITING).is_err(),
        "the upgrade waits for the reader"
    );
    // A reader arriving now waits behind the upgrade.
    assert!(c
        .read_write_lock(name)
        .read_lock()
        .try_lock()
        .unwrap()
        .is_none());

    let released = Instant::now();
    release_r.send(()).unwrap();
    let (what, at, fields) = urx.recv_timeout(SETUP).expect("upgraded");
    assert_eq!(what, "upgraded");
    let waited = at.saturating_duration_since(released);
    assert!(
        waited < Duration::from_secs(1),
        "the reader's release hands the write hold over at once: {waited:?}"
    );
    let mine: Vec<&String> = fields
        .iter()
        .filter(|f| f.ends_with(&fields_suffix(&fields, "w:")))
        .collect();
    assert_eq!(
        fields.len(),
        2,
        "the write and the upgradeable hold: {fields:?}"
    );
    assert!(fields
        .iter()
        .any(|f| f.starts_with(&format!("w:{}:", a.id()))));
    assert!(fields
        .iter()
        .any(|f| f.starts_with(&format!("u:{}:", a.id()))));
    assert_eq!(mine.len(), 2, "both of one thread: {fields:?}");
    assert_eq!(
        rx.recv_timeout(SETUP).unwrap().0,
        "released",
        "the reader left"
    );
    // Write exclusion: no reader, no writer.
    assert!(b
        .read_write_lock(name)
        .read_lock()
        .try_lock()
        .unwrap()
        .is_none());
    assert!(
        rx.recv_timeout(STILL_WAITING).is_err(),
        "the writer still waits"
    );

    go.send("downgrade").unwrap();
    let (what, _, fields) = urx.recv_timeout(SETUP).unwrap();
    assert_eq!(what, "downgraded");
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert!(fields[0].starts_with("u:"));
    assert!(
        rx.recv_timeout(STILL_WAITING).is_err(),
        "the writer waits for the upgradeable hold"
    );
    go.send("end").unwrap();
    tu.join().unwrap();
    assert_eq!(
        rx.recv_timeout(SETUP).unwrap().0,
        "write",
        "then the writer"
    );
    release_w.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
    tr.join().unwrap();
    tw.join().unwrap();
}

/// The thread-token part that the field of `prefix` ends with (`<prefix><client>:<token>`).
fn fields_suffix(fields: &[String], prefix: &str) -> String {
    let f = fields
        .iter()
        .find(|f| f.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} field in {fields:?}"));
    f[prefix.len()..].to_owned()
}

/// Readers stream in from three other clients (each thread looping lock, a short
/// section, unlock), in every other round with a writer waiting too: an upgrade still
/// completes within a bound set by one reader's section (the readers that come after it
/// queue behind it), the upgraded hold excludes every reader (a counter of readers
/// inside, kept in Redis by their sections, is zero throughout the write section), and
/// then the writer and the readers all go on: nobody deadlocks.
#[test]
fn upgrade_with_readers_streaming_and_a_writer_waiting_is_not_starved() {
    const SECTION: Duration = Duration::from_millis(30);
    const ROUNDS: usize = 4;
    let server = RedisServer::new();
    let url = server.url();
    let name = "stream";
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let inside_key = format!("inside:{{{name}}}");
    let mut streamers = Vec::new();
    for _ in 0..3 {
        let c = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
        let (stop, reads, url, inside_key) =
            (stop.clone(), reads.clone(), url.clone(), inside_key.clone());
        streamers.push(thread::spawn(move || {
            let mut con = connect(&url);
            let read = c.read_write_lock(name).read_lock();
            while !stop.load(Ordering::Relaxed) {
                let g = read.lock().expect("read");
                let _: i64 = redis::cmd("INCR").arg(&inside_key).query(&mut con).unwrap();
                thread::sleep(SECTION);
                let _: i64 = redis::cmd("DECR").arg(&inside_key).query(&mut con).unwrap();
                g.unlock().expect("unlock read");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut con = connect(&url);
    assert!(
        wait_until(SETUP, || reads.load(Ordering::Relaxed) >= 6),
        "the readers stream"
    );
    let a = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let writer_client = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let rw = a.read_write_lock(name);
    let mut worst = Duration::ZERO;
    for round in 0..ROUNDS {
        let with_writer = round % 2 == 1;
        let up = rw.upgradeable_lock().lock().expect("upgradeable");
        let (tx, rx) = mpsc::channel();
        let writer = if with_writer {
            // A writer queues behind the upgradeable hold (and the readers behind it).
            let writer = holder_thread(&writer_client, name, "write", tx);
            assert!(
                wait_until(SETUP, || queue(&mut con, name)
                    .iter()
                    .any(|h| h.starts_with(&format!("{}:", writer_client.id())))),
                "round {round}: the writer queues"
            );
            Some(writer)
        } else {
            // The readers keep coming in alongside the upgradeable hold.
            let before = reads.load(Ordering::Relaxed);
            assert!(
                wait_until(SETUP, || reads.load(Ordering::Relaxed) >= before + 3),
                "round {round}: readers come in beside the upgradeable hold"
            );
            None
        };
        let (w, took) = support::timed(|| {
            up.try_upgrade_for(Duration::from_secs(10))
                .expect("upgrade")
                .expect("the upgrade is not starved")
        });
        worst = worst.max(took);
        let inside: i64 = redis::cmd("GET")
            .arg(&inside_key)
            .query::<Option<i64>>(&mut con)
            .unwrap()
            .unwrap_or(0);
        assert_eq!(
            inside, 0,
            "round {round}: a reader is inside the write section"
        );
        thread::sleep(SECTION);
        let inside: i64 = redis::cmd("GET")
            .arg(&inside_key)
            .query::<Option<i64>>(&mut con)
            .unwrap()
            .unwrap_or(0);
        assert_eq!(
            inside, 0,
            "round {round}: a reader came into the write section"
        );
        assert!(
            rx.try_recv().is_err(),
            "round {round}: the writer came in during the upgraded hold"
        );
        drop(w);
        drop(up);
        if let Some((release_w, tw)) = writer {
            let (side, _) = rx.recv_timeout(SETUP).expect("then the writer is served");
            assert_eq!(side, "write");
            release_w.send(()).unwrap();
            assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
            tw.join().unwrap();
        }
        let before = reads.load(Ordering::Relaxed);
        assert!(
            wait_until(SETUP, || reads.load(Ordering::Relaxed) >= before + 3),
            "round {round}: the readers go on"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for s in streamers {
        s.join().unwrap();
    }
    eprintln!("upgrade with streaming readers: worst {worst:?} over {ROUNDS} rounds");
    // Each reader inside when the upgrade queued has at most one section left; the grant
    // is handed over by the last one's release. 1.5 s leaves room for a loaded machine.
    assert!(
        worst < Duration::from_millis(1_500),
        "the upgrade took {worst:?}: starved by the readers"
    );
}

/// The child side of the multi-process tests; a no-op in a normal run.
#[test]
fn upgradeable_entry() {
    support::child::run_named_role(
        ROLE,
        URL,
        NAME,
        &[
            ("upgrader", upgrader_process),
            ("reader", reader_process),
            ("holder", crash_holder_process),
        ],
    );
}

fn spawn_child(role: &str, url: &str, name: &str) -> ChildProc {
    ChildProc::spawn(
        "upgradeable_entry",
        &[(ROLE, role), (URL, url), (NAME, name)],
    )
}

/// The witness: KEYS[1] its hash; ARGV[1] 'enter' or 'exit', ARGV[2] 'r' (a plain or
/// upgradeable reader) or 'w' (an upgraded writer). A writer entering while anyone is
/// inside, or a reader while a writer is, is a violation. Returns the violations so far.
const WITNESS: &str = r"
local w, op, mode = KEYS[1], ARGV[1], ARGV[2]
local function num(f) return tonumber(redis.call('hget', w, f) or '0') end
local field = mode == 'r' and 'readers' or 'writers'
if op == 'enter' then
    if (mode == 'w' and (num('readers') > 0 or num('writers') > 0))
        or (mode == 'r' and num('writers') > 0) then
        redis.call('hincrby', w, 'violations', 1)
    end
    redis.call('hincrby', w, field, 1)
    redis.call('hincrby', w, mode .. '_entries', 1)
else
    redis.call('hincrby', w, field, -1)
end
return num('violations')
";

fn witness(con: &mut redis::Connection, name: &str, op: &str, mode: &str) {
    let _: i64 = redis::Script::new(WITNESS)
        .key(format!("witness:{{{name}}}"))
        .arg(op)
        .arg(mode)
        .invoke(con)
        .expect("witness");
}

const CHILD_ROUNDS: usize = 15;

/// Takes the upgradeable side, reads a moment (inside the witness as a reader), upgrades,
/// writes a moment (inside as a writer), releases; `CHILD_ROUNDS` times, then says
/// `done`.
fn upgrader_process(url: &str, name: &str) {
    let client = CLIENTS.scaled(Duration::from_secs(5)).at(url);
    let mut con = connect(url);
    let rw = client.read_write_lock(name);
    say("ready");
    for _ in 0..CHILD_ROUNDS {
        let up = rw.upgradeable_lock().lock().expect("upgradeable");
        witness(&mut con, name, "enter", "r");
        thread::sleep(Duration::from_millis(5));
        witness(&mut con, name, "exit", "r");
        let w = up.upgrade().expect("upgrade");
        witness(&mut con, name, "enter", "w");
        thread::sleep(Duration::from_millis(10));
        witness(&mut con, name, "exit", "w");
        w.unlock().expect("unlock write");
        up.unlock().expect("unlock upgradeable");
    }
    say("done");
}

/// Loops plain reads (inside the witness as a reader) until told `stop`, then says `done`.
fn reader_process(url: &str, name: &str) {
    let client = CLIENTS.scaled(Duration::from_secs(5)).at(url);
    let mut con = connect(url);
    let read = client.read_write_lock(name).read_lock();
    let stop = support::child::stop_on_stdin();
    say("ready");
    while !stop.load(Ordering::Relaxed) {
        let g = read.lock().expect("read");
        witness(&mut con, name, "enter", "r");
        thread::sleep(Duration::from_millis(5));
        witness(&mut con, name, "exit", "r");
        g.unlock().expect("unlock read");
    }
    say("done");
}

/// Upgraders in two processes and readers in two more: every upgraded write section is
/// alone (witnessed inside Redis), every upgrader finishes its rounds (no deadlock, no
/// starvation by the readers), and the readers keep reading.
#[test]
fn upgraded_holds_exclude_everyone_across_processes() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "witnessed";
    let mut con = connect(&url);
    let mut readers: Vec<ChildProc> = (0..2).map(|_| spawn_child("reader", &url, name)).collect();
    for r in &readers {
        r.expect("ready");
    }
    let upgraders: Vec<ChildProc> = (0..2)
        .map(|_| spawn_child("upgrader", &url, name))
        .collect();
    for u in &upgraders {
        u.expect("ready");
    }
    let started = Instant::now();
    for u in upgraders {
        u.expect("done");
        u.wait_success();
    }
    let took = started.elapsed();
    for r in &mut readers {
        r.send("stop");
    }
    for r in readers {
        r.expect("done");
        r.wait_success();
    }
    let w: HashMap<String, i64> =
        support::query_key(&mut con, "HGETALL", format!("witness:{{{name}}}"));
    eprintln!("witness after {took:?}: {w:?}");
    assert_eq!(w.get("violations").copied().unwrap_or(0), 0, "{w:?}");
    assert_eq!(w["w_entries"], 2 * CHILD_ROUNDS as i64, "{w:?}");
    assert!(
        w["r_entries"] > 2 * CHILD_ROUNDS as i64,
        "the plain readers read too: {w:?}"
    );
    assert_eq!(w["readers"], 0);
    assert_eq!(w["writers"], 0);
}

/// Takes the upgradeable side (lease: the watchdog's, 1.5 s) and says `held <client id>`;
/// on `upgrade`, says `upgrading` and upgrades (and says `upgraded`). Killed by the test.
fn crash_holder_process(url: &str, name: &str) {
    let client = CLIENTS.scaled(CRASH_LEASE).at(url);
    let rw = client.read_write_lock(name);
    let up = rw.upgradeable_lock().lock().expect("upgradeable");
    say(&format!("held {}", client.id()));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    if line.trim() == "upgrade" {
        say("upgrading");
        let w = up.upgrade().expect("upgrade");
        say("upgraded");
        std::mem::forget(w);
    }
    std::mem::forget(up);
    thread::sleep(Duration::from_secs(600));
}

/// The watchdog lease of the crashed holders.
const CRASH_LEASE: Duration = Duration::from_millis(1_500);
/// The margin on either side of a lease's end, on a loaded machine.
const MARGIN: Duration = Duration::from_millis(400);

/// A process holding the upgradeable side is SIGKILLed: the slot stays taken until the
/// lease it last renewed ends (not before), and is free within the lease of the kill.
#[test]
fn a_dead_upgradeable_holder_frees_the_slot_when_its_lease_ends() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "crash";
    let mut con = connect(&url);
    let mut holder = spawn_child("holder", &url, name);
    let line = holder.next_line();
    let id = line.strip_prefix("held ").expect("held").to_owned();
    // Let a renewal or two run, then kill.
    thread::sleep(CRASH_LEASE);
    let field = hold_fields(&mut con, name)
        .into_iter()
        .find(|f| f.starts_with(&format!("u:{id}:")))
        .expect("the child's upgradeable hold");
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    let killed = Instant::now();
    // When its lease ends, by the server's clock.
    let (ends, now): (i64, (i64, i64)) = redis::pipe()
        .cmd("ZSCORE")
        .arg(Keys::rw(PREFIX, name).leases())
        .arg(&field)
        .cmd("TIME")
        .query(&mut con)
        .unwrap();
    let left = Duration::from_millis((ends - (now.0 * 1000 + now.1 / 1000)).max(0) as u64);
    assert!(left <= CRASH_LEASE, "lease left {left:?}");

    let other = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let up = other.read_write_lock(name).upgradeable_lock();
    assert!(
        up.try_lock().unwrap().is_none(),
        "still taken right after the kill"
    );
    let got = up
        .try_lock_for(CRASH_LEASE + MARGIN)
        .unwrap()
        .expect("free when the dead holder's lease ends");
    let after = killed.elapsed();
    eprintln!(
        "dead upgradeable holder: slot free {after:?} after the kill, lease left was {left:?}"
    );
    assert!(
        after + MARGIN >= left,
        "freed {after:?} after the kill, before its lease ({left:?}) ended"
    );
    assert!(
        after <= left + MARGIN,
        "freed {after:?} after the kill, lease left {left:?}"
    );
    assert_eq!(hold_fields(&mut con, name).len(), 1);
    got.unlock().unwrap();
}

/// A process SIGKILLed while its upgrade waits at the head of the queue: readers held
/// behind the pending upgrade are let in by the release of the reader it waited for
/// (the dead waiter is skipped), and a writer gets in once the dead holder's lease ends.
#[test]
fn a_dead_pending_upgrade_blocks_nobody() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "crash-pending";
    let mut con = connect(&url);
    let reader_client = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let (tx, rx) = mpsc::channel();
    let (release_r, tr) = holder_thread(&reader_client, name, "read", tx.clone());
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "read");
    let mut holder = spawn_child("holder", &url, name);
    let line = holder.next_line();
    let id = line.strip_prefix("held ").expect("held").to_owned();
    holder.send("upgrade");
    holder.expect("upgrading");
    await_queue_len(&mut con, name, 1, "the pending upgrade");
    assert!(queue(&mut con, name)[0].starts_with(&format!("{id}:")));
    // A reader behind the pending upgrade.
    let late_client = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let (ltx, lrx) = mpsc::channel();
    let (release_l, tl) = holder_thread(&late_client, name, "read", ltx);
    await_queue_len(&mut con, name, 2, "the late reader");
    assert!(
        lrx.recv_timeout(STILL_WAITING).is_err(),
        "it waits behind the upgrade"
    );
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    let killed = Instant::now();
    release_r.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
    let (side, at) = lrx.recv_timeout(SETUP).expect("the late reader gets in");
    assert_eq!(side, "read");
    assert!(
        at - killed < Duration::from_secs(1),
        "the late reader waited {:?} after the kill",
        at - killed
    );
    release_l.send(()).unwrap();
    assert_eq!(lrx.recv_timeout(SETUP).unwrap().0, "released");
    // The dead holder's upgradeable hold (not its write hold: it never got one) ends
    // with its lease; then a writer gets in.
    let w = reader_client
        .read_write_lock(name)
        .write_lock()
        .try_lock_for(CRASH_LEASE + MARGIN)
        .unwrap()
        .expect("a writer gets in once the dead holder's lease ends");
    assert!(killed.elapsed() <= CRASH_LEASE + MARGIN);
    w.unlock().unwrap();
    tr.join().unwrap();
    tl.join().unwrap();
}

/// Bad input, refused typed and changing nothing: the upgradeable side asked by a thread
/// that reads (its upgrade would wait for that read hold) is `WouldDeadlock`, and so is
/// the write side still; a zero lease is `InvalidArgument`; an empty name
/// `InvalidName`; an upgrade of a hold that was force-unlocked is `LeaseLost`.
#[test]
fn bad_input_is_refused_typed() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "bad";
    let a = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    let mut con = connect(&url);
    let rw = a.read_write_lock(name);
    let r = rw.read_lock().lock().expect("read");
    let before = hold_fields(&mut con, name);
    assert!(matches!(
        rw.upgradeable_lock().lock(),
        Err(Error::WouldDeadlock { .. })
    ));
    assert!(matches!(
        rw.upgradeable_lock().try_lock(),
        Err(Error::WouldDeadlock { .. })
    ));
    assert!(matches!(
        rw.write_lock().try_lock(),
        Err(Error::WouldDeadlock { .. })
    ));
    assert_eq!(hold_fields(&mut con, name), before);
    assert!(queue(&mut con, name).is_empty());
    r.unlock().unwrap();

    assert!(matches!(
        rw.upgradeable_lock()
            .try_lock_with(redmutex::LockOptions::new().lease(Duration::ZERO))
            .map(Option::unwrap),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        a.read_write_lock("").upgradeable_lock().try_lock(),
        Err(Error::InvalidName(_))
    ));
    assert!(hold_fields(&mut con, name).is_empty());

    // Holding the upgradeable side, a plain read is fine (it is this thread's), and the
    // upgrade then waits for the others only.
    let up = rw.upgradeable_lock().lock().expect("upgradeable");
    let r = rw
        .read_lock()
        .lock()
        .expect("read beside the upgradeable hold");
    let w = up
        .try_upgrade()
        .unwrap()
        .expect("own holds do not block the upgrade");
    drop((w, r));

    assert!(rw.upgradeable_lock().force_unlock().unwrap());
    assert!(matches!(up.upgrade(), Err(Error::LeaseLost { .. })));
    assert!(hold_fields(&mut con, name).is_empty());
    assert!(queue(&mut con, name).is_empty());
}

/// An upgrade that gives up: `try_upgrade` with a reader in makes one attempt and queues
/// nothing; `try_upgrade_for` returns `None` within its wait (plus a margin), leaves the
/// queue, lets in the reader that waited behind it at once, and keeps the upgradeable
/// hold (a writer still waits for it).
#[test]
fn an_upgrade_that_times_out_leaves_the_queue_and_keeps_the_upgradeable_hold() {
    const WAIT: Duration = Duration::from_millis(400);
    let server = RedisServer::new();
    let url = server.url();
    let name = "give-up";
    let (a, b, c) = (
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
    );
    let mut con = connect(&url);
    let (tx, rx) = mpsc::channel();
    let (release_r, tr) = holder_thread(&b, name, "read", tx);
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "read");
    let up = a
        .read_write_lock(name)
        .upgradeable_lock()
        .lock()
        .expect("upgradeable");
    assert!(up.try_upgrade().unwrap().is_none(), "a reader is in");
    assert!(
        queue(&mut con, name).is_empty(),
        "one attempt queues nothing"
    );

    // A reader that comes while the upgrade waits queues behind it.
    let (ltx, lrx) = mpsc::channel();
    let waiter = {
        let url = url.clone();
        let c = c.clone();
        thread::spawn(move || {
            let mut con = connect(&url);
            // Only once the upgrade is queued.
            assert!(wait_until(SETUP, || queue(&mut con, name).len() == 1));
            holder_thread(&c, name, "read", ltx)
        })
    };
    let asked = Instant::now();
    let got = up.try_upgrade_for(WAIT).expect("try_upgrade_for");
    let took = asked.elapsed();
    assert!(got.is_none(), "the reader is still in");
    assert!(took >= WAIT, "gave up after {took:?}");
    assert!(
        took < WAIT + Duration::from_millis(500),
        "gave up after {took:?}"
    );
    let (release_l, tl) = waiter.join().unwrap();
    let (side, at) = lrx.recv_timeout(SETUP).expect("the late reader gets in");
    assert_eq!(side, "read");
    let after = at.saturating_duration_since(asked + took);
    assert!(
        after < Duration::from_millis(500),
        "the late reader got in {after:?} after the upgrade gave up"
    );
    assert!(queue(&mut con, name).is_empty());
    assert_eq!(
        a.read_write_lock(name)
            .upgradeable_lock()
            .hold_count()
            .unwrap(),
        1
    );
    assert!(!up.is_lease_lost());
    let d = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    assert!(d
        .read_write_lock(name)
        .write_lock()
        .try_lock()
        .unwrap()
        .is_none());
    assert!(d
        .read_write_lock(name)
        .upgradeable_lock()
        .try_lock()
        .unwrap()
        .is_none());

    release_r.send(()).unwrap();
    release_l.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
    assert_eq!(lrx.recv_timeout(SETUP).unwrap().0, "released");
    // Alone now: the upgrade is granted at once.
    let w = up.try_upgrade().unwrap().expect("no reader left");
    drop(w);
    up.unlock().unwrap();
    tr.join().unwrap();
    tl.join().unwrap();
}

/// The writer's own thread may take the upgradeable side (past a queued writer: it waits
/// for this very hold) and keep it when it stops writing: readers come in, writers and
/// other upgradeable readers still wait. Likewise the upgradeable reader may take a plain
/// read hold and leave the upgradeable one, reading on like any reader.
#[test]
fn downgrades_to_upgradeable_and_to_read() {
    let server = RedisServer::new();
    let url = server.url();
    let name = "downgrade";
    let (a, b) = (
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
    );
    let mut con = connect(&url);
    let rw = a.read_write_lock(name);
    let w = rw.write_lock().lock().expect("write");
    let (tx, rx) = mpsc::channel();
    let (release_w, tw) = holder_thread(&b, name, "write", tx);
    await_queue_len(&mut con, name, 1, "writer");
    let up = rw
        .upgradeable_lock()
        .try_lock()
        .unwrap()
        .expect("the writer's own thread");
    w.unlock().unwrap();
    let fields = hold_fields(&mut con, name);
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert!(fields[0].starts_with("u:"));
    let c = CLIENTS.scaled(Duration::from_secs(5)).at(&url);
    assert!(rx.recv_timeout(STILL_WAITING).is_err(), "the writer waits");
    assert!(c
        .read_write_lock(name)
        .upgradeable_lock()
        .try_lock()
        .unwrap()
        .is_none());

    // Upgradeable to read: read (at once, past the queued writer, which waits for this
    // thread's hold: queued, the read would wait for itself), then leave the upgradeable
    // hold.
    let r = rw
        .read_lock()
        .try_lock()
        .unwrap()
        .expect("read beside the upgradeable hold, past the queue");
    up.unlock().unwrap();
    let fields = hold_fields(&mut con, name);
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert!(fields[0].starts_with("r:"));
    assert!(
        rx.recv_timeout(STILL_WAITING).is_err(),
        "the writer waits for the reader"
    );
    assert!(matches!(
        rw.upgradeable_lock().try_lock(),
        Err(Error::WouldDeadlock { .. })
    ));
    r.unlock().unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "write");
    release_w.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
    tw.join().unwrap();
}

/// On a Redis Cluster: the keys an upgrade touches (the queue it moves to the head of
/// included) are the lock's, in its slot; the upgrade waits for the reader of another
/// client, ahead of a queued writer, and gets the write hold from the reader's release.
#[test]
fn an_upgrade_works_on_a_cluster() {
    let cluster = support::topology::Cluster::new(3, 0);
    let build = || {
        Clients::DEFAULT
            .watchdog(Duration::from_secs(5))
            .command(Duration::from_millis(1500))
            .connect(Duration::from_secs(10))
            .cluster_at(cluster.seed_urls())
    };
    let (a, b, c) = (build(), build(), build());
    let name = "clustered";
    let (tx, rx) = mpsc::channel();
    let (release_r, tr) = holder_thread(&b, name, "read", tx.clone());
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "read");
    let up = a
        .read_write_lock(name)
        .upgradeable_lock()
        .lock()
        .expect("upgradeable");
    let (release_w, tw) = holder_thread(&c, name, "write", tx);
    let writer_queued = || {
        c.inspect(name)
            .unwrap()
            .iter()
            .any(|i| i.kind == LockKind::ReadWrite && i.waiters.len() == 1)
    };
    assert!(wait_until(SETUP, writer_queued), "the writer queues");
    let released = Arc::new(AtomicBool::new(false));
    let releaser = {
        let (released, c) = (released.clone(), c.clone());
        thread::spawn(move || {
            // Once the upgrade is queued, ahead of the writer.
            assert!(wait_until(SETUP, || c
                .inspect(name)
                .unwrap()
                .iter()
                .any(|i| i.waiters.len() == 2)));
            let q = c
                .inspect(name)
                .unwrap()
                .into_iter()
                .find(|i| i.kind == LockKind::ReadWrite)
                .unwrap()
                .waiters;
            released.store(true, Ordering::SeqCst);
            release_r.send(()).unwrap();
            q
        })
    };
    let w = up.upgrade().expect("upgrade");
    assert!(
        released.load(Ordering::SeqCst),
        "upgraded only after the reader left"
    );
    let q = releaser.join().unwrap();
    assert!(q[0].starts_with(&format!("{}:", a.id())), "{q:?}");
    assert!(rx.recv_timeout(SETUP).unwrap().0 == "released");
    assert!(rx.recv_timeout(STILL_WAITING).is_err(), "the writer waits");
    drop(w);
    drop(up);
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "write");
    release_w.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "released");
    tr.join().unwrap();
    tw.join().unwrap();
}

/// An upgrade that queues behind a long queue (more waiters than one Lua call takes as
/// arguments) moves to its head with every other entry kept in order, and the queue keeps
/// its expiry.
#[test]
fn an_upgrade_moves_ahead_of_a_long_queue_in_order() {
    const FAKES: usize = 9_000;
    let server = RedisServer::new();
    let url = server.url();
    let name = "long";
    let (a, b) = (
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
        CLIENTS.scaled(Duration::from_secs(5)).at(&url),
    );
    let mut con = connect(&url);
    let (tx, rx) = mpsc::channel();
    let (release_r, tr) = holder_thread(&b, name, "read", tx);
    assert_eq!(rx.recv_timeout(SETUP).unwrap().0, "read");
    let up = a
        .read_write_lock(name)
        .upgradeable_lock()
        .lock()
        .expect("upgradeable");
    // Writers of processes that do not exist, queued behind the upgradeable hold (live
    // entries: nothing fits while the reader reads, so nobody is told anything).
    let (secs, _): (i64, i64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now = secs * 1000;
    let fakes: Vec<String> = (0..FAKES).map(|i| format!("fake-{i}:1")).collect();
    let mut pipe = redis::pipe();
    for f in &fakes {
        pipe.cmd("RPUSH")
            .arg(Keys::rw(PREFIX, name).queue())
            .arg(f)
            .ignore();
        pipe.cmd("HSET")
            .arg(Keys::rw(PREFIX, name).waiters())
            .arg(f)
            .arg(format!("{} {now} 5000 1 1 1", now + 60_000))
            .ignore();
    }
    // Both keys, as the queue's own rules keep them (queue.lua's Q.outlive).
    for k in [
        Keys::rw(PREFIX, name).queue(),
        Keys::rw(PREFIX, name).waiters(),
    ] {
        pipe.cmd("PEXPIRE").arg(k).arg(60_000).ignore();
    }
    pipe.query::<()>(&mut con).unwrap();

    let releaser = {
        let url = url.clone();
        thread::spawn(move || {
            let mut con = connect(&url);
            assert!(wait_until(SETUP, || queue(&mut con, name).len() == FAKES + 1));
            let q = queue(&mut con, name);
            let ttl: i64 = support::query_key(&mut con, "PTTL", Keys::rw(PREFIX, name).queue());
            release_r.send(()).unwrap();
            (q, ttl)
        })
    };
    let w = up
        .try_upgrade_for(SETUP)
        .expect("upgrade")
        .expect("granted once the reader left");
    let (q, ttl) = releaser.join().unwrap();
    assert!(q[0].starts_with(&format!("{}:", a.id())), "{:?}", &q[..3]);
    assert_eq!(q[1..], fakes[..], "the others in their order");
    assert!(ttl > 50_000, "the queue kept its expiry: {ttl} ms");
    assert_eq!(
        queue(&mut con, name),
        fakes,
        "the upgrade left the queue with its grant"
    );
    drop(w);
    drop(up);
    tr.join().unwrap();
}
