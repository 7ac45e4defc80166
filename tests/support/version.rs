//! Which server the tests run on (Redis, Valkey; its version) and what it lacks.

use std::process::{Command, Stdio};

use super::server_binary;

/// Which server a binary is, from `<bin> --version` ("Redis server v=6.2.14 ..." or
/// "Valkey server v=8.1.8 ..."): the features a test needs differ between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerKind {
    /// The binary asked.
    pub bin: String,
    /// "Redis" or "Valkey", as the binary names itself.
    pub product: String,
    /// Its own version (Valkey's, not the `redis_version` it also reports).
    pub version: (u32, u32, u32),
}

impl ServerKind {
    /// Asks `bin --version`; panics when the binary cannot be run or its answer is not
    /// understood, since no test of a server feature can then be trusted.
    pub fn of(bin: &str) -> ServerKind {
        let out = Command::new(bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {bin:?} --version: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let parsed = text.split_whitespace().next().zip(
            text.split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .and_then(parse_version),
        );
        let Some((product, version)) = parsed else {
            panic!("{bin:?} --version said {text:?}: not a Redis or Valkey server")
        };
        ServerKind {
            bin: bin.to_owned(),
            product: product.to_owned(),
            version,
        }
    }

    /// Whether this is Valkey (which reports `redis_version:7.2.4` beside its own).
    pub fn is_valkey(&self) -> bool {
        self.product.eq_ignore_ascii_case("valkey")
    }

    /// Redis `major.minor` or later; every Valkey is (it forked from Redis 7.2).
    fn redis_at_least(&self, major: u32, minor: u32) -> bool {
        self.is_valkey() || (self.version.0, self.version.1) >= (major, minor)
    }

    /// `FUNCTION` and `FCALL` (Redis 7.0).
    pub fn has_functions(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// `CLUSTER ADDSLOTSRANGE` (Redis 7.0); before it slots are added one by one.
    pub fn has_slot_ranges(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// A command over several keys of a slot being migrated, some on the source and some
    /// not, gets `TRYAGAIN` from the source (Redis 7.0); before, the source sends it to
    /// the target with `ASK`, as when none is there.
    pub fn tries_again_when_some_keys_are_here(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// The `cluster-port` setting (Redis 7.0); before it the bus is on port + 10000.
    pub fn has_cluster_port(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// `SENTINEL DEBUG`, which shortens a sentinel's periods (Redis 7.0).
    pub fn has_sentinel_debug(&self) -> bool {
        self.redis_at_least(7, 0)
    }

    /// Whether the binary was built with TLS: one without it refuses `tls-port` (Redis)
    /// or finds no TLS connection type (Valkey) and exits; one with it exits too, for the
    /// missing certificate, which is what is asked for here.
    pub fn has_tls(&self) -> bool {
        let out = Command::new(&self.bin)
            .args([
                "--port",
                "0",
                "--tls-port",
                "1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--daemonize", "no", "--logfile", ""])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", self.bin));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        !(text.contains("Bad directive") || text.contains("Failed finding TLS support"))
    }

    /// "Redis 6.2.14", "Valkey 8.1.8".
    pub fn name(&self) -> String {
        let (a, b, c) = self.version;
        format!("{} {a}.{b}.{c}", self.product)
    }
}

/// `"8.1.8"` as numbers.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// The server the tests run (`REDIS_SERVER_BIN`, else `redis-server`), asked once.
pub fn server_kind() -> &'static ServerKind {
    static KIND: std::sync::OnceLock<ServerKind> = std::sync::OnceLock::new();
    KIND.get_or_init(|| ServerKind::of(&server_binary()))
}

/// Says on stderr that `test` does not run on this server, and why (a feature it lacks):
/// the caller then returns. Only for features the server lacks, never for a behaviour
/// of the library that differs.
pub fn skip(test: &str, lacks: &str) {
    eprintln!(
        "SKIPPED {test}: {} ({}) lacks {lacks}",
        server_kind().name(),
        server_kind().bin
    );
}

/// The Redis 6.2 server binary CI provides in `REDIS_6_SERVER_BIN` (6.2 has no functions,
/// so the scripts run there with `EVALSHA`), if it is set.
pub fn redis6_binary() -> Option<String> {
    std::env::var("REDIS_6_SERVER_BIN")
        .ok()
        .filter(|s| !s.is_empty())
}

/// The `redis_version` line of `INFO server` on `con`. On Valkey, which reports the Redis version it is compatible with, its own follows:
/// "7.2.4 (Valkey 8.1.8)".
pub fn redis_version(con: &mut redis::Connection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(con)
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    let redis = field("redis_version").unwrap_or_else(|| "?".to_owned());
    match field("valkey_version") {
        Some(valkey) => format!("{redis} (Valkey {valkey})"),
        None => redis,
    }
}
