//! `redmutex man`: the manual page, made of the help text. One page holds every command
//! with its options (an operator's `man redmutex` finds `-w` under `run`), and the exit
//! status; `redmutex man run` prints the page of one command alone (redmutex-run(1)).

use clap::{Command, CommandFactory};
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

use crate::args::{Cli, EXIT_STATUS};

/// The page of the command at `path` (`[]`: every command on one page), or why not.
pub(crate) fn manual(path: &[String]) -> Result<String, String> {
    let mut root = Cli::command();
    root.build();
    if path.is_empty() {
        return Ok(whole(&root));
    }
    let mut cmd = &root;
    for (i, name) in path.iter().enumerate() {
        cmd = visible(cmd).find(|c| c.get_name() == name).ok_or_else(|| {
            let within = std::iter::once("redmutex")
                .chain(path[..i].iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ");
            let known: Vec<&str> = visible(cmd).map(Command::get_name).collect();
            format!(
                "`{within}` has no command {name:?}; its commands: {}",
                known.join(", ")
            )
        })?;
    }
    Ok(one(cmd, &path.join("-")))
}

/// The commands an operator sees (not `__guard`, not clap's `help`).
fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
}

/// Renders with clap_mangen; a `Vec` never fails to be written to.
fn render(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).expect("writing to memory");
    String::from_utf8_lossy(&out).into_owned()
}

/// A page's title, NAME, SYNOPSIS, DESCRIPTION and OPTIONS, as clap_mangen renders them.
fn head(man: &Man) -> String {
    let mut page = String::new();
    for part in [
        Man::render_title,
        Man::render_name_section,
        Man::render_synopsis_section,
        Man::render_description_section,
        Man::render_options_section,
    ] {
        page.push_str(&render(|w| part(man, w)));
    }
    page
}

/// `redmutex man`: the top level, then each command (and each `latch` command) as a
/// subsection with its synopsis, options and notes, then EXIT STATUS.
fn whole(root: &Command) -> String {
    let man = Man::new(root.clone());
    let mut page = head(&man);
    let mut commands = Roff::default();
    commands.control("SH", ["COMMANDS"]);
    page.push_str(&commands.render());
    let mut stack: Vec<&Command> = visible(root).collect();
    stack.reverse();
    while let Some(cmd) = stack.pop() {
        page.push_str(&command(cmd));
        let mut subs: Vec<&Command> = visible(cmd).collect();
        subs.reverse();
        stack.extend(subs);
    }
    page.push_str(&environment(root));
    page.push_str(&exit_status());
    page.push_str(&see_also("flock(1)"));
    once_preamble(&page)
}

/// One command as a subsection of the whole page: its options but not the global ones
/// (those are on the page once, at the top).
fn command(cmd: &Command) -> String {
    let bin = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let mut head = Roff::default();
    head.control("SS", [bin]);
    if let Some(about) = cmd.get_about() {
        head.text([roman(about.to_string())]);
    }
    let mut own = cmd.clone();
    for global in cmd.get_arguments().filter(|a| a.is_global_set()) {
        own = own.mut_arg(global.get_id().clone(), |a| a.hide(true));
    }
    let man = Man::new(own);
    let mut text = head.render();
    text.push_str(&demoted(&render(|w| man.render_synopsis_section(w))));
    if cmd
        .get_arguments()
        .any(|a| !a.is_hide_set() && !a.is_global_set())
    {
        text.push_str(&demoted(&render(|w| man.render_options_section(w))));
    }
    text.push_str(&notes(cmd, None));
    text
}

/// `redmutex man run`: the page of one command, global options included.
fn one(cmd: &Command, path: &str) -> String {
    let name = format!("redmutex-{path}");
    let man = Man::new(cmd.clone().display_name(&name)).title(&name);
    let mut page = head(&man);
    if visible(cmd).next().is_some() {
        // `latch`: its commands in full, as on the whole page.
        let mut commands = Roff::default();
        commands.control("SH", ["COMMANDS"]);
        page.push_str(&commands.render());
        for sub in visible(cmd) {
            page.push_str(&command(sub));
        }
    }
    page.push_str(&notes(cmd, Some("NOTES")));
    page.push_str(&environment(cmd));
    page.push_str(&exit_status());
    page.push_str(&see_also("redmutex(1), flock(1)"));
    once_preamble(&page)
}

