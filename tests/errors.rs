//! Errors that say what to do: each way of failing to reach or use Redis is a typed error
//! whose message names the lock, the server (host:port, never the password) and the way
//! out, provoked on real servers.

mod support;

use std::time::Duration;

use redmutex::{Client, Error};
use support::keys::{Keys, DEFAULT_PREFIX};
use support::RedisServer;

const SECRET: &str = "s3cret-pw";

use support::set_acl_user as set_user;

fn client(url: &str) -> Client {
    Client::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_millis(400))
        .build()
        .expect("client")
}

/// `text` names `what` (each of them) and never the password.
fn says(err: &Error, what: &[&str]) {
    eprintln!("{err}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains(SECRET), "password leaked: {text}");
    }
    let text = err.to_string();
    for w in what {
        assert!(text.contains(w), "{w:?} missing from: {text}");
    }
}

#[test]
fn a_server_that_is_down_is_named() {
    let port = support::free_port();
    let c = Client::builder()
        .url(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = c.lock("jobs").try_lock().expect_err("nobody listens");
    assert!(matches!(err, Error::Pool { .. }), "{err:?}");
    says(
        &err,
        &["lock \"jobs\"", &format!("127.0.0.1:{port}"), "running"],
    );
}

#[test]
fn a_wrong_password_is_final_and_says_so() {
    let server = RedisServer::new();
    set_user(&server, "locker", &format!("on >{SECRET} ~* &* +@all"));
    let c = Client::builder()
        .url(format!(
            "redis://locker:wrong-{SECRET}@127.0.0.1:{}/",
            server.port()
        ))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // `lock()` waits for a connection for the whole connect timeout: a refusal must end it.
    let (result, took) = support::timed(|| c.lock("jobs").lock());
    let err = result.expect_err("wrong password");
    assert!(took < Duration::from_secs(2), "retried for {took:?}: {err}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    says(
        &err,
        &[
            "lock \"jobs\"",
            "authentication failed for user locker",
            &format!("127.0.0.1:{}", server.port()),
            "password",
        ],
    );
}

#[test]
fn a_missing_password_is_an_authentication_error() {
    let server = RedisServer::with_args(&["--requirepass", SECRET]);
    let c = client(&server.url());
    let (result, took) = support::timed(|| c.lock("jobs").try_lock());
    let err = result.expect_err("no password");
    assert!(took < Duration::from_secs(2), "retried for {took:?}: {err}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    says(
        &err,
        &[
            "lock \"jobs\"",
            "authentication",
            &format!("127.0.0.1:{}", server.port()),
            "password",
        ],
    );
}

#[test]
fn a_user_without_a_needed_command_is_told_which_rule() {
    let server = RedisServer::new();
    set_user(
        &server,
        "weak",
        &format!("on >{SECRET} resetchannels ~redmutex:* &redmutex:* -@all +ping +get"),
    );
    let c = client(&format!(
        "redis://weak:{SECRET}@127.0.0.1:{}/",
        server.port()
    ));
    let err = c.lock("jobs").try_lock().expect_err("no permission");
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    says(
        &err,
        &[
            "lock \"jobs\"",
            "user weak",
            &format!("127.0.0.1:{}", server.port()),
            "ACL",
        ],
    );
}

#[test]
fn a_key_holding_other_data_is_not_a_lock() {
    let server = RedisServer::new();
    let key = Keys::lock(DEFAULT_PREFIX, "jobs").key();
    redis::cmd("SET")
        .arg(&key)
        .arg("hello")
        .exec(&mut server.connection())
        .unwrap();
    let c = client(&server.url());
    let err = c.lock("jobs").try_lock().expect_err("a string");
    assert!(matches!(err, Error::NotALock { .. }), "{err:?}");
    says(&err, &["lock \"jobs\"", "not a redmutex lock"]);
    let text = err.to_string();
    assert!(!text.contains("@user_function"), "{text}");
    assert!(!text.contains("redmutex_"), "{text}");
    assert!(std::error::Error::source(&err).is_some(), "source kept");
}

#[test]
fn a_server_that_never_answers_is_named() {
    let server = RedisServer::new();
    let c = client(&server.url());
    c.lock("warm").lock().unwrap().unlock().unwrap();
    server.freeze();
    let _thaw = support::Thaw(&server);
    let err = c.lock("jobs").try_lock().expect_err("frozen");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    says(
        &err,
        &["lock \"jobs\"", &format!("127.0.0.1:{}", server.port())],
    );
    assert!(!err.to_string().contains("os error"), "{err}");
}

#[test]
fn a_bad_url_says_which_part() {
    for (url, part) in [
        ("http://127.0.0.1/", "scheme"),
        ("redis://127.0.0.1:notaport/", "port"),
        ("redis://127.0.0.1:99999/", "port"),
        ("redis://127.0.0.1/db7", "database"),
        (&*format!("redis://u:{SECRET}@/"), "host"),
        ("127.0.0.1:6379", "scheme"),
    ] {
        let err = Client::open(url).expect_err(url);
        match &err {
            Error::InvalidUrl { part: p, .. } => assert_eq!(*p, part, "{url}: {err}"),
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
        says(&err, &[part]);
    }
}

#[test]
fn a_multilock_member_that_is_frozen_is_named() {
    let up = RedisServer::new();
    let frozen = RedisServer::new();
    let clients = [client(&up.url()), client(&frozen.url())];
    for c in &clients {
        c.lock("warm").lock().unwrap().unlock().unwrap();
    }
    frozen.freeze();
    let _thaw = support::Thaw(&frozen);
    let all = redmutex::MultiLock::new(clients.iter().map(|c| c.lock("jobs"))).unwrap();
    let err = all.try_lock().expect_err("a member is frozen");
    assert!(matches!(err, Error::NoQuorum { .. }), "{err:?}");
    let cause = std::error::Error::source(&err).expect("the member's failure");
    let text = cause.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{}", frozen.port())),
        "{err}: {text}"
    );
}

#[test]
fn a_multilock_member_holding_other_data_is_not_a_lock() {
    let server = RedisServer::new();
    redis::cmd("SET")
        .arg(Keys::lock(DEFAULT_PREFIX, "b").key())
        .arg("hello")
        .exec(&mut server.connection())
        .unwrap();
    let c = client(&server.url());
    let all = redmutex::MultiLock::new([c.lock("a"), c.lock("b")]).unwrap();
    let err = all.try_lock().expect_err("b is a string");
    let found = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
        .any(|e| e.to_string().contains("not a redmutex lock"));
    assert!(found, "{err:?}");
}

#[test]
fn another_redis_error_names_the_server() {
    let server = RedisServer::new();
    let proxy = support::FaultProxy::new(server.port());
    let c = client(&proxy.url());
    c.lock("warm").lock().unwrap().unlock().unwrap();
    let acquire = support::function_name(&server.url(), "acquire");
    proxy.fail_next_request_with(&acquire, "-ERR injected\r\n");
    let err = c.lock("jobs").try_lock().expect_err("refused");
    assert_eq!(proxy.failed_requests(), 1, "the fault was injected");
    assert!(matches!(err, Error::Redis { .. }), "{err:?}");
    says(
        &err,
        &[
            "lock \"jobs\"",
            proxy
                .url()
                .trim_start_matches("redis://")
                .trim_end_matches('/'),
            "injected",
        ],
    );
}

/// `err` is the `InvalidArgument` of the lock `name`: `lock_name` says so, and the message
/// names it and says what is valid (`valid`).
fn bad_argument_on(err: &Error, name: &str, valid: &str) {
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert_eq!(err.lock_name(), Some(name), "{err:?}");
    says(
        err,
        &[&format!("lock \"{name}\": invalid argument: "), valid],
    );
}

/// Issue 28: a zero lease (or zero permits) is refused, before anything is sent, with the
/// lock's name and what a valid value is, whatever kind of lock is asked.
#[test]
fn a_bad_argument_names_the_lock_and_sends_nothing() {
    use redmutex::LockOptions;
    let server = RedisServer::new();
    let c = client(&server.url());
    // Setup traffic (connections, script loading) first, so that the count below is ours.
    c.lock("warm").lock().unwrap().unlock().unwrap();
    let before = server.total_calls();
    let zero = || LockOptions::new().lease(Duration::ZERO);
    let lease = "must be longer than zero";
    let rw = c.read_write_lock("rw");
    for (name, r) in [
        ("plain", c.lock("plain").try_lock_with(zero()).map(drop)),
        ("fair", c.fair_lock("fair").try_lock_with(zero()).map(drop)),
        (
            "fenced",
            c.fenced_lock("fenced").try_lock_with(zero()).map(drop),
        ),
        ("rw", rw.read_lock().try_lock_with(zero()).map(drop)),
        ("rw", rw.write_lock().try_lock_with(zero()).map(drop)),
        ("rw", rw.upgradeable_lock().try_lock_with(zero()).map(drop)),
        (
            "owned",
            c.lock("owned").owned().try_lock_with(zero()).map(drop),
        ),
        (
            "sem",
            c.semaphore("sem", 2).try_acquire_with(zero()).map(drop),
        ),
    ] {
        bad_argument_on(&r.expect_err("a zero lease"), name, lease);
    }
    let sem = c.semaphore("sem", 2);
    let err = sem
        .try_acquire_with(LockOptions::new().permits(0))
        .map(drop)
        .expect_err("zero permits");
    bad_argument_on(&err, "sem", "at least one permit");
    let err = sem.try_set_permits(0).expect_err("zero permits");
    bad_argument_on(&err, "sem", "at least one permit");
    let err = c
        .semaphore("none", 0)
        .try_acquire()
        .map(drop)
        .expect_err("a semaphore of no permits");
    bad_argument_on(&err, "none", "at least one permit");
    let err = c
        .lock("capped")
        .with_max_hold(Duration::ZERO)
        .map(drop)
        .expect_err("a zero max_hold");
    bad_argument_on(&err, "capped", "must be longer than command_timeout");
    let err = c
        .count_down_latch("batch")
        .try_set_count(0)
        .expect_err("a zero count");
    bad_argument_on(&err, "batch", "between 1 and");
    // `total_calls` itself is one command (INFO), counted after its reply.
    assert_eq!(server.total_calls(), before + 1, "nothing was sent");
}

/// A bad client setting is tied to no lock.
#[test]
fn a_bad_setting_names_no_lock() {
    let err = Client::builder()
        .url("redis://127.0.0.1/")
        .key_prefix("a{b")
        .build()
        .map(drop)
        .expect_err("a prefix with a brace");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert_eq!(err.lock_name(), None);
    assert!(err.to_string().starts_with("invalid argument: "), "{err}");
}

/// Issue 28: a cancelled wait names its lock, cancelled before the call (nothing sent) or
/// while it waits behind a holder.
#[test]
fn a_cancelled_wait_names_the_lock() {
    use redmutex::{CancellationToken, LockOptions};
    let server = RedisServer::new();
    let (holder, waiter) = (client(&server.url()), client(&server.url()));
    let cancelled = |err: &Error, name: &str| {
        assert!(matches!(err, Error::Cancelled { .. }), "{err:?}");
        assert_eq!(err.lock_name(), Some(name), "{err:?}");
        says(err, &[&format!("lock \"{name}\": "), "cancelled"]);
    };

    let token = CancellationToken::new();
    token.cancel();
    let options = || LockOptions::new().cancellable(&token);
    let rw = waiter.read_write_lock("rw");
    for (name, r) in [
        ("pre", waiter.lock("pre").try_lock_with(options()).map(drop)),
        (
            "pre-fair",
            waiter
                .fair_lock("pre-fair")
                .try_lock_with(options())
                .map(drop),
        ),
        ("rw", rw.write_lock().try_lock_with(options()).map(drop)),
        (
            "pre-owned",
            waiter
                .lock("pre-owned")
                .owned()
                .try_lock_with(options())
                .map(drop),
        ),
        (
            "pre-sem",
            waiter
                .semaphore("pre-sem", 1)
                .try_acquire_with(options())
                .map(drop),
        ),
    ] {
        cancelled(&r.expect_err("cancelled before"), name);
    }

    // During the wait: the lock is held elsewhere, the token is cancelled meanwhile.
    let held = holder.lock("busy").lock().unwrap();
    let during = CancellationToken::new();
    let canceller = {
        let during = during.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            during.cancel();
        })
    };
    let err = waiter
        .lock("busy")
        .try_lock_with(LockOptions::new().cancellable(&during))
        .map(drop)
        .expect_err("cancelled while waiting");
    canceller.join().unwrap();
    cancelled(&err, "busy");
    held.unlock().unwrap();

    // A MultiLock's wait is on several locks: like its quorum errors, it names none.
    let both =
        redmutex::MultiLock::new([waiter.lock("m-1"), waiter.lock("m-2")]).expect("two locks");
    let err = both
        .try_lock_with(LockOptions::new().cancellable(&token))
        .map(drop)
        .expect_err("cancelled before");
    assert!(matches!(err, Error::Cancelled { .. }), "{err:?}");
    assert_eq!(err.lock_name(), None, "{err:?}");
}

