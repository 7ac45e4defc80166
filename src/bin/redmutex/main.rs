//! `redmutex`: a distributed `flock(1)` on Redis, for shells, cron jobs and operators.

#![forbid(unsafe_code)]

mod run;
mod show;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redmutex::{Client, Error};

/// The lock was not acquired in time (`--no-wait`, or `--wait` ran out): EX_TEMPFAIL.
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// The lease was lost while the command ran: another holder may have run meanwhile.
pub(crate) const LEASE_LOST: u8 = 76;
/// Redis could not be reached, or refused: EX_UNAVAILABLE.
pub(crate) const UNAVAILABLE: u8 = 69;
/// A bad name or value the arguments' syntax could not catch: EX_USAGE.
pub(crate) const USAGE: u8 = 64;
/// The key holds something that is not a redmutex lock: EX_DATAERR.
pub(crate) const NOT_A_LOCK: u8 = 65;

const EXIT_CODES: &str = "\
Exit codes: the command's own with `run` (128 + n when a signal n ended it); 75 when the
lock was not acquired in time; 76 when its lease was lost while the command ran; 69 when
Redis could not be reached or refused; 65 when a key holds something that is not a lock;
64 for a bad name or value; 2 for bad usage.";

/// A distributed flock(1) on Redis: reentrant hash locks, leases renewed by a watchdog
/// while held, and waiting by pub/sub.
#[derive(Parser)]
#[command(name = "redmutex", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: Command,
}

/// Where Redis is. Passwords in URLs are never printed.
#[derive(Args)]
struct Connection {
    /// The Redis server: redis://[user:password@]host[:port][/db], or rediss:// for TLS.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379/",
        global = true
    )]
    url: String,
    /// The namespace of every key and channel: the same as the programs that share the
    /// locks use.
    #[arg(
        long,
        env = "REDMUTEX_PREFIX",
        default_value = "redmutex:",
        global = true
    )]
    prefix: String,
    /// Sentinels (comma-separated redis:// URLs) to find the primary of --service
    /// through; --url then only gives the credentials, db and TLS.
    #[arg(
        long,
        env = "REDIS_SENTINELS",
        hide_env_values = true,
        value_delimiter = ',',
        requires = "service",
        conflicts_with = "cluster",
        global = true
    )]
    sentinel: Vec<String>,
    /// The Sentinel service name (with --sentinel).
    #[arg(long, env = "REDIS_SENTINEL_SERVICE", global = true)]
    service: Option<String>,
    /// Redis Cluster nodes (comma-separated redis:// URLs), instead of --url.
    #[arg(
        long,
        env = "REDIS_CLUSTER",
        hide_env_values = true,
        value_delimiter = ',',
        global = true
    )]
    cluster: Vec<String>,
    /// How long to wait for a connection before failing.
    #[arg(long, value_parser = duration, default_value = "5s", global = true)]
    connect_timeout: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command while holding a lock; release it when the command exits.
    #[command(after_help = "\
Examples:
  redmutex run nightly-report -- ./report.sh --full
  redmutex run --no-wait deploy -- make deploy       # exit 75 at once if held
  redmutex run --wait 10m --lease 1m backup -- pg_dump -f /backup/db.sql
  redmutex run --token-env FENCE ledger -- ./apply.sh  # $FENCE: a fencing token

The lock is renewed while the command runs, so a long command keeps it. If redmutex
dies (SIGKILL, a crashed host), the lock frees itself within --lease. SIGINT, SIGTERM,
SIGHUP and SIGQUIT sent to redmutex are passed on to the command; the lock is released
once it exits. If the lease is lost meanwhile (Redis lost it, or could not be reached
for a whole lease), another holder may start: the command gets --on-lost (SIGTERM by
default) and redmutex exits with 76 whatever the command's status.")]
    Run(run::RunArgs),
    /// Show who holds locks, for how long, and who waits.
    #[command(after_help = "\
