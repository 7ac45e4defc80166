//! `redmutex run`: a command run while the lock is held, through `__guard`, a small
//! process in between that puts the command in a process group of its own and kills that
//! group when redmutex dies, however it dies.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::str::FromStr;
use std::thread;

use clap::Args;
use crossbeam_channel::{bounded, never, select, unbounded, Receiver};
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::{getpid, Pid};
use redmutex::Error;
use signal_hook::consts::SIGTSTP;
use signal_hook::iterator::{Handle, Signals};

use crate::connect::{connect, Connection};
use crate::output::{fail, warn, why_lost, LEASE_LOST};
use crate::signals::{Catcher, ACQUIRE_GRACE, JOB};
use crate::take::{acquire, failed, kind_of, not_acquired, notice, stopped, Held, TakeArgs};

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    take: TakeArgs,
    /// Pass the hold's fencing token (a number larger than any earlier holder's) to the
    /// command in this environment variable.
    #[arg(long, value_name = "VAR",
          conflicts_with_all = ["fair", "semaphore", "shared", "exclusive"])]
    token_env: Option<String>,
    /// The signal the command gets if the lease is lost while it runs (TERM, KILL, INT,
    /// HUP, USR1, …), or `none` to let it run on.
    #[arg(long, value_name = "SIGNAL", default_value = "TERM", value_parser = on_lost)]
    on_lost: Lost,
    /// The command and its arguments: everything after the lock name (or after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

/// What to do to the command when the lease is lost.
#[derive(Clone, Copy)]
pub(crate) struct Lost(pub(crate) Option<Signal>);

pub(crate) fn on_lost(s: &str) -> Result<Lost, String> {
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

pub(crate) fn run(connection: &Connection, args: RunArgs, quiet: bool) -> Result<u8, Error> {
    let take = &args.take;
    // Caught before the lock is taken: a signal that arrives as it is taken must find
    // redmutex able to give it back, not end it with the lock held for a lease.
    let catcher = Catcher::install(&take.name, (take.lease / 3).min(ACQUIRE_GRACE))?;
    let client = connect(connection, Some(take.lease))?;
    let name = take.name.as_str();
    let waiting = notice(&client, name, kind_of(take), quiet);
    let held = acquire(&client, take, args.token_env.is_some(), catcher.cancel());
    drop(waiting);
    let signalled = catcher.settle();
    let held = match (held, signalled) {
        (Err(Error::Cancelled { .. }), Some(code)) => return Ok(stopped(name, code)),
        (Ok(held), _) => held,
        (Err(e), _) => return Ok(failed(&client, name, &e)),
    };
    let Some(held) = held else {
        if let Some(code) = signalled {
            return Ok(code);
        }
        return Ok(not_acquired(take));
    };
    if let Some(code) = signalled {
        warn(format_args!(
            "redmutex: a signal arrived as {name} was acquired; released, the command not run"
        ));
        if let Err(e) = held.unlock() {
            fail(&e);
        }
        return Ok(code);
    }
    // From here on a signal is passed on to the command, and redmutex waits for it.
    let outcome = supervise(&args, &held, &catcher.signals);
    drop(catcher);
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
        Err(Error::LeaseLost { .. } | Error::NotHeld { .. }) => Ok(LEASE_LOST),
        Err(e) => {
            // The command ran under the lock; only the release failed (it ends with its
            // lease): the command's status still tells what happened.
            warn(format_args!("redmutex: releasing {name} failed: {e}"));
            Ok(code)
        }
    }
}

/// Starts the command (through `__guard`) and waits for it, passing signals on and
/// watching the lease. The exit code, or `Err(code)` when it was not started.
///
/// Runs on the main thread: the guard's parent-death signal fires when the thread that
/// started it ends, and only the main thread lives as long as redmutex.
fn supervise(args: &RunArgs, held: &Held, signals: &Receiver<i32>) -> Result<u8, u8> {
    if let Ok(sig) = signals.try_recv() {
        // Asked to stop before the command started: it never will.
        warn(format_args!(
            "redmutex: signal {sig} before the command started"
        ));
        return Err(128u8.wrapping_add(sig as u8));
    }
    let (job, _closes_job) = catch_job_control()?;
    let (guard, group) = start_guard(args, held)?;
    let done = exited(group);
    wait_for_command(args, held, guard, group, signals, &job, &done)
}

/// Catches the job-control signals (`JOB`), which the returned channel delivers until the
/// [`Closes`] is dropped; `Err(71)` when they cannot be caught.
///
/// Ctrl-Z stops redmutex's group, the terminal's foreground job, and not the command's:
/// it is passed on, then redmutex stops itself (and so stops renewing, as a stopped
/// `flock` would not, but the command is stopped too); `fg` or `bg` continues redmutex,
/// which continues the command.
fn catch_job_control() -> Result<(Receiver<i32>, Closes), u8> {
    let (job_tx, job) = unbounded();
    let mut job_signals = Signals::new(JOB).map_err(|e| {
        warn(format_args!("redmutex: cannot catch job control: {e}"));
        71u8
    })?;
    let job_handle = job_signals.handle();
    thread::spawn(move || {
        for sig in job_signals.forever() {
            if job_tx.send(sig).is_err() {
                return;
            }
        }
    });
    Ok((job, Closes(job_handle)))
}

