//! Errors say which lock: an error from an operation on a named lock carries the name,
//! through `Error::lock_name` and at the start of its message, printed escaped where the
//! name is not plain text, and never with the client's URL or password.

mod support;

use std::time::Duration;

use crossbeam_channel::Receiver;
use redmutex::Error;
use support::clients::Clients;
use support::RedisServer;

const CLIENTS: Clients = Clients::DEFAULT
    .watchdog(Duration::from_secs(2))
    .command(Duration::from_millis(500));

/// Long beside the fixed leases below, short beside a test run.
const WAIT: Duration = Duration::from_secs(5);

/// Waits for a `lost()` channel to be told the hold is gone.
fn told_lost(lost: &Receiver<redmutex::LostLease>, what: &str) {
    let told = lost.recv_timeout(WAIT);
    assert!(told.is_ok(), "{what}: {told:?}");
}

/// `err` names the lock `name` and reads, in full, `text`.
fn names(err: &Error, name: &str, text: &str) {
    assert_eq!(err.lock_name(), Some(name), "{err:?}");
    assert_eq!(err.to_string(), text);
}

#[test]
fn lease_lost_after_force_unlock_names_the_lock() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("en-lost").at(&server.url());
    let lock = c.lock("orders:42");
    let guard = lock.lock().expect("lock");
    assert!(lock.force_unlock().expect("force_unlock"));
    told_lost(&guard.lost(), "the guard is told its hold is gone");
    let err = guard.unlock().expect_err("the hold was force-unlocked");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    names(
        &err,
        "orders:42",
        "lock \"orders:42\": the lock's lease was lost before it was released",
    );
}

#[test]
fn a_fixed_lease_run_out_names_the_lock_on_unlock_and_extend() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("en-fixed").at(&server.url());
    let guard = support::leased(&c.lock("report"), Duration::from_millis(300), "lock");
    told_lost(&guard.lost(), "the lease runs out");
    let err = guard
        .extend(Duration::from_secs(1))
        .expect_err("nothing to extend");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert_eq!(err.lock_name(), Some("report"));
    let err = guard.unlock().expect_err("the lease ran out");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert_eq!(err.lock_name(), Some("report"));
}

#[test]
fn not_held_names_the_lock() {
    let (server, proxy, c) = CLIENTS.prefix("en-notheld").serve_through_proxy();
    // (The scripts loaded first: the fault is aimed at the release's own request.)
    c.lock("warm-up").lock().unwrap().unlock().unwrap();
    let guard = c.lock("jobs").lock().expect("lock");
    // The release ran but its reply was lost: the repeat finds nothing, and cannot tell
    // its own first run from a loss. (A hold found gone otherwise is `LeaseLost`.)
    proxy.lose_next_reply_to(&support::function_name(&server.url(), "release"));
    let err = guard.unlock().expect_err("the repeat finds nothing");
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    names(
        &err,
        "jobs",
        "lock \"jobs\": the lock is not held by this thread",
    );
}

#[test]
fn a_redis_that_is_down_names_the_lock_being_taken() {
    let mut server = RedisServer::new();
    let c = CLIENTS.prefix("en-down").at(&server.url());
    c.lock("warmup")
        .lock()
        .expect("lock")
        .unlock()
        .expect("unlock");
    server.kill();
    let err = c
        .lock("down:1")
        .try_lock_for(Duration::from_millis(500))
        .expect_err("Redis is down");
    assert!(
        matches!(
            err,
            Error::Redis { .. } | Error::Pool { .. } | Error::Timeout { .. }
        ),
        "{err:?}"
    );
    assert_eq!(err.lock_name(), Some("down:1"), "{err}");
    assert!(err.to_string().starts_with("lock \"down:1\": "), "{err}");
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    let err = c.inspect("down:2").expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("down:2"), "{err}");
    let err = c.force_unlock("down:3").expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("down:3"), "{err}");
}

