//! The command line: what redmutex takes, and its help text (the manual page is made
//! of it too).

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::connect::Connection;
use crate::parse::duration;
use crate::{guard, hold, latch, run};

/// What each exit code means: the manual's EXIT STATUS, and the end of `--help`.
pub(crate) const EXIT_STATUS: [(&str, &str); 11] = [
    ("0", "`hold` released on a signal; `wait` found the lock free; any other command did what it was asked"),
    ("the command's", "`run` exits with its command's code (128 + n when a signal n ended it)"),
    ("75", "the lock was not acquired in time (--no-wait, or --wait ran out); flock(1) exits 1 here: --conflict-exit-code N (-E N) picks the code, as flock's does"),
    ("76", "the lease was lost while held: another holder may have run meanwhile"),
    ("69", "Redis could not be reached, or refused"),
    ("65", "the name is in use as another kind (a lock, --shared/-x, -n, a latch: a name is one kind at a time), or a key holds something that is not a lock (or, with unlock --force, only a count-down latch)"),
    ("64", "a bad name or value"),
    ("141", "standard output was closed by its reader (as `| head` does)"),
    ("74", "standard output could not be written"),
    ("128 + n", "signal n ended redmutex before the command started"),
    ("2", "bad usage"),
];

/// `--help`'s list of exit codes, from [`EXIT_STATUS`].
fn exit_codes() -> String {
    let mut text = String::from("Exit codes:");
    for (code, meaning) in EXIT_STATUS {
        text.push_str(&format!("\n  {code:<14} {meaning}"));
    }
    text
}

/// The heading of -v and -q.
const OUTPUT: &str = "Output options";

/// A distributed flock(1) on Redis: reentrant hash locks, leases renewed by a watchdog
/// while held, and waiting by pub/sub.
#[derive(Parser)]
#[command(
    name = "redmutex",
    version,
    after_help = exit_codes(),
    override_usage = "redmutex [OPTIONS] <COMMAND>"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) connection: Connection,
    /// Show what the library does on standard error: -v its acquisitions, releases and
    /// retries; -vv also redmutex's own steps (where it connected, the command's start and
    /// exit), each acquisition's time, where each message comes from, and every crate's
    /// debug messages. Without -v or -q, RUST_LOG (e.g.
    /// `RUST_LOG=redmutex=debug`) picks the messages; by default only its warnings show.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = OUTPUT)]
    pub(crate) verbose: u8,
    /// No messages but errors: not the library's warnings, nor the note that says whom
    /// redmutex waits for.
    #[arg(
        short,
        long,
        global = true,
        conflicts_with = "verbose",
        help_heading = OUTPUT
    )]
    pub(crate) quiet: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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

In a script, go on only once it says `held` (a `&` alone races: the script would run
before the lock is held, or while another holds it):
  fifo=$(mktemp -u) && mkfifo \"$fifo\"
  redmutex hold --ready-fd 3 maintenance 3>\"$fifo\" & pid=$!
  if read -r ready < \"$fifo\"; then ./do-maintenance.sh; kill $pid; fi
  wait $pid; status=$?; rm -f \"$fifo\"   # 0: held, then released; 75: never held

It prints `held NAME` on standard output (or on --ready-fd) once the lock is held, keeps
renewing it, and releases it on SIGINT, SIGTERM, SIGHUP or SIGQUIT (exit 0). If it is
not held, nothing is printed and the descriptor closes as redmutex exits, so `read`
fails. If the lease is lost meanwhile it says so and exits 76."
    )]
    Hold(hold::HoldArgs),
    /// Show who holds locks, for how long, and who waits (every lock, without a NAME).
    #[command(
        override_usage = "redmutex status [OPTIONS] [NAME]...",
        after_help = "\
Examples:
  redmutex status nightly-report deploy
  redmutex status                  # every lock of the prefix, as `list` shows them
  redmutex status --json deploy | jq '.objects[0].holders'

A NAME with nothing under it shows as free. Without a NAME, status shows every object of
the prefix (`list`)."
    )]
    Status {
        /// The lock names; none: every lock of the prefix, as `list`.
        #[arg(value_name = "NAME")]
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
        #[arg(long)]
        force: bool,
        /// The lock name.
        name: String,
    },
    /// (Internal) what `run` starts: runs the command in its process group and kills
    /// that group if redmutex dies.
    #[command(name = "__guard", hide = true)]
    Guard(guard::GuardArgs),
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
        /// The exit code when --wait runs out, as flock's -E (default 75).
        #[arg(short = 'E', long, value_name = "N", default_value_t = crate::output::NOT_ACQUIRED)]
        conflict_exit_code: u8,
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
    /// Print the manual page (roff): `redmutex man | man -l -`; every command and its
    /// options are on it. `redmutex man run` prints the page of `run` alone.
    #[command(after_help = "\
Examples:
  redmutex man | man -l -
  redmutex man > /usr/local/share/man/man1/redmutex.1
  redmutex man latch wait | man -l -")]
    Man {
        /// A command (and a `latch` command): its page alone.
        #[arg(value_name = "COMMAND")]
        command: Vec<String>,
    },
}
