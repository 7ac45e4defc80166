//! `redmutex`: a distributed `flock(1)` on Redis, for shells, cron jobs and operators.

#![forbid(unsafe_code)]

// `run` binds the command to redmutex's life with Linux's parent-death signal and
// waitid(WNOWAIT), and restarts itself through /proc/self/exe.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "the redmutex command (feature `cli`) runs on Linux only; the library does not need it"
);

mod latch;
mod run;
mod show;

use std::fmt;
use std::io::{ErrorKind, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use redmutex::{Client, Error};

/// The lock was not acquired in time (`--no-wait`, or `--wait` ran out): EX_TEMPFAIL.
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// The lease was lost while the command ran: another holder may have run meanwhile.
pub(crate) const LEASE_LOST: u8 = 76;
/// Redis could not be reached, or refused: EX_UNAVAILABLE.
pub(crate) const UNAVAILABLE: u8 = 69;
/// A bad name or value the arguments' syntax could not catch: EX_USAGE.
pub(crate) const USAGE: u8 = 64;
/// The key holds something that is not a redmutex lock, or the name is in use as another
/// kind of lock: EX_DATAERR.
pub(crate) const NOT_A_LOCK: u8 = 65;
/// Standard output was closed by its reader (`redmutex list | head -1`): what a shell
/// reports for a tool ended by SIGPIPE, 128 + 13.
pub(crate) const CLOSED_OUTPUT: u8 = 141;
/// Standard output could not be written for another reason (a full disk): EX_IOERR.
pub(crate) const OUTPUT_FAILED: u8 = 74;

const EXIT_CODES: &str = "\
Exit codes: the command's own with `run` (128 + n when a signal n ended it); 0 when `hold`
released on a signal; 75 when the lock was not acquired in time; 76 when its lease was lost
while held; 69 when Redis could not be reached or refused; 65 when the name is in use as
another kind (a lock, --shared/-x, -n, a latch: a name is one kind at a time), when a key
holds something that is not a lock (or, with unlock --force, only a count-down latch); 64
for a bad name or value; 141 when standard output was closed by its reader (as `| head` does), 74 when it
could not be written; 128 + n when signal n ended redmutex before the command started; 2
for bad usage.";

/// The heading of the options every command takes.
const CONNECTION: &str = "Connection options";
/// The heading of -v and -q.
const OUTPUT: &str = "Output options";

/// A distributed flock(1) on Redis: reentrant hash locks, leases renewed by a watchdog
/// while held, and waiting by pub/sub.
#[derive(Parser)]
#[command(
    name = "redmutex",
    version,
    after_help = EXIT_CODES,
    override_usage = "redmutex [OPTIONS] <COMMAND>"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    connection: Connection,
    /// Show what the library does on standard error: -v its acquisitions, releases and
    /// retries, -vv everything of every crate. Without -v or -q, RUST_LOG (e.g.
    /// `RUST_LOG=redmutex=debug`) picks the messages; by default only its warnings show.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = OUTPUT)]
    verbose: u8,
    /// No messages but errors: not the library's warnings, nor the note that says whom
    /// redmutex waits for.
    #[arg(
        short,
        long,
        global = true,
        conflicts_with = "verbose",
        help_heading = OUTPUT
    )]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where Redis is. Passwords in URLs are never printed; no value from the environment is
/// shown in the help.
#[derive(Args)]
#[command(next_help_heading = CONNECTION)]
pub(crate) struct Connection {
    /// The Redis server: redis://[user:password@]host[:port][/db], or rediss:// for TLS
    /// [default: redis://127.0.0.1:6379/].
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    url: Option<String>,
    /// The namespace of every key and channel: the same as the programs that share the
    /// locks use [default: redmutex:].
    #[arg(long, env = "REDMUTEX_PREFIX", hide_env_values = true, global = true)]
    prefix: Option<String>,
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
    #[arg(
        long,
        env = "REDIS_SENTINEL_SERVICE",
        hide_env_values = true,
        global = true
    )]
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
    /// How long to wait for Redis to answer a connection before failing (a refused
    /// connection fails at once).
    #[arg(long, value_parser = connect_timeout, default_value = "5s", global = true)]
    connect_timeout: Duration,
}

