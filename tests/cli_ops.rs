//! The `redmutex` command as an operator meets it: failing fast and clearly, on a Redis
//! Cluster too, run against real redis-server processes.

mod support;

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use redis::Commands;
use support::cli::{bare, output};
use support::keys::Keys;
use support::topology::Cluster;
use support::RedisServer;

const PREFIX: &str = "ops:";

fn redmutex(server: &RedisServer) -> Command {
    support::cli::redmutex(server, PREFIX)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A port nothing listens on: bound, then closed.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_refusing_server_is_reported_at_once_not_after_the_connect_timeout() {
    let port = closed_port();
    let url = format!("redis://127.0.0.1:{port}/");
    for args in [
        &["status", "x"][..],
        &["list"],
        &["unlock", "--force", "x"],
        &["wait", "x"],
        &["run", "x", "--", "true"],
        &["run", "--no-wait", "x", "--", "true"],
    ] {
        let started = Instant::now();
        // The default connect timeout (5 s): a refusal is an answer, not a wait.
        let out = output(bare().args(["--url", &url]).args(args));
        let took = started.elapsed();
        let said = stderr(&out);
        eprintln!("{args:?}: refused, reported after {took:?}");
        assert_eq!(out.status.code(), Some(69), "{args:?}: {said}");
        assert!(said.contains("refused"), "{args:?}: {said}");
        assert!(took < Duration::from_millis(1500), "{args:?} took {took:?}");
    }
}

#[test]
fn a_server_that_never_answers_is_reported_within_the_connect_timeout() {
    // Connections are accepted (by the kernel's backlog) and never answered.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}/", silent.local_addr().unwrap().port());
    for args in [
        &["status", "x"][..],
        &["wait", "x"],
        &["run", "x", "--", "true"],
        &["run", "--no-wait", "x", "--", "true"],
    ] {
        let (out, took) = support::timed(|| {
            output(
                bare()
                    .args(["--url", &url, "--connect-timeout", "800ms"])
                    .args(args),
            )
        });
        eprintln!("{args:?}: silent server, reported after {took:?} (--connect-timeout 800ms)");
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {said}");
        // In words, naming the server: not "Resource temporarily unavailable (os error
        // 11)", which reads as a local fault.
        assert!(
            said.contains(&format!(
                "127.0.0.1:{}",
                silent.local_addr().unwrap().port()
            )) && said.contains("did not answer")
                && !said.contains("os error"),
            "{args:?}: {said}"
        );
        // `--no-wait` gives a connection 250 ms (the library's bound on a try), and the
        // others the whole --connect-timeout.
        let least = if args.contains(&"--no-wait") {
            200
        } else {
            700
        };
        assert!(
            took >= Duration::from_millis(least) && took < Duration::from_millis(1800),
            "{args:?} took {took:?}"
        );
    }
}

#[test]
fn a_refused_password_or_permission_is_said_in_words_at_once() {
    let server = RedisServer::with_args(&["--requirepass", "s3cret"]);
    let mut con = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}/", server.port()))
        .unwrap()
        .get_connection()
        .unwrap();
    // A user that may connect and PING but not run the scripts.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "reader", "on", ">pw", "~*", "&*", "+ping", "+hello", "+client",
        ])
        .query(&mut con)
        .unwrap();
    // One that may run every command but use no channel (Redis 7's default for a new
    // user): it cannot hear a release, so it is refused before it holds anything.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nochan",
            "on",
            ">pw",
            "~*",
            "resetchannels",
            "+@all",
        ])
        .query(&mut con)
        .unwrap();
    let at = format!("127.0.0.1:{}", server.port());
    for (url, words) in [
        (
            format!("redis://:wrong@{at}/"),
            &[
                "authentication failed for user default",
                "check the user and password",
            ][..],
        ),
        (
            format!("redis://{at}/"),
            &[
                "authentication failed for user default",
                "requires a password",
            ],
        ),
        (
            format!("redis://bob:s3cret@{at}/"),
            &["authentication failed for user bob"],
        ),
        (
            format!("redis://reader:pw@{at}/"),
            &["user reader", "lacks a permission", "docs/redis-layout.md"],
        ),
        (
            format!("redis://nochan:pw@{at}/"),
            &[
                "user nochan",
                "lacks a permission",
                "channel",
                "docs/redis-layout.md",
            ],
        ),
    ] {
        let (out, took) = support::timed(|| {
            output(bare().args(["--url", &url, "--prefix", PREFIX]).args([
                "run",
                "--no-wait",
                "x",
                "true",
            ]))
        });
        let said = stderr(&out);
        eprintln!("{url}: {took:?}: {said}");
        assert_eq!(out.status.code(), Some(69), "{url}: {said}");
        assert!(said.contains(&at), "{url}: the server is not named: {said}");
        for word in words {
            assert!(said.contains(word), "{url}: no {word:?} in {said}");
        }
        // Said once: the library's warning of a refused channel is kept back for it.
        assert!(
            !said.contains("channel refused"),
            "{url}: said twice: {said}"
        );
        assert_eq!(said.lines().count(), 1, "{url}: {said}");
        for raw in ["NOAUTH", "AuthenticationFailed", "s3cret", "pw@", "wrong"] {
            assert!(!said.contains(raw), "{url}: {raw:?} in {said}");
        }
        // Final: said at once, not after the 5 s connect timeout of retries.
        assert!(took < Duration::from_millis(2500), "{url}: took {took:?}");
    }
}

