//! Unit tests of how server errors are told apart and how names are printed.

use super::{is_no_permission, printable};

fn server_error(reply: &str) -> redis::RedisError {
    let value = redis::parse_redis_value(reply.as_bytes()).expect("a reply");
    value.extract_error().expect_err("an error reply")
}

#[test]
fn acl_refusals_are_told_from_other_errors() {
    for refusal in [
        "-NOPERM this user has no permissions to access one of the channels used as arguments\r\n",
        "-ERR The user executing the script can't publish to the channel mentioned in the command script: redmutex_x_release, on @user_function:359.\r\n",
        "-ERR Error running script (call to f_0123): @user_script:1: The user executing the script can't run this command or subcommand\r\n",
    ] {
        assert!(is_no_permission(&server_error(refusal)), "{refusal}");
    }
    assert!(!is_no_permission(&server_error("-ERR injected\r\n")));
}

#[test]
fn names_are_printed_escaped() {
    assert_eq!(&*printable(b"orders:42"), "orders:42");
    assert_eq!(&*printable("café".as_bytes()), "café");
    assert_eq!(&*printable(b"a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
    assert_eq!(&*printable(b"q\"uote\\"), "q\\\"uote\\\\");
    assert_eq!(&*printable(b"\xff\xfeok"), "\\xff\\xfeok");
    let long = vec![b'x'; 1000];
    assert_eq!(printable(&long).chars().count(), 257);
    assert!(printable(&long).ends_with('…'));
}