/// Starts `__guard`, which runs the command, as the leader of a process group of its own
/// (with the hold's fencing token in the environment if asked): the guard and the group's
/// id, or `Err(126)` when it cannot be started.
fn start_guard(args: &RunArgs, held: &Held) -> Result<(Child, Pid), u8> {
    // /proc/self/exe, not a path: the very binary running, even if replaced on disk since.
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("redmutex")
        .arg("__guard")
        .arg("--parent")
        .arg(std::process::id().to_string());
    if let Lost(Some(sig)) = args.on_lost {
        command.arg("--catch").arg(sig.as_str());
    }
    command.arg("--").args(&args.command).process_group(0);
    if let (Some(var), Held::Fenced(guard)) = (&args.token_env, held) {
        command.env(var, guard.token().to_string());
    }
    let guard = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            warn(format_args!("redmutex: cannot start the command: {e}"));
            return Err(126);
        }
    };
    // The guard leads the command's process group: its pid is the group's id.
    let group = Pid::from_raw(guard.id() as i32);
    tracing::trace!(
        "the command started in process group {group}: {:?}",
        args.command
    );
    Ok((guard, group))
}

/// A channel ready once the guard leading `group` has exited, which leaves it unreaped:
/// until [`wait_for_command`] reaps it, after its last signal, the guard's pid (the
/// group's id) cannot be given to another process.
fn exited(group: Pid) -> Receiver<()> {
    let (done_tx, done) = bounded(1);
    thread::spawn(move || loop {
        match waitid(Id::Pid(group), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(Errno::EINTR) => continue,
            _ => {
                let _ = done_tx.send(());
                return;
            }
        }
    });
    done
}

/// Waits for the command to exit, passing the signals caught and job control on to its
/// `group` and sending it `--on-lost`'s signal once the lease is lost: its exit code, or
/// [`LEASE_LOST`] when the lease was lost while it ran.
fn wait_for_command(
    args: &RunArgs,
    held: &Held,
    mut guard: Child,
    group: Pid,
    signals: &Receiver<i32>,
    job: &Receiver<i32>,
    done: &Receiver<()>,
) -> Result<u8, u8> {
    // Told by the client the moment the lease is lost: no polling. (The lock is only
    // released after this loop, so the channel is ready for a loss alone.)
    let mut lease = held.lost();
    let mut lost = false;
    loop {
        select! {
            recv(done) -> _ => {
                // The one place that reaps: no signal is sent from here on.
                let code = match guard.wait() {
                    Ok(status) => code_of(status),
                    Err(e) => {
                        warn(format_args!("redmutex: waiting for the command failed: {e}"));
                        1
                    }
                };
                tracing::trace!("the command exited: {code}");
                if lost {
                    warn(format_args!(
                        "redmutex: the command exited with {code} after the lease was lost"
                    ));
                    return Ok(LEASE_LOST);
                }
                return Ok(code);
            }
            recv(signals) -> sig => {
                // The command is not in the terminal's foreground group, so a Ctrl-C
                // reaches only redmutex: every signal caught is passed on.
                if let Ok(Ok(sig)) = sig.map(Signal::try_from) {
                    tracing::trace!("{sig} passed on to the command");
                    signal(group, sig);
                }
            }
            recv(job) -> sig => {
                if sig == Ok(SIGTSTP) {
                    signal(group, Signal::SIGTSTP);
                    let _ = kill(getpid(), Signal::SIGSTOP);
                } else {
                    signal(group, Signal::SIGCONT);
                }
            }
            recv(lease) -> _ => {
                // Ready for good once lost: looked at once.
                lease = never();
                if !lost {
                    lost = true;
                    warn(format_args!(
                        "redmutex: the lease of {} was lost while the command ran{}; another \
                         holder may run now",
                        args.take.name,
                        why_lost()
                    ));
                    if let Lost(Some(sig)) = args.on_lost {
                        signal(group, sig);
                    }
                }
            }
        }
    }
}

/// Closes a signal iterator when dropped, ending the thread that reads it.
struct Closes(Handle);

impl Drop for Closes {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Sends `sig` to the command's process group (the command, what it started, and the
/// guard, which survives the signals it is told of).
fn signal(group: Pid, sig: Signal) {
    if let Err(e) = killpg(group, sig) {
        if e != Errno::ESRCH {
            warn(format_args!(
                "redmutex: could not send {sig} to the command: {e}"
            ));
        }
    }
}

/// A shell's exit code for `status`: the code, or 128 + the signal that ended it.
pub(crate) fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => 1,
    }
}