#[test]
fn run_and_wait_on_a_key_that_is_not_a_lock_say_so_cleanly() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let key = Keys::lock(PREFIX, "data").key();
    let _: () = con.set(&key, "precious").unwrap();
    for args in [
        &["run", "data", "--", "true"][..],
        &["run", "--no-wait", "data", "--", "true"],
        &["wait", "data"],
        &["hold", "--no-wait", "data"],
    ] {
        let out = output(redmutex(&server).args(args));
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(65), "{args:?}: {said}");
        assert!(said.contains("not a redmutex lock"), "{args:?}: {said}");
        for raw in ["script", "@user_function", "redmutex_", "\"WRONGTYPE\""] {
            assert!(!said.contains(raw), "{args:?} shows {raw:?}: {said}");
        }
        assert_eq!(said.lines().count(), 1, "{said}");
    }
    let value: String = redis::cmd("GET").arg(&key).query(&mut con).unwrap();
    assert_eq!(value, "precious");
}

#[test]
fn errors_speak_of_flags_not_library_fields() {
    for (args, said) in [
        (
            &["run", "--lease", "2ms", "x", "--", "true"][..],
            "--lease must be at least 3ms",
        ),
        (
            &["run", "-l", "20years", "x", "--", "true"],
            "--lease must be at most",
        ),
        (
            &["--connect-timeout", "0s", "status", "x"],
            "--connect-timeout must be longer than zero",
        ),
    ] {
        let out = output(bare().args(["--url", "redis://127.0.0.1:1/"]).args(args));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(
            !err.contains("watchdog_timeout") && !err.contains("command_timeout"),
            "{err}"
        );
    }
    // Caught past the arguments' syntax: 64, still in the flags' words.
    for (args, said) in [
        (
            &[
                "--url",
                "redis://127.0.0.1:1/",
                "--prefix",
                "a{",
                "status",
                "x",
            ][..],
            "--prefix must not contain",
        ),
        (
            &["--url", "redis://127.0.0.1:1/x", "status", "x"],
            "bad --url redis://127.0.0.1:1/x",
        ),
        (
            &[
                "--url",
                "redis://127.0.0.1:1/",
                "latch",
                "set",
                "l",
                "2",
                "--expire",
                "0s",
            ],
            "--expire must be longer than zero",
        ),
    ] {
        let out = output(bare().args(args));
        let err = stderr(&out);
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(
            !err.contains("key_prefix") && !err.contains("invalid argument"),
            "{err}"
        );
        let want = if args.contains(&"--expire") { 2 } else { 64 };
        assert_eq!(out.status.code(), Some(want), "{args:?}: {err}");
    }
}

#[test]
fn list_on_a_cluster_finds_the_locks_of_every_primary() {
    let cluster = Cluster::new(3, 0);
    let seeds = cluster.seed_urls().join(",");
    let client = redmutex::Client::builder()
        .cluster(cluster.seed_urls())
        .key_prefix(PREFIX)
        .build()
        .unwrap();
    // Enough names that every primary owns some (each name is its own slot).
    let names: Vec<String> = (0..24).map(|i| format!("job-{i}")).collect();
    let guards: Vec<_> = names
        .iter()
        .map(|n| client.lock(n.as_str()).lock().unwrap())
        .collect();
    let out = output(
        bare()
            .args(["--cluster", &seeds, "--prefix", PREFIX])
            .args(["list", "--json"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut listed: Vec<String> = json["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(listed, want);
    // The library call the command makes.
    assert_eq!(client.list("job-*").unwrap().len(), names.len());
    for g in guards {
        g.unlock().unwrap();
    }
}

#[test]
fn through_sentinels_the_first_that_answers_is_enough() {
    let sentinels = support::topology::Sentinels::new(0, 1);
    let mut urls = vec![format!("redis://127.0.0.1:{}/", closed_port())];
    urls.extend(sentinels.sentinel_urls());
    let out = output(
        bare()
            .args(["--sentinel", &urls.join(","), "--service"])
            .arg(sentinels.service_name())
            .args([
                "--prefix",
                PREFIX,
                "run",
                "--no-wait",
                "via-sentinel",
                "true",
            ]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // None answers: refused, at once.
    let started = Instant::now();
    let out = output(bare().args([
        "--sentinel",
        &urls[0],
        "--service",
        "mymaster",
        "status",
        "x",
    ]));
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(stderr(&out).contains("refused"), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}
