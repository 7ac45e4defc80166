//! Locks shared by separate processes: this test binary re-executes itself as the other
//! processes, its role chosen by an environment variable.

mod support;

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::Error;
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const ROLE: &str = "REDMUTEX_TEST_CHILD_ROLE";
const URL: &str = "REDMUTEX_TEST_CHILD_URL";
const PREFIX: &str = "redmutex-test:";

/// Clients of `watchdog` whose commands time out within half of it (at most 3 s).
fn with_watchdog(watchdog: Duration) -> Clients {
    Clients::new(PREFIX)
        .watchdog(watchdog)
        .command(watchdog.min(Duration::from_secs(6)) / 2)
}

const WORKERS: usize = 4;
const THREADS: usize = 4;
const ITERATIONS: usize = 25;

/// Waits on a child longer than this only when something is broken.
const STUCK: Duration = Duration::from_secs(30);

/// The child side of every test; a no-op in a normal run.
#[test]
fn child_entry() {
    support::child::run_role(
        ROLE,
        URL,
        &[
            ("counter", counter_worker),
            ("crash-holder", crash_holder),
            ("nested-holder", nested_holder),
            ("fenced-holder", fenced_holder),
        ],
    );
}

fn counter_worker(url: &str) {
    let client = with_watchdog(Duration::from_secs(30)).at(url);
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = client.clone();
            let url = url.to_owned();
            thread::spawn(move || {
                let mut con = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .expect("counter connection");
                let lock = client.lock("counter");
                for _ in 0..ITERATIONS {
                    let outer = lock.lock().expect("outer lock");
                    let inner = lock.lock().expect("re-entry");
                    assert_eq!(lock.hold_count().expect("hold_count"), 2);
                    // Deliberately not atomic: only the lock keeps increments apart.
                    let n: Option<u64> = redis::cmd("GET")
                        .arg("counter")
                        .query(&mut con)
                        .expect("GET");
                    thread::yield_now();
                    redis::cmd("SET")
                        .arg("counter")
                        .arg(n.unwrap_or(0) + 1)
                        .exec(&mut con)
                        .expect("SET");
                    drop(inner);
                    outer.unlock().expect("unlock");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker thread");
    }
    say("done");
}

fn crash_holder(url: &str) {
    let client = with_watchdog(Duration::from_secs(1)).at(url);
    let _guard = client.lock("crash").lock().expect("lock");
    say("held");
    // Killed here by the parent, guard and all.
    loop {
        thread::sleep(Duration::from_secs(60));
    }
}

fn nested_holder(url: &str) {
    let client = with_watchdog(Duration::from_secs(30)).at(url);
    let lock = client.lock("nested");
    let outer = lock.lock().expect("outer lock");
    let inner = lock.lock().expect("re-entry");
    say("held");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read from the parent");
    say(&format!("inner {}", outcome(inner.unlock())));
    say(&format!("outer {}", outcome(outer.unlock())));
}

fn fenced_holder(url: &str) {
    let client = with_watchdog(Duration::from_millis(600)).at(url);
    let guard = client.fenced_lock("fenced").lock().expect("lock");
    say(&format!("token {}", guard.token()));
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read from the parent");
    let mut con = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("store connection");
    let accepted = store_write(&mut con, guard.token(), "from A");
    say(&format!("write accepted={accepted}"));
    say(&format!("unlock {}", outcome(guard.unlock())));
}

/// The guarded resource: it keeps the highest token it has seen and refuses writes that
/// carry a lower one. Its check and write are one script, like the lock's own.
fn store_write(con: &mut redis::Connection, token: u64, value: &str) -> bool {
    let accepted: i64 = redis::Script::new(
        "local top = tonumber(redis.call('get', KEYS[2]) or '0')
         if tonumber(ARGV[1]) < top then return 0 end
         redis.call('set', KEYS[2], ARGV[1])
         redis.call('set', KEYS[1], ARGV[2])
         return 1",
    )
    .key("store:{data}")
    .key("store:{data}:top")
    .arg(token)
    .arg(value)
    .invoke(con)
    .expect("store write");
    accepted == 1
}

fn outcome(r: Result<(), Error>) -> String {
    match r {
        Ok(()) => "ok".to_owned(),
        Err(Error::NotHeld { .. }) => "not-held".to_owned(),
        Err(Error::LeaseLost { .. }) => "lease-lost".to_owned(),
        Err(e) => format!("error {e}"),
    }
}

/// This test binary as the child `role`.
fn spawn(role: &str, server: &RedisServer) -> ChildProc {
    ChildProc::spawn("child_entry", &[(ROLE, role), (URL, &server.url())])
}

/// Script calls (FCALL or EVALSHA) the server has executed so far.
fn script_calls(server: &RedisServer) -> u64 {
    server.script_calls()
}

/// Subscriptions to the lock's channels (`channel` is their common prefix).
fn numsub(con: &mut redis::Connection, channel: &str) -> i64 {
    support::subscribers(con, channel)
}

#[test]
fn mutual_exclusion_across_processes() {
    let server = RedisServer::new();
    let children: Vec<ChildProc> = (0..WORKERS).map(|_| spawn("counter", &server)).collect();
    for child in children {
        child.expect("done");
        child.wait_success();
    }
    let mut con = server.connection();
    let n: u64 = redis::cmd("GET")
        .arg("counter")
        .query(&mut con)
        .expect("GET");
    assert_eq!(n, (WORKERS * THREADS * ITERATIONS) as u64, "lost updates");
    let key = Keys::lock(PREFIX, "counter").key();
    let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut con).unwrap();
    assert!(!exists, "the lock must be free after every release");
}

#[test]
fn a_crashed_holder_releases_within_the_watchdog_timeout() {
    const WATCHDOG: Duration = Duration::from_secs(1);
    let server = RedisServer::new();
    let mut con = server.connection();
    let mut holder = spawn("crash-holder", &server);
    holder.expect("held");

    let waiter_client = with_watchdog(WATCHDOG).at(&server.url());
    let (tx, acquired) = mpsc::channel();
    let lock = waiter_client.lock("crash");
    let waiter = thread::spawn(move || {
        let guard = lock.lock().expect("waiter lock");
        tx.send(Instant::now()).expect("report");
        guard.unlock().expect("waiter unlock");
    });
    let channel = format!("{}:to:", Keys::lock(PREFIX, "crash").key());
    assert!(
        support::wait_until(STUCK, || numsub(&mut con, &channel) >= 1),
        "the waiter never subscribed"
    );
    // The holder is alive and renewing: the waiter must stay blocked across renewals.
    assert!(
        // Not a whole number of renewal periods, so the kill lands between renewals.
        acquired
            .recv_timeout(WATCHDOG * 2 + Duration::from_millis(150))
            .is_err(),
        "the waiter took a lock whose holder is alive"
    );

    let before = script_calls(&server);
    let killed = Instant::now();
    holder.child.kill().expect("SIGKILL the holder");
    let key = Keys::lock(PREFIX, "crash").key();
    let left: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
    assert!(
        left > 0,
        "the dead holder's lease must still be running (PTTL {left})"
    );

    let at = acquired
        .recv_timeout(STUCK)
        .expect("the waiter never acquired");
    waiter.join().expect("waiter thread");
    let after_kill = at - killed;
    // Not before the lease the holder left behind ran out, and not much after it.
    assert!(
        after_kill + Duration::from_millis(50) >= Duration::from_millis(left as u64),
        "acquired {after_kill:?} after the kill, while {left} ms of lease were left"
    );
    assert!(
        after_kill <= WATCHDOG + Duration::from_secs(1),
        "acquired only {after_kill:?} after the kill"
    );
    // It slept until the predicted end of the lease instead of polling: a try there (the
    // holder may have renewed once more since the waiter last looked), a try at the real
    // end, the release of its own hold, and its watchdog's renewal of its queue entry
    // once per period (a third of the lease); a 10 ms poll would have made a hundred.
    let calls = script_calls(&server) - before;
    eprintln!(
        "acquired {after_kill:?} after the kill ({left} ms of lease left), {calls} script calls"
    );
    let rounds = (after_kill.as_millis() / (WATCHDOG / 3).as_millis()) as u64 + 1;
    assert!(
        calls <= 6 + rounds,
        "{calls} script calls while waiting for a dead holder ({rounds} renewal rounds)"
    );
}

#[test]
fn ownership_is_visible_across_processes() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let mut holder = spawn("nested-holder", &server);
    holder.expect("held");

    let client = with_watchdog(Duration::from_secs(30)).at(&server.url());
    let lock = client.lock("nested");
    assert!(lock.is_locked().unwrap());
    assert!(!lock.is_held_by_current_thread().unwrap());
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert!(lock.try_lock().unwrap().is_none());
    let key = Keys::lock(PREFIX, "nested").key();
    let counts: Vec<i64> = redis::cmd("HVALS").arg(&key).query(&mut con).unwrap();
    assert_eq!(counts, vec![2], "one holder, two levels");

    assert!(lock.force_unlock().unwrap());
    assert!(!lock.is_locked().unwrap());
    holder.send("release");
    // Each release that finds the hold gone says it was lost (issue 26).
    holder.expect("inner lease-lost");
    holder.expect("outer lease-lost");
    holder.wait_success();
    // The stale releases changed nothing: the lock is free for anyone.
    let guard = lock.try_lock().unwrap().expect("free after force_unlock");
    assert_eq!(lock.hold_count().unwrap(), 1);
    guard.unlock().unwrap();
}

