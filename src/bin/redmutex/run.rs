//! `redmutex run`: a command run as a child while the lock is held.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::str::FromStr;
use std::thread;
use std::time::Duration;

use clap::Args;
use crossbeam_channel::{after, select, unbounded};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use redmutex::{Error, Fair, FencedGuard, Kind, Lock, LockGuard};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;

use crate::{connect, duration, fail, Connection, LEASE_LOST, NOT_ACQUIRED};

/// How often the lease is looked at while the command runs: a local check, no traffic.
const LEASE_CHECK: Duration = Duration::from_millis(100);

#[derive(Args)]
pub(crate) struct RunArgs {
    /// The lock name.
    name: String,
    /// Wait at most this long for the lock, then exit 75; default: as long as it takes.
    #[arg(long, value_parser = duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// How long the lock outlives a redmutex that died; renewed every third of it while
    /// the command runs.
    #[arg(long, value_parser = duration, default_value = "30s")]
    lease: Duration,
    /// First come, first served: wait in line behind every earlier waiter.
    #[arg(long, conflicts_with = "token_env")]
    fair: bool,
    /// Pass the hold's fencing token (a number larger than any earlier holder's) to the
    /// command in this environment variable.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// The signal the command gets if the lease is lost while it runs (TERM, KILL, INT,
    /// HUP, USR1, …), or `none` to let it run on.
    #[arg(long, value_name = "SIGNAL", default_value = "TERM", value_parser = on_lost)]
    on_lost: Lost,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// What to do to the command when the lease is lost.
#[derive(Clone, Copy)]
pub(crate) struct Lost(Option<Signal>);

fn on_lost(s: &str) -> Result<Lost, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Lost(None));
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    Signal::from_str(&name)
        .map(|sig| Lost(Some(sig)))
        .map_err(|_| format!("{s:?} is not a signal name (TERM, KILL, INT, HUP, USR1, …) or none"))
}

/// A held lock of any kind the command can be run under.
enum Held {
    Plain(LockGuard),
    Fair(LockGuard<Fair>),
    Fenced(FencedGuard),
}

impl Held {
    fn is_lease_lost(&self) -> bool {
        match self {
            Held::Plain(g) => g.is_lease_lost(),
            Held::Fair(g) => g.is_lease_lost(),
            Held::Fenced(g) => g.is_lease_lost(),
        }
    }

    fn unlock(self) -> Result<(), Error> {
        match self {
            Held::Plain(g) => g.unlock(),
            Held::Fair(g) => g.unlock(),
            Held::Fenced(g) => g.unlock(),
        }
    }
}

fn take<K: Kind>(lock: Lock<K>, args: &RunArgs) -> Result<Option<LockGuard<K>>, Error> {
    if args.no_wait {
        lock.try_lock()
    } else if let Some(wait) = args.wait {
        lock.try_lock_for(wait)
    } else {
        lock.lock().map(Some)
    }
}

pub(crate) fn run(connection: &Connection, args: RunArgs) -> Result<u8, Error> {
    let client = connect(connection, Some(args.lease))?;
    let name = args.name.as_str();
    let held = if args.token_env.is_some() {
        take(client.fenced_lock(name), &args)?.map(Held::Fenced)
    } else if args.fair {
        take(client.fair_lock(name), &args)?.map(Held::Fair)
    } else {
        take(client.lock(name), &args)?.map(Held::Plain)
    };
    let Some(held) = held else {
        let within = match args.wait {
            Some(wait) => format!("within {}", humantime::format_duration(wait)),
            None => "at once (--no-wait)".to_owned(),
        };
        eprintln!("redmutex: {name} is held by another; not acquired {within}");
        return Ok(NOT_ACQUIRED);
    };
    // From here on a signal must not end redmutex before the lock is released: it is
    // passed on to the command, and redmutex waits for the command.
    let (signal_tx, signals) = unbounded();
    let mut catcher = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])
        .map_err(Error::Thread)?;
    let catching = catcher.handle();
    thread::spawn(move || {
        for origin in catcher.forever() {
            if signal_tx.send(origin).is_err() {
                return;
            }
        }
    });
    let outcome = supervise(&args, &held, &signals);
    catching.close();
    let released = held.unlock();
    let code = match outcome {
        Ok(code) => code,
        Err(not_started) => {
            // The lock was held for nothing, and is free again.
            if let Err(e) = released {
                fail(&e);
            }
            return Ok(not_started);
        }
    };
    match released {
        Ok(()) => Ok(code),
        Err(Error::LeaseLost | Error::NotHeld) => Ok(LEASE_LOST),
        Err(e) => {
            // The command ran under the lock; only the release failed (it ends with its
            // lease): the command's status still tells what happened.
            eprintln!("redmutex: releasing {name} failed: {e}");
            Ok(code)
        }
    }
}

/// Starts the command and waits for it, passing signals on and watching the lease. The
/// exit code, or `Err(code)` when the command could not be started.
fn supervise(
    args: &RunArgs,
    held: &Held,
    signals: &crossbeam_channel::Receiver<signal_hook::iterator::exfiltrator::origin::Origin>,
) -> Result<u8, u8> {
    if let Ok(origin) = signals.try_recv() {
        // Asked to stop before the command started: it never will.
        eprintln!(
            "redmutex: signal {} before the command started",
            origin.signal
        );
        return Err(128 + origin.signal as u8);
    }
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut command = Command::new(program);
    command.args(rest);
    if let (Some(var), Held::Fenced(guard)) = (&args.token_env, held) {
        command.env(var, guard.token().to_string());
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("redmutex: cannot run {}: {e}", program.to_string_lossy());
            // As shells do: 127 not found, 126 found but not runnable.
            return Err(if e.kind() == ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let pid = Pid::from_raw(child.id() as i32);
    let (done_tx, done) = unbounded();
    thread::spawn(move || {
        let _ = done_tx.send(child.wait());
    });
    let mut lost = false;
    loop {
        select! {
            recv(done) -> status => {
                let status = status.expect("the waiting thread sends once");
                let code = match status {
                    Ok(status) => code_of(status),
                    Err(e) => {
                        eprintln!("redmutex: waiting for the command failed: {e}");
                        1
                    }
                };
                if lost {
                    eprintln!("redmutex: the command exited with {code} after the lease was lost");
                    return Ok(LEASE_LOST);
                }
                return Ok(code);
            }
            recv(signals) -> origin => {
                let Ok(origin) = origin else { continue };
                // A terminal's Ctrl-C reaches the whole process group, the command
                // included: only a signal sent to redmutex alone is passed on.
                if origin.process.is_some() {
                    if let Ok(sig) = Signal::try_from(origin.signal) {
                        signal(pid, sig);
                    }
                }
            }
            recv(after(LEASE_CHECK)) -> _ => {
                if !lost && held.is_lease_lost() {
                    lost = true;
                    eprintln!(
                        "redmutex: the lease of {} was lost while the command ran; another \
                         holder may run now",
                        args.name
                    );
                    if let Lost(Some(sig)) = args.on_lost {
                        signal(pid, sig);
                    }
                }
            }
        }
    }
}

/// Sends `sig` to the command; one that has just exited (and not been waited for yet)
/// is no failure.
fn signal(pid: Pid, sig: Signal) {
    if let Err(e) = kill(pid, sig) {
        if e != nix::errno::Errno::ESRCH {
            eprintln!("redmutex: could not send {sig} to the command: {e}");
        }
    }
}

/// A shell's exit code for `status`: the code, or 128 + the signal that ended it.
fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => 1,
    }
}