/// The page with roff's preamble (which every rendered piece starts with) once, at its top.
fn once_preamble(page: &str) -> String {
    let preamble = Roff::default().render();
    match page.strip_prefix(preamble.as_str()) {
        Some(rest) => format!("{preamble}{}", rest.replace(preamble.as_str(), "")),
        None => page.replace(preamble.as_str(), ""),
    }
}

/// A page's `.SH` headings as bold paragraphs, inside a command's subsection.
fn demoted(roff: &str) -> String {
    roff.lines()
        .map(|line| match line.strip_prefix(".SH ") {
            Some(heading) => {
                let heading = heading.trim_matches('"').to_lowercase();
                let mut head = Roff::default();
                head.control("PP", []).text([bold(heading + ":")]);
                head.render()
            }
            None => format!("{line}\n"),
        })
        .collect()
}

/// The command's examples and notes, as written (examples keep their lines).
fn notes(cmd: &Command, heading: Option<&str>) -> String {
    let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) else {
        return String::new();
    };
    let mut roff = Roff::default();
    match heading {
        Some(heading) => roff.control("SH", [heading]),
        None => roff.control("PP", []),
    };
    roff.control("nf", []);
    for line in after.to_string().lines() {
        roff.text([roman(line)]);
    }
    roff.control("fi", []);
    roff.render()
}

/// What redmutex reads from the environment besides its options' defaults: `-v`'s and
/// `-q`'s stand-in, and what a hold records.
const ENVIRONMENT: [(&str, &str); 2] = [
    (
        "RUST_LOG",
        "Which messages show on standard error when neither -v nor -q is given, as \
         tracing's filter directives (e.g. RUST_LOG=redmutex=debug); unset or empty: only \
         the library's warnings.",
    ),
    (
        "USER",
        "Recorded with each hold run and hold take, beside the host, the pid and the \
         command line, for status and list to show (a null user when unset).",
    ),
];

/// ENVIRONMENT: the variables the options read (each when its option is not given), from
/// the Command tree so that none is missed, then [`ENVIRONMENT`].
fn environment(cmd: &Command) -> String {
    let mut roff = Roff::default();
    roff.control("SH", ["ENVIRONMENT"]);
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        roff.control("TP", [])
            .text([bold(var.to_string_lossy())])
            .text([roman(format!(
                "Read when --{long} is not given (the option wins). {help}"
            ))]);
    }
    for (var, meaning) in ENVIRONMENT {
        roff.control("TP", [])
            .text([bold(var)])
            .text([roman(meaning)]);
    }
    roff.render()
}

fn exit_status() -> String {
    let mut roff = Roff::default();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in EXIT_STATUS {
        roff.control("TP", [])
            .text([bold(code)])
            .text([roman(meaning)]);
    }
    roff.render()
}

fn see_also(pages: &str) -> String {
    let mut roff = Roff::default();
    roff.control("SH", ["SEE ALSO"]).text([roman(pages)]);
    roff.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option of every command, as the Command tree has them.
    fn options(cmd: &Command, found: &mut Vec<(String, String)>) {
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                found.push((cmd.get_name().to_owned(), format!("--{long}")));
            }
            if let Some(short) = arg.get_short() {
                found.push((cmd.get_name().to_owned(), format!("-{short}")));
            }
        }
        for sub in visible(cmd) {
            options(sub, found);
        }
    }

    #[test]
    fn the_whole_page_and_each_commands_page_name_every_option() {
        let mut root = Cli::command();
        root.build();
        let mut found = Vec::new();
        options(&root, &mut found);
        let page = manual(&[]).unwrap().replace("\\-", "-");
        for (cmd, flag) in &found {
            assert!(page.contains(flag.as_str()), "{cmd} {flag}");
        }
        assert!(page.contains(".SH \"EXIT STATUS\""), "{page}");
        for sub in visible(&root) {
            let page = manual(&[sub.get_name().to_owned()])
                .unwrap()
                .replace("\\-", "-");
            let mut own = Vec::new();
            options(sub, &mut own);
            for (cmd, flag) in own {
                assert!(page.contains(flag.as_str()), "{cmd} {flag}");
            }
        }
    }
}
