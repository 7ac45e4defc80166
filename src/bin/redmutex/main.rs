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
use redmutex::{Client, Error, LockKind};

use args::{Cli, Command};
use connect::connect;
use output::{fail, messages, not_a_lock, print, warn, NOT_A_LOCK};

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| usage_error(e));
    messages(cli.verbose, cli.quiet);
    let quiet = cli.quiet;
    let outcome = match cli.command {
        Command::Run(args) => run::run(&cli.connection, args, quiet),
        Command::Hold(args) => hold::hold(&cli.connection, args, quiet),
        Command::Guard(args) => Ok(guard::guard(args)),
        Command::Status { names, json } => connect(&cli.connection, None).and_then(|c| {
            if names.is_empty() {
                // Everything there is, as `list` shows it: what `git status` or
                // `systemctl status` without a name would do.
                return Ok(print(&show::list(&c.list("*")?, json)));
            }
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

/// Exits on a usage error, as clap says it, except for a word where a command goes: a lock
/// name first (`redmutex NAME COMMAND`, flock's order) is shown the `run` line that does
/// what was meant, rather than clap's nearest command (for `lock` or `mylock`: `unlock`,
/// which frees someone else's lock). A command's typo (`stauts`) is still named.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let Some(ContextValue::String(word)) = e.get(ContextKind::InvalidSubcommand) else {
        e.exit()
    };
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let rest = words_after_command(&args, word);
    let mut root = Cli::command();
    root.build();
    let mut text = format!("unrecognized subcommand {word:?}\n");
    let near = near_command(&root, word);
    if let Some(near) = near {
        text.push_str(&format!("\n  tip: a similar command exists: '{near}'"));
    }
    // A typo's options (`unlok --force x`) are no command to run.
    if near.is_some() && rest.first().is_some_and(|a| a.starts_with('-')) {
        text.push_str("\n  (`redmutex --help` lists the commands)");
        root.error(ErrorKind::InvalidSubcommand, text).exit()
    }
    let run = std::iter::once(word.as_str())
        .chain(rest.iter().map(String::as_str))
        .map(shell_word)
        .collect::<Vec<_>>()
        .join(" ");
    if rest.is_empty() {
        text.push_str(&format!(
            "\n  tip: to run a command while holding the lock {word}: `redmutex run {run} \
             COMMAND...`; to hold it until a signal: `redmutex hold {run}`"
        ));
    } else {
        text.push_str(&format!(
            "\n  tip: to run `{}` while holding the lock {word}: `redmutex run {run}`",
            rest.iter()
                .map(|a| shell_word(a))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    text.push_str("\n  (`redmutex --help` lists the commands)");
    root.error(ErrorKind::InvalidSubcommand, text).exit()
}

/// What follows `word`, the first argument that is not an option (or an option's value)
/// of redmutex itself.
fn words_after_command(args: &[String], word: &str) -> Vec<String> {
    let root = Cli::command();
    let takes_value = |arg: &str| {
        root.get_arguments().any(|a| {
            a.get_action().takes_values()
                && (a.get_long().is_some_and(|l| arg == format!("--{l}"))
                    || a.get_short().is_some_and(|s| arg == format!("-{s}")))
        })
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == word {
            return args[i + 1..].to_vec();
        }
        i += if takes_value(arg) { 2 } else { 1 };
    }
    Vec::new()
}

/// The command `word` is one slip away from (a letter wrong, missing, extra, or two
/// swapped), if any: further than that, a lock name is likelier than a typo.
fn near_command<'a>(root: &'a clap::Command, word: &str) -> Option<&'a str> {
    root.get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(clap::Command::get_name)
        .find(|name| one_slip(word, name))
}

/// Whether `a` and `b` differ by at most one edit (a transposition counting as one).
fn one_slip(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let (short, long) = if a.len() <= b.len() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    match long.len() - short.len() {
        0 => {
            let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            match differ[..] {
                [] | [_] => true,
                [i, j] => j == i + 1 && a[i] == b[j] && a[j] == b[i],
                _ => false,
            }
        }
        1 => (0..long.len()).any(|skip| {
            long.iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, c)| c)
                .eq(short.iter())
        }),
        _ => false,
    }
}

/// `word` as a shell reads it back: quoted when it holds anything but plain characters.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `unlock --force`: frees every kind of `name` that can be held.
fn unlock(c: &Client, name: &str) -> Result<u8, Error> {
    let before = c.inspect(name)?;
    if let Some(foreign) = before.iter().find(|i| i.kind == LockKind::Foreign) {
        // Refused before anything is freed (each script would refuse it too).
        return Ok(not_a_lock(&foreign.key));
    }
    let freed = c.force_unlock(name)?;
    let latch = before.iter().find(|i| i.kind == LockKind::CountDownLatch);
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
