//! The `redmutex` command run as a process, for the tests of the command (feature `cli`).

use std::process::{Command, Output};
use std::time::Duration;

use super::clients::Clients;
use super::RedisServer;

/// The clients a test of the command makes beside it, its keys under `prefix`.
pub const fn clients(prefix: &'static str) -> Clients {
    Clients::new(prefix)
        .watchdog(Duration::from_secs(5))
        .command(Duration::from_secs(1))
}

/// The built `redmutex` binary. (Cargo names it to the tests only; the examples and
/// benches that share this module are built without it.)
pub fn bin() -> &'static str {
    match option_env!("CARGO_BIN_EXE_redmutex") {
        Some(bin) => bin,
        None => panic!("only the tests of the redmutex binary run it"),
    }
}

/// `redmutex` with no Redis settings from the environment: what a test's own machine
/// exports must not point it elsewhere.
pub fn bare() -> Command {
    let mut cmd = Command::new(bin());
    for var in [
        "REDIS_URL",
        "REDIS_SENTINELS",
        "REDIS_SENTINEL_SERVICE",
        "REDIS_CLUSTER",
        "REDMUTEX_PREFIX",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// `redmutex` on `server`, its keys under `prefix`.
pub fn redmutex(server: &RedisServer, prefix: &str) -> Command {
    let mut cmd = bare();
    cmd.args(["--url", &server.url(), "--prefix", prefix]);
    cmd
}

/// Runs `cmd` to its end; whatever it exits with, it must not have panicked.
pub fn output(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run redmutex");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "redmutex panicked: {stderr}");
    out
}
