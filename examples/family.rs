//! The lock family at work: a read-write lock, a semaphore and a count-down latch, each
//! shared by several clients (one per participant, as separate processes would be), with
//! a witness in Redis that counts who is inside and proves the guarantee held.
//!
//! ```sh
//! cargo run --release --example family
//! ```
//!
//! Without `REDIS_URL` it starts a throwaway `redis-server` on a free loopback port.
//!
//! - **Read-write lock**: 6 readers and 2 writers loop on one lock. Readers hold it for
//!   2 ms, writers for 1 ms. Printed: reads and writes per second, the most readers inside
//!   at once, and violations (a writer inside with anyone else): must be 0.
//! - **Semaphore**: 12 workers share 4 permits, some asking for 2 at once, each holding its
//!   permits for 2 ms. Printed: acquisitions per second, the most permits in use at once
//!   (must not pass 4), and each worker's share.
//! - **Count-down latch**: 2 waiters sleep until 5 workers, finishing at random moments,
//!   have all counted down. Printed: how long after the last count-down each waiter woke.

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, LockOptions};

const RUN_FOR: Duration = Duration::from_secs(2);
const PREFIX: &str = "family-demo:";

/// Adds ARGV[1] to the counter KEYS[1] and keeps its high-water mark in KEYS[2]: the
/// witness of who is inside, atomic on the server whatever the clients do.
const ENTER: &str = r"
local now = redis.call('incrby', KEYS[1], ARGV[1])
if now > tonumber(redis.call('get', KEYS[2]) or '0') then
    redis.call('set', KEYS[2], now)
end
return now
";

struct Witness {
    con: redis::Connection,
    enter: redis::Script,
}

impl Witness {
    fn new(url: &str) -> Witness {
        let con = redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("connect to Redis");
        Witness {
            con,
            enter: redis::Script::new(ENTER),
        }
    }

    /// Counts `n` in (or out, negative) on `what`; returns how many are inside now.
    fn count(&mut self, what: &str, n: i64) -> i64 {
        self.enter
            .key(format!("{PREFIX}witness:{what}"))
            .key(format!("{PREFIX}witness:{what}:max"))
            .arg(n)
            .invoke(&mut self.con)
            .expect("witness")
    }

    fn get(&mut self, key: &str) -> i64 {
        redis::cmd("GET")
            .arg(format!("{PREFIX}witness:{key}"))
            .query::<Option<i64>>(&mut self.con)
            .expect("witness read")
            .unwrap_or(0)
    }
}

fn client(url: &str) -> Client {
    Client::builder()
        .url(url)
        .key_prefix(PREFIX)
        .build()
        .expect("client")
}

fn main() -> ExitCode {
    let (url, _server) = support::redis_url_or_spawn();
    // A fresh witness (only its own keys: REDIS_URL may point at a server in use).
    let mut reset = redis::cmd("DEL");
    for what in ["readers", "writers", "permits"] {
        reset
            .arg(format!("{PREFIX}witness:{what}"))
            .arg(format!("{PREFIX}witness:{what}:max"));
    }
    reset
        .exec(&mut Witness::new(&url).con)
        .expect("reset the witness");
    let ok = read_write(&url) & semaphore(&url) & latch(&url);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn read_write(url: &str) -> bool {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let (url, stop) = (url.to_owned(), stop.clone());
            thread::spawn(move || {
                let rw = client(&url).read_write_lock("catalog");
                let mut w = Witness::new(&url);
                let (mut done, mut violations) = (0u64, 0u64);
                let writer = i >= 6;
                while !stop.load(Ordering::Relaxed) {
                    if writer {
                        let guard = rw.write().expect("write lock");
                        if w.count("writers", 1) != 1 || w.get("readers") != 0 {
                            violations += 1;
                        }
                        thread::sleep(Duration::from_millis(1));
                        w.count("writers", -1);
                        guard.unlock().expect("write unlock");
                    } else {
                        let guard = rw.read().expect("read lock");
                        w.count("readers", 1);
                        if w.get("writers") != 0 {
                            violations += 1;
                        }
                        thread::sleep(Duration::from_millis(2));
                        w.count("readers", -1);
                        guard.unlock().expect("read unlock");
                    }
                    done += 1;
                }
                (writer, done, violations)
            })
        })
        .collect();
    thread::sleep(RUN_FOR);
    stop.store(true, Ordering::Relaxed);
    let (mut reads, mut writes, mut violations) = (0, 0, 0);
    for t in workers {
        let (writer, done, bad) = t.join().expect("worker");
        if writer {
            writes += done;
        } else {
            reads += done;
        }
        violations += bad;
    }
    let secs = started.elapsed().as_secs_f64();
    let most_readers = Witness::new(url).get("readers:max");
    println!(
        "read-write lock: {:.0} reads/s and {:.0} writes/s over 6 readers + 2 writers; \
         up to {most_readers} readers inside at once; {violations} violations",
        reads as f64 / secs,
        writes as f64 / secs,
    );
    violations == 0 && most_readers >= 2 && writes > 0
}

fn semaphore(url: &str) -> bool {
    const PERMITS: u32 = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..12)
        .map(|i| {
            let (url, stop) = (url.to_owned(), stop.clone());
            thread::spawn(move || {
                let sem = client(&url).semaphore("encoders", PERMITS);
                let mut w = Witness::new(&url);
                let want = if i % 4 == 0 { 2 } else { 1 };
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let permit = sem
                        .try_acquire_with(LockOptions::new().permits(want))
                        .expect("acquire")
                        .expect("no wait bound: always acquired");
                    w.count("permits", i64::from(want));
                    thread::sleep(Duration::from_millis(2));
                    w.count("permits", -i64::from(want));
                    permit.release().expect("release");
                    done += 1;
                }
                done
            })
        })
        .collect();
    thread::sleep(RUN_FOR);
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = workers
        .into_iter()
        .map(|t| t.join().expect("worker"))
        .collect();
    let secs = started.elapsed().as_secs_f64();
    let most = Witness::new(url).get("permits:max");
    let total: u64 = counts.iter().sum();
    println!(
        "semaphore: {:.0} acquisitions/s by 12 workers on {PERMITS} permits; at most \
         {most} permits in use at once; per worker {counts:?}",
        total as f64 / secs,
    );
    most <= i64::from(PERMITS) && most >= 2 && counts.iter().all(|&c| c > 0)
}

fn latch(url: &str) -> bool {
    let setter = client(url).count_down_latch("import");
    setter.try_set_count(5).expect("set the latch");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let latch = client(url).count_down_latch("import");
            thread::spawn(move || {
                let opened = latch.wait_for(Duration::from_secs(10)).expect("wait");
                (opened, Instant::now())
            })
        })
        .collect();
    let workers: Vec<_> = (0..5u64)
        .map(|i| {
            let latch = client(url).count_down_latch("import");
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(40 + 37 * i));
                latch.count_down().expect("count down");
                Instant::now()
            })
        })
        .collect();
    let last = workers
        .into_iter()
        .map(|t| t.join().expect("worker"))
        .max()
        .expect("five workers");
    let mut ok = true;
    let delays: Vec<String> = waiters
        .into_iter()
        .map(|t| {
            let (opened, at) = t.join().expect("waiter");
            ok &= opened;
            format!(
                "{:.2} ms",
                at.saturating_duration_since(last).as_secs_f64() * 1e3
            )
        })
        .collect();
    println!(
        "count-down latch: 5 workers counted down; the 2 waiters woke {} after the last",
        delays.join(" and ")
    );
    ok
}
