//! The `redmutex` command, built with the `cli` feature, run as a process against a real
//! redis-server: overlap, exit codes, signals, status, forced unlock and bad input.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Commands;
use redmutex::Client;
use support::cli::output;
use support::clients::Clients;
use support::keys::{self, Keys};
use support::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_redmutex");

const PREFIX: &str = "cli:";

const CLIENTS: Clients = support::cli::clients(PREFIX);

fn redmutex(server: &RedisServer) -> Command {
    support::cli::redmutex(server, PREFIX)
}

fn locked(c: &Client, name: &str) -> bool {
    c.lock(name).is_locked().expect("is_locked")
}

/// Waits until one thread waits in the queue of the lock `name`.
fn queued(server: &RedisServer, name: &str) {
    let queue = Keys::lock(PREFIX, name).queue();
    assert!(support::wait_until(Duration::from_secs(5), || {
        redis::cmd("LLEN")
            .arg(&queue)
            .query::<i64>(&mut server.connection())
            .unwrap()
            == 1
    }));
}

/// Nanoseconds since the epoch, as `date +%s%N` in the children writes them.
fn read_ns(path: &std::path::Path) -> u128 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .expect("a timestamp")
}

#[test]
fn two_runs_never_overlap_and_the_second_starts_when_the_first_ends() {
    let (server, c) = CLIENTS.serve();
    let dir = tempfile::tempdir().unwrap();
    let script = |tag: &str| {
        let d = dir.path().display();
        format!("date +%s%N > {d}/{tag}.start; sleep 0.4; date +%s%N > {d}/{tag}.end")
    };
    let mut first = redmutex(&server)
        .args(["run", "nightly", "--", "sh", "-c", &script("a")])
        .spawn()
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(5), || locked(
        &c, "nightly"
    )));
    let second = redmutex(&server)
        .args(["run", "nightly", "--", "sh", "-c", &script("b")])
        .spawn()
        .unwrap();
    assert!(first.wait().unwrap().success());
    let second = second.wait_with_output().unwrap();
    assert!(second.status.success());
    let (a_end, b_start) = (
        read_ns(&dir.path().join("a.end")),
        read_ns(&dir.path().join("b.start")),
    );
    assert!(b_start > a_end, "the second started before the first ended");
    let gap = Duration::from_nanos((b_start - a_end) as u64);
    // The first's exit, its release, the second's wake-up (pub/sub) and starting `date`.
    eprintln!("the second run started {gap:?} after the first's command ended");
    assert!(gap < Duration::from_millis(500), "{gap:?}");
    assert!(!locked(&c, "nightly"));
}

#[test]
fn exit_codes_pass_through() {
    let server = RedisServer::new();
    let code = |script: &str| {
        output(redmutex(&server).args(["run", "codes", "--", "sh", "-c", script]))
            .status
            .code()
    };
    assert_eq!(code("exit 0"), Some(0));
    assert_eq!(code("exit 3"), Some(3));
    // Killed by a signal: 128 + n, as a shell reports it.
    assert_eq!(code("kill -TERM $$"), Some(128 + 15));
    assert_eq!(code("kill -KILL $$"), Some(128 + 9));
    // Not found: 127, like a shell.
    let out = output(redmutex(&server).args(["run", "codes", "--", "/no/such/command"]));
    assert_eq!(out.status.code(), Some(127));
    assert!(!locked(&CLIENTS.at(&server), "codes"));
}

