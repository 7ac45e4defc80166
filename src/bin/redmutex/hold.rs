//! `redmutex hold`: a lock held until a signal, for an operator or a script.

use std::fs::{File, OpenOptions};

use clap::Args;
use crossbeam_channel::select;
use redmutex::Error;

use crate::connect::{connect, Connection};
use crate::output::{fail, print, warn, why_lost, write_out, LEASE_LOST, USAGE};
use crate::signals::{Catcher, ACQUIRE_GRACE};
use crate::take::{acquire, failed, kind_of, not_acquired, notice, stopped, TakeArgs};

#[derive(Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    take: TakeArgs,
    /// Write `held NAME` to this open file descriptor (not to standard output) once the
    /// lock is held: a script waits for that line before it goes on (see the example). It
    /// stays open until redmutex exits, which closes it without a line if it never held.
    #[arg(long, value_name = "FD")]
    ready_fd: Option<u32>,
}

/// Opens `--ready-fd`'s descriptor (through /proc: the binary forbids `unsafe`, which
/// adopting a raw descriptor takes); why not, as an error to print.
fn ready(fd: u32) -> Result<File, String> {
    OpenOptions::new()
        .append(true)
        .open(format!("/proc/self/fd/{fd}"))
        .map_err(|e| {
            format!(
                "redmutex: --ready-fd {fd}: descriptor {fd} is not open for writing ({e}); give \
                 it as the shell's {fd}>FILE or {fd}>&1"
            )
        })
}

/// Says `line` on `--ready-fd`, or else on standard output: 0, or the exit code.
fn say(ready: Option<File>, line: &str) -> u8 {
    let Some(mut file) = ready else {
        return print(line);
    };
    write_out(&mut file, line, "to --ready-fd")
}

/// `redmutex hold`: takes the lock, says `held NAME`, and keeps it until a signal (then
/// releases it: exit 0) or until its lease is lost (exit 76).
pub(crate) fn hold(connection: &Connection, args: HoldArgs, quiet: bool) -> Result<u8, Error> {
    let take = &args.take;
    let ready = match args.ready_fd.map(ready).transpose() {
        Ok(ready) => ready,
        Err(why) => {
            warn(format_args!("{why}"));
            return Ok(USAGE);
        }
    };
    let catcher = Catcher::install(&take.name, (take.lease / 3).min(ACQUIRE_GRACE))?;
    let client = connect(connection, Some(take.lease))?;
    let name = take.name.as_str();
    let waiting = notice(&client, name, kind_of(take), quiet);
    let held = acquire(&client, take, false, catcher.cancel());
    drop(waiting);
    let signalled = catcher.settle();
    let held = match (held, signalled) {
        (Err(Error::Cancelled { .. }), Some(code)) => return Ok(stopped(name, code)),
        (Ok(Some(held)), _) => held,
        (Ok(None), _) => return Ok(signalled.unwrap_or_else(|| not_acquired(take))),
        (Err(e), _) => return Ok(failed(&client, name, &e)),
    };
    if let Some(code) = signalled {
        // Asked to stop as it was taken: given back at once, as `run` does.
        if let Err(e) = held.unlock() {
            fail(&e);
        }
        return Ok(code);
    }
    let said = say(ready, &format!("held {name}\n"));
    if said != 0 {
        // Nobody reads what it says: released rather than held unseen.
        let _ = held.unlock();
        return Ok(said);
    }
    let lost = held.lost();
    select! {
        recv(catcher.signals) -> _ => {}
        recv(lost) -> _ => {}
    }
    drop(catcher);
    match held.unlock() {
        Ok(()) => Ok(0),
        Err(Error::LeaseLost { .. } | Error::NotHeld { .. }) => {
            warn(format_args!(
                "redmutex: the lease of {name} was lost while held{}; another holder may have it \
                 now",
                why_lost()
            ));
            Ok(LEASE_LOST)
        }
        Err(e) => Ok(fail(&e)),
    }
}
