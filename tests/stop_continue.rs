//! A process stopped and continued (SIGSTOP then SIGCONT: Ctrl-Z and `fg`, a debugger, a
//! frozen container) while one of its calls waits for Redis's reply. On Linux the
//! blocked read then fails with `EINTR` even without a signal handler (signal(7): socket
//! reads with a timeout are not restarted after a stop); the call must go on, not fail.

mod support;

use std::io::BufRead;
use std::time::{Duration, Instant};

use support::child::{say, ChildProc};
use support::clients::Clients;
use support::{wait_until, RedisServer};

const PREFIX: &str = "stopped";
/// A command timeout far beyond the test's freeze: the read ends by the signal, never by
/// its timeout.
const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_secs(60))
    .command(Duration::from_secs(20));
const ROLE: &str = "REDMUTEX_STOPPED_ROLE";
const URL: &str = "REDMUTEX_STOPPED_URL";

/// Child: warms its client (scripts loaded, a pooled connection), says `ready <tid>` (the
/// thread that will call), and on `go` takes the lock and says `acquired` or the error.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "locker");
    let client = CLIENTS.at(std::env::var(URL).unwrap().as_str());
    let lock = client.lock("stopped");
    lock.lock()
        .expect("warm-up lock")
        .unlock()
        .expect("warm-up unlock");
    // SAFETY: gettid(2) takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    say(&format!("ready {tid}"));
    let mut lines = std::io::stdin().lock().lines();
    assert_eq!(lines.next().unwrap().unwrap(), "go");
    match lock.lock() {
        Ok(guard) => {
            guard.unlock().expect("unlock");
            say("acquired");
        }
        Err(e) => say(&format!("error {e}")),
    }
}

/// The system call a thread of `pid` is blocked in (its number), or `None` when running.
fn blocked_in(pid: u32, tid: &str) -> Option<i64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Whether process `pid` is stopped (state `T` in /proc/<pid>/stat).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits");
    // SAFETY: kill(2) on our own child, which is not reaped before ChildProc drops.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
}

/// The acquisition is sent while the server is frozen, so the calling thread blocks
/// reading its reply; the process is then stopped and continued (its read fails with
/// EINTR), and the server thawed: the acquisition ends with the lock, not an error.
#[test]
fn a_call_whose_process_is_stopped_and_continued_goes_on() {
    let server = RedisServer::new();
    let url = server.url();
    let mut child = ChildProc::spawn("child_entry", &[(ROLE, "locker"), (URL, url.as_str())]);
    let line = child.next_line();
    let tid = line
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("child said {line:?}"))
        .to_owned();
    let pid = child.child.id();
    server.freeze();
    child.send("go");
    // The calling thread is in a read (or a poll) of its socket: the reply is awaited.
    let reads = [libc::SYS_read, libc::SYS_recvfrom, libc::SYS_ppoll];
    let waiting = wait_until(Duration::from_secs(10), || {
        blocked_in(pid, &tid).is_some_and(|n| reads.contains(&n))
    });
    if !waiting {
        server.thaw();
        panic!("the child never blocked reading its reply");
    }
    signal(pid, libc::SIGSTOP);
    assert!(
        wait_until(Duration::from_secs(10), || stopped(pid)),
        "the child never stopped"
    );
    signal(pid, libc::SIGCONT);
    assert!(
        wait_until(Duration::from_secs(10), || !stopped(pid)),
        "the child never went on"
    );
    let thawed = Instant::now();
    server.thaw();
    let said = child
        .try_line(Duration::from_secs(20))
        .expect("the child never answered");
    assert_eq!(said, "acquired", "after {:?}", thawed.elapsed());
}
