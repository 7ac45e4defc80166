//! Errors that say what to do: each way of failing to reach or use Redis is a typed error
//! whose message names the lock, the server (host:port, never the password) and the way
//! out, provoked on real servers.

mod support;

use std::time::Duration;

use redmutex::{Client, Error};
use support::keys::{Keys, DEFAULT_PREFIX};
use support::RedisServer;

const SECRET: &str = "s3cret-pw";

fn set_user(server: &RedisServer, name: &str, rule: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name);
    for part in support::acl_rule_words(rule) {
        cmd.arg(part);
    }
    cmd.exec(&mut server.connection()).expect("ACL SETUSER");
}

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