impl Connection {
    fn url(&self) -> &str {
        self.url.as_deref().unwrap_or(DEFAULT_URL)
    }

    fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX)
    }
}

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";
const DEFAULT_PREFIX: &str = "redmutex:";

#[derive(Subcommand)]
enum Command {
    /// Run a command while holding a lock; release it when the command exits.
    #[command(
        override_usage = "redmutex run [OPTIONS] <NAME> [--] <COMMAND>...",
        after_help = "\
Examples:
  redmutex run nightly-report ./report.sh --full
  redmutex run -n 3 encoders ffmpeg -i in.mov out.mp4  # one of 3 permits
  redmutex run --shared schema ./read-only-job.sh      # readers run side by side
  redmutex run -x schema ./migrate.sh                  # alone: no --shared meanwhile
  redmutex run --no-wait deploy make deploy            # exit 75 at once if held
  redmutex run -w 10m -l 1m backup -- pg_dump -f /backup/db.sql
  redmutex run --token-env FENCE ledger ./apply.sh     # $FENCE: a fencing token

Everything after the lock name is the command (its own options included); `--` before
it still works. The lock is renewed while the command runs, so a long command keeps it.
A name is one kind at a time: one held as a lock, by --shared/-x, by -n or by a counting
latch is refused to the others at once (exit 65).
After a second of waiting, redmutex says on standard error whom it waits for (-q: not).
The command runs in a process group of its own: SIGINT, SIGTERM, SIGHUP and SIGQUIT that
reach redmutex (from kill, or from the terminal: Ctrl-C) are passed on to that whole
group, and the lock is released once the command exits. Ctrl-Z stops the command, then
redmutex (which then renews nothing: the lease may run out while stopped, and is then
reported as lost on `fg`); `fg` and `bg` continue both. As the command is not the
terminal's foreground job, a command that reads the terminal is stopped (SIGTTIN): give
it its input otherwise.

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
daemons), or left running after it exited, are not the command's and are not stopped."
    )]
    Run(run::RunArgs),
    /// Hold a lock until SIGINT or SIGTERM (Ctrl-C), then release it and exit 0.
    #[command(
        override_usage = "redmutex hold [OPTIONS] <NAME>",
        after_help = "\
Examples:
  redmutex hold maintenance          # prints `held maintenance`; Ctrl-C releases
  redmutex hold -n 2 --no-wait slots & pid=$!; ...; kill $pid

It prints `held NAME` on standard output once the lock is held, keeps renewing it, and
releases it on SIGINT, SIGTERM, SIGHUP or SIGQUIT (exit 0). If the lease is lost meanwhile
it says so and exits 76."
    )]
    Hold(run::HoldArgs),
    /// Show who holds locks, for how long, and who waits.
    #[command(
        override_usage = "redmutex status [OPTIONS] <NAME>...",
        after_help = "\
Examples:
  redmutex status nightly-report deploy
  redmutex status --json deploy | jq '.objects[0].holders'"
    )]
    Status {
        /// The lock names.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Print JSON (schema 1, see docs/cli.md) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the locks (and read-write locks, semaphores, latches) of the prefix.
    #[command(
        override_usage = "redmutex list [OPTIONS] [PATTERN]",
        after_help = "\
Examples:
  redmutex list
  redmutex list 'deploy-*' --json

On a Redis Cluster every primary is walked."
    )]
    List {
        /// A glob on the names (`*`, `?`, `[abc]`).
        #[arg(default_value = "*")]
        pattern: String,
        /// Print JSON (schema 1, see docs/cli.md) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Free a lock whoever holds it (a crashed holder's): prints what it removed.
    #[command(
        override_usage = "redmutex unlock --force [OPTIONS] <NAME>",
        after_help = "\
Example:
  redmutex unlock --force nightly-report

It frees every kind `status` shows held under the name: the lock (plain, fair or fenced
holds), every reader and the writer of the read-write lock, every permit held of the
semaphore (its number of permits stays); each is handed on to its waiters. The former
holders are not stopped; their own releases later fail. A count-down latch has no holder
and is left as it is (exit 65 when it is all the name has). A key that is not a redmutex
object is refused and nothing is changed (exit 65)."
    )]
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
    #[command(
        override_usage = "redmutex wait [OPTIONS] <NAME>",
        after_help = "\
Examples:
  redmutex wait deploy && ./smoke-test.sh
  redmutex wait -w 30s deploy || echo 'still deploying'

