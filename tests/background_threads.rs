//! Background threads that cannot be started: the waiter gets a typed error, nothing is
//! leaked or left poisoned, and the next waiter works once threads can be started again.
//! Background threads that did start end soon after the last handle of their client is
//! dropped.

mod support;

use std::time::{Duration, Instant};

use redmutex::{Client, Error};
use support::child::{say, ChildProc};
use support::RedisServer;

const URL: &str = "REDMUTEX_LIFECYCLE_URL";
const THREADS_URL: &str = "REDMUTEX_LIFECYCLE_THREADS_URL";

/// The current virtual size of this process, in bytes.
fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmSize in /proc/self/status");
    kib * 1024
}

fn set_address_space_limit(soft: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_AS, &mut lim), 0);
        lim.rlim_cur = soft.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &lim), 0);
    }
}

/// Runs in a child process only (a no-op in the normal test run): lowering the address
/// space limit would disturb the other tests of the binary.
#[test]
fn child_entry() {
    let Ok(url) = std::env::var(URL) else {
        return;
    };
    let build = || {
        Client::builder()
            .url(url.as_str())
            .key_prefix("lifecycle:")
            .build()
            .unwrap()
    };
    let (holder, waiter) = (build(), build());
    let held = support::leased(&holder.lock("busy"), Duration::from_secs(30), "acquire");
    let lock = waiter.lock("busy");
    // Warm the pool and the scripts without waiting (no pub/sub thread yet).
    assert!(lock
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::ZERO)
                .lease(Duration::from_secs(1))
        )
        .unwrap()
        .is_none());

    // No room for another thread's stack: the pub/sub thread cannot start.
    set_address_space_limit(vm_size() + 512 * 1024);
    let first = lock.try_lock_with(
        redmutex::LockOptions::new()
            .wait_for(Duration::from_millis(200))
            .lease(Duration::from_secs(1)),
    );
    set_address_space_limit(u64::MAX);
    say(&match &first {
        Err(Error::Thread(_)) => "thread-error".to_owned(),
        other => format!("unexpected {other:?}"),
    });

    // Threads can be started again: the next waiter works, woken by the release.
    let busy = holder.lock("busy");
    let releaser = std::thread::spawn(move || {
        // Time is not the subject: any moment after the waiter started will do.
        std::thread::sleep(Duration::from_millis(300));
        busy.force_unlock()
    });
    let (second, waited) = support::timed(|| {
        lock.try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::from_secs(5))
                .lease(Duration::from_secs(1)),
        )
    });
    match second {
        Ok(Some(g)) if waited < Duration::from_secs(2) => {
            g.unlock().unwrap();
            say("second-waiter-ok");
        }
        other => say(&format!("second waiter: {other:?} after {waited:?}")),
    }
    assert!(
        releaser.join().unwrap().unwrap(),
        "the lock was held until then"
    );
    drop(held);
}

/// Before the fix, the failed spawn panicked inside a `Once` (leaking the subscription's
/// count and poisoning the `Once`), so the child died on the first line.
#[test]
fn a_pubsub_thread_that_cannot_start_is_an_error_and_the_next_waiter_works() {
    let server = RedisServer::new();
    let child = ChildProc::spawn("child_entry", &[(URL, &server.url())]);
    assert_eq!(child.next_line(), "thread-error");
    assert_eq!(child.next_line(), "second-waiter-ok");
    child.wait_success();
}

/// The names of this process's threads that are the library's (`redmutex-...`).
fn library_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .filter(|c| c.starts_with("redmutex-"))
        .collect();
    names.sort();
    names
}

/// The threads each client starts (their names as `/proc` shows them, cut to 15 bytes).
const THREAD_NAMES: [&str; 5] = [
    "redmutex-pool",
    "redmutex-pubsub",
    "redmutex-watchd",
    "redmutex-loss",
    "redmutex-hook",
];
/// How many clients the child uses and drops.
const CLIENTS: usize = 5;
/// How long the child watches its threads after the drop: well past the bound the parent
/// asserts, well short of r2d2's 30 s reaper period.
const WATCHED: Duration = Duration::from_secs(5);

/// Runs in a child process only (a no-op in the normal test run): it counts the threads
/// of the whole process, which parallel tests would add to.
#[test]
fn threads_entry() {
    let Ok(url) = std::env::var(THREADS_URL) else {
        return;
    };
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|_| {
            Client::builder()
                .url(url.as_str())
                .key_prefix("lifecycle:threads:")
                .on_lease_lost(|_| {})
                .build()
                .unwrap()
        })
        .collect();
    // Every thread a client may start: the pool's, the pub/sub connection's and the
    // watchdog's (a watchdog hold), the loss thread's (`lost()`), the hook's.
    let guards: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let guard = c.lock(format!("job:{i}")).lock().unwrap();
            let _ = guard.lost();
            guard
        })
        .collect();
    // A thread takes its name itself, once it runs (std names it from inside): one just
    // started may still show its parent's name. Wait for the names, not for time; the
    // parent asserts the counts, so a thread that never starts still fails it.
    support::wait_until(WATCHED, || {
        let running = library_threads();
        THREAD_NAMES
            .iter()
            .all(|name| running.iter().filter(|n| n == name).count() == CLIENTS)
    });
    say(&format!("running {}", library_threads().join(",")));
    // The guards are the last handles: they keep their clients' threads until dropped.
    drop(clients);
    drop(guards);
    let dropped = Instant::now();
    // Nothing tells of a thread's end but the thread list.
    support::wait_until(WATCHED, || library_threads().is_empty());
    let left = library_threads();
    say(&format!(
        "after {} ms: {}",
        dropped.elapsed().as_millis(),
        left.join(",")
    ));
}

/// Issue 38, "a dropped `Client` leaves its pool thread for 30 s": r2d2's pool thread ran
/// its pending reaper job (due 30 s after the pool was built) before ending, so each
/// client dropped left a `redmutex-pool` thread behind for up to 30 s. Every thread of a
/// client ends within a second of its last handle (here a guard) being dropped (the pub/sub
/// reader, last, notices at its next idle read tick, 250 ms).
#[test]
fn the_threads_of_dropped_clients_end_soon_after() {
    let server = RedisServer::new();
    let child = ChildProc::spawn("threads_entry", &[(THREADS_URL, &server.url())]);
    let running = child.next_line();
    let after = child.next_line();
    println!("{running}\n{after}");
    let (ms, left) = after
        .strip_prefix("after ")
        .and_then(|rest| rest.split_once(" ms: "))
        .unwrap_or_else(|| panic!("unexpected line {after:?}"));
    let ms: u64 = ms.parse().expect("milliseconds");
    assert!(
        left.is_empty() && ms < 1000,
        "threads left {ms} ms after the last client was dropped: {left}"
    );
    let running: Vec<&str> = running
        .strip_prefix("running ")
        .expect("the running threads")
        .split(',')
        .collect();
    for name in THREAD_NAMES {
        assert_eq!(
            running.iter().filter(|n| **n == name).count(),
            CLIENTS,
            "one {name} thread per client: {running:?}"
        );
    }
    child.wait_success();
}
