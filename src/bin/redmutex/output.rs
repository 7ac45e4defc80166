//! What redmutex says: on standard output, on standard error (its own words and the
//! library's), and in its exit code.

use std::fmt;
use std::io::{ErrorKind, Write};

use redmutex::{Client, Error, LockKind};

use crate::connect::UNREACHABLE;

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

/// By default the library's warnings only: not the pool's own reports of a refused
/// connection, which the error redmutex prints already says.
const QUIET_DEFAULT: &str = "redmutex=warn";

/// Shows the library's `tracing` events (and the `log` records of the crates under it) on
/// standard error, as `-v`/`-q` or else RUST_LOG ask; by default its warnings only.
pub(crate) fn messages(verbose: u8, quiet: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
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
    // -vv: also where each message comes from (crate, module, thread), each acquisition's
    // span as it closes with its time, and redmutex's own steps (trace level).
    let more = !quiet && verbose >= 2;
    let spans = if more {
        tracing_subscriber::fmt::format::FmtSpan::CLOSE
    } else {
        tracing_subscriber::fmt::format::FmtSpan::NONE
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(more)
        .with_thread_names(more)
        .with_span_events(spans)
        .with_timer(tracing_subscriber::fmt::time::Uptime::default())
        .with_env_filter(filter)
        .finish()
        .with(SaidItself)
        .try_init();
}

/// What redmutex says of why a hold was lost, by the `reason` of the library's `lease lost`
/// event (`LossReason` in snake case).
fn why(reason: &str) -> String {
    match reason {
        "lease_expired" => "its lease ran out",
        "deleted" => "Redis no longer had it: force-unlocked, deleted, or lost by Redis",
        "server_lost" => "a failover lost it",
        "renewal_failed" => "no renewal reached Redis within the lease",
        "max_hold" => "it reached its max hold",
        "client_dropped" => "nothing renewed it any more",
        other => other,
    }
    .to_owned()
}

/// Why the library said the hold was lost, once [`SaidItself`] kept its warning back.
static WHY_LOST: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// ` (why)` for redmutex's own line on a lost lease, or nothing if the library did not
/// say (with -q).
pub(crate) fn why_lost() -> String {
    match &*WHY_LOST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        Some(why) => format!(" ({why})"),
        None => String::new(),
    }
}

/// Keeps back the library's `lease lost` warning (noting its reason), and its `pub/sub
/// channel refused` (the NoPermission error that follows says it). `run` and `hold` say
/// it themselves, naming the lock as the user did and what happens next, so that a lost
/// lease is said once, the library's why included. The event is told apart by what the
/// library documents of it (src/runtime/telemetry.rs): target `redmutex`, level WARN,
/// message `lease lost`, a `reason` field; the library says it once per hold, before the
/// guard is told, so the why is noted before redmutex asks for it.
struct SaidItself;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SaidItself {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::WARN || meta.target() != "redmutex" {
            return true;
        }
        if meta.fields().field("channel").is_some() {
            // The library's "pub/sub channel refused": the call that needed the channel
            // fails with NoPermission, whose message redmutex prints (user, server, the
            // ACL rule to give), so the warning would say it twice.
            let mut refusal = Loss::default();
            event.record(&mut refusal);
            return !refusal
                .message
                .starts_with("redmutex: pub/sub channel refused");
        }
        if meta.fields().field("reason").is_none() {
            return true;
        }
        let mut loss = Loss::default();
        event.record(&mut loss);
        if loss.message != "lease lost" {
            return true;
        }
        *WHY_LOST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why(&loss.reason));
        false
    }
}

/// A `lease lost` event's message and reason.
#[derive(Default)]
struct Loss {
    message: String,
    reason: String,
}

impl tracing::field::Visit for Loss {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "reason" => self.reason = format!("{value:?}"),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "reason" => self.reason = value.to_owned(),
            _ => {}
        }
    }
}

/// Writes `text` to standard output: 0, or the exit code when it could not (quietly for a
/// reader that went away, as `| head` does).
pub(crate) fn print(text: &str) -> u8 {
    write_out(&mut std::io::stdout().lock(), text, "the output")
}

/// Writes `text` to `out` (`what` names it in a failure): 0, or the exit code when it
/// could not, quietly for a reader that went away.
pub(crate) fn write_out(out: &mut impl Write, text: &str, what: &str) -> u8 {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == ErrorKind::BrokenPipe => CLOSED_OUTPUT,
        Err(e) => {
            warn(format_args!("redmutex: writing {what} failed: {e}"));
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
        Error::NotALock { .. } => {
            let key = client
                .inspect(name)
                .ok()
                .and_then(|found| found.into_iter().find(|i| i.kind == LockKind::Foreign))
                .map_or_else(|| format!("a key of {name}"), |i| i.key);
            Some(not_a_lock(&key))
        }
        _ => None,
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

/// Reports `e` and returns the exit code for it.
pub(crate) fn fail(e: &Error) -> u8 {
    if let Error::Redis { source, .. } = e {
        let why = source.to_string();
        if why.starts_with(UNREACHABLE) {
            warn(format_args!("redmutex: {why}"));
            return UNAVAILABLE;
        }
    }
    if let Error::InvalidArgument { reason, .. } = e {
        // The library names its settings; the user wrote flags. (No lock is named: the
        // CLI's bad arguments are settings of its client.)
        let mut said = reason.clone();
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
    if let Error::InvalidUrl {
        url, part, reason, ..
    } = e
    {
        // A sentinel's or cluster node's URL says so after it; any other came from --url
        // (or REDIS_URL, which stands for it).
        let flag = if url.ends_with("address)") {
            "url"
        } else {
            "--url"
        };
        warn(format_args!(
            "redmutex: bad {flag} {url}: the {part} {reason}"
        ));
        return USAGE;
    }
    warn(format_args!("redmutex: {e}"));
    match e {
        Error::InvalidName(_) | Error::InvalidArgument { .. } => USAGE,
        Error::NotALock { .. } => NOT_A_LOCK,
        _ => UNAVAILABLE,
    }
}
