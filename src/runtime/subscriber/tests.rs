//! The subscriber's unit tests.

use super::*;

#[test]
fn a_force_unlock_message_is_read_back() {
    assert_eq!(parse_forced(b"f 42 p:{a b}"), Some((42, &b"p:{a b}"[..])));
    assert_eq!(parse_forced(b"s"), None);
    assert_eq!(parse_forced(b"f x p:{a}"), None);
    assert_eq!(parse_forced(b"f 42"), None);
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
