//! The docs run as written: every shell command of README.md's and docs/cli.md's ```sh
//! blocks is run against a throwaway redis-server with the built `redmutex` first on
//! `PATH`, and docs/cli.md's sample outputs (the status table, the waiting note, the JSON
//! line, the record a hold keeps) are compared with what the command prints, so that the
//! docs cannot drift from the CLI again.
//!
//! What is not run, and why, is printed (`--nocapture` shows it): `cargo` and `git` lines
//! (they build and install what this test runs), crontab lines (their schedule and
//! `rediss://` host are the example's). Scripts the examples name (`./backup.sh`) are
//! stubs that exit 0, in a scratch directory that is also the working directory; a path
//! under /etc is redirected into it.
#![cfg(feature = "cli")]

mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::RedisServer;

const DOCS: [&str; 2] = ["README.md", "docs/cli.md"];

fn read(doc: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).unwrap()
}

/// The blocks of `doc` fenced with ````lang`, each as its lines.
fn blocks(doc: &str, lang: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in read(doc).lines() {
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) if info.split([',', ' ']).next() == Some(lang) => {
                current = Some(Vec::new())
            }
            (Some(_), Some("")) => found.push(current.take().unwrap()),
            (Some(block), _) => block.push(line.to_owned()),
            _ => {}
        }
    }
    found
}

/// `line` without a trailing `# comment` (a `#` after a space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        prev = c;
    }
    line.trim_end()
}

/// The built binary's directory, to go first on `PATH`.
fn bin_dir() -> String {
    let bin = Path::new(support::cli::bin());
    bin.parent().unwrap().to_str().unwrap().to_owned()
}