#[test]
fn a_held_lock_gives_75_at_once_with_no_wait_and_at_the_bound_with_wait() {
    let (server, c) = CLIENTS.serve();
    let guard = c.lock("busy").lock().unwrap();
    let t = Instant::now();
    let out = output(redmutex(&server).args(["run", "--no-wait", "busy", "--", "true"]));
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(75));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("busy is held"), "{said}");
    // At once, not after waiting: the holder never lets go (its lease is renewed), so a
    // wait would last until the test ends, and one of a second or more would have said
    // whom it waits for. The bound in time leaves room for starting a process and
    // connecting on a loaded machine (621 ms seen on 2 cores, both busy, for ~20 ms idle).
    assert!(!said.contains("waiting for"), "--no-wait waited: {said}");
    assert!(took < Duration::from_secs(3), "--no-wait took {took:?}");

    let (out, took) = support::timed(|| {
        output(redmutex(&server).args(["run", "--wait", "300ms", "busy", "--", "true"]))
    });
    assert_eq!(out.status.code(), Some(75));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(3300),
        "--wait 300ms took {took:?}"
    );
    guard.unlock().unwrap();
}

#[test]
fn a_killed_redmutex_frees_its_lock_within_the_lease() {
    let (server, c) = CLIENTS.serve();
    let mut run = redmutex(&server)
        .args(["run", "--lease", "1s", "crash", "--", "sleep", "3"])
        .spawn()
        .unwrap();
    assert!(support::wait_until(Duration::from_secs(5), || locked(
        &c, "crash"
    )));
    // Time is the subject: let a renewal or two happen first.
    thread::sleep(Duration::from_millis(700));
    run.kill().unwrap();
    let killed = Instant::now();
    run.wait().unwrap();
    assert!(support::wait_until(Duration::from_secs(3), || !locked(
        &c, "crash"
    )));
    let freed = killed.elapsed();
    eprintln!("the lock of a SIGKILLed redmutex (lease 1 s) freed after {freed:?}");
    // Renewed every third of the lease: at least two thirds were left at the kill.
    assert!(
        freed >= Duration::from_millis(550) && freed <= Duration::from_millis(1300),
        "{freed:?}"
    );
}

/// Starts `redmutex run` with a shell that reports "ready" and traps TERM; returns it
/// once the command is running.
fn trapping(
    server: &RedisServer,
    args: &[&str],
    on_term: &str,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let script = format!("trap '{on_term}' TERM; echo ready; while :; do sleep 0.02; done");
    let mut child = redmutex(server)
        .arg("run")
        .args(args)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (child, out)
}