/// A user that may run every command but subscribe to no channel: Redis 7's default for
/// new users (`acl-pubsub-default resetchannels`), set explicitly for Redis 6.2.
fn no_channel_user(server: &RedisServer) -> Client {
    user_client(server, "nochan", "~* resetchannels +@all")
}

/// A client of the ACL user `name`, made with `rule`.
fn user_client(server: &RedisServer, name: &str, rule: &str) -> Client {
    set_user(server, name, &format!("on >{SECRET} {rule}"));
    Client::builder()
        .url(format!(
            "redis://{name}:{SECRET}@127.0.0.1:{}/",
            server.port()
        ))
        .connect_timeout(Duration::from_secs(2))
        // Longer than the bounds below: a refusal must end a wait, not the timeout.
        .command_timeout(Duration::from_secs(3))
        .build()
        .expect("client")
}

fn says_no_channel(err: &Error, server: &RedisServer, name: &str) {
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    assert_eq!(err.lock_name(), Some(name), "{err}");
    says(
        err,
        &[
            &format!("lock \"{name}\""),
            "user nochan",
            &format!("127.0.0.1:{}", server.port()),
            "docs/redis-layout.md",
        ],
    );
}

#[test]
fn a_user_without_channel_permission_is_told_when_it_waits() {
    let server = RedisServer::new();
    let holder = client(&server.url());
    for fair in [true, false] {
        // A new client each time: its first wait is the one that learns of the refusal.
        let waiter = no_channel_user(&server);
        let name = if fair { "fair-jobs" } else { "jobs" };
        let release = support::hold_lock(&holder, name, fair);
        // Its pub/sub reader cannot subscribe: it would never hear the release.
        let (result, took) = support::timed(|| {
            let wait = Duration::from_secs(5);
            if fair {
                waiter
                    .fair_lock(name)
                    .try_lock_for(wait)
                    .map(|g| g.is_some())
            } else {
                waiter.lock(name).try_lock_for(wait).map(|g| g.is_some())
            }
        });
        let err = result.expect_err("no channel permission");
        eprintln!("{name}: told after {took:?}");
        assert!(took < Duration::from_secs(2), "told after {took:?}: {err}");
        says_no_channel(&err, &server, name);
        // Nothing of the refused waiter is left: no queue entry, no hold.
        let keys = Keys::lock(DEFAULT_PREFIX, name);
        let mut con = server.connection();
        let queued = support::llen(&mut con, &keys.queue());
        assert_eq!(queued, 0, "{name}: the refused waiter left its queue entry");
        release().expect("the holder's release still works");
        let left: i64 = redis::cmd("EXISTS")
            .arg(keys.key())
            .query(&mut con)
            .unwrap();
        assert_eq!(left, 0, "{name}: released");
    }
}

