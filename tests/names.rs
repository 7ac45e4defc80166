//! Lock names in every common string form (issue 6, point 11): `&String`, `&Vec<u8>`,
//! `Cow<str>` and the like are accepted by `Client::lock` and `Client::fenced_lock`, and
//! name the same lock as the `&str` form. Before the fix this file did not compile:
//! `lock(name: impl Into<Vec<u8>>)` took no `&String`, `&Vec<u8>` or `Cow<str>`.

mod support;

use std::borrow::Cow;
use std::time::Duration;

use redmutex::{Client, Error};
use support::RedisServer;

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .url(server.url())
        .key_prefix("names:")
        .watchdog_timeout(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(1))
        .build()
        .expect("build client")
}

/// Point 11: a lock taken through each borrowed or owned form is the lock of the `&str`
/// form: the `&str` lock sees this thread's hold (same key, same holder).
#[test]
fn every_string_form_names_the_same_lock() {
    let server = RedisServer::new();
    let c = client(&server);
    let string = String::from("names-a");
    let bytes: Vec<u8> = b"names-a".to_vec();
    let by_str = c.lock("names-a");

    let forms = [
        ("&String", c.lock(&string)),
        ("&Vec<u8>", c.lock(&bytes)),
        ("Cow::Borrowed", c.lock(Cow::Borrowed("names-a"))),
        (
            "Cow::Owned",
            c.lock(Cow::<str>::Owned("names-a".to_owned())),
        ),
    ];
    for (what, lock) in &forms {
        assert_eq!(lock.name(), b"names-a", "{what}: name");
        let g = lock.lock().expect("lock");
        assert_eq!(
            by_str.hold_count().expect("hold_count"),
            1,
            "{what}: the &str form does not see the hold"
        );
        g.unlock().expect("unlock");
        assert!(
            !by_str.is_locked().expect("is_locked"),
            "{what}: still held"
        );
    }
    // The string itself is still usable: the borrowed forms did not consume it.
    assert_eq!(string, "names-a");
    assert_eq!(bytes, b"names-a");
}

/// Point 11: the same forms for `fenced_lock`; nested levels through different forms are
/// one hold with one token.
#[test]
fn every_string_form_names_the_same_fenced_lock() {
    let server = RedisServer::new();
    let c = client(&server);
    let string = String::from("names-f");
    let bytes: Vec<u8> = b"names-f".to_vec();
    let by_str = c.fenced_lock("names-f");
    let outer = by_str.lock().expect("outer lock");

    let forms = [
        ("&String", c.fenced_lock(&string)),
        ("&Vec<u8>", c.fenced_lock(&bytes)),
        ("Cow::Borrowed", c.fenced_lock(Cow::Borrowed("names-f"))),
        (
            "Cow::Owned",
            c.fenced_lock(Cow::<str>::Owned("names-f".to_owned())),
        ),
    ];
    for (what, lock) in &forms {
        assert_eq!(lock.name(), b"names-f", "{what}: name");
        let inner = lock.lock().expect("re-entry");
        assert_eq!(
            inner.token(),
            outer.token(),
            "{what}: not the same hold as the &str form"
        );
        assert_eq!(by_str.hold_count().expect("hold_count"), 2, "{what}");
        inner.unlock().expect("inner unlock");
    }
    outer.unlock().expect("outer unlock");
    assert!(!by_str.is_locked().expect("is_locked"));
}

/// A prefix holding one of the bytes that start what follows a prefix in a key (`!` of
/// the auxiliary keys, `{`, `~`, `#` of the lock keys) is refused when the client is
/// built: with it, one prefix's keys could be another's. Prefix `a!queue:`'s lock `x` is
/// `a!queue:{x}`, which is prefix `a`'s queue of lock `x`: a fair waiter of one and a
/// holder of the other would write a hash and a sorted set into one key.
#[test]
fn a_prefix_whose_keys_could_be_another_prefixes_is_refused() {
    let server = RedisServer::new();
    for prefix in ["a!queue:", "a!", "!", "a~", "a#", "a{", "a}"] {
        match Client::builder()
            .url(server.url())
            .key_prefix(prefix)
            .build()
        {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("key_prefix"), "{why}"),
            Ok(_) => panic!("prefix {prefix:?} accepted"),
            Err(e) => panic!("prefix {prefix:?}: {e}"),
        }
    }
    // Prefixes without those bytes still work, beside each other on one server.
    let a = Client::builder()
        .url(server.url())
        .key_prefix("a")
        .build()
        .expect("prefix a");
    let b = Client::builder()
        .url(server.url())
        .key_prefix("a:queue:")
        .build()
        .expect("prefix a:queue:");
    let held = a.fair_lock("x").lock().expect("a holds x");
    let other = b.fair_lock("x").lock().expect("b's x is another lock");
    other.unlock().expect("unlock b");
    held.unlock().expect("unlock a");
}