#[test]
fn fencing_tokens_stop_a_paused_holder_from_writing() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let mut a = spawn("fenced-holder", &server);
    let line = a.next_line();
    let a_token: u64 = line
        .strip_prefix("token ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));

    // A stops (a GC pause, a frozen VM): its watchdog stops renewing with it.
    let pid = a.child.id();
    signal(pid, "STOP");
    let key = Keys::lock(PREFIX, "fenced").key();
    assert!(
        support::wait_until(Duration::from_secs(5), || {
            !redis::cmd("EXISTS")
                .arg(&key)
                .query::<bool>(&mut con)
                .unwrap()
        }),
        "the paused holder's lease never ran out"
    );

    let b_client = with_watchdog(Duration::from_secs(30)).at(&server.url());
    let b = b_client
        .fenced_lock("fenced")
        .lock()
        .expect("B takes the lock");
    assert!(
        b.token() > a_token,
        "B's token {} after A's {a_token}",
        b.token()
    );
    assert!(store_write(&mut con, b.token(), "from B"));

    // A wakes up believing it still holds the lock, and writes.
    signal(pid, "CONT");
    a.send("write");
    a.expect("write accepted=false");
    let unlock = a.next_line();
    assert!(
        unlock == "unlock not-held" || unlock == "unlock lease-lost",
        "A's unlock: {unlock}"
    );
    a.wait_success();
    let data: String = support::query_key(&mut con, "GET", "store:{data}");
    assert_eq!(data, "from B", "the stale holder's write was refused");
    assert!(b_client
        .fenced_lock("fenced")
        .is_held_by_current_thread()
        .unwrap());
    b.unlock().expect("B unlock");
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {name} {pid}: {status}");
}