It waits its turn like any waiter, takes the lock and releases it at once: it returns
once nobody held it for an instant, so a waiter queued before it goes first."
    )]
    Wait {
        /// The lock name.
        name: String,
        /// Give up after this long (exit 75); default: wait as long as it takes.
        #[arg(short, long, value_parser = duration)]
        wait: Option<Duration>,
    },
    /// Count-down latches: one process waits until others have counted down to zero.
    #[command(subcommand)]
    Latch(latch::LatchCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "\
Examples:
  redmutex completions bash > /etc/bash_completion.d/redmutex
  redmutex completions zsh > \"${fpath[1]}/_redmutex\"")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `redmutex man | man -l -`.
    Man,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    messages(cli.verbose, cli.quiet);
    let quiet = cli.quiet;
    let outcome = match cli.command {
        Command::Run(args) => run::run(&cli.connection, args, quiet),
        Command::Hold(args) => run::hold(&cli.connection, args, quiet),
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
        Command::Wait { name, wait } => run::wait(&cli.connection, &name, wait, quiet),
        Command::Latch(command) => latch::latch(&cli.connection, command),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "redmutex", &mut out);
            Ok(print(&String::from_utf8_lossy(&out)))
        }
        Command::Man => {
            let mut out = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut out) {
                Ok(()) => Ok(print(&String::from_utf8_lossy(&out))),
                Err(e) => {
                    warn(format_args!("redmutex: rendering the manual failed: {e}"));
                    Ok(OUTPUT_FAILED)
                }
            }
        }
    };
    ExitCode::from(outcome.unwrap_or_else(|e| fail(&e)))
}

