//! `redmutex __guard`: the process between `run` and the command, which kills the
//! command's process group when redmutex dies.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::process::{Child, Command};
use std::thread;

use clap::Args;
use crossbeam_channel::{bounded, select, unbounded};
use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{killpg, pthread_sigmask, SigmaskHow, Signal};
use nix::unistd::{getpgrp, getppid, Pid};
use signal_hook::consts::FORBIDDEN;
use signal_hook::iterator::Signals;

use crate::output::warn;
use crate::run::{code_of, on_lost, Lost};
use crate::signals::{caught_set, CAUGHT};

/// `redmutex __guard`: started by `run` as the leader of a new process group; runs the
/// command in that group and exits with its status.
#[derive(Args)]
pub(crate) struct GuardArgs {
    /// The pid of the redmutex that started it.
    #[arg(long)]
    parent: i32,
    /// A signal besides INT, TERM, HUP and QUIT that redmutex may send the group (its
    /// --on-lost), which the guard must survive.
    #[arg(long, value_parser = on_lost)]
    catch: Option<Lost>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

/// The guard: the command must not outlive the redmutex that holds its lock, since once
/// the lock's lease ends another run may start. redmutex's death, whatever killed it,
/// reaches the guard as its parent-death signal (SIGTERM; the kernel sends it), and the
/// guard then SIGKILLs the whole group, itself included: the command and every process it
/// started in it (a shell's pipeline). SIGKILL, not a polite signal, because nothing is
/// left to wait for a command that lingers: the lock is already running out, and a
/// command that outlived it would run beside the next holder.
pub(crate) fn guard(args: GuardArgs) -> u8 {
    let mut signals = match catch_signals(&args) {
        Ok(signals) => signals,
        Err(code) => return code,
    };
    let parent = Pid::from_raw(args.parent);
    if getppid() != parent {
        // redmutex died before the parent-death signal was asked for, so it will never
        // come: the command must not start.
        return 128 + 9;
    }
    if let Some(sig) = signals.pending().next() {
        // redmutex passed a signal on before the command started: it never will.
        return 128u8.wrapping_add(sig as u8);
    }
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let child = match Command::new(program).args(rest).spawn() {
        Ok(child) => child,
        Err(e) => {
            warn(format_args!(
                "redmutex: cannot run {}: {e}",
                program.to_string_lossy()
            ));
            // As shells do: 127 not found, 126 found but not runnable.
            return if e.kind() == ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    wait_for_command(child, signals, parent)
}

/// Catches the signals redmutex may send the group (and `--catch`'s), unblocks them, and
/// asks for SIGTERM at redmutex's death: the caught signals, or `Err(71)` when any of it
/// fails.
fn catch_signals(args: &GuardArgs) -> Result<Signals, u8> {
    let mut caught = CAUGHT.to_vec();
    if let Some(Lost(Some(sig))) = args.catch {
        let sig = sig as i32;
        if !FORBIDDEN.contains(&sig) && !caught.contains(&sig) {
            caught.push(sig);
        }
    }
    // Caught, not ignored: a signal redmutex sends the group reaches the command and
    // leaves the guard in place, while the command starts with the default actions (exec
    // resets caught signals, not ignored ones).
    let signals = match Signals::new(&caught) {
        Ok(signals) => signals,
        Err(e) => {
            warn(format_args!("redmutex: cannot catch signals: {e}"));
            return Err(71);
        }
    };
    // Blocked in redmutex's threads (see Catcher::install), and so here: unblocked, for
    // the guard to get them and the command to start as if run from a shell.
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&caught_set()), None) {
        warn(format_args!("redmutex: cannot unblock signals: {e}"));
        return Err(71);
    }
    if let Err(e) = set_pdeathsig(Signal::SIGTERM) {
        warn(format_args!(
            "redmutex: cannot watch for redmutex's death: {e}"
        ));
        return Err(71);
    }
    Ok(signals)
}

/// Waits for the command `child` to exit, returning its exit code; a signal caught once
/// redmutex (`parent`) is gone kills the whole group instead.
fn wait_for_command(mut child: Child, mut signals: Signals, parent: Pid) -> u8 {
    let (done_tx, done) = bounded(1);
    thread::spawn(move || {
        let _ = done_tx.send(child.wait());
    });
    let (signal_tx, caught) = unbounded();
    let handle = signals.handle();
    thread::spawn(move || {
        for sig in signals.forever() {
            if signal_tx.send(sig).is_err() {
                return;
            }
        }
    });
    loop {
        select! {
            recv(done) -> status => {
                handle.close();
                return match status.expect("the waiting thread sends once") {
                    Ok(status) => code_of(status),
                    Err(e) => {
                        warn(format_args!("redmutex: waiting for the command failed: {e}"));
                        1
                    }
                };
            }
            recv(caught) -> _ => {
                // Passed on by redmutex (the command has it too, and decides), unless
                // redmutex is gone: then its parent is another process now.
                if getppid() != parent {
                    let _ = killpg(getpgrp(), Signal::SIGKILL);
                }
            }
        }
    }
}