#[test]
fn a_user_without_channel_permission_cannot_hold() {
    let server = RedisServer::new();
    let c = no_channel_user(&server);
    // Uncontended: its force_unlock notices could never arrive, so it is told at once
    // rather than when it first has to wait; the lock is not left held.
    for attempt in 0..2 {
        let (result, took) = support::timed(|| c.lock("jobs").lock());
        let err = result.map(drop).expect_err("no channel permission");
        eprintln!("attempt {attempt}: told after {took:?}");
        assert!(
            took < Duration::from_secs(1),
            "attempt {attempt}: told after {took:?}: {err}"
        );
        says_no_channel(&err, &server, "jobs");
        let left: i64 = redis::cmd("EXISTS")
            .arg(Keys::lock(DEFAULT_PREFIX, "jobs").key())
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(left, 0, "attempt {attempt}: the lock was left held");
    }
    let other = client(&server.url());
    other
        .lock("jobs")
        .try_lock()
        .unwrap()
        .expect("free")
        .unlock()
        .unwrap();
}

#[test]
fn a_waiter_whose_channel_is_refused_later_leaves_the_queue() {
    let server = RedisServer::new();
    let holder = client(&server.url());
    let waiter = user_client(&server, "flip", "~* &* +@all");
    let held = holder.fair_lock("jobs").lock().unwrap();
    let keys = Keys::lock(DEFAULT_PREFIX, "jobs");
    std::thread::scope(|scope| {
        let wait = scope.spawn(|| {
            let result = waiter
                .fair_lock("jobs")
                .try_lock_for(Duration::from_secs(10))
                .map(|g| g.is_some());
            (result, std::time::Instant::now())
        });
        let mut con = server.connection();
        let queued = || support::llen(&mut server.connection(), &keys.queue());
        assert!(
            support::wait_until(Duration::from_secs(5), || queued() == 1),
            "queued"
        );
        // Its channels revoked: the server drops its pub/sub connection, and the reader
        // finds them refused when it subscribes again.
        let revoked = std::time::Instant::now();
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("flip")
            .arg("resetchannels")
            .exec(&mut con)
            .unwrap();
        let (result, ended) = wait.join().unwrap();
        let err = result.expect_err("its channel refused");
        let took = ended - revoked;
        eprintln!("told after {took:?}");
        assert!(took < Duration::from_secs(2), "told after {took:?}: {err}");
        assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
        assert_eq!(err.lock_name(), Some("jobs"), "{err}");
        assert_eq!(queued(), 0, "the refused waiter left its queue entry");
    });
    held.unlock().expect("the holder's release still works");
}

