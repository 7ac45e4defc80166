//! Test binaries that re-execute themselves as other processes: the child runs one
//! `#[test]` entry (a no-op unless its role variable is set) and talks to the parent
//! through marked stdout lines and stdin.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Lines a child means for the parent; the test harness prints its own lines too.
const MARK: &str = "CHILD:";
/// Waits on a child longer than this only when something is broken.
const STUCK: Duration = Duration::from_secs(30);

/// Writes one line for the parent (from the child).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{line}").expect("write to the parent");
    out.flush().expect("flush to the parent");
}

/// A child process, killed when dropped so a failing test leaves nothing behind.
pub struct ChildProc {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl ChildProc {
    /// Runs this test binary's `entry` test with `env` set.
    pub fn spawn(entry: &str, env: &[(&str, &str)]) -> ChildProc {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args(["--exact", entry, "--nocapture", "--test-threads=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // The harness may have started the line ("test child_entry ... ").
                if let Some(at) = line.find(MARK) {
                    if tx.send(line[at + MARK.len()..].to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        ChildProc {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// Asserts that the child's next line is `want`.
    pub fn expect(&self, want: &str) {
        let got = self.next_line();
        assert_eq!(got, want, "unexpected line from the child");
    }

    /// The child's next line; panics if it says nothing for a long time.
    pub fn next_line(&self) -> String {
        self.lines
            .recv_timeout(STUCK)
            .expect("the child said nothing (it failed or hung)")
    }

    /// The child's next line, if it says one within `timeout`.
    pub fn try_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("child stdin");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    pub fn wait_success(mut self) {
        let status = self.child.wait().expect("wait for child");
        assert!(status.success(), "child failed: {status}");
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a test binary re-run as a child: its role and the server URL the parent set in
/// `role_var` and `url_var`; `None` in a normal run, where the entry does nothing.
pub fn entry(role_var: &str, url_var: &str) -> Option<(String, String)> {
    let role = std::env::var(role_var).ok()?;
    let url = std::env::var(url_var).unwrap_or_else(|_| panic!("{url_var} for the child"));
    Some((role, url))
}

/// A child's body, by its role: given the server URL.
pub type Role = (&'static str, fn(&str));
/// The same for children that also take a lock name: given the URL and the name.
pub type NamedRole = (&'static str, fn(&str, &str));

/// A child entry's body: runs the function `roles` gives for the role the parent set (with
/// the server URL); nothing in a normal run. An unknown role fails the child.
pub fn run_role(role_var: &str, url_var: &str, roles: &[Role]) {
    let Some((role, url)) = entry(role_var, url_var) else {
        return;
    };
    let run = pick(roles, &role);
    run(&url);
}

/// [`run_role`] for children that also take a lock name (from `name_var`).
pub fn run_named_role(role_var: &str, url_var: &str, name_var: &str, roles: &[NamedRole]) {
    let Some((role, url)) = entry(role_var, url_var) else {
        return;
    };
    let name = std::env::var(name_var).expect("lock name for the child");
    let run = pick(roles, &role);
    run(&url, &name);
}

fn pick<F: Copy>(roles: &[(&str, F)], role: &str) -> F {
    roles
        .iter()
        .find(|(r, _)| *r == role)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("unknown child role {role:?}"))
}

/// The numbers of a child's line `<word> <n> <n> ...` (`word` given with its space).
pub fn numbers<T: std::str::FromStr>(line: &str, word: &str) -> Vec<T> {
    line.strip_prefix(word)
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .split(' ')
        .map(|w| w.parse().unwrap_or_else(|_| panic!("not a number: {w:?}")))
        .collect()
}

/// A flag the parent sets by writing a line to (or closing) the child's stdin.
pub fn stop_on_stdin() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let set = stop.clone();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        set.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    stop
}