/// `unlock --force`: frees every kind of `name` that can be held.
fn unlock(c: &Client, name: &str) -> Result<u8, Error> {
    let before = c.inspect(name)?;
    if let Some(foreign) = before.iter().find(|i| i.kind == "foreign") {
        // Refused before anything is freed (each script would refuse it too).
        return Ok(not_a_lock(&foreign.key));
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

/// Says that `key` holds someone else's data, and returns the exit code for it.
pub(crate) fn not_a_lock(key: &str) -> u8 {
    warn(format_args!(
        "redmutex: WRONGTYPE {key} holds data that is not a redmutex lock; nothing was changed"
    ));
    NOT_A_LOCK
}

/// Reports a WRONGTYPE refusal of an operation on `name` as `unlock --force` does (naming
/// the key, not the script that met it); `None` for any other error.
pub(crate) fn refused_as_not_a_lock(client: &Client, name: &str, e: &Error) -> Option<u8> {
    match e {
        Error::Redis { source, .. } if wrong_type(source) => {
            let key = client
                .inspect(name)
                .ok()
                .and_then(|found| found.into_iter().find(|i| i.kind == "foreign"))
                .map_or_else(|| format!("a key of {name}"), |i| i.key);
            Some(not_a_lock(&key))
        }
        _ => None,
    }
}

/// Whether Redis refused because a key holds another type. Redis 7 gives a script's
/// WRONGTYPE its own code; Redis 6.2 wraps it in "Error running script ...: WRONGTYPE
/// Operation against a key holding the wrong kind of value".
fn wrong_type(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
        || e.detail().is_some_and(|d| {
            d.contains("WRONGTYPE Operation against a key holding the wrong kind of value")
        })
}

/// The most the library records beside a hold.
const METADATA_MAX: usize = 1024;

/// The most of the host or the user a record keeps, in bytes: a field from the
/// environment may be any length, and the command line must keep room.
const FIELD_MAX: usize = 128;

/// What redmutex records beside each hold it takes, for `status` and `list` (and anyone's
/// `Client::inspect`): a JSON object with the host, the pid, the user and the command line
/// (its last arguments cut, and "…" added, to stay within the library's 1 KiB).
pub(crate) fn metadata() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    // Passwords in URLs (--url, --sentinel and --cluster lists) are not recorded.
    let cmd: Vec<String> = std::env::args_os()
        .map(|a| {
            let a = a.to_string_lossy();
            if a.contains("://") {
                a.split(',').map(redact).collect::<Vec<_>>().join(",")
            } else {
                a.into_owned()
            }
        })
        .collect();
    let user = std::env::var("USER").ok();
    record(host, user, cmd)
}

/// [`metadata`]'s JSON of these fields, within [`METADATA_MAX`] bytes: the host and the
/// user cut to [`FIELD_MAX`] bytes each, then the command line's last arguments replaced
/// by "…", then (escapes can make a short field long) the host and the user halved until
/// it fits. Every round makes something shorter, so it ends.
fn record(mut host: String, mut user: Option<String>, mut cmd: Vec<String>) -> String {
    host = cut(&host, FIELD_MAX);
    user = user.map(|u| cut(&u, FIELD_MAX));
    loop {
        let text = serde_json::json!({
            "host": host,
            "pid": std::process::id(),
            "user": user,
            "cmd": cmd,
        })
        .to_string();
        if text.len() <= METADATA_MAX {
            return text;
        }
        // Cut from the end: the program and the lock name come first.
        if cmd.last().is_some_and(|a| a == "…") {
            cmd.pop();
        }
        if cmd.pop().is_some() {
            cmd.push("…".to_owned());
            continue;
        }
        let longest = match &mut user {
            Some(user) if user.len() > host.len() => user,
            _ => &mut host,
        };
        if longest.is_empty() {
            // Nothing left to cut (not reached: the rest is a few dozen bytes).
            return text;
        }
        if longest.len() <= 16 {
            longest.clear();
        } else {
            let whole = longest.trim_end_matches('…');
            *longest = cut(whole, whole.len() / 2);
        }
    }
}

/// `s` if it is at most `max` bytes, else its longest start of at most `max` bytes that
/// ends between characters, and "…".
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A client for `connection`, with `lease` as its watchdog timeout when given (then it
/// takes holds, and records [`metadata`] with each).
///
/// Redis is reached once first, outside the client: the client's pool treats a refused
/// connection as a server that may come back (a restart) and tries again until the
/// connect timeout, which suits a program that runs for days, not a command an operator
/// waits for.
pub(crate) fn connect(connection: &Connection, lease: Option<Duration>) -> Result<Client, Error> {
    let mut builder = Client::builder()
        .url(connection.url())
        .key_prefix(connection.prefix())
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
    if lease.is_some() {
        builder = builder.metadata(metadata());
    }
    let client = builder.build()?;
    probe(connection)?;
    Ok(client)
}

/// Connects to the first of the servers `connection` names that answers (the sentinels,
/// the cluster's nodes, or --url) and has it answer a PING, all within the connect
/// timeout; the last failure when none does.
fn probe(connection: &Connection) -> Result<(), Error> {
    let urls: Vec<&str> = if !connection.cluster.is_empty() {
        connection.cluster.iter().map(String::as_str).collect()
    } else if connection.service.is_some() {
        connection.sentinel.iter().map(String::as_str).collect()
    } else {
        vec![connection.url()]
    };
    let mut last = None;
    for url in urls {
        match ping(url, connection.connect_timeout) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some((url, e)),
        }
    }
    match last {
        None => Ok(()),
        Some((url, e)) => Err(Error::InvalidArgument(format!(
            "{}{}: {e}",
            UNREACHABLE,
            redact(url)
        ))),
    }
}

/// The library's names for what the user gave as flags, in its `InvalidArgument` texts.
const FLAGS: [(&str, &str); 6] = [
    ("key_prefix", "--prefix"),
    ("bad redis url", "bad --url"),
    ("bad sentinel url", "bad --sentinel url"),
    ("bad cluster node url", "bad --cluster url"),
    ("watchdog_timeout", "--lease"),
    ("connect_timeout", "--connect-timeout"),
];

/// How an error of [`probe`] begins: [`fail`] knows it by this.
const UNREACHABLE: &str = "cannot reach redis at ";

fn ping(url: &str, timeout: Duration) -> redis::RedisResult<()> {
    use redis::IntoConnectionInfo;
    let started = std::time::Instant::now();
    let info = url.into_connection_info()?;
    // Without CLIENT SETINFO, whose replies redis-rs would wait for with the whole
    // timeout each.
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let info = info.set_redis_settings(settings);
    let mut con = redis::Client::open(info)?.get_connection_with_timeout(timeout)?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    con.set_read_timeout(Some(left))?;
    con.set_write_timeout(Some(left))?;
    redis::cmd("PING").query::<()>(&mut con)
}

/// `url` with its password (if any) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

/// Reports `e` and returns the exit code for it.
pub(crate) fn fail(e: &Error) -> u8 {
    if let Error::InvalidArgument(why) = e {
        if why.starts_with(UNREACHABLE) {
            warn(format_args!("redmutex: {why}"));
            return UNAVAILABLE;
        }
        // The library names its settings; the user wrote flags.
        let mut said = why.clone();
        for (field, flag) in FLAGS {
            said = said.replace(field, flag);
        }
        warn(format_args!("redmutex: {said}"));
        return USAGE;
    }
    if let Error::WrongKind { in_use, .. } = e {
        let how = match *in_use {
            "lock" => "`redmutex run NAME`, --fair, --token-env",
            "read-write lock" => "--shared or -x",
            "semaphore" => "-n",
            "count-down latch" => "`redmutex latch`",
            _ => "another kind",
        };
        warn(format_args!(
            "redmutex: {} is in use as a {in_use} ({how}); not taken: a name is one kind at a \
             time",
            e.lock_name().unwrap_or("the name")
        ));
        return NOT_A_LOCK;
    }
    warn(format_args!("redmutex: {e}"));
    match e {
        Error::InvalidName(_) | Error::InvalidArgument(_) => USAGE,
        Error::Redis { source: r, .. } if wrong_type(r) => NOT_A_LOCK,
        _ => UNAVAILABLE,
    }
}

/// `500ms`, `30s`, `5m`, `1h 30m`: humantime's format.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 5m)"))
}