/// A shell running `script` in `dir` with the doc's environment: this server, this binary.
fn shell(server: &RedisServer, dir: &Path, script: &str) -> Command {
    let path = format!(
        "{}:{}",
        bin_dir(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    for var in [
        "REDIS_SENTINELS",
        "REDIS_SENTINEL_SERVICE",
        "REDIS_CLUSTER",
        "REDMUTEX_PREFIX",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(["-o", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("REDIS_URL", server.url())
        .env("RUST_LOG", "warn")
        .env("MANPAGER", "cat")
        .stdin(Stdio::null());
    cmd
}

/// Waits for `child` at most `limit`; `None` (and the child killed) when it outlived it.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code().unwrap_or(-1));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first line `child` writes on `pipe`, within `limit`.
fn first_line(pipe: impl Read + Send + 'static, limit: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(pipe).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(limit).ok()
}

fn terminate(child: &mut Child) -> Option<i32> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_at_most(child, Duration::from_secs(10))
}

#[test]
fn every_shell_command_in_the_readme_and_cli_docs_runs_as_written() {
    let server = RedisServer::new();
    let dir = support::temp_dir("doc-commands");
    let mut failures = Vec::new();
    let mut ran = 0;
    for doc in DOCS {
        for block in blocks(doc, "sh") {
            // A line that starts something in the background (`&`) goes with the next
            // one, which uses it (`pid=$!`).
            let mut units: Vec<String> = Vec::new();
            for raw in &block {
                let line = strip_comment(raw);
                match units.last_mut() {
                    Some(unit) if unit.ends_with('&') => *unit = format!("{unit}\n{line}"),
                    _ if line.is_empty() => {}
                    _ => units.push(line.to_owned()),
                }
            }
            for line in units.iter().map(String::as_str) {
                let first = line.split_whitespace().next().unwrap_or("");
                if first == "cargo" || first == "git" {
                    println!("{doc}: not run (builds or installs what this test runs): {line}");
                    continue;
                }
                if first.contains('*') && line.split_whitespace().nth(4).is_some() {
                    println!("{doc}: not run (a crontab line): {line}");
                    continue;
                }
                // Stubs for the example scripts a line names.
                for word in line.split_whitespace() {
                    if let Some(name) = word.strip_prefix("./").filter(|n| !n.contains('/')) {
                        let stub = dir.path().join(name);
                        std::fs::write(&stub, "#!/bin/sh\nexit 0\n").unwrap();
                        let mut perms = std::fs::metadata(&stub).unwrap().permissions();
                        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
                        std::fs::set_permissions(&stub, perms).unwrap();
                    }
                }
                let script = line.replace("/etc/bash_completion.d/", "./");
                ran += 1;
                let words: Vec<&str> = line.split_whitespace().collect();
                if words.len() == 3 && words[..2] == ["redmutex", "hold"] {
                    // Runs until told: it must say "held NAME", then exit 0 on SIGTERM.
                    let mut child = shell(&server, dir.path(), &format!("exec {script}"))
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let said = first_line(child.stdout.take().unwrap(), Duration::from_secs(10));
                    let code = terminate(&mut child);
                    if said.as_deref() != Some(&format!("held {}\n", words[2])) || code != Some(0) {
                        failures.push(format!("{doc}: `{line}` said {said:?}, exited {code:?}"));
                    }
                    continue;
                }
                // Output to files, not pipes: something a line leaves in the background
                // must not keep the test reading.
                let err_path = dir.path().join("stderr.txt");
                let mut child = shell(&server, dir.path(), &script)
                    .stdout(std::fs::File::create(dir.path().join("stdout.txt")).unwrap())
                    .stderr(std::fs::File::create(&err_path).unwrap())
                    .spawn()
                    .unwrap();
                let code = wait_at_most(&mut child, Duration::from_secs(20));
                let err = std::fs::read_to_string(&err_path).unwrap_or_default();
                println!("{doc}: ran `{script}`: exit {code:?}");
                if code != Some(0) {
                    failures.push(format!("{doc}: `{script}` exited {code:?}: {err}"));
                }
            }
        }
    }
    assert!(
        ran >= 10,
        "only {ran} commands found: did the docs' blocks move?"
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The keys of a JSON text in the order they are written.
fn key_order(json: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut rest = json;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let end = after.find('"').unwrap();
        let word = &after[..end];
        rest = &after[end + 1..];
        if rest.trim_start().starts_with(':') {
            keys.push(word.to_owned());
        }
    }
    keys
}

/// The sample block of docs/cli.md that begins with `first` (a ```text or ```json block).
fn sample(first: &str) -> Vec<String> {
    ["text", "json"]
        .iter()
        .flat_map(|lang| blocks("docs/cli.md", lang))
        .find(|b| b.first().is_some_and(|l| l.starts_with(first)))
        .unwrap_or_else(|| panic!("docs/cli.md has no sample beginning {first:?}"))
}

fn holder_id(s: &str) -> bool {
    let (uuid, thread) = s.split_once(':').unwrap_or(("", ""));
    uuid.len() == 36
        && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && uuid.matches('-').count() == 4
        && !thread.is_empty()
        && thread.chars().all(|c| c.is_ascii_digit())
}

/// The waiting note, its variable parts checked by shape.
fn waiting_note_shape(note: &str) -> bool {
    let Some(rest) = note.strip_prefix("redmutex: waiting for deploy, held by ") else {
        return false;
    };
    let Some((id, rest)) = rest.split_once(" (") else {
        return false;
    };
    let Some((process, rest)) = rest.split_once(") for ") else {
        return false;
    };
    let Some((held, waiting)) = rest.split_once("; ") else {
        return false;
    };
    holder_id(id)
        && process.contains(" pid ")
        && held.ends_with('s')
        && held[..held.len() - 1].parse::<f64>().is_ok()
        && waiting
            .strip_suffix(" waiting")
            .is_some_and(|n| n.parse::<u32>().is_ok())
}

#[test]
fn the_cli_docs_sample_outputs_are_what_the_cli_prints() {
    let server = RedisServer::new();
    let dir = support::temp_dir("doc-samples");
    let spawn = |script: &str| {
        shell(&server, dir.path(), script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let run = |script: &str| {
        let out = shell(&server, dir.path(), script).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let waiters_now = || -> usize {
        let doc: serde_json::Value =
            serde_json::from_str(&run("redmutex status --json deploy")).unwrap();
        doc["objects"][0]["waiters"].as_array().map_or(0, Vec::len)
    };

    let mut holder = spawn("exec redmutex hold deploy");
    let said = first_line(holder.stdout.take().unwrap(), Duration::from_secs(10));
    assert_eq!(said.as_deref(), Some("held deploy\n"));

    // The record a hold keeps: the sample's keys, in the sample's order.
    let mut con = server.connection();
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg("redmutex:{deploy}")
        .query(&mut con)
        .unwrap();
    let record = fields
        .iter()
        .find(|(f, _)| f.starts_with("~m:"))
        .map(|(_, v)| v.split_once(' ').unwrap().1.to_owned())
        .expect("the hold's record");
    let sample_record = sample("{\"host\"").join("\n");
    assert_eq!(
        key_order(&record),
        key_order(&sample_record),
        "record {record}"
    );

    // One waiter: the JSON line, key for key in the same order as the sample.
    let mut first_waiter = spawn("exec redmutex run deploy true");
    assert!(support::wait_until(
        Duration::from_secs(10),
        || waiters_now() == 1
    ));
    let json = run("redmutex status --json deploy");
    let sample_json = sample("{\"schema\"");
    assert_eq!(
        sample_json.len(),
        1,
        "the JSON sample is one line, as the CLI prints it"
    );
    assert_eq!(
        key_order(json.trim()),
        key_order(&sample_json[0]),
        "printed: {json}"
    );
    let printed: serde_json::Value = serde_json::from_str(&json).unwrap();
    let documented: serde_json::Value = serde_json::from_str(&sample_json[0]).unwrap();
    for id in [
        &printed["objects"][0]["holders"][0]["id"],
        &documented["objects"][0]["holders"][0]["id"],
        &documented["objects"][0]["waiters"][0]["id"],
    ] {
        assert!(holder_id(id.as_str().unwrap()), "{id}");
    }

    // A second waiter: its note after a second, then the table with 2 waiting.
    let mut second_waiter = spawn("exec redmutex run deploy true");
    let note = first_line(
        second_waiter.stderr.take().unwrap(),
        Duration::from_secs(10),
    )
    .expect("the waiting note");
    let sample_note = sample("redmutex: waiting for deploy")[0].clone();
    assert!(waiting_note_shape(&sample_note), "docs: {sample_note}");
    assert!(waiting_note_shape(note.trim_end()), "printed: {note}");
    assert!(support::wait_until(
        Duration::from_secs(10),
        || waiters_now() == 2
    ));

    let table = run("redmutex status deploy");
    let table: Vec<&str> = table.lines().collect();
    let documented = sample("$ redmutex status deploy");
    assert_eq!(table.len(), documented.len() - 1, "{table:?}");
    assert_eq!(table[0], documented[1], "the header");
    let columns = |row: &str| -> Vec<String> {
        row.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (got, want) = (columns(table[1]), columns(&documented[2]));
    assert_eq!(got.len(), want.len(), "{got:?} against {want:?}");
    assert_eq!(got[..2], want[..2], "NAME, KIND");
    assert!(
        holder_id(&got[2]) && holder_id(&want[2]),
        "HOLDER: {got:?} against {want:?}"
    );
    assert_eq!(got[3], want[3], "COUNT");
    assert_eq!(got[6], want[6], "WAITERS");
    // Each column starts where the sample's does (the header is the same, so do the rows).
    let starts = |row: &str| -> Vec<usize> {
        let mut at = Vec::new();
        let bytes = row.as_bytes();
        for i in 0..bytes.len() {
            if bytes[i] != b' ' && (i == 0 || row[..i].ends_with("  ")) {
                at.push(i);
            }
        }
        at
    };
    assert_eq!(
        starts(table[1]),
        starts(&documented[2]),
        "{}\n{}",
        table[1],
        documented[2]
    );

    assert_eq!(terminate(&mut holder), Some(0));
    assert_eq!(
        wait_at_most(&mut first_waiter, Duration::from_secs(10)),
        Some(0)
    );
    assert_eq!(
        wait_at_most(&mut second_waiter, Duration::from_secs(10)),
        Some(0)
    );
}

/// The docs' files, and the sources whose comments and help reach users.
fn user_facing() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join("Cargo.toml")];
    let mut dirs = vec![root.join("docs"), root.join("src"), root.join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md" || e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// Issue 38: the docs give only lines that work. No doc tells a user to fetch redmutex
/// from `github.com/redmutex/redmutex` (a repository that is not this project's: a `git =`
/// dependency, a `git clone`), and every `cargo install` shown uses the committed
/// `Cargo.lock` (`--locked`; without it cargo resolves anew and may pick versions that
/// need a newer Rust).
#[test]
fn the_docs_fetch_nothing_from_elsewhere_and_install_with_the_committed_lock() {
    let mut wrong = Vec::new();
    for file in user_facing() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let at = format!("{}:{}: {}", file.display(), n + 1, line.trim());
            let fetches = line.contains("git = ") || line.contains("git clone");
            if fetches && line.contains("github.com/redmutex/redmutex") {
                wrong.push(format!("{at} (not this project's repository)"));
            }
            if line.contains("cargo install") && !line.contains("--locked") {
                wrong.push(format!("{at} (without --locked)"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