#[test]
fn a_frozen_redis_times_out_naming_the_lock() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("en-frozen").at(&server.url());
    c.lock("warmup")
        .lock()
        .expect("lock")
        .unlock()
        .expect("unlock");
    server.freeze();
    let err = c.lock("slow:1").try_lock().expect_err("Redis is frozen");
    server.thaw();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert_eq!(err.lock_name(), Some("slow:1"));
    assert!(
        err.to_string().starts_with(&format!(
            "lock \"slow:1\": redis at 127.0.0.1:{} did not answer in time: ",
            server.port()
        )),
        "{err}"
    );
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
}

#[test]
fn would_deadlock_names_the_lock() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("en-deadlock").at(&server.url());
    let rw = c.read_write_lock("catalog");
    let read = rw.read_lock().lock().expect("read");
    let err = rw
        .write_lock()
        .try_lock()
        .expect_err("would wait for itself");
    assert!(matches!(err, Error::WouldDeadlock { .. }), "{err:?}");
    assert_eq!(err.lock_name(), Some("catalog"));
    assert!(err.to_string().starts_with("lock \"catalog\": "), "{err}");
    read.unlock().expect("unlock");
}

#[test]
fn a_name_that_is_not_plain_text_is_printed_escaped() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("en-escaped").at(&server.url());
    let lock = c.lock(b"bad\xff\n\"name\x1b[31m".to_vec());
    let guard = lock.lock().expect("lock");
    assert!(lock.force_unlock().expect("force_unlock"));
    told_lost(&guard.lost(), "told of the loss");
    let err = guard.unlock().expect_err("force-unlocked");
    let shown = r#"bad\xff\n\"name\u{1b}[31m"#;
    assert_eq!(err.lock_name(), Some(shown));
    let text = err.to_string();
    assert!(text.starts_with(&format!("lock \"{shown}\": ")), "{text}");
    assert!(!text.chars().any(char::is_control), "{text:?}");
}

#[test]
fn a_long_name_is_cut() {
    let server = RedisServer::new();
    let c = CLIENTS.prefix("en-long").at(&server.url());
    // The longest name there is (a longer one is refused, see tests/names.rs).
    let name = "n".repeat(redmutex::MAX_NAME_LEN);
    let lock = c.lock(&name);
    let guard = lock.lock().expect("lock");
    assert!(lock.force_unlock().expect("force_unlock"));
    told_lost(&guard.lost(), "told of the loss");
    let err = guard.unlock().expect_err("force-unlocked");
    let shown = err.lock_name().expect("named");
    assert_eq!(shown, format!("{}…", &name[..256]));
}

#[test]
fn the_url_and_password_never_show_in_a_named_error() {
    let secret = "s3cret-pw";
    let mut server = RedisServer::new();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(secret)
        .query(&mut server.connection())
        .unwrap();
    let url = format!("redis://:{secret}@127.0.0.1:{}/", server.port());
    let c = CLIENTS.prefix("en-secret").at(&url);
    let guard = c.lock("payroll").lock().expect("lock with the password");
    server.kill();
    let mut printed = Vec::new();
    let err = guard.unlock().expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("payroll"), "{err}");
    printed.push(format!("{err} / {err:?}"));
    let err = c
        .lock("payroll")
        .try_lock_for(Duration::from_millis(300))
        .expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("payroll"), "{err}");
    printed.push(format!("{err} / {err:?}"));
    for text in printed {
        assert!(!text.contains(secret), "password leaked: {text}");
        assert!(!text.contains("redis://"), "URL leaked: {text}");
    }
}

#[test]
fn semaphore_and_latch_errors_name_them() {
    let mut server = RedisServer::new();
    let c = CLIENTS.prefix("en-others").at(&server.url());
    let sem = c.semaphore("pool", 2);
    let latch = c.count_down_latch("start");
    assert!(latch.try_set_count(1).expect("set count"));
    server.kill();
    let err = sem.add_permits(1).expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("pool"), "{err}");
    let err = sem
        .try_acquire_for(Duration::from_millis(300))
        .expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("pool"), "{err}");
    let err = latch.count_down().expect_err("Redis is down");
    assert_eq!(err.lock_name(), Some("start"), "{err}");
}