/// The longest lease the library takes (ten years).
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `--lease`: the library's bounds on a watchdog timeout, said of the flag.
pub(crate) fn lease(s: &str) -> Result<Duration, String> {
    let lease = duration(s)?;
    if lease < Duration::from_millis(3) {
        return Err("--lease must be at least 3ms".to_owned());
    }
    if lease > MAX_LEASE {
        return Err("--lease must be at most 10 years".to_owned());
    }
    Ok(lease)
}

fn connect_timeout(s: &str) -> Result<Duration, String> {
    let timeout = duration(s)?;
    if timeout.is_zero() {
        return Err("--connect-timeout must be longer than zero".to_owned());
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_any_fields_fit_and_cut_between_characters() {
        let args = |n: usize| -> Vec<String> {
            ["redmutex", "run", "name"]
                .iter()
                .map(|s| s.to_string())
                .chain((0..n).map(|i| format!("arg{i}")))
                .collect()
        };
        for (host, user, cmd) in [
            ("h".to_owned(), Some("u".repeat(2100)), args(3)),
            ("h".to_owned(), Some("é".repeat(1500)), args(3)),
            ("h".to_owned(), Some("\u{1}".repeat(5000)), args(500)),
            ("\u{1}".repeat(5000), Some("\u{1}".repeat(5000)), args(0)),
            ("h".repeat(100_000), None, vec!["x".repeat(5000)]),
            ("h".to_owned(), Some(String::new()), args(1000)),
        ] {
            let text = record(host, user, cmd);
            assert!(text.len() <= METADATA_MAX, "{}", text.len());
            serde_json::from_str::<serde_json::Value>(&text).unwrap();
        }
        let text = record("h".into(), Some("é".repeat(1500)), args(1));
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["user"], format!("{}…", "é".repeat(FIELD_MAX / 2)));
        assert_eq!(doc["cmd"][2], "name");
        assert_eq!(cut("aé", 2), "a…");
        assert_eq!(cut("abc", 3), "abc");
    }
}