#[test]
fn sigterm_is_passed_on_and_the_lock_released_once_the_command_exits() {
    let (server, c) = CLIENTS.serve();
    let (mut run, _out) = trapping(&server, &["term"], "exit 7");
    assert!(locked(&c, "term"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(7), "the command's own exit code");
    // Released before redmutex exited.
    assert!(!locked(&c, "term"));
}

#[test]
fn a_lease_lost_while_the_command_runs_signals_it_and_exits_76() {
    let (server, c) = CLIENTS.serve();
    let (mut run, _out) = trapping(&server, &["--lease", "900ms", "lost"], "exit 9");
    assert!(c.lock("lost").force_unlock().unwrap());
    let t = Instant::now();
    let status = run.wait().unwrap();
    // The watchdog finds the hold gone at its next renewal (every 300 ms), then the
    // command gets SIGTERM (exit 9 by its trap) and redmutex says 76.
    assert_eq!(status.code(), Some(76));
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // The loss said once, by its name (not again as the library's WARN naming the key).
    let mut err = String::new();
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(
        err.lines().filter(|l| !l.contains("Terminated")).count(),
        2,
        "the loss, then the command's exit after it (and sh's word on its sleep): {err}"
    );
    assert!(
        err.contains("the lease of lost was lost while the command ran ("),
        "{err}"
    );
    assert!(!err.contains("{lost}") && !err.contains("WARN"), "{err}");
}

/// With the default watchdog (30 s: renewals every 10 s), an operator's `unlock --force`
/// reaches `redmutex run` at once (issue 26): its client is told on its own channel, and
/// the command is signalled well before the next renewal could have found the loss.
#[test]
fn a_force_unlock_stops_the_command_at_once_with_the_default_watchdog() {
    let (server, c) = CLIENTS.serve();
    let (mut run, _out) = trapping(&server, &["forced"], "exit 9");
    assert!(locked(&c, "forced"));
    // Its pub/sub connection listens on its client's own channel once it holds.
    let mut con = server.connection();
    let listening = support::wait_until(Duration::from_secs(5), || {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(keys::control_channels(PREFIX))
            .query(&mut con)
            .unwrap();
        !channels.is_empty()
    });
    assert!(
        listening,
        "redmutex run's client listens on its own channel"
    );
    let t = Instant::now();
    let out = output(redmutex(&server).args(["unlock", "--force", "forced"]));
    assert!(out.status.success(), "{out:?}");
    let status = run.wait().unwrap();
    let took = t.elapsed();
    assert_eq!(status.code(), Some(76));
    // (The figure includes starting the `unlock` process.)
    println!("unlock --force -> redmutex run exited 76 after {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn status_json_is_what_the_library_reports() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("report");
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let waiter_client = CLIENTS.at(&server);
    let waiter = thread::spawn(move || {
        let g = waiter_client.lock("report").lock().unwrap();
        g.unlock().unwrap();
    });
    queued(&server, "report");
    let out = output(redmutex(&server).args(["status", "--json", "report", "nothing"]));
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["schema"], 1);
    let objects = json["objects"].as_array().expect("an array");
    assert_eq!(objects.len(), 2);
    let report = &objects[0];
    let info = c.inspect("report").unwrap().remove(0);
    assert_eq!(report["name"], "report");
    assert_eq!(report["kind"], "lock");
    assert_eq!(report["key"], info.key);
    let holders = report["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1);
    let id = holders[0]["id"].as_str().unwrap();
    assert!(id.starts_with(c.id()), "{id} is not this client's");
    assert_eq!(holders[0]["count"], 2);
    assert_eq!(lock.hold_count().unwrap(), 2);
    let waiters = report["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1);
    assert_eq!(waiters[0]["id"], info.waiters[0].as_str());
    assert_eq!(waiters[0]["role"], "exclusive");
    assert_eq!(holders[0]["role"], "exclusive");
    let lease = report["lease_remaining_ms"].as_u64().unwrap();
    assert!(lease > 0 && lease <= 5000, "{lease}");
    assert_eq!(objects[1]["name"], "nothing");
    assert_eq!(objects[1]["kind"], "free");
    // The table says the same for people.
    let table = output(redmutex(&server).args(["status", "report"]));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains(id) && text.contains("lock"), "{text}");
    let listed = output(redmutex(&server).args(["list", "rep*", "--json"]));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["objects"][0]["name"], "report");
    drop(inner);
    outer.unlock().unwrap();
    waiter.join().unwrap();
}

#[test]
fn unlock_force_frees_a_held_lock_and_refuses_a_key_that_is_not_a_lock() {
    let (server, c) = CLIENTS.serve();
    let guard = c.lock("stuck").lock().unwrap();
    let out = output(redmutex(&server).args(["unlock", "--force", "stuck"]));
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(c.id()),
        "it did not say what it removed: {said}"
    );
    assert!(!locked(&c, "stuck"));
    assert!(guard.unlock().is_err());
    // Without --force: refused by the arguments.
    let out = output(redmutex(&server).args(["unlock", "stuck"]));
    assert_eq!(out.status.code(), Some(2));

    let mut con = server.connection();
    let key = Keys::lock(PREFIX, "data").key();
    let _: () = con.set(&key, "precious").unwrap();
    let out = output(redmutex(&server).args(["unlock", "--force", "data"]));
    assert_eq!(out.status.code(), Some(65));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("WRONGTYPE"), "{stderr}");
    let value: String = redis::cmd("GET").arg(&key).query(&mut con).unwrap();
    assert_eq!(value, "precious");
}

#[test]
fn wait_returns_when_the_lock_is_released() {
    let (server, c) = CLIENTS.serve();
    let guard = c.lock("gate").lock().unwrap();
    let waiting = redmutex(&server).args(["wait", "gate"]).spawn().unwrap();
    queued(&server, "gate");
    let released = Instant::now();
    guard.unlock().unwrap();
    let out = waiting.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(released.elapsed() < Duration::from_millis(500));
    assert!(!locked(&c, "gate"));
    let out = output(redmutex(&server).args(["wait", "--wait", "200ms", "gate"]));
    assert!(out.status.success());
}