#[test]
fn a_multilock_member_without_channel_permission_is_refused() {
    let server = RedisServer::new();
    let full = client(&server.url());
    let nochan = no_channel_user(&server);
    let all = redmutex::MultiLock::new([full.lock("a"), nochan.lock("b")]).unwrap();
    for attempt in 0..2 {
        let err = all.lock().map(drop).expect_err("a member without channels");
        assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
        assert_eq!(err.lock_name(), Some("b"), "attempt {attempt}: {err}");
        for name in ["a", "b"] {
            let left: i64 = redis::cmd("EXISTS")
                .arg(Keys::lock(DEFAULT_PREFIX, name).key())
                .query(&mut server.connection())
                .unwrap();
            assert_eq!(left, 0, "attempt {attempt}: {name} was left held");
        }
    }
}

#[test]
fn a_user_given_channel_permission_can_hold_again() {
    let server = RedisServer::new();
    let c = no_channel_user(&server);
    let err = c.lock("jobs").lock().map(drop).expect_err("refused");
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    set_user(&server, "nochan", "allchannels");
    // The reader asks for its channel again, backing off to once a second.
    let fixed = std::time::Instant::now();
    assert!(
        support::wait_until(Duration::from_secs(3), || c
            .lock("jobs")
            .try_lock()
            .is_ok_and(|g| g.is_some_and(|g| g.unlock().is_ok()))),
        "still refused after the ACL allowed the channels"
    );
    eprintln!("held again after {:?}", fixed.elapsed());
}
