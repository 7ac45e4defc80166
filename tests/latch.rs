//! `CountDownLatch` (issue 8, item 3): processes count down, waiters in other processes
//! wake within a bound of the last count-down without polling, the latch's expiry opens
//! it, and bad input changes nothing.

mod support;

use std::io::BufRead;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Error, LatchOptions};
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, RedisServer};

const ROLE: &str = "REDMUTEX_LATCH_ROLE";
const URL: &str = "REDMUTEX_LATCH_URL";
const PREFIX: &str = "latch:";

const CLIENTS: Clients = Clients::new(PREFIX);
const NAME: &str = "jobs";
/// Waiters wake within this of the count-down that opened the latch.
const WAKE_BOUND: Duration = Duration::from_millis(500);
/// Milliseconds of wall-clock time: the processes compared run on one machine.
fn mono_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
        * 1e3
}

/// The child processes: "waiter" (two threads wait, each reports when it returned) and
/// "counter" (counts down once per line on stdin, reporting when its call returned).
#[test]
fn latch_entry() {
    let (Ok(role), Ok(url)) = (std::env::var(ROLE), std::env::var(URL)) else {
        return;
    };
    let c = CLIENTS.at(&url);
    match role.as_str() {
        "waiter" => {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let latch = c.count_down_latch(NAME);
                    thread::spawn(move || latch.wait_for(Duration::from_secs(20)))
                })
                .collect();
            say("waiting");
            for t in threads {
                let opened = t.join().unwrap().expect("wait");
                say(&format!("woke {} {opened}", mono_ms()));
            }
        }
        "counter" => {
            let latch = c.count_down_latch(NAME);
            say("ready");
            for line in std::io::stdin().lock().lines() {
                if line.unwrap() != "down" {
                    break;
                }
                let left = latch.count_down().expect("count down");
                say(&format!("left {left} {}", mono_ms()));
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str, server: &RedisServer) -> ChildProc {
    ChildProc::spawn("latch_entry", &[(ROLE, role), (URL, server.url().as_str())])
}

/// Issue 8: N processes count down, waiters in other processes (two threads each) wake
/// within a bound of the last count-down, and while they wait they send nothing.
#[test]
fn waiters_across_processes_wake_when_the_last_count_down_lands() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let latch = c.count_down_latch(NAME);
    assert!(latch.try_set_count(3).unwrap());
    let waiters: Vec<ChildProc> = (0..2).map(|_| spawn("waiter", &server)).collect();
    let mut counters: Vec<ChildProc> = (0..3).map(|_| spawn("counter", &server)).collect();
    for w in &waiters {
        w.expect("waiting");
    }
    for c in &counters {
        c.expect("ready");
    }
    let channel = format!("{}:opened", Keys::lock(PREFIX, NAME).latch());
    let mut con = server.connection();
    assert!(
        wait_until(Duration::from_secs(5), || support::subscribers(
            &mut con, &channel
        ) == 2),
        "the waiter processes never subscribed"
    );
    // Settled: each waiting thread has read the count once its subscription was confirmed.
    thread::sleep(Duration::from_millis(200));
    let before = server.total_calls();
    thread::sleep(Duration::from_millis(800));
    let idle = server.total_calls() - before;
    assert!(idle <= 1, "{idle} commands while everybody waited: polling");

    let mut last = 0.0;
    for (i, counter) in counters.iter_mut().enumerate() {
        counter.send("down");
        let line = counter.next_line();
        let mut words = line.split_whitespace().skip(1);
        let left: u64 = words.next().unwrap().parse().unwrap();
        last = words.next().unwrap().parse().unwrap();
        assert_eq!(left, 2 - i as u64, "count after {} count-downs", i + 1);
    }
    for w in &waiters {
        for _ in 0..2 {
            let line = w.next_line();
            let mut words = line.split_whitespace().skip(1);
            let at: f64 = words.next().unwrap().parse().unwrap();
            let opened: bool = words.next().unwrap().parse().unwrap();
            assert!(opened, "a waiter gave up instead of seeing the latch open");
            let after = Duration::from_secs_f64(((at - last) / 1e3).max(0.0));
            assert!(
                after <= WAKE_BOUND,
                "a waiter woke {after:?} after the last count-down"
            );
        }
    }
    assert_eq!(latch.count().unwrap(), 0);
    assert!(
        !support::exists(&mut server.connection(), Keys::lock(PREFIX, NAME).latch()),
        "an open latch leaves no key"
    );
    for c in counters {
        drop(c);
    }
    for w in waiters {
        w.wait_success();
    }
}

