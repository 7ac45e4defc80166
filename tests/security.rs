//! Authentication, ACL users confined to the library's keys and channels, and secrets kept
//! out of every printed form.

mod support;

use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use redmutex::{Client, Error};
use support::keys::{Keys, DEFAULT_PREFIX};
use support::RedisServer;

/// The minimal ACL rule for the default prefix, as the README documents it.
const ACL_RULE: &str = "on >s3cret-pw resetchannels ~redmutex:* &redmutex:* -@all \
    +fcall +function|load +evalsha +script|load +exists +hget +hmget +hgetall +pttl +subscribe \
    +unsubscribe +publish +ping +wait +hincrby +hset +hexists +pexpire +del +incr +time +type \
    +hkeys +hdel +rpush +lindex +lpop +lrem +lrange +get +set +decr +zadd +zscore +zrem +zcard \
    +zrange +zrangebyscore";

use support::set_acl_user as set_user;

fn url_for(server: &RedisServer, user: &str, password: &str) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{}/", server.port())
}

#[test]
fn a_user_confined_to_the_prefix_can_do_everything() {
    let server = RedisServer::new();
    set_user(&server, "locker", ACL_RULE);
    let url = url_for(&server, "locker", "s3cret-pw");
    let build = || {
        Client::builder()
            .url(url.as_str())
            .watchdog_timeout(Duration::from_millis(600))
            .command_timeout(Duration::from_millis(300))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let lock = a.lock("acl");
    let outer = lock.lock().expect("lock as the ACL user");
    let inner = lock.lock().expect("re-enter");
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_locked().unwrap());
    assert!(lock.remaining_lease().unwrap().is_some());

    // A waiter in another client: subscribe, sleep, wake on the release.
    let other = b.lock("acl");
    let waiter = thread::spawn(move || other.lock().map(|g| g.unlock()));
    thread::sleep(Duration::from_millis(900)); // watchdog renewals run meanwhile
    assert!(!outer.is_lease_lost());
    drop(inner);
    outer.unlock().expect("unlock as the ACL user");
    waiter
        .join()
        .unwrap()
        .expect("waiter lock")
        .expect("waiter unlock");

    let fenced = a.fenced_lock("acl-fenced").lock().expect("fenced lock");
    assert!(fenced.token() >= 1);
    fenced.unlock().unwrap();
    let _held = a.lock("forced").lock().unwrap();
    assert!(b.lock("forced").force_unlock().unwrap());

    // A fair waiter handed the lock, and a count-down latch, under the same rule.
    let held = a.fair_lock("acl-fair").lock().expect("fair lock");
    let other = b.fair_lock("acl-fair");
    let waiter = thread::spawn(move || other.lock().map(|g| g.unlock()));
    thread::sleep(Duration::from_millis(100));
    held.unlock().expect("fair unlock");
    waiter
        .join()
        .unwrap()
        .expect("fair waiter")
        .expect("fair waiter unlock");
    let latch = a.count_down_latch("acl-latch");
    assert!(latch.try_set_count(1).expect("latch set"));
    let waiter = b.count_down_latch("acl-latch");
    let waiting = thread::spawn(move || waiter.wait_for(Duration::from_secs(5)));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(latch.count_down().expect("latch count down"), 0);
    assert!(waiting.join().unwrap().expect("latch wait"));

    // A read-write lock: two readers, a writer queued behind them and handed the lock,
    // read leases renewed past the watchdog timeout.
    let mut admin = server.connection();
    let queued = |admin: &mut redis::Connection, key: &str| {
        support::wait_until(Duration::from_secs(5), || {
            redis::cmd("EXISTS").arg(key).query::<i64>(admin).unwrap() == 1
        })
    };
    let rw = a.read_write_lock("acl-rw");
    let r1 = rw.read_lock().lock().expect("read lock");
    let r2 = rw.read_lock().lock().expect("read re-entry");
    let writer = b.read_write_lock("acl-rw").write_lock();
    let waiter = thread::spawn(move || writer.lock().map(|g| g.unlock()));
    assert!(queued(
        &mut admin,
        &Keys::rw(DEFAULT_PREFIX, "acl-rw").queue()
    ));
    thread::sleep(Duration::from_millis(700)); // past the 600 ms lease: renewed meanwhile
    assert!(!r1.is_lease_lost());
    assert_eq!(rw.read_lock().hold_count().unwrap(), 2);
    drop(r2);
    r1.unlock().expect("read unlock");
    waiter
        .join()
        .unwrap()
        .expect("writer lock")
        .expect("writer unlock");
    assert!(rw.write_lock().force_unlock().is_ok());

    // A semaphore: a waiter handed a released permit, and an operator adding permits.
    let sem = a.semaphore("acl-sem", 1);
    let permit = sem.acquire().expect("permit");
    let other = b.semaphore("acl-sem", 1);
    let waiter = thread::spawn(move || other.acquire().map(|p| p.release()));
    assert!(queued(
        &mut admin,
        &Keys::sem(DEFAULT_PREFIX, "acl-sem").queue()
    ));
    permit.release().expect("permit release");
    waiter
        .join()
        .unwrap()
        .expect("waiter permit")
        .expect("waiter release");
    assert_eq!(sem.add_permits(2).expect("add permits"), 3);
    assert_eq!(sem.available_permits().expect("available"), 3);
}

