//! `redmutex`: a distributed `flock(1)` on Redis, for shells, cron jobs and operators.

#![forbid(unsafe_code)]

// `run` binds the command to redmutex's life with Linux's parent-death signal and
// waitid(WNOWAIT), and restarts itself through /proc/self/exe.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "the redmutex command (feature `cli`) runs on Linux only; the library does not need it"
);

mod run;
mod show;

use std::fmt;
use std::io::{ErrorKind, Write};
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
/// Standard output was closed by its reader (`redmutex list | head -1`): what a shell
/// reports for a tool ended by SIGPIPE, 128 + 13.
pub(crate) const CLOSED_OUTPUT: u8 = 141;
/// Standard output could not be written for another reason (a full disk): EX_IOERR.
pub(crate) const OUTPUT_FAILED: u8 = 74;

const EXIT_CODES: &str = "\
Exit codes: the command's own with `run` (128 + n when a signal n ended it); 75 when the
lock was not acquired in time; 76 when its lease was lost while the command ran; 69 when
Redis could not be reached or refused; 65 when a key holds something that is not a lock
(or, with unlock --force, only a count-down latch); 64 for a bad name or value; 141 when
standard output was closed by its reader (as `| head` does), 74 when it could not be
written; 128 + n when signal n ended redmutex before the command started; 2 for bad
usage.";

/// A distributed flock(1) on Redis: reentrant hash locks, leases renewed by a watchdog
/// while held, and waiting by pub/sub.
#[derive(Parser)]
#[command(name = "redmutex", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    /// Show what the library does on standard error: -v its acquisitions, releases and
    /// retries, -vv everything of every crate. Without -v or -q, RUST_LOG (e.g.
    /// `RUST_LOG=redmutex=debug`) picks the messages; by default only its warnings show.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// No messages from the library, not even warnings (redmutex's own errors still show).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
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

The lock is renewed while the command runs, so a long command keeps it. The command
runs in a process group of its own: SIGINT, SIGTERM, SIGHUP and SIGQUIT that reach
redmutex (from kill, or from the terminal: Ctrl-C) are passed on to that whole group, and
the lock is released once the command exits. Ctrl-Z stops the command, then redmutex
(which then renews nothing: the lease may run out while stopped, and is then reported as
lost on `fg`); `fg` and `bg` continue both. As the command is not the terminal's
foreground job, a command that reads the terminal is stopped (SIGTTIN): give it its
input otherwise.

How each death ends:
  the command exits           the lock is released; its exit code is redmutex's
  redmutex gets SIGTERM etc.  passed on; released once the command exits
  a signal while waiting      not acquired (or released at once if it just was), the
                              command never starts; exit 128 + n
  redmutex is SIGKILLed       the command's whole process group gets SIGKILL at once;
                              the lock frees itself within --lease, after they died
  the host dies               the lock frees itself within --lease
  the lease is lost           (Redis lost it, or was unreachable for a whole lease)
                              another holder may start: the command gets --on-lost
                              (SIGTERM by default) and redmutex exits with 76
Processes the command started in a process group or session of their own (setsid,
daemons), or left running after it exited, are not the command's and are not stopped.")]
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

It frees every kind `status` shows held under the name: the lock (plain, fair or fenced
holds), every reader and the writer of the read-write lock, every permit held of the
semaphore (its number of permits stays); each is handed on to its waiters. The former
holders are not stopped; their own releases later fail. A count-down latch has no holder
and is left as it is (exit 65 when it is all the name has). A key that is not a redmutex
object is refused and nothing is changed (exit 65).")]
    Unlock {
        /// Required: freeing someone else's lock is a deliberate act.
        #[arg(long, required = true)]
        force: bool,
        /// The lock name.
        name: String,
    },
    /// (Internal) what `run` starts: runs the command in its process group and kills
    /// that group if redmutex dies.
    #[command(name = "__guard", hide = true)]
    Guard(run::GuardArgs),
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

/// By default the library's warnings only: not the pool's own reports of a refused
/// connection, which the error redmutex prints already says.
const QUIET_DEFAULT: &str = "redmutex=warn";

