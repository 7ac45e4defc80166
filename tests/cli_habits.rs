//! The `redmutex` command's habits, as operators used to flock(1), `etcdctl lock` and
//! `consul lock` expect them: short flags, commands without `--`, `hold`, semaphores,
//! shared holds, latches, a note while waiting, help, completions, and JSON schema 1.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use support::cli::{bare, output};
use support::clients::Clients;
use support::RedisServer;

const PREFIX: &str = "habits:";

const CLIENTS: Clients = support::cli::clients(PREFIX);

fn redmutex(server: &RedisServer) -> Command {
    support::cli::redmutex(server, PREFIX)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["schema"], 1);
    doc
}

/// A `redmutex hold` that said `held NAME`; killed when dropped.
struct Holding {
    child: Child,
    _out: BufReader<ChildStdout>,
}

impl Holding {
    fn start(server: &RedisServer, args: &[&str]) -> Holding {
        let mut child = redmutex(server)
            .arg("hold")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let line = next_line(&mut out);
        let name = args.last().unwrap();
        assert_eq!(line, format!("held {name}\n"));
        Holding { child, _out: out }
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Exit code and standard error.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!err.contains("panicked"), "{err}");
        (status.code(), err)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next line `out` gives (with its newline).
fn next_line(out: &mut impl BufRead) -> String {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line
}

#[test]
fn run_takes_the_command_after_the_name_without_a_double_dash() {
    let server = RedisServer::new();
    // `-n` after the name is echo's, not redmutex's --semaphore.
    let out = output(redmutex(&server).args(["run", "-w", "1s", "job", "echo", "-n", "hi"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi");
    let out = output(redmutex(&server).args(["run", "-l", "2s", "job", "sh", "-c", "exit 3"]));
    assert_eq!(out.status.code(), Some(3));
    // An option of redmutex between the name and the command is still redmutex's.
    let out = output(redmutex(&server).args(["run", "job", "--no-wait", "echo", "ok"]));
    assert_eq!(text(&out.stdout), "ok\n");
    // `--` still works, and still lets a command start with a dash-less name after it.
    let out = output(redmutex(&server).args(["run", "job", "--", "echo", "--", "x"]));
    assert_eq!(text(&out.stdout), "-- x\n");
    assert!(!CLIENTS.at(&server).lock("job").is_locked().unwrap());
}

#[test]
fn hold_holds_until_a_signal_then_releases_and_exits_0() {
    let (server, c) = CLIENTS.serve();
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let holding = Holding::start(&server, &["-l", "3s", "maint"]);
        assert!(c.lock("maint").is_locked().unwrap());
        let out = output(redmutex(&server).args(["run", "--no-wait", "maint", "true"]));
        assert_eq!(out.status.code(), Some(75));
        holding.signal(sig);
        let (code, err) = holding.finish();
        assert_eq!(code, Some(0), "{sig}: {err}");
        // Released before it exited.
        assert!(!c.lock("maint").is_locked().unwrap(), "{sig}");
    }
}

#[test]
fn hold_exits_76_when_its_lease_is_lost() {
    let (server, c) = CLIENTS.serve();
    let holding = Holding::start(&server, &["--lease", "900ms", "fragile"]);
    assert!(c.lock("fragile").force_unlock().unwrap());
    let t = Instant::now();
    let (code, err) = holding.finish();
    assert_eq!(code, Some(76), "{err}");
    assert!(err.contains("lost"), "{err}");
    // Said once, by name, with the library's why; not again as its WARN naming the key.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("the lease of fragile was lost while held ("),
        "{err}"
    );
    assert!(!err.contains("{fragile}") && !err.contains("WARN"), "{err}");
    // Found at the next renewal, every third of the lease.
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn a_semaphore_of_n_lets_n_hold_at_once_and_status_shows_them() {
    let server = RedisServer::new();
    let a = Holding::start(&server, &["-n", "2", "encoders"]);
    let b = Holding::start(&server, &["--semaphore", "2", "encoders"]);
    let out = output(redmutex(&server).args(["run", "-n", "2", "--no-wait", "encoders", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    let doc = json(&output(
        redmutex(&server).args(["status", "--json", "encoders"]),
    ));
    let sem = &doc["objects"][0];
    assert_eq!(sem["kind"], "semaphore");
    assert_eq!(sem["permits"], 2);
    assert_eq!(sem["count"], Value::Null);
    let holders = sem["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2);
    for h in holders {
        assert_eq!(h["role"], "permit");
        assert_eq!(h["permits"], 1);
        assert_eq!(h["count"], Value::Null);
    }
    a.signal(Signal::SIGTERM);
    assert_eq!(a.finish().0, Some(0));
    // A permit is free again.
    let out = output(redmutex(&server).args(["run", "-n", "2", "--no-wait", "encoders", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    b.signal(Signal::SIGTERM);
    assert_eq!(b.finish().0, Some(0));
    assert_eq!(
        CLIENTS
            .at(&server)
            .semaphore("encoders", 2)
            .available_permits()
            .unwrap(),
        2
    );
}

#[test]
fn shared_holds_are_readers_of_the_read_write_lock() {
    let (server, c) = CLIENTS.serve();
    let r1 = Holding::start(&server, &["--shared", "schema"]);
    let r2 = Holding::start(&server, &["--shared", "schema"]);
    let write = c.read_write_lock("schema").write_lock();
    assert!(
        write.try_lock().unwrap().is_none(),
        "a writer got in beside readers"
    );
    let doc = json(&output(redmutex(&server).args(["list", "--json"])));
    let rw = &doc["objects"][0];
    assert_eq!(rw["kind"], "rwlock");
    let holders = rw["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2);
    for h in holders {
        assert_eq!(h["role"], "read");
        assert_eq!(h["count"], 1);
        let id = h["id"].as_str().unwrap();
        assert!(!id.starts_with("r:") && !id.contains(' '), "{id}");
    }
    for r in [r1, r2] {
        r.signal(Signal::SIGTERM);
        assert_eq!(r.finish().0, Some(0));
    }
    let w = write
        .try_lock()
        .unwrap()
        .expect("free once the readers left");
    let doc = json(&output(
        redmutex(&server).args(["status", "--json", "schema"]),
    ));
    assert_eq!(doc["objects"][0]["holders"][0]["role"], "write");
    w.unlock().unwrap();
}

#[test]
fn latch_set_count_down_and_wait() {
    let server = RedisServer::new();
    let out = output(redmutex(&server).args(["latch", "set", "batch", "2"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Counting already: left as it is.
    let out = output(redmutex(&server).args(["latch", "set", "batch", "5"]));
    assert_eq!(out.status.code(), Some(75));
    let out = output(redmutex(&server).args(["latch", "wait", "-w", "200ms", "batch"]));
    assert_eq!(out.status.code(), Some(75));
    let doc = json(&output(
        redmutex(&server).args(["status", "--json", "batch"]),
    ));
    assert_eq!(doc["objects"][0]["kind"], "latch");
    assert_eq!(doc["objects"][0]["count"], 2);
    assert_eq!(doc["objects"][0]["permits"], Value::Null);
    let waiting = redmutex(&server)
        .args(["latch", "wait", "batch"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = output(redmutex(&server).args(["latch", "count-down", "batch"]));
    assert_eq!(text(&out.stdout), "1\n");
    let out = output(redmutex(&server).args(["latch", "count-down", "batch"]));
    assert_eq!(text(&out.stdout), "0\n");
    let t = Instant::now();
    let status = waiting.wait_with_output().unwrap().status;
    assert!(status.success());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn after_a_second_of_waiting_it_says_who_holds_the_lock_unless_quiet() {
    let (server, c) = CLIENTS.serve();
    let guard = c.lock("busy").lock().unwrap();
    let started = Instant::now();
    let mut run = redmutex(&server)
        .args(["run", "busy", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(run.stderr.take().unwrap());
    let line = next_line(&mut err);
    let said_after = started.elapsed();
    eprintln!("the note came {said_after:?} after the start: {line}");
    assert!(
        line.starts_with("redmutex: waiting for busy, held by "),
        "{line}"
    );
    assert!(line.contains(c.id()), "{line}");
    assert!(
        said_after >= Duration::from_millis(1000) && said_after < Duration::from_millis(3000),
        "{said_after:?}"
    );
    guard.unlock().unwrap();
    assert!(run.wait().unwrap().success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "said more than once");

    let guard = c.lock("busy").lock().unwrap();
    let out = output(redmutex(&server).args(["-q", "run", "-w", "1500ms", "busy", "true"]));
    assert_eq!(out.status.code(), Some(75));
    let err = text(&out.stderr);
    assert!(!err.contains("waiting for"), "-q did not silence it: {err}");
    // Acquired within the second: nothing said.
    guard.unlock().unwrap();
    let out = output(redmutex(&server).args(["run", "busy", "true"]));
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn help_reads_right_and_completions_and_the_manual_are_generated() {
    let help = text(&output(bare().arg("--help")).stdout);
    assert!(help.contains("Connection options:"), "{help}");
    assert!(help.contains("Output options:"), "{help}");
    assert!(help.contains("[env: REDMUTEX_PREFIX]"), "{help}");
    assert!(
        !help.contains("=]"),
        "an unset variable shown with a value: {help}"
    );
    let run_help = text(&output(bare().args(["run", "--help"])).stdout);
    for flag in ["-w, --wait", "-l, --lease", "-n, --semaphore", "--shared"] {
        assert!(run_help.contains(flag), "{flag}: {run_help}");
    }
    // A value taken from the environment does not make --url look required.
    let out = output(bare().env("REDIS_URL", "redis://h/").args(["run", "x"]));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let usage = err.lines().find(|l| l.starts_with("Usage:")).expect(&err);
    assert!(!usage.contains("--url"), "{usage}");
    for shell in ["bash", "zsh", "fish"] {
        let out = output(bare().args(["completions", shell]));
        assert_eq!(out.status.code(), Some(0));
        let script = text(&out.stdout);
        assert!(
            script.contains("redmutex") && script.contains("hold"),
            "{shell}"
        );
    }
    let man = output(bare().arg("man"));
    assert_eq!(man.status.code(), Some(0));
    let man = text(&man.stdout);
    assert!(
        man.starts_with(".ie") || man.contains(".TH redmutex"),
        "{man}"
    );
}

#[test]
fn json_kinds_are_one_word_and_ids_carry_no_role_prefix() {
    let (server, c) = CLIENTS.serve();
    // (A name is one kind at a time: one name each.)
    let _l = c.lock("all").lock().unwrap();
    let _r = c.read_write_lock("all-rw").read_lock().lock().unwrap();
    let _p = c
        .semaphore("all-sem", 3)
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    assert!(c.count_down_latch("all-latch").try_set_count(4).unwrap());
    let doc = json(&output(redmutex(&server).args([
        "status",
        "--json",
        "all",
        "all-rw",
        "all-sem",
        "all-latch",
        "none",
    ])));
    let objects = doc["objects"].as_array().unwrap();
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["lock", "rwlock", "semaphore", "latch", "free"]);
    for o in objects {
        for h in o["holders"].as_array().unwrap() {
            let id = h["id"].as_str().unwrap();
            assert!(id.starts_with(c.id()), "{id}");
        }
        for field in ["lease_remaining_ms", "token", "permits", "count", "key"] {
            assert!(o.get(field).is_some(), "{field} missing in {o}");
        }
    }
    assert!(objects[0]["lease_remaining_ms"].as_u64().unwrap() <= 5000);
    assert_eq!(objects[2]["permits"], 3);
    assert_eq!(objects[2]["holders"][0]["permits"], 2);
    assert_eq!(objects[3]["count"], 4);
}

#[test]
fn status_and_list_show_the_holders_host_pid_command_and_since() {
    let server = RedisServer::with_args(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}/", server.port());
    let c = redmutex::Client::builder()
        .url(url.as_str())
        .key_prefix(PREFIX)
        .build()
        .unwrap();
    let before = std::time::SystemTime::now();
    let mut holding = bare()
        .args([
            "--url", &url, "--prefix", PREFIX, "hold", "-l", "5s", "owned",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = next_line(&mut BufReader::new(holding.stdout.take().unwrap()));
    assert_eq!(line, "held owned\n");
    let status = |json: bool| {
        let mut cmd = bare();
        cmd.args(["--url", &url, "--prefix", PREFIX, "status", "owned"]);
        if json {
            cmd.arg("--json");
        }
        output(&mut cmd)
    };
    let doc = json(&status(true));
    let holder = &doc["objects"][0]["holders"][0];
    assert_eq!(holder["pid"], holding.id());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(holder["host"], host.trim());
    let cmd: Vec<&str> = holder["cmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&cmd[cmd.len() - 4..], ["hold", "-l", "5s", "owned"]);
    let since = holder["since_ms"].as_u64().unwrap() as u128;
    let epoch = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap();
    // The server's clock is this machine's: since the hold started, give or take a second.
    assert!(since + 1000 >= epoch(before).as_millis(), "{since}");
    assert!(since <= epoch(std::time::SystemTime::now()).as_millis() + 1000);
    assert!(holder["held_for_ms"].as_u64().unwrap() < 10_000);
    let table = status(false);
    let table = text(&table.stdout);
    let pid = holding.id().to_string();
    assert!(
        table.contains(&format!("pid {pid}: ")) && table.contains("hold -l 5s owned"),
        "{table}"
    );
    // The password in --url was not recorded.
    let raw = format!("{:?}", c.inspect("owned").unwrap());
    assert!(
        !raw.contains("s3cret") && !table.contains("s3cret"),
        "{raw}"
    );
    // The waiting note says the same.
    let out = output(bare().args([
        "--url", &url, "--prefix", PREFIX, "run", "-w", "1200ms", "owned", "true",
    ]));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("pid {pid}: ")) && err.contains(" for "),
        "{err}"
    );
    kill(Pid::from_raw(holding.id() as i32), Signal::SIGTERM).unwrap();
    assert!(holding.wait().unwrap().success());
    // Released: nothing of it is left.
    assert!(c.inspect("owned").unwrap().is_empty());
}

/// Waits for `child` at most `bound`; kills it (and fails) if it has not ended by then.
fn wait_bounded(mut child: Child, bound: Duration, what: &str) -> Output {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            assert!(
                !text(&out.stderr).contains("panicked"),
                "{}",
                text(&out.stderr)
            );
            return out;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {bound:?}; stderr: {}",
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_user_name_over_a_kibibyte_is_cut_and_the_command_runs() {
    let (server, c) = CLIENTS.serve();
    // ASCII, and two-byte characters whose cut must fall between them.
    for (name, user) in [
        ("long-user", "u".repeat(2100)),
        ("long-user-utf8", "é".repeat(1500)),
    ] {
        let child = redmutex(&server)
            .env("USER", &user)
            .args(["run", "-l", "5s", name, "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_bounded(child, Duration::from_secs(20), name);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        // `hold`, whose record is read while it holds: once it says "held NAME" (a
        // signal before that, while the acquisition returns, gives the lock back and
        // exits 128 + n, as it should).
        let mut child = redmutex(&server)
            .env("USER", &user)
            .args(["hold", "-l", "5s", "--no-wait", name])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let said = next_line(&mut BufReader::new(child.stdout.take().unwrap()));
        let info = (said == format!("held {name}\n"))
            .then(|| c.inspect(name).unwrap().into_iter().next())
            .flatten();
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let out = wait_bounded(child, Duration::from_secs(20), name);
        let info = info.unwrap_or_else(|| panic!("never held ({said:?}): {}", text(&out.stderr)));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let meta = &info.metadata[0].text;
        assert!(meta.len() <= 1024, "{}", meta.len());
        let doc: Value = serde_json::from_str(meta).unwrap();
        let recorded = doc["user"].as_str().expect("the user is recorded");
        assert!(recorded.ends_with('…'), "{recorded}");
        let kept = recorded.trim_end_matches('…');
        assert!(!kept.is_empty() && user.starts_with(kept), "{recorded}");
        // The command line is still there, the lock name included.
        let cmd = doc["cmd"].as_array().unwrap();
        assert!(cmd.iter().any(|a| a == name), "{cmd:?}");
        assert!(c.inspect(name).unwrap().is_empty());
    }
}

/// A name is one kind at a time: `run NAME` (a lock), `run --shared NAME` and
/// `run -x NAME` (the two sides of one read-write lock), `run -n K NAME` (a semaphore) and
/// a counting latch never run together. A kind that meets another is refused at once,
/// exit 65, saying which kind holds the name; `-x` and `--shared` exclude each other as
/// flock's -x and -s do.
#[test]
fn a_name_held_as_one_kind_is_refused_to_another_and_exclusive_pairs_with_shared() {
    let server = RedisServer::new();
    let run = |args: &[&str]| {
        let out = output(redmutex(&server).arg("run").args(args).arg("true"));
        (out.status.code(), text(&out.stderr))
    };
    let kinds: [(&[&str], &str); 4] = [
        (&[], "lock"),
        (&["--shared"], "read-write lock"),
        (&["-n", "2"], "semaphore"),
        (&["--fair"], "lock"),
    ];
    for (held_args, in_use) in kinds {
        let mut args = held_args.to_vec();
        args.push("mixed");
        let holding = Holding::start(&server, &args);
        for (other, other_kind) in kinds
            .iter()
            .chain([(&["-x"][..], "read-write lock")].iter())
        {
            if *other_kind == in_use {
                continue;
            }
            // Waiting would not help: refused at once.
            let started = Instant::now();
            let mut args = other.to_vec();
            args.extend(["-w", "10s", "mixed"]);
            let (code, err) = run(&args);
            assert_eq!(code, Some(65), "{held_args:?} then {other:?}: {err}");
            assert!(
                err.contains(&format!("mixed is in use as a {in_use}")),
                "{held_args:?} then {other:?}: {err}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{held_args:?} then {other:?}"
            );
        }
        holding.signal(Signal::SIGTERM);
        assert_eq!(holding.finish().0, Some(0));
    }
    // -x is the write side of --shared's read-write lock: each keeps the other out.
    let reader = Holding::start(&server, &["--shared", "schema"]);
    let (code, err) = run(&["-x", "--no-wait", "schema"]);
    assert_eq!(code, Some(75), "{err}");
    reader.signal(Signal::SIGTERM);
    assert_eq!(reader.finish().0, Some(0));
    let writer = Holding::start(&server, &["--exclusive", "schema"]);
    let (code, err) = run(&["--shared", "--no-wait", "schema"]);
    assert_eq!(code, Some(75), "{err}");
    let (code, err) = run(&["-x", "--no-wait", "schema"]);
    assert_eq!(code, Some(75), "{err}");
    let doc = json(&output(
        redmutex(&server).args(["status", "--json", "schema"]),
    ));
    assert_eq!(doc["objects"][0]["kind"], "rwlock");
    assert_eq!(doc["objects"][0]["holders"][0]["role"], "write");
    writer.signal(Signal::SIGTERM);
    assert_eq!(writer.finish().0, Some(0));
    let (code, err) = run(&["-x", "--no-wait", "schema"]);
    assert_eq!(code, Some(0), "{err}");
    // A counting latch holds its name too, and is refused a name held otherwise.
    let latch = |args: &[&str]| {
        let out = output(redmutex(&server).arg("latch").args(args));
        (out.status.code(), text(&out.stderr))
    };
    assert_eq!(latch(&["set", "batch", "2"]).0, Some(0));
    let (code, err) = run(&["batch"]);
    assert_eq!(code, Some(65), "{err}");
    assert!(
        err.contains("batch is in use as a count-down latch"),
        "{err}"
    );
    let holding = Holding::start(&server, &["held-name"]);
    let (code, err) = latch(&["set", "held-name", "2"]);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("held-name is in use as a lock"), "{err}");
    drop(holding);
}

/// The commands `redmutex <path> --help` lists (clap's own `help` left out).
fn commands_of(path: &[String]) -> Vec<Vec<String>> {
    let help = text(&output(bare().args(path).arg("--help")).stdout);
    let Some((_, list)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    list.lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(|name| path.iter().cloned().chain([name.to_owned()]).collect())
        .collect()
}

/// The flags `redmutex <path> --help` shows (`-w`, `--wait`, ...).
fn flags_of(path: &[String]) -> Vec<String> {
    let help = text(&output(bare().args(path).arg("--help")).stdout);
    let mut flags = Vec::new();
    for line in help.lines().map(str::trim_start) {
        for word in line.split_whitespace() {
            let word = word.trim_end_matches(',').trim_end_matches("...");
            if !word.starts_with('-') {
                break;
            }
            flags.push(word.to_owned());
        }
    }
    flags
}

#[test]
fn the_manual_names_every_option_of_every_command_and_the_exit_status() {
    let man = output(bare().arg("man"));
    assert_eq!(man.status.code(), Some(0));
    let man = text(&man.stdout).replace("\\-", "-");
    assert!(man.contains(".SH \"EXIT STATUS\""), "{man}");
    assert!(!man.contains(".SH EXTRA"), "{man}");
    assert!(!man.contains("redmutex-run(1)"), "a page that is not there");
    let mut todo = commands_of(&[]);
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        seen += 1;
        let section = format!(".SS \"redmutex {}\"", path.join(" "));
        let section = if man.contains(&section) {
            section
        } else {
            format!(".SS redmutex {}", path.join(" "))
        };
        assert!(man.contains(&section), "{path:?} not on the page");
        let own = output(bare().arg("man").args(&path));
        assert_eq!(own.status.code(), Some(0), "redmutex man {path:?}");
        let own = text(&own.stdout).replace("\\-", "-");
        assert!(own.contains(".SH \"EXIT STATUS\""), "{path:?}");
        let flags = flags_of(&path);
        assert!(flags.contains(&"--help".to_owned()), "{path:?}: {flags:?}");
        for flag in flags {
            assert!(man.contains(&flag), "{path:?} {flag} not on the page");
            assert!(own.contains(&flag), "{path:?} {flag} not on its page");
        }
        todo.extend(commands_of(&path));
    }
    assert!(seen >= 11, "{seen} commands");
    for flag in ["-w", "--no-wait", "-n", "--shared", "--url", "-v"] {
        assert!(man.contains(flag), "{flag}");
    }
    let out = output(bare().args(["man", "bogus"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("its commands: run, hold"));
}

/// The script `redmutex hold --help` gives, as written.
fn hold_pattern() -> String {
    let help = text(&output(bare().args(["hold", "--help"])).stdout);
    let (_, from) = help.split_once("In a script").expect(&help);
    let script: Vec<&str> = from
        .lines()
        .skip_while(|l| !l.starts_with("  "))
        .take_while(|l| l.starts_with("  "))
        .map(str::trim_start)
        .collect();
    assert!(script.len() >= 3, "{help}");
    script.join("\n")
}

/// Runs `script` in a directory of its own whose `./do-maintenance.sh` records whether a
/// `run --no-wait` of the lock is refused (75: it is held), with `redmutex` on the PATH;
/// the script's exit code and what the maintenance saw (`None`: it never ran).
fn run_pattern(server: &RedisServer, script: &str) -> (Option<i32>, Option<String>) {
    let dir = support::temp_dir("hold-pattern");
    let maintenance = dir.path().join("do-maintenance.sh");
    std::fs::write(
        &maintenance,
        "#!/bin/sh\nredmutex run --no-wait maintenance true 2>/dev/null; echo $? > seen\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &maintenance,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bin_dir = std::path::Path::new(support::cli::bin()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("{script}\nexit $status"))
        .current_dir(dir.path())
        .env("PATH", path)
        .env("REDIS_URL", server.url())
        .env("REDMUTEX_PREFIX", PREFIX)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(20), "the hold pattern");
    let seen = std::fs::read_to_string(dir.path().join("seen")).ok();
    (out.status.code(), seen)
}

#[test]
fn the_documented_hold_pattern_runs_the_maintenance_only_while_held() {
    let (server, c) = CLIENTS.serve();
    let script = hold_pattern();
    assert!(script.contains("--ready-fd"), "{script}");
    // docs/cli.md's `hold` example is this script, line for line: what runs here is
    // what the docs say (tests/doc_commands.rs runs it there too, without a rival).
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    assert!(
        docs.contains(&format!("```sh\n{script}\n```")),
        "docs/cli.md's hold example is not `redmutex hold --help`'s:\n{script}"
    );
    let (code, seen) = run_pattern(&server, &script);
    assert_eq!(code, Some(0));
    assert_eq!(seen.as_deref(), Some("75\n"), "the maintenance ran unheld");
    assert!(!c.lock("maintenance").is_locked().unwrap(), "not released");
    // Held by another: the script's hold (made not to wait) never says `held`, so the
    // maintenance never runs and the script learns 75.
    let _other = Holding::start(&server, &["maintenance"]);
    let no_wait = script.replace("hold --ready-fd", "hold --no-wait --ready-fd");
    assert_ne!(no_wait, script);
    let (code, seen) = run_pattern(&server, &no_wait);
    assert_eq!(code, Some(75));
    assert_eq!(
        seen, None,
        "the maintenance ran while another held the lock"
    );
}

#[test]
fn a_ready_fd_that_is_not_open_is_a_usage_error() {
    let server = RedisServer::new();
    let out = output(redmutex(&server).args(["hold", "--ready-fd", "9", "x"]));
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr).contains("--ready-fd 9"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn flock_habits_conflict_exit_code_bare_seconds_and_hints_for_n_and_unlock() {
    let (server, c) = CLIENTS.serve();
    // flock's `-n job ...`: told that -n is the semaphore's count and --no-wait flock's -n.
    let out = output(redmutex(&server).args(["run", "-n", "job", "true"]));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("number of permits") && err.contains("--no-wait"),
        "{err}"
    );
    // `-w 5` as flock reads it: seconds (fractions too).
    let out = output(redmutex(&server).args(["run", "-w", "5", "free", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let held = c.lock("busy").lock().unwrap();
    assert!(c.count_down_latch("closed").try_set_count(1).unwrap());
    let t = Instant::now();
    let out = output(redmutex(&server).args(["run", "-w", "0.3", "busy", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    // --conflict-exit-code / -E, as flock's: for --no-wait, --wait, hold and wait.
    for args in [
        &["run", "--no-wait", "-E", "1", "busy", "true"][..],
        &[
            "run",
            "-w",
            "100ms",
            "--conflict-exit-code",
            "1",
            "busy",
            "true",
        ],
        &["hold", "--no-wait", "-E", "1", "busy"],
        &["wait", "-w", "0.1", "-E", "1", "busy"],
        &["latch", "wait", "-w", "0.1", "-E", "1", "closed"],
    ] {
        let out = output(redmutex(&server).args(args));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = output(redmutex(&server).args(["run", "--no-wait", "busy", "true"]));
    assert_eq!(out.status.code(), Some(75), "the default stays 75");
    // `unlock` without --force says why it wants it.
    let out = output(redmutex(&server).args(["unlock", "busy"]));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("whoever holds it") && err.contains("redmutex unlock --force busy"),
        "{err}"
    );
    assert!(c.lock("busy").is_locked().unwrap());
    held.unlock().unwrap();
}

#[test]
fn two_vs_say_more_than_one() {
    let server = RedisServer::new();
    let said = |flag: &str| {
        let out = output(redmutex(&server).args([flag, "run", "verbose", "true"]));
        assert_eq!(out.status.code(), Some(0));
        text(&out.stderr)
    };
    let (v, vv) = (said("-v"), said("-vv"));
    assert!(v.contains("acquired") && v.contains("released"), "{v}");
    assert!(!v.contains("TRACE"), "{v}");
    assert!(
        vv.lines().count() > v.lines().count(),
        "-v:\n{v}\n-vv:\n{vv}"
    );
    for more in [
        "connected to redis://",
        "the command started",
        "the command exited: 0",
    ] {
        assert!(vv.contains(more), "{more}: {vv}");
    }
    // Each acquisition's span with its time, and where each message comes from.
    assert!(
        vv.contains("time.busy") && vv.contains("redmutex::run"),
        "{vv}"
    );
}

#[test]
fn json_keys_come_in_the_documented_order_schema_first() {
    let (server, c) = CLIENTS.serve();
    let _held = c.lock("ordered").lock().unwrap();
    let out = output(redmutex(&server).args(["status", "--json", "ordered"]));
    let said = text(&out.stdout);
    json(&out);
    assert!(
        said.starts_with(r#"{"schema":1,"objects":[{"name":"ordered","kind":"lock","key":"#),
        "{said}"
    );
    let at = |key: &str| said.find(&format!("\"{key}\":")).expect(key);
    let order = [
        "holders",
        "id",
        "role",
        "count",
        "host",
        "since_ms",
        "held_for_ms",
        "waiters",
        "lease_remaining_ms",
        "token",
    ];
    for pair in order.windows(2) {
        assert!(at(pair[0]) < at(pair[1]), "{pair:?}: {said}");
    }
}

/// Issue 38: a lock name where a command goes (`redmutex NAME COMMAND`, flock's order) is
/// pointed at `redmutex run NAME COMMAND`, never at `unlock` (which frees someone else's
/// lock); a typo of a command is still told its command. Usage errors: exit 2.
#[test]
fn a_lock_name_first_points_at_run_not_unlock() {
    for (args, said) in [
        (
            &["mylock", "./backup.sh", "--full"][..],
            "redmutex run mylock ./backup.sh --full",
        ),
        (&["lock", "make"], "redmutex run lock make"),
        (&["nightly"], "redmutex run nightly"),
        (
            &["--url", "redis://127.0.0.1:1/", "deploy", "ls"],
            "redmutex run deploy ls",
        ),
        (&["stauts", "deploy"], "'status'"),
    ] {
        let out = output(bare().args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(!err.contains("unlock"), "{args:?}: {err}");
    }
}

/// Issue 38: a semaphore refused says all its permits are in use, a read lock that a
/// writer is in the way, not "held by another".
#[test]
fn a_refusal_says_what_is_in_the_way() {
    let server = RedisServer::new();
    let _permit = Holding::start(&server, &["-n", "1", "pool"]);
    let out = output(redmutex(&server).args(["run", "-n", "1", "--no-wait", "pool", "true"]));
    assert_eq!(out.status.code(), Some(75));
    let err = text(&out.stderr);
    assert!(err.contains("all permits of pool are in use"), "{err}");
    assert!(!err.contains("held by another"), "{err}");
    let _writer = Holding::start(&server, &["-x", "schema"]);
    let out = output(redmutex(&server).args(["run", "-s", "-w", "0.1", "schema", "true"]));
    assert_eq!(out.status.code(), Some(75));
    let err = text(&out.stderr);
    assert!(err.contains("schema is held for writing"), "{err}");
}

/// Issue 38: `status` without a name shows every object of the prefix, as `list` does
/// (table and JSON), instead of a usage error; a semaphore that exists with no holder
/// shows its permits (`status` and `list`), not "free".
#[test]
fn status_without_a_name_shows_everything_and_an_idle_semaphore_its_permits() {
    let (server, c) = CLIENTS.serve();
    let held = c.lock("deploy").lock().unwrap();
    c.semaphore("pool", 3).acquire().unwrap().release().unwrap();
    for args in [
        &["status", "--json", "pool"][..],
        &["list", "--json"],
        &["status", "--json"],
    ] {
        let doc = json(&output(redmutex(&server).args(args)));
        let objects = doc["objects"].as_array().unwrap();
        let pool = objects
            .iter()
            .find(|o| o["name"] == "pool")
            .unwrap_or_else(|| panic!("{args:?}: {doc}"));
        assert_eq!(pool["kind"], "semaphore", "{args:?}: {doc}");
        assert_eq!(pool["permits"], 3, "{args:?}: {doc}");
        assert_eq!(pool["holders"], serde_json::json!([]), "{args:?}: {doc}");
        if args.len() == 2 {
            let names: Vec<&str> = objects.iter().filter_map(|o| o["name"].as_str()).collect();
            assert_eq!(names, ["deploy", "pool"], "{args:?}: {doc}");
        }
    }
    let out = output(redmutex(&server).arg("status"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let listed = text(&output(redmutex(&server).arg("list")).stdout);
    let rows = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(rows(&table), rows(&listed), "{table}");
    assert!(table.contains("semaphore (3 permits)"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("deploy ")), "{table}");
    held.unlock().unwrap();
}

/// Issue 38: the manual has an ENVIRONMENT section naming every variable redmutex reads
/// (the whole page and each command's).
#[test]
fn the_manual_says_which_environment_variables_are_read() {
    for path in [&[][..], &["run"], &["latch", "wait"]] {
        let man = output(bare().arg("man").args(path));
        assert_eq!(man.status.code(), Some(0));
        let man = text(&man.stdout).replace("\\-", "-");
        let section = man
            .split_once(".SH ENVIRONMENT")
            .unwrap_or_else(|| panic!("{path:?}: no ENVIRONMENT section"))
            .1;
        let section = section.split("\n.SH ").next().unwrap();
        for var in [
            "REDIS_URL",
            "REDMUTEX_PREFIX",
            "REDIS_SENTINELS",
            "REDIS_SENTINEL_SERVICE",
            "REDIS_CLUSTER",
            "RUST_LOG",
            "USER",
        ] {
            assert!(section.contains(var), "{path:?}: {var} not in {section}");
        }
        assert!(section.contains("--url"), "{path:?}: {section}");
    }
}
