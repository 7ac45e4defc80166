//! The subscriber's unit tests.

use super::dispatch::parse_forced;
use super::*;
use crate::runtime::connection::pool::{is_interrupted as interrupted, EINTR};

#[test]
fn a_force_unlock_message_is_read_back() {
    assert_eq!(parse_forced(b"f 42 p:{a b}"), Some((42, &b"p:{a b}"[..])));
    assert_eq!(parse_forced(b"s"), None);
    assert_eq!(parse_forced(b"f x p:{a}"), None);
    assert_eq!(parse_forced(b"f 42"), None);
}

#[test]
fn a_slot_is_mapped_to_its_primary_and_a_moved_one_to_its_new_owner() {
    let a = ("10.0.0.1".to_owned(), 7000);
    let b = ("10.0.0.2".to_owned(), 7001);
    let mut map = shards::SlotMap::new(vec![(0, 8191, a.clone()), (8192, 16383, b.clone())]);
    assert_eq!(map.owner(0), Some(&a));
    assert_eq!(map.owner(8191), Some(&a));
    assert_eq!(map.owner(8192), Some(&b));
    map.moved(5, b.clone());
    assert_eq!(map.owner(5), Some(&b));
    assert_eq!(map.owner(6), Some(&a));
    assert_eq!(shards::SlotMap::new(Vec::new()).owner(1), None);
    // A waiter's channel lives in its lock key's slot.
    assert_eq!(
        shards::slot(b"redmutex:{orders}:to:c1"),
        shards::slot(b"redmutex:{orders}")
    );
}

#[test]
fn a_moved_reply_names_its_node() {
    assert_eq!(
        shards::parse_addr("127.0.0.1:7001"),
        Some(("127.0.0.1".to_owned(), 7001))
    );
    assert_eq!(
        shards::parse_addr("::1:7002"),
        Some(("::1".to_owned(), 7002))
    );
    assert_eq!(shards::parse_addr("nonsense"), None);
}

#[test]
fn a_refused_ssubscribe_command_is_told_from_a_refused_channel() {
    let reply = |text: &str| -> redis::RedisError {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
            .expect("a reply")
            .extract_error()
            .expect_err("an error")
    };
    assert!(shards::refuses_command(&reply(
        "ERR unknown command 'SSUBSCRIBE', with args beginning with: 'x'"
    )));
    assert!(shards::refuses_command(&reply(
        "NOPERM User locker has no permissions to run the 'ssubscribe' command"
    )));
    assert!(!shards::refuses_command(&reply(
        "NOPERM No permissions to access a channel"
    )));
    assert!(!shards::refuses_command(&reply("MOVED 12 127.0.0.1:7001")));
}

#[test]
fn an_interrupted_read_is_told_from_other_failures() {
    let eintr = std::io::Error::from_raw_os_error(EINTR);
    assert_eq!(eintr.kind(), std::io::ErrorKind::Interrupted);
    assert!(interrupted(&redis::RedisError::from(eintr)));
    assert!(interrupted(&redis::RedisError::from(std::io::Error::from(
        std::io::ErrorKind::Interrupted
    ))));
    for kind in [
        std::io::ErrorKind::ConnectionReset,
        std::io::ErrorKind::UnexpectedEof,
        std::io::ErrorKind::TimedOut,
        std::io::ErrorKind::HostUnreachable,
    ] {
        let e = redis::RedisError::from(std::io::Error::from(kind));
        assert!(!interrupted(&e), "{kind:?}");
    }
    for errno in [104, 110, 113] {
        let e = redis::RedisError::from(std::io::Error::from_raw_os_error(errno));
        assert!(!interrupted(&e), "os error {errno}");
    }
}
