//! Background threads that cannot be started: the waiter gets a typed error, nothing is
//! leaked or left poisoned, and the next waiter works once threads can be started again.

mod support;

use std::time::Duration;

use redmutex::{Client, Error};
use support::child::{say, ChildProc};
use support::RedisServer;

const URL: &str = "REDMUTEX_LIFECYCLE_URL";

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