/// try_set_count only sets a latch that is not counting; count_down counts one at a time
/// and does nothing to an open latch; the count can be set again once it opened.
#[test]
fn setting_and_counting() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let latch = c.count_down_latch("basics");
    assert_eq!(latch.count().unwrap(), 0, "never set: open");
    assert_eq!(
        latch.count_down().unwrap(),
        0,
        "counting down an open latch"
    );
    assert!(
        !support::exists(
            &mut server.connection(),
            Keys::lock(PREFIX, "basics").latch()
        ),
        "…writes nothing"
    );
    assert!(
        latch.wait_for(Duration::ZERO).unwrap(),
        "an open latch does not block"
    );
    let options = LatchOptions::new().expire_after(Duration::from_secs(30));
    assert!(latch.try_set_count_with(2, options).unwrap());
    assert!(!latch.try_set_count(5).unwrap(), "counting already");
    assert_eq!(latch.count().unwrap(), 2);
    let pttl: i64 = support::query_key(
        &mut server.connection(),
        "PTTL",
        Keys::lock(PREFIX, "basics").latch(),
    );
    assert!(
        (29_000..=30_000).contains(&pttl),
        "the expiry the setter chose: {pttl}"
    );
    assert_eq!(latch.count_down().unwrap(), 1);
    let started = Instant::now();
    assert!(
        !latch.wait_for(Duration::from_millis(200)).unwrap(),
        "still counting"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(700),
        "wait_for(200 ms) took {waited:?}"
    );
    assert_eq!(latch.count_down().unwrap(), 0);
    assert_eq!(latch.count().unwrap(), 0);
    assert!(latch.try_set_count(1).unwrap(), "set again");
    // A name is one kind at a time: no lock of the name while its latch counts, and no
    // latch set while its lock is held (tests/one_kind_per_name.rs has every pair).
    support::assert_wrong_kind(c.lock("basics").lock(), "count-down latch");
    assert_eq!(latch.count_down().unwrap(), 0);
    let guard = c.lock("basics").lock().unwrap();
    assert!(latch.try_set_count(1).is_err());
    assert_eq!(latch.count().unwrap(), 0);
    guard.unlock().unwrap();
}

/// The expiry opens a latch left counting (say its workers crashed): waiters return when
/// it passes, not before, with nothing published.
#[test]
fn an_expired_latch_opens() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let latch = c.count_down_latch("expiring");
    let options = LatchOptions::new().expire_after(Duration::from_millis(400));
    assert!(latch.try_set_count_with(5, options).unwrap());
    let waiter = c.count_down_latch("expiring");
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    thread::spawn(move || {
        let r = waiter.wait_for(Duration::from_secs(5));
        tx.send((r.map_err(|e| e.to_string()), started.elapsed()))
            .unwrap();
    });
    let (opened, after) = rx.recv_timeout(Duration::from_secs(6)).unwrap();
    assert_eq!(opened, Ok(true));
    assert!(
        after >= Duration::from_millis(350) && after <= Duration::from_millis(1_000),
        "the waiter returned {after:?} after a 400 ms expiry"
    );
}

