//! `rediss://` against a TLS-only redis-server whose certificates the test makes with the
//! openssl command-line tool.
#![cfg(feature = "tls")]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use redmutex::{Client, Error};
use support::RedisServer;

/// A CA and a server certificate it signed for 127.0.0.1, in `dir`.
fn make_certificates(dir: &Path, ca_name: &str) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        &format!("/CN={ca_name}"),
    ]);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "server.crt",
        "-extfile",
        "san.ext",
    ]);
}

/// A server with a TLS port (next to its plain one) and the directory of the certificates
/// made for it, with that port; `None`, the test `test` then skipped, when the server binary
/// under test has no TLS (the Redis 6.2 and Valkey builds of the PyPI wheels CI runs have
/// none).
fn tls_server(test: &str) -> Option<(tempfile::TempDir, RedisServer, u16)> {
    if !support::server_kind().has_tls() {
        support::skip(test, "TLS (built without it)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path(), "redmutex test CA");
    let tls_port = support::free_port();
    let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let port = tls_port.to_string();
    let server = RedisServer::with_args(&[
        "--tls-port",
        &port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    Some((dir, server, tls_port))
}

#[test]
fn locks_work_over_tls_with_a_trusted_ca() {
    let Some((dir, server, tls_port)) = tls_server("locks_work_over_tls_with_a_trusted_ca") else {
        return;
    };
    let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
    let client = Client::builder()
        .url(format!("rediss://127.0.0.1:{tls_port}/"))
        .tls_ca_certificate(ca)
        .watchdog_timeout(Duration::from_millis(600))
        .command_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = client.lock("tls");
    let outer = lock.lock().expect("lock over TLS");
    let inner = lock.lock().expect("re-enter over TLS");
    assert_eq!(lock.hold_count().unwrap(), 2);
    // A waiter over TLS too: its pub/sub connection is a TLS connection as well.
    let other = client.lock("tls");
    let waiter = std::thread::spawn(move || other.lock().map(|g| g.unlock()));
    std::thread::sleep(Duration::from_millis(800)); // renewals over TLS meanwhile
    assert!(!outer.is_lease_lost());
    drop(inner);
    outer.unlock().unwrap();
    waiter
        .join()
        .unwrap()
        .expect("waiter lock")
        .expect("waiter unlock");
    // The plain port saw the lock too: it is one server.
    let n: i64 = redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(n, 0, "everything released");
}

#[test]
fn an_untrusted_certificate_is_refused() {
    let Some((_dir, server, tls_port)) = tls_server("an_untrusted_certificate_is_refused") else {
        return;
    };
    // Another CA, which did not sign the server's certificate.
    let other = tempfile::tempdir().unwrap();
    make_certificates(other.path(), "some other CA");
    let wrong_ca = std::fs::read(other.path().join("ca.crt")).unwrap();
    let client = Client::builder()
        .url(format!("rediss://127.0.0.1:{tls_port}/"))
        .tls_ca_certificate(wrong_ca)
        .connect_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    // Not `try_lock()`: its 250 ms budget includes making the first connection, and a TLS
    // connect costs 250-600 ms here (redis-rs reads every system CA on each connect), so
    // the pool could give up before the handshake failed and name no cause. With time
    // to spare, the pool's wait ends with the handshake's own error.
    let err = client
        .lock("tls")
        .try_lock_for(Duration::from_secs(3))
        .expect_err("untrusted server");
    assert!(
        matches!(err, Error::Pool { .. } | Error::Redis { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("certificate"), "{err}");
    let n: i64 = redis::cmd("DBSIZE")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(n, 0, "nothing was written");
    // TLS settings with a plain URL are a configuration error, not a silent downgrade.
    let plain = Client::builder()
        .url(server.url())
        .tls_ca_certificate(b"not used".to_vec())
        .build();
    assert!(
        matches!(plain, Err(Error::InvalidArgument { .. })),
        "{plain:?}"
    );
}
