//! `redmutex wait`: until a lock is free.

use std::time::Duration;

use redmutex::{Error, LockKind, LockOptions};

use crate::connect::{connect, Connection};
use crate::output::warn;
use crate::signals::{Catcher, ACQUIRE_GRACE};
use crate::take::{deadline, failed, notice, stopped};

/// `redmutex wait`: takes the lock and gives it back at once, with signals caught around
/// the acquisition as `run` does, so that a Ctrl-C never leaves the lock held.
pub(crate) fn wait(
    connection: &Connection,
    name: &str,
    wait: Option<Duration>,
    conflict: u8,
    quiet: bool,
) -> Result<u8, Error> {
    let catcher = Catcher::install(name, ACQUIRE_GRACE)?;
    let client = connect(connection, None)?;
    let lock = client.lock(name);
    let waiting = notice(&client, name, LockKind::Lock, quiet);
    let options = LockOptions::new().cancellable(catcher.cancel());
    let guard = lock.try_lock_with(match wait.and_then(deadline) {
        Some(until) => options.wait_until(until),
        None => options,
    });
    drop(waiting);
    let signalled = catcher.settle();
    let guard = match (guard, signalled) {
        (Err(Error::Cancelled { .. }), Some(code)) => return Ok(stopped(name, code)),
        (Ok(guard), _) => guard,
        (Err(e), _) => return Ok(failed(&client, name, &e)),
    };
    match guard {
        Some(guard) => {
            guard.unlock()?;
            Ok(signalled.unwrap_or(0))
        }
        None => {
            if let Some(code) = signalled {
                return Ok(code);
            }
            warn(format_args!(
                "redmutex: {name} was still held after {}",
                humantime::format_duration(wait.unwrap_or_default())
            ));
            Ok(conflict)
        }
    }
}
