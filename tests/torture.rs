//! Torture: 4 processes x 4 threads take a few fenced locks thousands of times, with
//! nested critical sections, while a chaos thread SIGKILLs and restarts workers and
//! freezes the server. An independent witness inside Redis checks every entry into a
//! critical section: nobody else may still hold the lock, and fencing tokens must
//! strictly increase.
//!
//! Some sections nest a short fixed lease inside the watchdog hold and outlast it (the
//! lease rule: the inner level must not cut the outer hold), and some lock names are
//! built to collide with another lock's auxiliary keys (`{x}` and `{x}:fence`): every
//! name must keep making progress.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redmutex::Client;
use support::child::{say, ChildProc};
use support::RedisServer;

const ROLE: &str = "REDMUTEX_TORTURE_ROLE";
const URL: &str = "REDMUTEX_TORTURE_URL";
const PREFIX: &str = "torture:";
const LOCKS: [&str; 5] = ["alpha", "{x}", "{x}:fence", "x:fence", "beta:released"];
/// One section in this many nests a short fixed lease and outlasts it.
const LONG_EVERY: u64 = 16;
const INNER_LEASE: Duration = Duration::from_millis(30);
const LONG_SECTION: Duration = Duration::from_millis(50);
const WORKERS: usize = 4;
const THREADS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(8);
/// Short, so that a killed holder's lock frees itself quickly.
const WATCHDOG: Duration = Duration::from_millis(1_000);
/// Server freezes stay well below the lease: they must not cost anyone a lock.
const FREEZE: Duration = Duration::from_millis(150);

/// The witness, called at the start and at the end of every critical section. KEYS[1]
/// its hash, KEYS[2] the lock's hash (same slot); ARGV[1] "enter" or "exit", ARGV[2] the
/// caller's fencing token. A violation is a caller inside its critical section while the
/// lock's current hold is not its own (someone else got in, or two holds coexist), or an
/// entry whose token is not larger than every token seen before. Returns the violations.
const WITNESS: &str = r"
local w, lock, op, token = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local violations = 0
if redis.call('hget', lock, '~fence') ~= token or redis.call('hlen', lock) ~= 2 then
    violations = violations + 1
end
if op == 'enter' then
    if tonumber(token) <= tonumber(redis.call('hget', w, 'last') or '0') then
        violations = violations + 1
    end
    if redis.call('hexists', w, 'inside') == 1 then
        -- The previous holder never left: it was killed inside.
        redis.call('hincrby', w, 'takeovers', 1)
    end
    redis.call('hset', w, 'inside', token, 'last', token)
    redis.call('hincrby', w, 'entries', 1)
else
    redis.call('hdel', w, 'inside')
end
if violations > 0 then
    redis.call('hincrby', w, 'violations', violations)
end
return violations
";

/// The Redis key of lock `name` (the names above are brace-free or carry a valid tag).
fn lock_key(name: &str) -> String {
    if name.contains('{') {
        format!("{PREFIX}~{name}")
    } else {
        format!("{PREFIX}{{{name}}}")
    }
}

/// The witness's own key: no lock key starts like this after the prefix.
fn witness_key(name: &str) -> String {
    format!("{PREFIX}witness:{name}")
}

#[test]
fn torture_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "worker");
    worker(&std::env::var(URL).expect("URL"));
}

fn worker(url: &str) {
    let client = Client::builder()
        .url(url)
        .key_prefix(PREFIX)
        .watchdog_timeout(WATCHDOG)
        .command_timeout(Duration::from_millis(500))
        .build()
        .expect("build client");
    say("started");
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let client = client.clone();
            let url = url.to_owned();
            thread::spawn(move || {
                let mut con = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .expect("witness connection");
                let witness = redis::Script::new(WITNESS);
                let mut rng = u64::from(std::process::id()) << 8 | t as u64;
                loop {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let name = LOCKS[(rng % LOCKS.len() as u64) as usize];
                    let lock = client.fenced_lock(name);
                    // Redis may be frozen or the scripts flushed: errors are retried,
                    // never fatal. What must never happen is a witnessed overlap.
                    let long = rng.is_multiple_of(LONG_EVERY);
                    let Ok(outer) = lock.lock() else { continue };
                    let inner = if long {
                        lock.lock_with_lease(INNER_LEASE)
                    } else {
                        lock.lock()
                    };
                    let Ok(inner) = inner else { continue };
                    assert_eq!(outer.token(), inner.token(), "one hold, one token");
                    let call = |op: &str, con: &mut redis::Connection| {
                        witness
                            .key(witness_key(name))
                            .key(lock_key(name))
                            .arg(op)
                            .arg(outer.token())
                            .invoke::<i64>(con)
                    };
                    let _ = call("enter", &mut con);
                    if long {
                        // Outlives the inner level's lease: the watchdog hold must last.
                        thread::sleep(LONG_SECTION);
                    } else {
                        thread::yield_now();
                    }
                    let _ = call("exit", &mut con);
                    drop(inner);
                    let _ = outer.unlock();
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn torture_no_two_holders_ever_overlap() {
    let server = RedisServer::new();
    let url = server.url();
    let spawn = || ChildProc::spawn("torture_entry", &[(ROLE, "worker"), (URL, url.as_str())]);
    let mut workers: Vec<ChildProc> = (0..WORKERS).map(|_| spawn()).collect();
    for w in &workers {
        w.expect("started");
    }

    let (mut kills, mut freezes) = (0, 0);
    let started = Instant::now();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    while started.elapsed() < RUN_FOR {
        thread::sleep(Duration::from_millis(400));
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng.is_multiple_of(3) {
            server.freeze();
            thread::sleep(FREEZE);
            server.thaw();
            freezes += 1;
        } else {
            // SIGKILL mid-flight, holder or not, and start a replacement.
            let i = (rng % WORKERS as u64) as usize;
            workers[i] = spawn();
            workers[i].expect("started");
            kills += 1;
        }
    }
    drop(workers);

    let mut con = server.connection();
    let (mut entries, mut takeovers, mut violations) = (0i64, 0i64, 0i64);
    let mut starved = Vec::new();
    for name in LOCKS {
        let (e, t, v): (Option<i64>, Option<i64>, Option<i64>) = redis::cmd("HMGET")
            .arg(witness_key(name))
            .arg("entries")
            .arg("takeovers")
            .arg("violations")
            .query(&mut con)
            .expect("witness figures");
        eprintln!(
            "torture: lock {name:?}: {} critical sections",
            e.unwrap_or(0)
        );
        if e.unwrap_or(0) < 100 {
            starved.push((name, e.unwrap_or(0)));
        }
        entries += e.unwrap_or(0);
        takeovers += t.unwrap_or(0);
        violations += v.unwrap_or(0);
    }
    eprintln!(
        "torture: {WORKERS} processes x {THREADS} threads, {} locks, {:.1} s: \
         {entries} critical sections (each nested 2 deep), {kills} workers SIGKILLed and \
         restarted, {freezes} server freezes of {FREEZE:?}, {takeovers} takeovers from \
         another holder, violations {violations}",
        LOCKS.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        violations, 0,
        "two holders overlapped, or a token went backwards"
    );
    assert!(entries >= 2_000, "only {entries} critical sections");
    assert!(
        starved.is_empty(),
        "locks that made (almost) no progress: {starved:?}"
    );
    assert!(
        kills >= 5 && freezes >= 2,
        "{kills} kills, {freezes} freezes"
    );
}
