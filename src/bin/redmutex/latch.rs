//! `redmutex latch`: count-down latches from the shell (one job waits for N others).

use std::time::Duration;

use clap::Subcommand;
use redmutex::{Error, LatchOptions};

use crate::connect::{connect, Connection};
use crate::output::{print, warn, NOT_ACQUIRED};
use crate::parse::{duration, MAX_LEASE};

#[derive(Subcommand)]
pub(crate) enum LatchCommand {
    /// Start counting: the latch opens after N count-downs (exit 75 if it already counts).
    #[command(override_usage = "redmutex latch set [OPTIONS] <NAME> <N>")]
    Set {
        /// The latch name.
        name: String,
        /// How many count-downs open it.
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        count: u64,
        /// The latch opens by itself after this long, whatever its count (the library's
        /// default, CountDownLatch::DEFAULT_EXPIRY).
        #[arg(long, value_parser = expire, default_value = DEFAULT_EXPIRE)]
        expire: Duration,
    },
    /// Count down by one; prints the count left (0: it opened).
    #[command(override_usage = "redmutex latch count-down [OPTIONS] <NAME>")]
    CountDown {
        /// The latch name.
        name: String,
    },
    /// Block until the latch is open (count 0, never set, or expired), then exit 0.
    #[command(override_usage = "redmutex latch wait [OPTIONS] <NAME>")]
    Wait {
        /// The latch name.
        name: String,
        /// Give up after this long (exit 75); default: wait as long as it takes.
        #[arg(short, long, value_parser = duration)]
        wait: Option<Duration>,
        /// The exit code when --wait runs out, as flock's -E (default 75).
        #[arg(short = 'E', long, value_name = "N", default_value_t = NOT_ACQUIRED)]
        conflict_exit_code: u8,
    },
}

/// `--expire`'s default: the library's own (a unit test holds them together).
const DEFAULT_EXPIRE: &str = "1h";

/// `--expire`: the library's bounds on a latch's expiry, said of the flag.
fn expire(s: &str) -> Result<Duration, String> {
    let expire = duration(s)?;
    if expire.is_zero() || expire > MAX_LEASE {
        return Err("--expire must be longer than zero and at most 10 years".to_owned());
    }
    Ok(expire)
}

pub(crate) fn latch(connection: &Connection, command: LatchCommand) -> Result<u8, Error> {
    let client = connect(connection, None)?;
    match command {
        LatchCommand::Set {
            name,
            count,
            expire,
        } => {
            if client
                .count_down_latch(name.as_str())
                .try_set_count_with(count, LatchOptions::new().expire_after(expire))?
            {
                Ok(print(&format!("{name}: counting down from {count}\n")))
            } else {
                warn(format_args!(
                    "redmutex: the latch {name} is counting already; left as it is"
                ));
                Ok(NOT_ACQUIRED)
            }
        }
        LatchCommand::CountDown { name } => {
            let left = client.count_down_latch(name.as_str()).count_down()?;
            Ok(print(&format!("{left}\n")))
        }
        LatchCommand::Wait {
            name,
            wait,
            conflict_exit_code,
        } => {
            let latch = client.count_down_latch(name.as_str());
            match wait {
                None => latch.wait().map(|()| 0),
                Some(wait) if latch.wait_for(wait)? => Ok(0),
                Some(wait) => {
                    warn(format_args!(
                        "redmutex: the latch {name} was still closed after {}",
                        humantime::format_duration(wait)
                    ));
                    Ok(conflict_exit_code)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// `latch set` without `--expire` sets what `try_set_count` would.
    #[test]
    fn the_default_expiry_is_the_librarys() {
        assert_eq!(
            super::expire(super::DEFAULT_EXPIRE),
            Ok(redmutex::CountDownLatch::DEFAULT_EXPIRY)
        );
    }
}
