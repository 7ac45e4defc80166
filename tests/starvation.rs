//! Starvation under contention (issue 7): four processes, one thread each, loop
//! `lock()` → ~1 ms critical section → release on one lock for 4 s. With `Lock` no process
//! may starve (each gets at least 20 % of the mean number of acquisitions); with `FairLock`
//! the least-served process gets at least half of what the most-served one gets. A
//! witness in Redis counts overlapping critical sections: there must be none.
//!
//! The workers are this test binary re-executed (`starvation_entry`).

mod support;

use std::time::{Duration, Instant};

use redmutex::Client;
use support::child::{say, ChildProc};
use support::RedisServer;

const ROLE: &str = "REDMUTEX_STARVATION_ROLE";
const URL: &str = "REDMUTEX_STARVATION_URL";
const PREFIX: &str = "starvation:";
const LOCK: &str = "contended";
const WORKERS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(4);
const SECTION: Duration = Duration::from_millis(1);

/// Entering: the number of callers inside, this one included, must be 1. KEYS[1] the
/// witness counter, KEYS[2] its violation counter; ARGV[1] "enter" or "exit".
const WITNESS: &str = r"
if ARGV[1] == 'enter' then
    if redis.call('incr', KEYS[1]) ~= 1 then
        return redis.call('incr', KEYS[2])
    end
else
    redis.call('decr', KEYS[1])
end
return 0
";

/// The child side; a no-op in a normal run.
#[test]
fn starvation_entry() {
    let Some((role, url)) = support::child::entry(ROLE, URL) else {
        return;
    };
    worker(&url, role == "fair");
}

/// Says `ready`, waits for a line, loops for `RUN_FOR`, then says
/// `count <acquisitions> <errors>`.
fn worker(url: &str, fair: bool) {
    let client = Client::builder()
        .url(url)
        .key_prefix(PREFIX)
        .watchdog_timeout(Duration::from_secs(10))
        .command_timeout(Duration::from_secs(2))
        .build()
        .expect("build client");
    let mut con = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("witness connection");
    let witness = redis::Script::new(WITNESS);
    let call = |op: &str, con: &mut redis::Connection| {
        witness
            .key("witness:inside")
            .key("witness:violations")
            .arg(op)
            .invoke::<i64>(con)
            .expect("witness")
    };
    // Loads the script, so that the first critical section is as short as the others.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(WITNESS)
        .query(&mut con)
        .expect("SCRIPT LOAD");
    say("ready");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read from the parent");
    let (count, errors) = if fair {
        run(&client.fair_lock(LOCK), &mut con, &call)
    } else {
        run(&client.lock(LOCK), &mut con, &call)
    };
    say(&format!("count {count} {errors}"));
}

/// The loop of one worker, for any kind of lock: lock, 1 ms inside (witnessed), release.
fn run<K: redmutex::Kind>(
    lock: &redmutex::Lock<K>,
    con: &mut redis::Connection,
    call: &dyn Fn(&str, &mut redis::Connection) -> i64,
) -> (u64, u64) {
    let started = Instant::now();
    let (mut count, mut errors) = (0u64, 0u64);
    while started.elapsed() < RUN_FOR {
        let Ok(guard) = lock.lock() else {
            errors += 1;
            continue;
        };
        call("enter", con);
        std::thread::sleep(SECTION);
        call("exit", con);
        if guard.unlock().is_err() {
            errors += 1;
        }
        count += 1;
    }
    (count, errors)
}

/// Runs the loop in `WORKERS` processes; returns each one's acquisitions and the
/// witnessed overlaps.
fn contend(kind: &str) -> (Vec<u64>, i64) {
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let mut workers: Vec<ChildProc> = (0..WORKERS)
        .map(|_| ChildProc::spawn("starvation_entry", &[(ROLE, kind), (URL, &url)]))
        .collect();
    for w in &workers {
        w.expect("ready");
    }
    for w in &mut workers {
        w.send("go");
    }
    let mut counts = Vec::new();
    for w in workers {
        let line = w.next_line();
        let words: Vec<u64> = support::child::numbers(&line, "count ");
        assert_eq!(words[1], 0, "{kind}: a worker's lock or unlock failed");
        counts.push(words[0]);
        w.wait_success();
    }
    let violations: Option<i64> = redis::cmd("GET")
        .arg("witness:violations")
        .query(&mut con)
        .expect("GET");
    let total: u64 = counts.iter().sum();
    let (least, most) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    eprintln!(
        "starvation ({kind}): {WORKERS} processes x 1 thread, {RUN_FOR:?}, {SECTION:?} \
         sections: {total} acquisitions ({:.0}/s), per process {counts:?}, least/most {:.2}",
        total as f64 / RUN_FOR.as_secs_f64(),
        least as f64 / most.max(1) as f64
    );
    (counts, violations.unwrap_or(0))
}

/// Issue 7, "`Lock` under the 4-process loop: no process starves": every process gets at
/// least 20 % of the mean number of acquisitions, and no two are ever inside at once.
/// How evenly a plain (barging) lock serves them is a measure of speed, not a property:
/// with the machine's cores busy elsewhere, the process that is running takes a free lock
/// before a sleeping one is scheduled (least/most 0.44 seen with both cores loaded), so
/// the ratio is a target of `cargo bench --bench contention` (on a quiet machine), not
/// asserted here. `FairLock`'s evenness below is its contract, asserted.
#[test]
fn a_contended_lock_starves_no_process() {
    let (counts, violations) = contend("plain");
    assert_eq!(violations, 0, "critical sections overlapped");
    let total: u64 = counts.iter().sum();
    let mean = total as f64 / counts.len() as f64;
    assert!(total >= 200, "only {total} acquisitions in {RUN_FOR:?}");
    for (i, &c) in counts.iter().enumerate() {
        assert!(
            c as f64 >= 0.2 * mean,
            "process {i} starved: {c} acquisitions, mean {mean:.0} ({counts:?})"
        );
    }
}

/// Issue 7, the same loop on a `FairLock`: the least-served process gets at least 0.8 of
/// what the most-served one gets (strict FIFO makes them take turns), and no two are ever
/// inside at once.
#[test]
fn a_contended_fair_lock_serves_processes_evenly() {
    let (counts, violations) = contend("fair");
    assert_eq!(violations, 0, "critical sections overlapped");
    let total: u64 = counts.iter().sum();
    let (least, most) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    assert!(total >= 200, "only {total} acquisitions in {RUN_FOR:?}");
    assert!(
        least as f64 >= 0.8 * most as f64,
        "least/most {least}/{most} below 0.8 ({counts:?})"
    );
}