/// Shows the library's `tracing` events and `log` records on standard error, as `-v`/`-q`
/// or else RUST_LOG ask; by default its warnings only.
fn messages(verbose: u8, quiet: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let flags = match (quiet, verbose) {
        (true, _) => Some("off"),
        (false, 0) => None,
        (false, 1) => Some("redmutex=debug"),
        (false, _) => Some("debug,redmutex=trace"),
    };
    let filter = match flags {
        Some(directives) => EnvFilter::new(directives),
        None => match std::env::var("RUST_LOG") {
            Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives)
                .unwrap_or_else(|e| {
                    warn(format_args!("redmutex: ignoring RUST_LOG ({e})"));
                    EnvFilter::new(QUIET_DEFAULT)
                }),
            _ => EnvFilter::new(QUIET_DEFAULT),
        },
    };
    // (The fmt layer drops what stderr cannot take: a message never ends redmutex.)
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_timer(tracing_subscriber::fmt::time::Uptime::default())
        .with_env_filter(filter)
        .try_init();
}

/// `500ms`, `30s`, `5m`, `1h 30m`: humantime's format.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 5m)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    messages(cli.verbose, cli.quiet);
    let outcome = match cli.command {
        Command::Run(args) => run::run(&cli.connection, args),
        Command::Guard(args) => Ok(run::guard(args)),
        Command::Status { names, json } => connect(&cli.connection, None).and_then(|c| {
            let mut found = Vec::new();
            for name in &names {
                let info = c.inspect(name.as_str())?;
                found.push((name.clone(), info));
            }
            Ok(print(&show::status(&found, json)))
        }),
        Command::List { pattern, json } => connect(&cli.connection, None).and_then(|c| {
            let found = c.list(&pattern)?;
            Ok(print(&show::list(&found, json)))
        }),
        Command::Unlock { name, .. } => {
            connect(&cli.connection, None).and_then(|c| unlock(&c, &name))
        }
        Command::Wait { name, wait } => run::wait(&cli.connection, &name, wait),
    };
    ExitCode::from(outcome.unwrap_or_else(|e| fail(&e)))
}

/// `unlock --force`: frees every kind of `name` that can be held.
fn unlock(c: &Client, name: &str) -> Result<u8, Error> {
    let before = c.inspect(name)?;
    if let Some(foreign) = before.iter().find(|i| i.kind == "foreign") {
        // Refused before anything is freed (each script would refuse it too).
        warn(format_args!(
            "redmutex: WRONGTYPE {} holds data that is not a redmutex lock; nothing was changed",
            foreign.key
        ));
        return Ok(NOT_A_LOCK);
    }
    let freed = c.force_unlock(name)?;
    let latch = before.iter().find(|i| i.kind == "count-down latch");
    if freed.is_empty() {
        if let Some(latch) = latch {
            warn(format_args!(
                "redmutex: {name} is a count-down latch (count {}), which has no holder to \
                 free; left as it is",
                latch.count.unwrap_or(0)
            ));
            return Ok(NOT_A_LOCK);
        }
        return Ok(print(&format!("{name}: not locked; nothing removed\n")));
    }
    let mut text = show::removed(name, &freed, &before);
    if let Some(latch) = latch {
        text.push_str(&format!(
            "{name}: count-down latch (count {}) left as it is\n",
            latch.count.unwrap_or(0)
        ));
    }
    Ok(print(&text))
}

/// Writes `text` to standard output: 0, or the exit code when it could not (quietly for a
/// reader that went away, as `| head` does).
pub(crate) fn print(text: &str) -> u8 {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == ErrorKind::BrokenPipe => CLOSED_OUTPUT,
        Err(e) => {
            warn(format_args!("redmutex: writing the output failed: {e}"));
            OUTPUT_FAILED
        }
    }
}

/// Writes a line to standard error, or nothing if it is closed: a message must never end
/// redmutex (`eprintln!` would panic), least of all while it holds a lock.
pub(crate) fn warn(message: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
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
    warn(format_args!("redmutex: {e}"));
    match e {
        Error::InvalidName(_) | Error::InvalidArgument(_) => USAGE,
        Error::Redis { source: r, .. } if r.code() == Some("WRONGTYPE") => NOT_A_LOCK,
        _ => UNAVAILABLE,
    }
}
