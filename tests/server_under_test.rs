//! The server the suite runs is the one asked for. CI runs the suite on Redis 7.0, 6.2
//! and Valkey 8.1 by setting `REDIS_SERVER_BIN`; these tests check that the servers the
//! harness starts (plain, Sentinel, cluster node) are that binary and say the version its
//! `--version` gives, so a step meant for another server cannot silently run the default
//! one. `REDMUTEX_EXPECT_SERVER` ("Redis 6.2", "Valkey 8.1"...), which `.ci/run` sets
//! for each run, must then be what that binary is.

mod support;

use std::collections::HashMap;
use std::path::PathBuf;

use support::topology::{Cluster, Sentinels};
use support::{server_kind, RedisServer, ServerKind};

/// `INFO server`'s fields.
fn info_server(con: &mut redis::Connection) -> HashMap<String, String> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(con)
        .expect("INFO server");
    info.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Where `bin` is, as the process that runs it sees it: a bare name is looked up on
/// `PATH`, as `Command` does.
fn resolve(bin: &str) -> PathBuf {
    let path = if bin.contains('/') {
        PathBuf::from(bin)
    } else {
        std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(bin))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| panic!("{bin} is not on PATH"))
    };
    path.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts that the server process `pid`, answering on `con`, is `kind`: the same
/// executable (from /proc: `INFO`'s `executable` is argv[0] joined to the working
/// directory, wrong for a binary found on `PATH`), the same product and version
/// (Valkey's own, beside the `redis_version` it reports), in `mode`.
fn assert_is(pid: u32, con: &mut redis::Connection, kind: &ServerKind, mode: &str) {
    let exe = std::fs::canonicalize(format!("/proc/{pid}/exe"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/exe: {e}"));
    assert_eq!(
        exe,
        resolve(&kind.bin),
        "the server runs another binary than REDIS_SERVER_BIN"
    );
    let info = info_server(con);
    let field = |name: &str| info.get(name).map(String::as_str);
    let (a, b, c) = kind.version;
    let version = format!("{a}.{b}.{c}");
    if kind.is_valkey() {
        assert_eq!(field("server_name"), Some("valkey"), "{info:?}");
        assert_eq!(field("valkey_version"), Some(version.as_str()), "{info:?}");
        assert_eq!(field("server_mode"), Some(mode), "{info:?}");
    } else {
        assert_eq!(field("redis_version"), Some(version.as_str()), "{info:?}");
        assert_eq!(field("valkey_version"), None, "{info:?}");
        assert_eq!(field("redis_mode"), Some(mode), "{info:?}");
    }
}

#[test]
fn a_started_server_is_the_binary_asked_for() {
    let kind = server_kind();
    let server = RedisServer::new();
    assert_is(server.pid(), &mut server.connection(), kind, "standalone");
    eprintln!("servers: the suite runs {} ({})", kind.name(), kind.bin);
}

#[test]
fn the_binary_is_the_server_ci_expects() {
    let kind = server_kind();
    match std::env::var("REDMUTEX_EXPECT_SERVER") {
        Ok(expected) if !expected.trim().is_empty() => {
            // "Redis 6.2" matches "Redis 6.2.14", not "Redis 6.20.1".
            let name = kind.name();
            let expected = expected.trim();
            assert!(
                name == expected || name.starts_with(&format!("{expected}.")),
                "REDMUTEX_EXPECT_SERVER is {expected:?}, but REDIS_SERVER_BIN ({}) is {name}",
                kind.bin
            );
        }
        _ => eprintln!(
            "note: REDMUTEX_EXPECT_SERVER is not set; the suite runs {} ({})",
            kind.name(),
            kind.bin
        ),
    }
}

#[test]
fn sentinels_and_cluster_nodes_are_the_binary_asked_for() {
    let kind = server_kind();
    let sentinels = Sentinels::new(1, 1);
    let sentinel = &sentinels.sentinels()[0];
    assert_is(sentinel.pid(), &mut sentinel.connection(), kind, "sentinel");
    let primary = sentinels.primary();
    assert_is(primary.pid(), &mut primary.connection(), kind, "standalone");
    let cluster = Cluster::new(3, 0);
    for node in cluster.nodes() {
        assert_is(node.pid(), &mut node.server().connection(), kind, "cluster");
    }
}
