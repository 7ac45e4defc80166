//! The waiter queue's bookkeeping (`lua/queue.lua`), driven through the bundled acquire,
//! cancel and release scripts by hand: the count of fair waiters and the queue keys'
//! expiry, which the scripts keep with as few commands as they can (issue 18), must stay
//! exact whichever way an entry comes and goes.

mod support;

use redis::Connection;
use support::RedisServer;

const LOCK: &str = "l";
const FENCE: &str = "f";
const QUEUE: &str = "q";
const WAITERS: &str = "w";

/// The other kinds' keys of the lock's name, which the acquire script takes last (none of
/// them is held here).
const OTHER_KINDS: [&str; 3] = ["rw", "sem", "latch"];

fn eval(con: &mut Connection, body: &str, args: &[String]) -> Vec<redis::Value> {
    eval_with(con, body, &[], args)
}

/// [`eval`] with `more` keys after the lock's own.
fn eval_with(
    con: &mut Connection,
    body: &str,
    more: &[&str],
    args: &[String],
) -> Vec<redis::Value> {
    redis::cmd("EVAL")
        .arg(support::queued_script(body))
        .arg(4 + more.len())
        .arg(LOCK)
        .arg(FENCE)
        .arg(QUEUE)
        .arg(WAITERS)
        .arg(more)
        .arg(args)
        .query::<redis::Value>(con)
        .map(|reply| match reply {
            redis::Value::Array(items) => items,
            // A lock's common replies are one integer (acquire_fast.lua and acquire.lua: a grant's count,
            // release_fast.lua: the levels left): read as the tables they stand for.
            redis::Value::Int(n) if body == support::lock_acquire() => {
                vec![
                    redis::Value::Int(1),
                    redis::Value::Int(n),
                    redis::Value::Int(0),
                ]
            }
            redis::Value::Int(n) => vec![redis::Value::Int(n), redis::Value::Int(0)],
            other => panic!("an unexpected reply: {other:?}"),
        })
        .expect("script")
}

