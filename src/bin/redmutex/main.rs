//! `redmutex`: a distributed `flock(1)` on Redis, for shells, cron jobs and operators.

#![forbid(unsafe_code)]

// `run` binds the command to redmutex's life with Linux's parent-death signal and
// waitid(WNOWAIT), and restarts itself through /proc/self/exe.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "the redmutex command (feature `cli`) runs on Linux only; the library does not need it"
);

mod args;
mod connect;
mod guard;
mod hold;
mod latch;
mod man;
mod output;
mod parse;
mod run;
mod show;
mod signals;
mod take;
mod wait;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use redmutex::{Client, Error};

use args::{Cli, Command};
use connect::connect;
use output::{fail, messages, not_a_lock, print, warn, NOT_A_LOCK};

fn main() -> ExitCode {
    let cli = Cli::parse();
    messages(cli.verbose, cli.quiet);
    let quiet = cli.quiet;
    let outcome = match cli.command {
        Command::Run(args) => run::run(&cli.connection, args, quiet),
        Command::Hold(args) => hold::hold(&cli.connection, args, quiet),
        Command::Guard(args) => Ok(guard::guard(args)),
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
        Command::Unlock { name, force } => {
            if !force {
                // Said in words: clap's own error would only name the missing flag.
                let mut cli = Cli::command();
                cli.build();
                cli.find_subcommand_mut("unlock")
                    .expect("unlock is a command")
                    .error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        format!(
                            "unlock frees {name} whoever holds it (a crashed holder's, or a \
                             live one's, whose own release then fails): add --force to say \
                             that is meant, `redmutex unlock --force {name}`; `redmutex status \
                             {name}` shows who holds it"
                        ),
                    )
                    .exit()
            }
            connect(&cli.connection, None).and_then(|c| unlock(&c, &name))
        }
        Command::Wait {
            name,
            wait,
            conflict_exit_code,
        } => wait::wait(&cli.connection, &name, wait, conflict_exit_code, quiet),
        Command::Latch(command) => latch::latch(&cli.connection, command),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "redmutex", &mut out);
            Ok(print(&String::from_utf8_lossy(&out)))
        }
        Command::Man { command } => match man::manual(&command) {
            Ok(page) => Ok(print(&page)),
            Err(why) => Cli::command()
                .error(clap::error::ErrorKind::InvalidSubcommand, why)
                .exit(),
        },
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