/// `e`'s message, asserted to contain both `one` and `other`.
#[track_caller]
fn says_both(e: &Error, one: &str, other: &str) -> String {
    let text = e.to_string();
    assert!(text.contains(one) && text.contains(other), "{text}");
    text
}

#[test]
fn a_user_without_the_rule_gets_a_clear_permission_error() {
    let server = RedisServer::new();
    set_user(
        &server,
        "elsewhere",
        &ACL_RULE.replace("~redmutex:*", "~other:*"),
    );
    let client = Client::open(url_for(&server, "elsewhere", "s3cret-pw")).unwrap();
    match client.lock("acl").try_lock() {
        Err(e @ Error::NoPermission { .. }) => {
            let text = says_both(&e, "elsewhere", "permission");
            assert!(!text.contains("s3cret-pw"));
        }
        other => panic!("expected a permission error, got {other:?}"),
    }
    let mut con = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(keys.is_empty(), "nothing was written: {keys:?}");
}

#[test]
fn a_wrong_password_is_an_error_that_does_not_repeat_it() {
    let server = RedisServer::new();
    set_user(&server, "locker", ACL_RULE);
    let client = Client::open(url_for(&server, "locker", "wrong-pw")).unwrap();
    let err = client.lock("x").try_lock().expect_err("bad password");
    for text in [format!("{err}"), format!("{err:?}")] {
        assert!(!text.contains("wrong-pw"), "{text}");
    }
}

/// Captures every log record of the process, for the secret check below.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        self.0.lock().unwrap().push(format!("{}", record.args()));
    }
    fn flush(&self) {}
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(c).expect("the only logger");
        log::set_max_level(log::LevelFilter::Trace);
        c
    })
}

#[test]
fn passwords_never_reach_debug_output_errors_or_logs() {
    let logs = capture();
    let mut server = RedisServer::new();
    set_user(&server, "locker", ACL_RULE);
    let secret = "s3cret-pw";
    let url = url_for(&server, "locker", secret);
    let builder = Client::builder()
        .url(url.as_str())
        .watchdog_timeout(Duration::from_millis(600))
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300));
    let mut printed = vec![format!("{builder:?}")];
    let client = builder.build().unwrap();
    printed.push(format!("{client:?}"));
    let lock = client.lock("logged");
    printed.push(format!("{lock:?}"));
    let guard = lock.lock().unwrap();
    printed.push(format!("{guard:?}"));
    // Failures get logged: renewals against a dead server, a release on drop.
    server.kill();
    thread::sleep(Duration::from_millis(400));
    drop(guard);
    if let Err(e) = client.lock("after").try_lock() {
        printed.push(format!("{e} / {e:?}"));
    }
    let logged = logs.0.lock().unwrap().clone();
    assert!(
        logged.iter().any(|l| l.contains("redmutex")),
        "the failures were logged: {logged:?}"
    );
    for text in printed.iter().chain(&logged) {
        assert!(!text.contains(secret), "password leaked: {text}");
    }
}

#[test]
fn a_server_password_is_used_and_required() {
    let server = RedisServer::with_args(&["--requirepass", "pw-only"]);
    let with = Client::open(format!("redis://:pw-only@127.0.0.1:{}/", server.port())).unwrap();
    let guard = with.lock("auth").lock().expect("lock with the password");
    guard.unlock().unwrap();
    let without = Client::open(server.url()).unwrap();
    match without.lock("auth").try_lock() {
        Err(e @ Error::Auth { .. }) => {
            says_both(&e, "authentication failed", "requires a password");
        }
        other => panic!("expected an authentication error, got {other:?}"),
    }
}