/// One attempt of `holder` (flags: 1 fair) that queues with an entry living `ttl` ms.
fn attempt(con: &mut Connection, holder: &str, flags: u8, ttl: u64) -> Vec<redis::Value> {
    let args = [
        holder,
        "30000",
        "0",
        &flags.to_string(),
        "1",
        &ttl.to_string(),
        "7",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect::<Vec<_>>();
    eval_with(con, support::lock_acquire(), &OTHER_KINDS, &args)
}

fn leave(con: &mut Connection, holder: &str) {
    let args: Vec<String> = [holder, "0", "0", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    eval(con, support::manifest::CANCEL.text, &args);
}

fn fair_count(con: &mut Connection) -> Option<i64> {
    redis::cmd("HGET")
        .arg(WAITERS)
        .arg("~fair")
        .query(con)
        .unwrap()
}

/// The fair entries actually queued, counted from the entries' own flags.
fn fair_entries(con: &mut Connection) -> i64 {
    let all: Vec<(String, String)> = redis::cmd("HGETALL").arg(WAITERS).query(con).unwrap();
    all.iter()
        .filter(|(h, _)| !h.starts_with('~'))
        .filter(|(_, v)| {
            let flags: u64 = v.split(' ').nth(3).unwrap().parse().unwrap();
            flags % 2 == 1
        })
        .count() as i64
}

fn pttl(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

fn hold_elsewhere(con: &mut Connection) {
    let _: () = redis::cmd("HSET")
        .arg(LOCK)
        .arg("other:1")
        .arg(1)
        .query(con)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(LOCK)
        .arg(60_000)
        .query(con)
        .unwrap();
}

#[track_caller]
fn assert_count_exact(con: &mut Connection) {
    let entries = fair_entries(con);
    let count = fair_count(con);
    let expected = (entries > 0).then_some(entries);
    assert_eq!(count, expected, "'~fair' against the fair entries queued");
}

#[test]
fn the_fair_count_follows_every_join_change_and_leave() {
    let server = RedisServer::new();
    let mut con = server.connection();
    hold_elsewhere(&mut con);
    // Joins: two fair, one plain.
    for (h, flags) in [("a:1", 1), ("b:1", 1), ("c:1", 0)] {
        attempt(&mut con, h, flags, 30_000);
        assert_count_exact(&mut con);
    }
    assert_eq!(fair_count(&mut con), Some(2));
    // A fair entry becomes plain while another fair one stays: the count goes down.
    attempt(&mut con, "a:1", 0, 30_000);
    assert_count_exact(&mut con);
    assert_eq!(fair_count(&mut con), Some(1));
    // The last fair entry becomes plain: the count goes.
    attempt(&mut con, "b:1", 0, 30_000);
    assert_count_exact(&mut con);
    // A refresh with the same flags changes nothing; a plain entry becomes fair.
    attempt(&mut con, "c:1", 0, 30_000);
    attempt(&mut con, "c:1", 1, 30_000);
    attempt(&mut con, "c:1", 1, 30_000);
    assert_count_exact(&mut con);
    assert_eq!(fair_count(&mut con), Some(1));
    attempt(&mut con, "d:1", 1, 30_000);
    assert_eq!(fair_count(&mut con), Some(2));
    // Leaving from the middle of the queue, then from its head.
    leave(&mut con, "c:1");
    assert_count_exact(&mut con);
    leave(&mut con, "a:1");
    assert_count_exact(&mut con);
    // The lock goes; a kick hands it on: to "b:1" (plain, told to try; nobody listens, so
    // it is dropped), then to "d:1" (fair, made the holder; unheard too, and dropped):
    // every entry goes, and the count with them.
    let _: () = redis::cmd("DEL").arg(LOCK).query(&mut con).unwrap();
    eval(&mut con, support::manifest::KICK.text, &[]);
    assert_count_exact(&mut con);
    assert_queue_gone(&mut con);
}

#[test]
fn a_waiter_taking_the_lock_from_the_head_takes_its_fair_count() {
    let server = RedisServer::new();
    let mut con = server.connection();
    hold_elsewhere(&mut con);
    attempt(&mut con, "a:1", 1, 30_000);
    attempt(&mut con, "b:1", 1, 30_000);
    assert_eq!(fair_count(&mut con), Some(2));
    let _: () = redis::cmd("DEL").arg(LOCK).query(&mut con).unwrap();
    // "a:1" is first and the lock free: it takes it, leaving "b:1" counted.
    let reply = attempt(&mut con, "a:1", 1, 30_000);
    assert_eq!(reply[0], redis::Value::Int(1), "granted: {reply:?}");
    assert_count_exact(&mut con);
    assert_eq!(fair_count(&mut con), Some(1));
    let _: () = redis::cmd("DEL").arg(LOCK).query(&mut con).unwrap();
    let reply = attempt(&mut con, "b:1", 1, 30_000);
    assert_eq!(reply[0], redis::Value::Int(1), "granted: {reply:?}");
    assert_eq!(fair_count(&mut con), None);
    assert_queue_gone(&mut con);
}

/// The queue lives at least as long as its longest-lived entry and at most twice as long:
/// the list never expires before an entry it orders (that waiter would never be served in
/// turn), and neither key lives longer than twice the longest entry asked for. The keys
/// are raised only when less than an entry's life is left, and then to twice it: a queue
/// whose waiters keep joining pays one PTTL a join (`Q.outlive`).
#[test]
fn the_queue_outlives_each_entry_and_never_the_longest_by_much() {
    let server = RedisServer::new();
    let mut con = server.connection();
    hold_elsewhere(&mut con);
    // A long entry, then short ones: the keys keep what the long one raised them to.
    attempt(&mut con, "a:1", 0, 20_000);
    attempt(&mut con, "b:1", 0, 5_000);
    for key in [QUEUE, WAITERS] {
        let ms = pttl(&mut con, key);
        assert!((35_000..=40_000).contains(&ms), "{key}: {ms} ms");
    }
    // The queue emptied and made again while the waiters hash lives on (a field left by
    // hand keeps it): the new list lives as long as the hash, which outlives its entry.
    leave(&mut con, "a:1");
    leave(&mut con, "b:1");
    let _: () = redis::cmd("HSET")
        .arg(WAITERS)
        .arg("~x")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(WAITERS)
        .arg(20_000)
        .query(&mut con)
        .unwrap();
    attempt(&mut con, "c:1", 0, 5_000);
    let (list, hash) = (pttl(&mut con, QUEUE), pttl(&mut con, WAITERS));
    assert!((15_000..=20_000).contains(&list), "list {list} ms");
    assert!((15_000..=20_000).contains(&hash), "hash {hash} ms");
    // A longer entry than what is left raises both (a list left longer than the hash
    // with them).
    let _: () = redis::cmd("PEXPIRE")
        .arg(QUEUE)
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    attempt(&mut con, "d:1", 0, 40_000);
    for key in [QUEUE, WAITERS] {
        let ms = pttl(&mut con, key);
        assert!((75_000..=80_000).contains(&ms), "{key}: {ms} ms");
    }
    // A refresh that needs no more time than is left changes no expiry, and costs one
    // PTTL (of the hash; the other is Q.look's of the lock) and no PEXPIRE.
    let before = server.command_calls();
    attempt(&mut con, "c:1", 0, 5_000);
    attempt(&mut con, "d:1", 0, 40_000);
    let calls = server.calls_since(&before, |_| false);
    assert_eq!(calls.get("pexpire"), None, "{calls:?}");
    assert_eq!(calls.get("pttl"), Some(&4), "{calls:?}");
    for key in [QUEUE, WAITERS] {
        let ms = pttl(&mut con, key);
        assert!((75_000..=80_000).contains(&ms), "{key}: {ms} ms");
    }
}

/// The renewal script keeps a waiter's entry alive by the same rule.
#[test]
fn a_refreshed_entry_keeps_its_queue_alive() {
    let server = RedisServer::new();
    let mut con = server.connection();
    hold_elsewhere(&mut con);
    attempt(&mut con, "a:1", 0, 2_000);
    let refresh = |con: &mut Connection, ttl: u64| -> (Vec<i64>, Vec<i64>) {
        redis::Script::new(support::manifest::RENEW.text)
            .prepare_invoke()
            .arg(0)
            .key(QUEUE)
            .key(WAITERS)
            .arg(1)
            .arg("a:1")
            .arg(ttl)
            .invoke(con)
            .unwrap()
    };
    // Less left than the entry's life: both raised to twice it.
    let (lost, gone) = refresh(&mut con, 30_000);
    assert!(lost.is_empty() && gone.is_empty());
    for key in [QUEUE, WAITERS] {
        let ms = pttl(&mut con, key);
        assert!((55_000..=60_000).contains(&ms), "{key}: {ms} ms");
    }
    // The list alone left short (written by someone else): raised, the hash untouched.
    let _: () = redis::cmd("PEXPIRE")
        .arg(QUEUE)
        .arg(1_000)
        .query(&mut con)
        .unwrap();
    refresh(&mut con, 20_000);
    let list = pttl(&mut con, QUEUE);
    assert!((15_000..=20_000).contains(&list), "list {list} ms");
    assert!(pttl(&mut con, WAITERS) > 25_000);
}

/// An emptied queue leaves neither of its keys behind.
fn assert_queue_gone(con: &mut redis::Connection) {
    let n: i64 = redis::cmd("EXISTS")
        .arg(QUEUE)
        .arg(WAITERS)
        .query(con)
        .unwrap();
    assert_eq!(n, 0, "an emptied queue leaves no keys behind");
}

/// Whether the lock's hold carries the queue mark (queue.lua's '~q').
fn marked(con: &mut Connection) -> bool {
    redis::cmd("HEXISTS")
        .arg(LOCK)
        .arg("~q")
        .query::<i64>(con)
        .unwrap()
        == 1
}

/// `holder`'s release of its one level: the reply's first two numbers (0 and w: 1 when a
/// waiter was told its turn).
fn release(con: &mut Connection, holder: &str) -> (i64, i64) {
    let args: Vec<String> = [holder, "0", "1"].iter().map(|s| s.to_string()).collect();
    let reply = eval(con, support::lock_release(), &args);
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => *n,
        other => panic!("not a number: {other:?}"),
    };
    (int(&reply[0]), int(&reply[1]))
}

#[track_caller]
fn assert_granted(reply: &[redis::Value]) {
    assert_eq!(reply[0], redis::Value::Int(1), "granted: {reply:?}");
}

#[track_caller]
fn assert_queued(reply: &[redis::Value]) {
    assert_eq!(reply[0], redis::Value::Int(0), "queued: {reply:?}");
    assert_eq!(reply.len(), 3, "queued: {reply:?}");
}

/// A release frees a hold without the queue mark without looking at the queue (the
/// uncontended release's one command less: `tests/script_cost.rs`), so every hold that
/// may have a waiter behind it must carry the mark, however it was made: queued behind,
/// taken while the queue existed (the first waiter's own turn here), or handed on from
/// the queue (by an acquire or a release). Each release below that has a waiter behind it
/// tells one its turn (w = 1): told to try, or handed the lock once it has waited past the
/// starvation bound (2 ms: either, whatever the machine's load; each step below holds
/// both ways). Waiters have flag 8, "listens elsewhere": taken at their word, as nobody
/// subscribes here.
#[test]
fn every_hold_a_waiter_may_wait_behind_carries_the_queue_mark() {
    const ELSEWHERE: u8 = 8;
    const FAIR: u8 = 1;
    let server = RedisServer::new();
    let mut con = server.connection();
    // Taken with no queue: unmarked, and its release finds nobody.
    assert_granted(&attempt(&mut con, "a:1", 0, 30_000));
    assert!(!marked(&mut con), "nobody waits");
    assert_eq!(release(&mut con, "a:1"), (0, 0));
    // A waiter queues behind an unmarked hold: it marks it, and the release tells it.
    assert_granted(&attempt(&mut con, "a:1", 0, 30_000));
    assert!(!marked(&mut con));
    assert_queued(&attempt(&mut con, "b:1", ELSEWHERE, 30_000));
    assert!(marked(&mut con), "queued behind");
    assert_queued(&attempt(&mut con, "c:1", ELSEWHERE, 30_000));
    assert_eq!(release(&mut con, "a:1"), (0, 1), "b is told its turn");
    // The first waiter takes the free lock itself while c still waits (or finds it was
    // handed the lock): marked.
    assert_granted(&attempt(&mut con, "b:1", ELSEWHERE, 30_000));
    assert!(marked(&mut con), "taken while the queue exists");
    assert_eq!(release(&mut con, "b:1"), (0, 1), "c is told its turn");
    // A fair caller finds the lock free and c first (it hands the lock to c) or c
    // holding: it queues behind c's hold, marked.
    assert_queued(&attempt(&mut con, "x:1", FAIR | ELSEWHERE, 30_000));
    assert!(marked(&mut con), "handed on");
    assert_eq!(release(&mut con, "c:1"), (0, 1), "handed to x");
    assert!(marked(&mut con), "handed on by a release");
    // The queue is empty now: the mark stays with the hold, whose release finds nobody.
    assert_eq!(release(&mut con, "x:1"), (0, 0));
    assert_queue_gone(&mut con);
    // With the queue gone, a new hold is unmarked again.
    assert_granted(&attempt(&mut con, "h:1", 0, 30_000));
    assert!(!marked(&mut con));
}

/// An attempt that queues reads the lock's lease first (`Q.look` without `found`): behind
/// a held lock it looks at no other kind (no EXISTS: a name held as a lock is no other
/// kind's), and a name another kind holds while the lock is free is still refused, the
/// attempt's entry taken out of the queue.
#[test]
fn a_queueing_attempt_reads_the_lease_first_and_still_refuses_another_kind() {
    let server = RedisServer::new();
    let mut con = server.connection();
    hold_elsewhere(&mut con);
    let before = server.command_calls();
    let reply = attempt(&mut con, "a:1", 0, 5_000);
    assert_eq!(reply[0], redis::Value::Int(0), "queued: {reply:?}");
    let calls = server.calls_since(&before, |_| false);
    assert_eq!(calls.get("exists"), None, "{calls:?}");
    assert_eq!(support::llen(&mut con, QUEUE), 1);
    // The lock freed and the name taken as a semaphore (its main key, OTHER_KINDS[1]).
    let _: () = redis::cmd("DEL").arg(LOCK).query(&mut con).unwrap();
    let _: () = redis::cmd("SET")
        .arg(OTHER_KINDS[1])
        .arg(1)
        .query(&mut con)
        .unwrap();
    let reply = attempt(&mut con, "a:1", 0, 5_000);
    assert_eq!(
        reply[..2],
        [redis::Value::Int(-4), redis::Value::Int(3)],
        "refused as a semaphore's name: {reply:?}"
    );
    assert_queue_gone(&mut con);
}
