//! Lock names in every common string form (issue 6, point 11): `&String`, `&Vec<u8>`,
//! `Cow<str>` and the like are accepted by `Client::lock` and `Client::fenced_lock`, and
//! name the same lock as the `&str` form. Before the fix this file did not compile:
//! `lock(name: impl Into<Vec<u8>>)` took no `&String`, `&Vec<u8>` or `Cow<str>`.

mod support;

use std::borrow::Cow;
use std::time::Duration;

use redmutex::{Client, Error, MAX_NAME_LEN};
use support::clients::Clients;
use support::RedisServer;

const CLIENTS: Clients = Clients::new("names:")
    .watchdog(Duration::from_secs(3))
    .command(Duration::from_secs(1));

/// Point 11: a lock taken through each borrowed or owned form is the lock of the `&str`
/// form: the `&str` lock sees this thread's hold (same key, same holder).
#[test]
fn every_string_form_names_the_same_lock() {
    let (_server, c) = CLIENTS.serve();
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
    let (_server, c) = CLIENTS.serve();
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
            Err(Error::InvalidArgument { reason: why, .. }) => {
                assert!(why.contains("key_prefix"), "{why}")
            }
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

/// Commands the server executed, but for the `INFO` that reads them.
fn executed(server: &RedisServer) -> u64 {
    server
        .command_calls()
        .iter()
        .filter(|(cmd, _)| cmd.as_str() != "info")
        .map(|(_, n)| n)
        .sum()
}

/// Issue 26, item 10: a name of 10 MB was accepted and sent on every call (several times
/// over: the key, the queue's and the other keys, the channel). A name longer than
/// [`MAX_NAME_LEN`] bytes is refused with `Error::InvalidName` by every operation of every
/// object, before anything reaches the server; a name of exactly that length works.
#[test]
fn a_name_longer_than_the_maximum_is_refused_and_never_sent() {
    // The number docs/api.md and the refusal's message give.
    assert_eq!(MAX_NAME_LEN, 4096);
    let (server, c) = CLIENTS.serve();
    let longest = "n".repeat(MAX_NAME_LEN);
    let guard = c
        .lock(&longest)
        .lock()
        .expect("a name of the maximum length");
    assert!(c.lock(&longest).is_locked().unwrap());
    assert_eq!(c.inspect(&longest).unwrap().len(), 1);
    guard.unlock().unwrap();
    let permit = c.semaphore(&longest, 1).acquire().unwrap();
    permit.release().unwrap();
    let latch = c.count_down_latch(&longest);
    assert!(latch.try_set_count(1).unwrap());
    assert_eq!(latch.count_down().unwrap(), 0);

    for len in [MAX_NAME_LEN + 1, 10 << 20] {
        let name = vec![b'n'; len];
        let before = executed(&server);
        let s = Duration::from_millis(10);
        let lock = c.lock(&name);
        let rw = c.read_write_lock(&name);
        let sem = c.semaphore(&name, 2);
        let latch = c.count_down_latch(&name);
        let results: Vec<(&str, Result<(), Error>)> = vec![
            ("lock", lock.lock().map(drop)),
            ("try_lock", lock.try_lock().map(drop)),
            ("try_lock_for", lock.try_lock_for(s).map(drop)),
            ("owned().lock", lock.owned().lock().map(drop)),
            ("is_locked", lock.is_locked().map(drop)),
            ("hold_count", lock.hold_count().map(drop)),
            ("remaining_lease", lock.remaining_lease().map(drop)),
            ("force_unlock", lock.force_unlock().map(drop)),
            ("fenced lock", c.fenced_lock(&name).lock().map(drop)),
            ("fair lock", c.fair_lock(&name).lock().map(drop)),
            ("read", rw.read_lock().lock().map(drop)),
            ("write", rw.write_lock().try_lock().map(drop)),
            ("upgradeable", rw.upgradeable_lock().lock().map(drop)),
            (
                "write force_unlock",
                rw.write_lock().force_unlock().map(drop),
            ),
            ("acquire", sem.acquire().map(drop)),
            ("try_acquire", sem.try_acquire().map(drop)),
            ("available_permits", sem.available_permits().map(drop)),
            ("add_permits", sem.add_permits(1).map(drop)),
            ("try_set_count", latch.try_set_count(1).map(drop)),
            ("count_down", latch.count_down().map(drop)),
            ("count", latch.count().map(drop)),
            ("wait_for", latch.wait_for(s).map(drop)),
            ("inspect", c.inspect(&name).map(drop)),
            (
                "MultiLock::new",
                redmutex::MultiLock::new([lock.clone(), c.lock("other")]).map(drop),
            ),
        ];
        for (op, r) in results {
            assert!(
                matches!(r, Err(Error::InvalidName(_))),
                "{op} on a name of {len} bytes: {:?}",
                r.map_err(|e| e.to_string().chars().take(200).collect::<String>())
            );
        }
        assert_eq!(
            executed(&server),
            before,
            "a name of {len} bytes reached the server"
        );
    }
}