/// Bad input: typed errors, nothing changed.
#[test]
fn bad_input_changes_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let latch = c.count_down_latch("bad");
    for (count, expiry) in [
        (0, Duration::from_secs(1)),
        (1, Duration::ZERO),
        (1, Duration::from_secs(11 * 365 * 24 * 3600)),
        (u64::MAX, Duration::from_secs(1)),
    ] {
        assert!(
            matches!(
                latch.try_set_count_with(count, LatchOptions::new().expire_after(expiry)),
                Err(Error::InvalidArgument { .. })
            ),
            "try_set_count_with({count}, {expiry:?})"
        );
    }
    assert!(!support::exists(
        &mut server.connection(),
        Keys::lock(PREFIX, "bad").latch()
    ));
    let empty = c.count_down_latch("");
    assert!(matches!(empty.count(), Err(Error::InvalidName(_))));
    assert!(matches!(empty.count_down(), Err(Error::InvalidName(_))));
    assert!(matches!(
        empty.wait_for(Duration::ZERO),
        Err(Error::InvalidName(_))
    ));

    // Someone else's data under the latch's key: refused, left as it was.
    let mut con = server.connection();
    let _: () = redis::cmd("SET")
        .arg(Keys::lock(PREFIX, "bad").latch())
        .arg("not a number")
        .arg("PX")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    assert!(latch.count_down().is_err());
    assert!(latch.count().is_err());
    assert!(latch.try_set_count(3).is_err());
    let value: String = support::query_key(&mut con, "GET", Keys::lock(PREFIX, "bad").latch());
    assert_eq!(value, "not a number");
    let pttl: i64 = support::query_key(&mut con, "PTTL", Keys::lock(PREFIX, "bad").latch());
    assert!(pttl > 50_000, "TTL untouched: {pttl}");

    // Numbers that are not Redis integers (a count is never rounded through a double).
    for foreign in [
        "1e3",
        "007",
        "9223372036854775808",
        "99999999999999999999",
        " 5",
    ] {
        let _: () = redis::cmd("SET")
            .arg(Keys::lock(PREFIX, "bad").latch())
            .arg(foreign)
            .query(&mut con)
            .unwrap();
        assert!(latch.count_down().is_err(), "count_down on {foreign:?}");
        assert!(latch.count().is_err(), "count of {foreign:?}");
        let value: String = support::query_key(&mut con, "GET", Keys::lock(PREFIX, "bad").latch());
        assert_eq!(value, foreign);
    }
}

/// A count-down whose reply is lost is not repeated by the client (a repeat would count
/// twice): the caller gets an error saying the outcome is unknown, and the latch counted
/// exactly once.
#[test]
fn a_count_down_whose_reply_is_lost_counts_once() {
    let (server, proxy, c) = CLIENTS.serve_through_proxy();
    let latch = c.count_down_latch("lost");
    assert!(latch.try_set_count(3).unwrap());
    // Loaded already (by the set), so the fault hits the real call, not a load round.
    let sha = support::function_name(&server.url(), "latch_count_down");
    proxy.lose_next_reply_to(&sha);
    let r = latch.count_down();
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert!(r.is_err(), "a lost reply is reported, not retried: {r:?}");
    assert_eq!(latch.count().unwrap(), 2, "counted once");
}

/// Issue 17, item 9: counts are exact over the whole range the API accepts (Lua numbers
/// are doubles: exact only up to 2^53), and a count near `i64::MAX` does not open the
/// latch at once.
#[test]
fn large_counts_are_exact() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let two_53 = 1u64 << 53;
    for (i, count) in [
        i64::MAX as u64,
        i64::MAX as u64 - 1,
        two_53 + 1,
        two_53 + 2,
        two_53,
    ]
    .into_iter()
    .enumerate()
    {
        let latch = c.count_down_latch(format!("large-{i}"));
        assert!(latch.try_set_count(count).unwrap());
        assert_eq!(latch.count().unwrap(), count, "read back");
        assert!(
            !latch.wait_for(Duration::ZERO).unwrap(),
            "a latch counting {count} is not open"
        );
        assert_eq!(
            latch.count_down().unwrap(),
            count - 1,
            "counted down from {count}"
        );
        assert_eq!(latch.count().unwrap(), count - 1);
        assert_eq!(latch.count_down().unwrap(), count - 2);
        assert!(!latch.try_set_count(5).unwrap(), "still counting");
        let info = c.inspect(format!("large-{i}")).unwrap();
        assert_eq!(info[0].count, Some(count - 2), "as inspect reports it");
        let stored: String = support::query_key(
            &mut server.connection(),
            "GET",
            Keys::lock(PREFIX, &format!("large-{i}")).latch(),
        );
        assert_eq!(stored, (count - 2).to_string(), "as Redis holds it");
    }
}