#[test]
fn bad_input_fails_with_a_clear_message_and_no_panic() {
    let server = RedisServer::new();
    let out = output(redmutex(&server).arg("bogus"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));

    let out = output(redmutex(&server).args(["run", "--wait", "5x", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("durations like"));

    let out = output(redmutex(&server).args(["run", "x"]));
    assert_eq!(out.status.code(), Some(2), "a run without a command");

    let out = output(redmutex(&server).args(["status", ""]));
    assert_eq!(out.status.code(), Some(64));

    // Unreachable: a clear error, and the password in the URL never printed.
    let out = output(Command::new(BIN).env_remove("REDIS_URL").args([
        "--url",
        "redis://user:s3cret@127.0.0.1:1/",
        "--connect-timeout",
        "300ms",
        "status",
        "x",
    ]));
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("redis"), "{stderr}");
    assert!(
        stderr.contains("cannot reach redis at 127.0.0.1:1: connection refused"),
        "the error names the server: {stderr}"
    );
    assert!(
        !stderr.contains("s3cret"),
        "the password was printed: {stderr}"
    );
    let help = output(
        Command::new(BIN)
            .env("REDIS_URL", "redis://u:s3cret@h/")
            .args(["--help"]),
    );
    assert!(!String::from_utf8_lossy(&help.stdout).contains("s3cret"));
}

#[test]
fn verbose_shows_the_library_events_and_quiet_silences_them() {
    let server = RedisServer::new();
    let stderr_of = |args: &[&str], rust_log: Option<&str>| {
        let mut cmd = redmutex(&server);
        match rust_log {
            Some(filter) => cmd.env("RUST_LOG", filter),
            None => cmd.env_remove("RUST_LOG"),
        };
        let out = output(cmd.args(args));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        stderr
    };
    let run = ["run", "shown", "--", "true"];

    // -v: the acquisition's span with its fields, and the release.
    let shown = stderr_of(&[&["-v"], &run[..]].concat(), None);
    assert!(
        shown.contains("redmutex.acquire{lock=shown kind=Lock"),
        "{shown}"
    );
    assert!(shown.contains("outcome=acquired"), "{shown}");
    assert!(shown.contains("released lock=shown"), "{shown}");
    // RUST_LOG picks the same without -v.
    let logged = stderr_of(&run, Some("redmutex=debug"));
    assert!(logged.contains("released lock=shown"), "{logged}");
    // -q silences them whatever RUST_LOG says; by default a run that goes well is silent.
    assert_eq!(stderr_of(&[&["-q"], &run[..]].concat(), Some("debug")), "");
    assert_eq!(stderr_of(&run, None), "");

    // Everything of every crate, against a server that is not there: the password in the
    // URL still never shows.
    let out = output(Command::new(BIN).env_remove("REDIS_URL").args([
        "-vv",
        "--url",
        "redis://user:s3cret@127.0.0.1:1/",
        "--connect-timeout",
        "300ms",
        "status",
        "x",
    ]));
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("s3cret"),
        "the password was printed: {stderr}"
    );
}