Examples:
  redmutex status nightly-report deploy
  redmutex status --json deploy | jq '.[0].holders'")]
    Status {
        /// The lock names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the locks (and read-write locks, semaphores, latches) of the prefix.
    #[command(after_help = "\
Examples:
  redmutex list
  redmutex list 'deploy-*' --json")]
    List {
        /// A glob on the names (`*`, `?`, `[abc]`).
        #[arg(default_value = "*")]
        pattern: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Free a lock whoever holds it (a crashed holder's): prints what it removed.
    #[command(after_help = "\
Example:
  redmutex unlock --force nightly-report

The former holder is not stopped; its own release later fails. A key that is not a
redmutex lock is refused and left as it is (exit 65).")]
    Unlock {
        /// Required: freeing someone else's lock is a deliberate act.
        #[arg(long, required = true)]
        force: bool,
        /// The lock name.
        name: String,
    },
    /// Block until a lock is free (pub/sub, no polling), then exit 0.
    #[command(after_help = "\
Examples:
  redmutex wait deploy && ./smoke-test.sh
  redmutex wait --wait 30s deploy || echo 'still deploying'

It waits its turn like any waiter, takes the lock and releases it at once: it returns
once nobody held it for an instant, so a waiter queued before it goes first.")]
    Wait {
        /// The lock name.
        name: String,
        /// Give up after this long (exit 75); default: wait as long as it takes.
        #[arg(long, value_parser = duration)]
        wait: Option<Duration>,
    },
}

/// `500ms`, `30s`, `5m`, `1h 30m`: humantime's format.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 5m)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run(args) => run::run(&cli.connection, args),
        Command::Status { names, json } => connect(&cli.connection, None).and_then(|c| {
            let mut found = Vec::new();
            for name in &names {
                let info = c.inspect(name.as_str())?;
                found.push((name.clone(), info));
            }
            show::status(&found, json);
            Ok(0)
        }),
        Command::List { pattern, json } => connect(&cli.connection, None).and_then(|c| {
            let found = c.list(&pattern)?;
            show::list(&found, json);
            Ok(0)
        }),
        Command::Unlock { name, .. } => connect(&cli.connection, None).and_then(|c| {
            let before = c.inspect(name.as_str())?;
            if c.lock(name.as_str()).force_unlock()? {
                show::removed(&name, &before);
            } else {
                println!("{name}: not locked; nothing removed");
            }
            Ok(0)
        }),
        Command::Wait { name, wait } => connect(&cli.connection, None).and_then(|c| {
            let lock = c.lock(name.as_str());
            let guard = match wait {
                Some(wait) => lock.try_lock_for(wait)?,
                None => Some(lock.lock()?),
            };
            match guard {
                Some(guard) => {
                    guard.unlock()?;
                    Ok(0)
                }
                None => {
                    eprintln!(
                        "redmutex: {name} was still held after {}",
                        humantime::format_duration(wait.unwrap_or_default())
                    );
                    Ok(NOT_ACQUIRED)
                }
            }
        }),
    };
    ExitCode::from(outcome.unwrap_or_else(|e| fail(&e)))
}

/// A client for `connection`, with `lease` as its watchdog timeout when given.
pub(crate) fn connect(connection: &Connection, lease: Option<Duration>) -> Result<Client, Error> {
    let mut builder = Client::builder()
        .url(connection.url.as_str())
        .key_prefix(connection.prefix.as_str())
        .connect_timeout(connection.connect_timeout);
    if let Some(service) = &connection.service {
        builder = builder.sentinel(&connection.sentinel, service.as_str());
    }
    if !connection.cluster.is_empty() {
        builder = builder.cluster(&connection.cluster);
    }
    if let Some(lease) = lease {
        // A renewal must be able to give up well within the lease.
        builder = builder
            .watchdog_timeout(lease)
            .command_timeout((lease / 3).min(Duration::from_secs(3)));
    }
    builder.build()
}

/// Reports `e` and returns the exit code for it.
pub(crate) fn fail(e: &Error) -> u8 {
    eprintln!("redmutex: {e}");
    match e {
        Error::InvalidName(_) | Error::InvalidArgument(_) => USAGE,
        Error::Redis(r) if r.code() == Some("WRONGTYPE") => NOT_A_LOCK,
        _ => UNAVAILABLE,
    }
}