/// Issue 17, item 10: a `try_set_count` whose reply is lost is sent again by the client
/// (it may run twice); the repeat recognizes the set its first run made and answers
/// `true`, not "someone else set it", and the count is the one set.
#[test]
fn a_set_whose_reply_is_lost_answers_that_it_set() {
    let (server, proxy, c) = CLIENTS.serve_through_proxy();
    let latch = c.count_down_latch("lost-set");
    let sha = support::function_name(&server.url(), "latch_set");
    proxy.lose_next_reply_to(&sha);
    let r = latch.try_set_count(3);
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert!(proxy.seen(&sha) >= 2, "the call was repeated");
    assert!(r.unwrap(), "its own set, found by the repeat");
    assert_eq!(latch.count().unwrap(), 3);

    // A latch opened between the first run and the repeat is not set again by the
    // repeat: the first run set it, and the answer says so. (Both runs reach Redis a
    // second late; the latch is counted down in between.)
    let delay = Duration::from_secs(1);
    proxy.delay_requests_containing(&sha, delay);
    proxy.lose_next_reply_to(&sha);
    let setter = c.count_down_latch("lost-set-opened");
    let call = thread::spawn(move || setter.try_set_count(1));
    let direct = CLIENTS
        .at(&server.url())
        .count_down_latch("lost-set-opened");
    assert!(wait_until(Duration::from_secs(10), || direct
        .count()
        .unwrap()
        == 1));
    assert_eq!(
        direct.count_down().unwrap(),
        0,
        "opened before the repeat ran"
    );
    let r = call.join().unwrap();
    assert_eq!(proxy.lost_replies(), 2);
    assert!(proxy.seen(&sha) >= 4, "the call was repeated");
    assert!(r.unwrap(), "its own set, found by the repeat");
    assert_eq!(
        direct.count().unwrap(),
        0,
        "the repeat did not set it again"
    );
    proxy.delay_requests_containing(&sha, Duration::ZERO);

    // Another caller's set still answers false.
    assert!(!c.count_down_latch("lost-set").try_set_count(5).unwrap());
    assert_eq!(latch.count().unwrap(), 3);
}

/// Issue 38: `try_set_count(n)` alone sets the count, with the documented default expiry
/// (`CountDownLatch::DEFAULT_EXPIRY`); `try_set_count_with` takes another.
#[test]
fn try_set_count_alone_expires_after_the_documented_default() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server.url());
    let pttl = |name: &str| -> i64 {
        support::query_key(
            &mut server.connection(),
            "PTTL",
            Keys::lock(PREFIX, name).latch(),
        )
    };
    let latch = c.count_down_latch("defaulted");
    assert!(latch.try_set_count(2).unwrap());
    assert_eq!(latch.count().unwrap(), 2);
    let default = redmutex::CountDownLatch::DEFAULT_EXPIRY;
    assert_eq!(default, Duration::from_secs(3600), "as documented");
    let left = pttl("defaulted");
    assert!(
        left > (default - Duration::from_secs(60)).as_millis() as i64
            && left <= default.as_millis() as i64,
        "{left} ms left"
    );
    let chosen = c.count_down_latch("chosen");
    let options = LatchOptions::new().expire_after(Duration::from_secs(60));
    assert!(chosen.try_set_count_with(2, options).unwrap());
    let left = pttl("chosen");
    assert!(left > 50_000 && left <= 60_000, "{left} ms left");
}