/// Whether the process `pid` has ended (gone, or a zombie nobody reaped yet: an orphan
/// whose new parent does not reap it promptly).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn a_sigkilled_redmutex_takes_its_command_and_the_commands_children_with_it() {
    let (server, c) = CLIENTS.serve();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // A shell with a background loop of its own (a grandchild of redmutex, with children
    // of its own) that writes a tick every 50 ms for as long as it lives.
    let script = format!(
        "(while :; do date +%s%N >> {d}/tick; sleep 0.05; done) & echo $! > {d}/loop.pid; \
         echo $$ > {d}/sh.pid; echo ready; wait"
    );
    let mut run = redmutex(&server)
        .args(["run", "--lease", "2s", "orphan", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = |f: &str| -> i32 {
        std::fs::read_to_string(dir.path().join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (sh, lp) = (pid("sh.pid"), pid("loop.pid"));
    assert!(!ended(sh) && !ended(lp));
    assert!(support::wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(dir.path().join("tick")).is_ok_and(|t| t.lines().count() >= 2)
    }));
    run.kill().unwrap();
    let killed = Instant::now();
    run.wait().unwrap();
    let died = support::wait_until(Duration::from_secs(3), || ended(sh) && ended(lp));
    let alive = (!ended(sh), !ended(lp));
    if !died {
        // Leave nothing behind: the orphans' process group is the shell's, or redmutex's.
        for pid in [sh, lp] {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    assert!(
        died,
        "the command (alive: {}) or its child (alive: {}) outlived redmutex",
        alive.0, alive.1
    );
    let gone = killed.elapsed();
    eprintln!("the command and its children ended {gone:?} after redmutex was SIGKILLed");
    assert!(gone < Duration::from_secs(1), "{gone:?}");
    // The lock is still held by the dead run until its lease ends; the next run starts
    // after that, and nothing of the first run's command writes any more.
    let second = output(redmutex(&server).args([
        "run",
        "orphan",
        "--",
        "sh",
        "-c",
        &format!("date +%s%N > {d}/second.start; sleep 0.3"),
    ]));
    assert!(second.status.success());
    let start = read_ns(&dir.path().join("second.start"));
    let last_tick: u128 = std::fs::read_to_string(dir.path().join("tick"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("ticks");
    assert!(
        last_tick < start,
        "the first run's command ticked {} ms after the second started",
        (last_tick - start) / 1_000_000
    );
    assert!(!locked(&c, "orphan"));
}

#[test]
fn a_signal_while_the_lock_is_being_acquired_releases_it_at_once() {
    let server = RedisServer::new();
    let proxy = support::FaultProxy::new(server.port());
    let c = CLIENTS.at(&server);
    // The acquisition's requests reach Redis 100 ms late each: a SIGTERM sent meanwhile
    // arrives while the lock is being taken. Redis then grants it; redmutex must give it
    // back at once rather than die and leave it held for the 6 s lease. (--wait, not
    // --no-wait: a single attempt's reply is not waited for that long.)
    let marker = "{around}";
    proxy.delay_requests_containing(marker, Duration::from_millis(100));
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let run = Command::new(BIN)
        .env_remove("REDIS_URL")
        .args(["--url", &proxy.url(), "--prefix", PREFIX])
        .args([
            "run", "--wait", "5s", "--lease", "6s", "around", "--", "touch",
        ])
        .arg(&ran)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(proxy.wait_seen(marker, 1, Duration::from_secs(5)));
    let signalled = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = run.wait_with_output().unwrap();
    let exited = signalled.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(128 + 15), "{stderr}");
    assert!(stderr.contains("released"), "{stderr}");
    assert!(!ran.exists(), "the command ran after the signal");
    // The request did reach Redis (it took the lock); by the time redmutex exited, the
    // lock was free again.
    assert!(proxy.wait_forwarded(marker, 1, Duration::from_secs(5)));
    let held = locked(&c, "around");
    eprintln!("redmutex exited {exited:?} after the signal; lock still held: {held}");
    assert!(!held, "the lock was left held until its lease ends");
    // Within the 1 s a signal waits for an acquisition, plus the release.
    assert!(exited < Duration::from_millis(2000), "{exited:?}");
}

#[test]
fn a_signal_while_waiting_ends_the_wait_and_takes_nothing() {
    let (server, c) = CLIENTS.serve();
    for (name, args) in [
        (
            "queue-run",
            &["run", "--lease", "6s", "queue-run", "--", "true"][..],
        ),
        ("queue-wait", &["wait", "queue-wait"]),
    ] {
        let guard = c.lock(name).lock().unwrap();
        let run = redmutex(&server)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        queued(&server, name);
        let signalled = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(run.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let out = run.wait_with_output().unwrap();
        let took = signalled.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + 2), "{args:?}: {stderr}");
        // It waits up to 1 s for an acquisition under way to return.
        assert!(took < Duration::from_millis(2000), "{args:?}: {took:?}");
        assert!(stderr.contains("not acquired"), "{stderr}");
        // The holder's hold is untouched.
        assert_eq!(c.lock(name).hold_count().unwrap(), 1);
        guard.unlock().unwrap();
    }
}

#[test]
fn status_and_list_into_a_closed_pipe_exit_quietly() {
    let (server, c) = CLIENTS.serve();
    let _guard = c.lock("piped").lock().unwrap();
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["status", "piped"],
        &["status", "--json", "piped"],
    ] {
        let (read, write) = nix::unistd::pipe().unwrap();
        // Like `redmutex list | head -0`: the reader is gone before anything is written.
        drop(read);
        let out = output(
            redmutex(&server)
                .args(args)
                .stdout(Stdio::from(write))
                .stderr(Stdio::piped()),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        // As a tool ended by SIGPIPE reports in a shell: 128 + 13.
        assert_eq!(out.status.code(), Some(141), "{args:?}");
    }
}

/// The kinds `status --json name` shows as held (with at least one holder).
fn held_kinds(server: &RedisServer, name: &str) -> Vec<String> {
    let out = output(redmutex(server).args(["status", "--json", name]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    json["objects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| !o["holders"].as_array().unwrap().is_empty())
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// Once `name`'s `kind` has a waiter, `redmutex unlock --force name` succeeds and says it
/// freed that kind, held by `holder`.
fn force_unlock_with_a_waiter(server: &RedisServer, holder: &Client, name: &str, kind: &str) {
    assert!(
        support::wait_until(Duration::from_secs(5), || holder
            .inspect(name)
            .unwrap()
            .iter()
            .any(|i| i.kind.to_string() == kind && i.waiters.len() == 1)),
        "nobody waits on {name}"
    );
    let out = output(redmutex(server).args(["unlock", "--force", name]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(kind) && said.contains(holder.id()), "{said}");
}

#[test]
fn unlock_force_frees_every_kind_status_shows_held() {
    let (server, c) = CLIENTS.serve();
    let other = CLIENTS.at(&server);

    // A read-write lock held by two readers, with a writer waiting behind them.
    let rw = c.read_write_lock("rw");
    let r1 = rw.read_lock().lock().unwrap();
    let r2 = other.read_write_lock("rw").read_lock().lock().unwrap();
    assert_eq!(held_kinds(&server, "rw"), ["rwlock"]);
    let writer_client = CLIENTS.at(&server);
    let writer = thread::spawn(move || {
        let w = writer_client
            .read_write_lock("rw")
            .write_lock()
            .lock()
            .unwrap();
        w.unlock().unwrap();
    });
    force_unlock_with_a_waiter(&server, &c, "rw", "read-write lock");
    // The writer that waited got it (it was handed on), and released it.
    writer.join().unwrap();
    assert!(
        r1.unlock().is_err(),
        "the forced reader still thinks it holds"
    );
    assert!(r2.unlock().is_err());
    assert!(held_kinds(&server, "rw").is_empty());

    // A semaphore: every permit held is given back (to a waiter first); its number of
    // permits stays.
    let sem = c.semaphore("sem", 2);
    let p = sem
        .try_acquire_with(redmutex::LockOptions::new().permits(2))
        .map(Option::unwrap)
        .unwrap();
    assert_eq!(held_kinds(&server, "sem"), ["semaphore"]);
    let waiter_client = CLIENTS.at(&server);
    let (took_tx, took) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let waiter = thread::spawn(move || {
        let permit = waiter_client.semaphore("sem", 2).acquire().unwrap();
        took_tx.send(()).unwrap();
        done.recv().unwrap();
        permit.release().unwrap();
    });
    force_unlock_with_a_waiter(&server, &c, "sem", "semaphore");
    took.recv_timeout(Duration::from_secs(2))
        .expect("the waiter was not handed a freed permit");
    assert_eq!(sem.available_permits().unwrap(), 1);
    done_tx.send(()).unwrap();
    waiter.join().unwrap();
    assert!(held_kinds(&server, "sem").is_empty());
    assert_eq!(sem.available_permits().unwrap(), 2);
    assert_eq!(sem.permits().unwrap(), 2);
    assert!(
        p.release().is_err(),
        "the forced permits' release succeeded"
    );
    assert_eq!(
        sem.available_permits().unwrap(),
        2,
        "a forced permit came back twice"
    );

    // Fair and fenced locks are the lock of the name.
    for (name, guard) in [
        (
            "fair",
            c.fair_lock("fair")
                .lock()
                .map(|g| Box::new(g) as Box<dyn std::any::Any>),
        ),
        (
            "fenced",
            c.fenced_lock("fenced")
                .lock()
                .map(|g| Box::new(g) as Box<dyn std::any::Any>),
        ),
    ] {
        let _guard = guard.unwrap();
        assert_eq!(held_kinds(&server, name), ["lock"]);
        let out = output(redmutex(&server).args(["unlock", "--force", name]));
        assert!(out.status.success());
        assert!(held_kinds(&server, name).is_empty(), "{name}");
    }

    // Two kinds under one name: both freed. (A name is one kind at a time, so the second
    // is refused; two kinds side by side are what an earlier version could leave, made
    // here by moving the read-write lock's keys aside while the lock is taken.)
    let _w = c.read_write_lock("both").write_lock().lock().unwrap();
    support::assert_wrong_kind(c.lock("both").lock(), "read-write lock");
    let mut con = server.connection();
    let moved = [
        (
            Keys::rw(PREFIX, "both").key(),
            format!("{PREFIX}aside:{{both}}"),
        ),
        (
            Keys::rw(PREFIX, "both").leases(),
            format!("{PREFIX}aside2:{{both}}"),
        ),
    ];
    for (key, aside) in &moved {
        redis::cmd("RENAME")
            .arg(key)
            .arg(aside)
            .query::<()>(&mut con)
            .unwrap();
    }
    let _l = c.lock("both").lock().unwrap();
    for (key, aside) in &moved {
        redis::cmd("RENAME")
            .arg(aside)
            .arg(key)
            .query::<()>(&mut con)
            .unwrap();
    }
    assert_eq!(held_kinds(&server, "both").len(), 2);
    let out = output(redmutex(&server).args(["unlock", "--force", "both"]));
    assert!(out.status.success());
    assert!(held_kinds(&server, "both").is_empty());

    // A count-down latch has no holder to free: refused, left as it is, not 0.
    let latch = c.count_down_latch("gate");
    assert!(latch.try_set_count(3).unwrap());
    let out = output(redmutex(&server).args(["unlock", "--force", "gate"]));
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stderr).contains("latch"));
    assert_eq!(latch.count().unwrap(), 3);

    // Nothing at all of the name: nothing to do, and it says so.
    let out = output(redmutex(&server).args(["unlock", "--force", "nothing"]));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing removed"));
}

/// SIGKILLs the processes when dropped, so that a failing test leaves none behind.
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The state letter of the process `pid` (`T` stopped, `Z` zombie, …), or `X` if gone.
fn state(pid: i32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .unwrap_or('X')
}

#[test]
fn ctrl_z_stops_the_command_with_redmutex_and_fg_continues_both() {
    let server = RedisServer::new();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let tick = dir.path().join("tick");
    let ticks = || {
        std::fs::read_to_string(&tick)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let script = format!(
        "echo $$ > {d}/sh.pid; echo ready; while :; do echo x >> {d}/tick; sleep 0.05; done"
    );
    let mut run = redmutex(&server)
        .args(["run", "--lease", "6s", "job", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let sh: i32 = std::fs::read_to_string(dir.path().join("sh.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let me = nix::unistd::Pid::from_raw(run.id() as i32);
    let _cleanup = KillOnDrop(vec![sh, me.as_raw()]);
    // What a terminal's Ctrl-Z sends to redmutex's group. The shell shows `D` instead of
    // `T` when the stop caught it in a vfork, waiting for its child (stopped before its
    // exec): stopped all the same, which the ticks below check.
    nix::sys::signal::kill(me, nix::sys::signal::Signal::SIGTSTP).unwrap();
    assert!(
        support::wait_until(Duration::from_secs(5), || matches!(state(sh), 'T' | 'D')
            && state(me.as_raw()) == 'T'),
        "command {}, redmutex {}",
        state(sh),
        state(me.as_raw())
    );
    let stopped_at = ticks();
    // Time is the subject: a stopped command writes nothing for a while.
    thread::sleep(Duration::from_millis(300));
    assert!(
        ticks() <= stopped_at + 1,
        "the command ran on while stopped"
    );
    // `fg`: SIGCONT to redmutex's group.
    nix::sys::signal::kill(me, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(support::wait_until(Duration::from_secs(5), || ticks() > stopped_at + 2));
    assert_ne!(state(sh), 'T');
    nix::sys::signal::kill(me, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(128 + 15));
    assert!(!locked(&CLIENTS.at(&server), "job"));
}

#[test]
fn a_signal_while_waiting_ends_the_wait_at_once() {
    let (server, c) = CLIENTS.serve();
    let guard = c.lock("busy").lock().unwrap();
    let permit = c.semaphore("busy-sem", 1).acquire().unwrap();
    let writer = c.read_write_lock("busy-rw").write_lock().lock().unwrap();
    let mut took = Vec::new();
    for (queue, args) in [
        (
            Keys::lock(PREFIX, "busy"),
            &["run", "--lease", "6s", "busy", "--", "true"][..],
        ),
        (
            Keys::lock(PREFIX, "busy"),
            &["run", "--wait", "1h", "busy", "--", "true"],
        ),
        (Keys::lock(PREFIX, "busy"), &["hold", "busy"]),
        (Keys::lock(PREFIX, "busy"), &["wait", "busy"]),
        (
            Keys::sem(PREFIX, "busy-sem"),
            &["run", "-n", "1", "busy-sem", "true"],
        ),
        (
            Keys::rw(PREFIX, "busy-rw"),
            &["run", "--shared", "-w", "1h", "busy-rw", "true"],
        ),
    ] {
        let queue = queue.queue();
        let len = || {
            redis::cmd("LLEN")
                .arg(&queue)
                .query::<i64>(&mut server.connection())
                .unwrap()
        };
        let run = redmutex(&server)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(support::wait_until(Duration::from_secs(5), || len() == 1));
        let signalled = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(run.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let out = run.wait_with_output().unwrap();
        let elapsed = signalled.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(out.status.code(), Some(128 + 15), "{args:?}: {stderr}");
        assert!(
            stderr.contains("signal 15 while waiting for busy") && stderr.contains("not acquired"),
            "{args:?}: {stderr}"
        );
        took.push((args[0], elapsed));
        eprintln!("{args:?}: exit {elapsed:?} after SIGTERM");
        // flock(1) leaves at once; a second's tick is not "at once" (a loaded machine
        // still stays well within this).
        assert!(
            elapsed < Duration::from_millis(500),
            "{args:?}: {elapsed:?}"
        );
        // It left the queue (its entry does not wait for its lease to lapse).
        assert_eq!(len(), 0, "{args:?}");
    }
    // The holders' holds are untouched.
    assert_eq!(c.lock("busy").hold_count().unwrap(), 1);
    assert_eq!(c.semaphore("busy-sem", 1).available_permits().unwrap(), 0);
    assert!(c
        .read_write_lock("busy-rw")
        .write_lock()
        .is_held_by_current_thread()
        .unwrap());
    eprintln!("exit after SIGTERM while waiting: {took:?}");
    guard.unlock().unwrap();
    permit.release().unwrap();
    writer.unlock().unwrap();
}
