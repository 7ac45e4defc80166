//! `ReadWriteLock` (issue 8, item 1) against real redis-server processes: readers in three
//! processes overlap and a writer excludes them all (witnessed inside Redis); downgrade;
//! upgrade refused at once with `Error::WouldDeadlock { .. }`; a writer waiting behind a stream
//! of readers gets in within a bound and no reader arriving after it passes it; a
//! SIGKILLed reader frees only its own share, when its own lease ends; lost leases of
//! read holds are reported; lost replies count once; bad input changes nothing; a
//! waiting writer sends nothing and is handed the lock by the release.
//!
//! Other processes are this test binary re-executed (`rw_entry`), driven by lines on
//! their stdin. A witness script inside Redis (`WITNESS`) is called by every critical
//! section on entry and exit, and checks the lock's hash and the sections inside.

mod support;

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, Kind, Lock};
use support::child::{say, ChildProc};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, FaultProxy, Monitor, RedisServer};

const ROLE: &str = "REDMUTEX_RW_ROLE";
const URL: &str = "REDMUTEX_RW_URL";
const NAME: &str = "REDMUTEX_RW_NAME";
const WATCHDOG_MS: &str = "REDMUTEX_RW_WATCHDOG_MS";
const PREFIX: &str = "rwt:";

const CLIENTS: Clients = Clients::new(PREFIX);
/// How long setup steps (a waiter showing in the queue) may take before the test fails.
const SETUP: Duration = Duration::from_secs(5);
/// The fixed lease of the streaming readers. Equal to the 1 s pickup window, so a read
/// hold's lease end is its grant time plus this whether it was taken directly or handed
/// over by a release: the witness works out grant times from it.
const STREAM_LEASE: Duration = Duration::from_millis(1_000);
/// A streaming reader's critical section.
const READ_SECTION: Duration = Duration::from_millis(50);

/// The witness, called by critical sections. KEYS[1] its hash, KEYS[2] the lock's holds,
/// KEYS[3] their leases, KEYS[4] the lock's waiters. ARGV[1] 'enter', 'exit' or 'peek';
/// ARGV[2] the mode, 'r' or 'w'; ARGV[3] the caller's client id (every reader in these
/// tests is the only reading thread of its client); ARGV[4] the caller's fixed read lease
/// in ms, or 0.
///
/// A violation: a reader entering while a writer is inside or while the hash records a
/// writer hold; a writer entering while anyone is inside or while the hash records any
/// read hold or another writer's; an entry whose own hold is not in the hash; and (with
/// ARGV[4]) a reader granted after a writer joined the queue, while that writer still
/// waits (`late`: the writer was passed). Returns {readers inside, writers inside,
/// violations so far}.
const WITNESS: &str = r"
local w, lock, leases, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, mode, client, lease = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local function num(f) return tonumber(redis.call('hget', w, f) or '0') end
local readers, writers = num('readers'), num('writers')
if op == 'peek' then
    return {readers, writers, num('violations')}
end
local v = 0
local mine, reads, writes, my_writes = nil, 0, 0, 0
local tag = client .. ':'
for _, f in ipairs(redis.call('hkeys', lock)) do
    local kind, rest = string.sub(f, 1, 2), string.sub(f, 3)
    local own = string.sub(rest, 1, #tag) == tag
    if kind == 'r:' then
        reads = reads + 1
        if own and mode == 'r' then mine = f end
    elseif kind == 'w:' then
        writes = writes + 1
        if own then my_writes = my_writes + 1; if mode == 'w' then mine = f end end
    end
end
if not mine then v = v + 1 end
if mode == 'w' then
    if reads > 0 or writes ~= 1 or my_writes ~= 1 then v = v + 1 end
    if op == 'enter' and (readers > 0 or writers > 0) then v = v + 1 end
    if op == 'exit' and (readers > 0 or writers ~= 1) then v = v + 1 end
else
    if writes > 0 or writers > 0 then v = v + 1 end
end
if op == 'enter' and mode == 'r' and lease > 0 and mine then
    local granted = tonumber(redis.call('zscore', leases, mine) or '0') - lease
    local entries = redis.call('hgetall', waiters)
    for i = 1, #entries, 2 do
        if string.sub(entries[i], 1, 1) ~= '~' then
            local _, since, _, flags = string.match(entries[i + 1], '^(%d+) (%d+) (%d+) (%d+)')
            if since and math.floor(tonumber(flags) / 4) % 2 == 0 and tonumber(since) < granted then
                v = v + 1
                redis.call('hincrby', w, 'late', 1)
            end
        end
    end
end
local field = mode == 'r' and 'readers' or 'writers'
if op == 'enter' then
    local n = redis.call('hincrby', w, field, 1)
    redis.call('hincrby', w, 'entries', 1)
    if mode == 'r' and n > num('max_readers') then
        redis.call('hset', w, 'max_readers', n)
    end
else
    redis.call('hincrby', w, field, -1)
end
if v > 0 then
    redis.call('hincrby', w, 'violations', v)
end
return {num('readers'), num('writers'), num('violations')}
";

fn witness_key(name: &str) -> String {
    format!("witness:{{{name}}}")
}

/// One witness call: (readers inside, writers inside, violations so far).
fn witness(
    con: &mut redis::Connection,
    name: &str,
    op: &str,
    mode: &str,
    client_id: &str,
    lease: Duration,
) -> (i64, i64, i64) {
    redis::Script::new(WITNESS)
        .key(witness_key(name))
        .key(Keys::rw(PREFIX, name).key())
        .key(Keys::rw(PREFIX, name).leases())
        .key(Keys::rw(PREFIX, name).waiters())
        .arg(op)
        .arg(mode)
        .arg(client_id)
        .arg(lease.as_millis() as u64)
        .invoke(con)
        .expect("witness")
}

fn witness_figure(con: &mut redis::Connection, name: &str, field: &str) -> i64 {
    let v: Option<i64> = redis::cmd("HGET")
        .arg(witness_key(name))
        .arg(field)
        .query(con)
        .expect("HGET witness");
    v.unwrap_or(0)
}

fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connection")
}

/// The lock's hash: field -> value.
fn holds(con: &mut redis::Connection, name: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(Keys::rw(PREFIX, name).key())
        .query(con)
        .expect("HGETALL")
}

/// The leases ZSET: field -> lease end (server ms).
fn leases(con: &mut redis::Connection, name: &str) -> HashMap<String, i64> {
    let flat: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(Keys::rw(PREFIX, name).leases())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(con)
        .expect("ZRANGE");
    flat.into_iter().collect()
}

/// The hash fields of holds (not the scripts' own `~` fields), sorted.
fn hold_fields(con: &mut redis::Connection, name: &str) -> Vec<String> {
    let mut f: Vec<String> = holds(con, name)
        .into_keys()
        .filter(|f| !f.starts_with('~'))
        .collect();
    f.sort();
    f
}

/// The one hold field of `client_id` in `mode` ('r' or 'w'), if any.
fn field_of(
    con: &mut redis::Connection,
    name: &str,
    mode: &str,
    client_id: &str,
) -> Option<String> {
    let start = format!("{mode}:{client_id}:");
    hold_fields(con, name)
        .into_iter()
        .find(|f| f.starts_with(&start))
}

fn server_ms(con: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    s * 1000 + us / 1000
}

fn await_queued(con: &mut redis::Connection, name: &str, n: i64, who: &str) {
    let mut seen = 0;
    assert!(
        wait_until(SETUP, || {
            seen = support::llen(con, &Keys::rw(PREFIX, name).queue());
            seen == n
        }),
        "{who}: the queue holds {seen} entries, expected {n} within {SETUP:?}"
    );
}

const QUEUE_LUA: &str = support::manifest::QUEUE.text;
const LEASES_LUA: &str = support::manifest::LEASES.text;
const RW_LUA: &str = support::manifest::RW.text;

/// The function of the read-write lock's acquire script (see `support::function_name`).
fn rw_acquire_call(server: &RedisServer) -> String {
    support::function_name(&server.url(), "rw_acquire")
}

/// The function of its release script.
fn rw_release_call(server: &RedisServer) -> String {
    support::function_name(&server.url(), "rw_release")
}

/// The child side of the multi-process tests; a no-op in a normal run.
#[test]
fn rw_entry() {
    support::child::run_named_role(
        ROLE,
        URL,
        NAME,
        &[("holder", holder_process), ("streamer", streamer_process)],
    );
}

fn spawn_child(role: &str, url: &str, name: &str, watchdog_ms: u64) -> ChildProc {
    let ms = watchdog_ms.to_string();
    ChildProc::spawn(
        "rw_entry",
        &[(ROLE, role), (URL, url), (NAME, name), (WATCHDOG_MS, &ms)],
    )
}

/// Spawns a holder process and returns it with its client id (its `ready` line).
fn spawn_holder(url: &str, name: &str, watchdog_ms: u64) -> (ChildProc, String) {
    let child = spawn_child("holder", url, name, watchdog_ms);
    let line = child.next_line();
    let id = line
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, id)
}

/// Takes commands on stdin, each for a thread of its own named by a tag:
/// - `read <tag>` / `write <tag>`: a thread takes that side with `lock()`, enters the
///   witness and says `in <tag> <readers> <writers> <violations>`, then waits for
///   `release <tag>` (exit the witness, unlock, say `out <tag> ok|<error>`) or
///   `count <tag>` (say `count <tag> <hold_count of its side>`);
/// - `tryread <tag>` / `trywrite <tag>`: one `try_lock()` on the main thread, says
///   `try <tag> some|none` (released at once);
/// - `exit`: releases nothing more, joins the threads, says `done`.
fn holder_process(url: &str, name: &str) {
    let watchdog = std::env::var(WATCHDOG_MS)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    let client = CLIENTS.scaled(watchdog).at(url);
    say(&format!("ready {}", client.id()));
    let mut threads = HashMap::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read from the parent");
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [mode @ ("read" | "write"), tag] => {
                let (tx, rx) = mpsc::channel::<String>();
                let rw = client.read_write_lock(name);
                let (url, name, tag, id) = (
                    url.to_owned(),
                    name.to_owned(),
                    (*tag).to_owned(),
                    client.id().to_owned(),
                );
                let key = tag.clone();
                let read = *mode == "read";
                let t = thread::spawn(move || {
                    let mut con = connect(&url);
                    let ctx = (&mut con, name.as_str(), tag.as_str(), id.as_str());
                    if read {
                        hold(rw.read_lock(), "r", ctx, rx);
                    } else {
                        hold(rw.write_lock(), "w", ctx, rx);
                    }
                });
                threads.insert(key, (tx, t));
            }
            [cmd @ ("release" | "count"), tag] => {
                let (tx, _) = threads.get(*tag).expect("a thread with that tag");
                tx.send((*cmd).to_owned()).expect("the thread listens");
            }
            [cmd @ ("tryread" | "trywrite"), tag] => {
                let rw = client.read_write_lock(name);
                let got = if *cmd == "tryread" {
                    rw.read_lock().try_lock().map(|g| g.is_some())
                } else {
                    rw.write_lock().try_lock().map(|g| g.is_some())
                };
                match got {
                    Ok(true) => say(&format!("try {tag} some")),
                    Ok(false) => say(&format!("try {tag} none")),
                    Err(e) => say(&format!("try {tag} error {e}")),
                }
            }
            ["exit"] => break,
            other => panic!("unknown command {other:?}"),
        }
    }
    for (_, (tx, t)) in threads {
        drop(tx);
        t.join().expect("holder thread");
    }
    say("done");
}

/// One holding thread of a holder process (see there).
fn hold<K: Kind>(
    lock: Lock<K>,
    mode: &str,
    (con, name, tag, id): (&mut redis::Connection, &str, &str, &str),
    commands: mpsc::Receiver<String>,
) {
    let guard = match lock.lock() {
        Ok(g) => g,
        Err(e) => {
            say(&format!("error {tag} {e}"));
            return;
        }
    };
    let (r, w, v) = witness(con, name, "enter", mode, id, Duration::ZERO);
    say(&format!("in {tag} {r} {w} {v}"));
    for cmd in commands {
        match cmd.as_str() {
            "count" => {
                let n = lock.hold_count().map_or(-1, i64::from);
                say(&format!("count {tag} {n}"));
            }
            _ => break,
        }
    }
    witness(con, name, "exit", mode, id, Duration::ZERO);
    match guard.unlock() {
        Ok(()) => say(&format!("out {tag} ok")),
        Err(e) => say(&format!("out {tag} {e:?}")),
    }
}

/// Words of the child's next line, which must start with `first`.
fn expect_words(child: &ChildProc, first: &str, tag: &str) -> Vec<String> {
    let line = child.next_line();
    let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    assert!(
        words.len() >= 2 && words[0] == first && words[1] == tag,
        "expected `{first} {tag} ...` from the child, got {line:?}"
    );
    words
}

/// Waits for `in <tag> <readers> <writers> <violations>`; returns the three numbers.
fn expect_in(child: &ChildProc, tag: &str) -> (i64, i64, i64) {
    let w = expect_words(child, "in", tag);
    let n = |i: usize| w[i].parse::<i64>().expect("number");
    (n(2), n(3), n(4))
}

/// Releases `tag` in `child` and checks its unlock succeeded.
fn release(child: &mut ChildProc, tag: &str) {
    child.send(&format!("release {tag}"));
    let w = expect_words(child, "out", tag);
    assert_eq!(w[2], "ok", "unlock of {tag}");
}

/// What a streaming reader (a loop of read holds) did.
#[derive(Default, Debug)]
struct StreamStats {
    sections: u64,
    /// Sections whose fixed-lease acquisition waited more than 10 ms (queued behind a writer).
    waited: u64,
    errors: u64,
}

/// Takes read holds of `name` back to back until `stop`, each `READ_SECTION` long, on a
/// client of its own (the witness tells its hold by its client id).
fn stream_reader(url: &str, name: &str, stop: &AtomicBool) -> StreamStats {
    let client = CLIENTS.scaled(Duration::from_secs(10)).at(url);
    let read = client.read_write_lock(name).read_lock();
    let mut con = connect(url);
    let mut stats = StreamStats::default();
    while !stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let guard = match read
            .try_lock_with(redmutex::LockOptions::new().lease(STREAM_LEASE))
            .map(Option::unwrap)
        {
            Ok(g) => g,
            Err(_) => {
                stats.errors += 1;
                continue;
            }
        };
        if asked.elapsed() > Duration::from_millis(10) {
            stats.waited += 1;
        }
        witness(&mut con, name, "enter", "r", client.id(), STREAM_LEASE);
        // The section's length is what is measured against the writer's wait.
        thread::sleep(READ_SECTION);
        witness(&mut con, name, "exit", "r", client.id(), STREAM_LEASE);
        if guard.unlock().is_err() {
            stats.errors += 1;
        }
        stats.sections += 1;
    }
    stats
}

/// Two streaming readers until `stop` on stdin; says `ready` once both run, then
/// `stopped <sections> <waited> <errors>`.
fn streamer_process(url: &str, name: &str) {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (url, name, stop) = (url.to_owned(), name.to_owned(), stop.clone());
            thread::spawn(move || stream_reader(&url, &name, &stop))
        })
        .collect();
    say("ready");
    for line in std::io::stdin().lock().lines() {
        if line.expect("stdin") == "stop" {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = StreamStats::default();
    for t in threads {
        let s = t.join().expect("streaming reader");
        total.sections += s.sections;
        total.waited += s.waited;
        total.errors += s.errors;
    }
    say(&format!(
        "stopped {} {} {}",
        total.sections, total.waited, total.errors
    ));
}

fn signal(child: &ChildProc, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own child, which is not reaped before ChildProc drops.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
}

// ---------------------------------------------------------------------------------------
// 1. Readers across processes overlap; a writer excludes all.

/// Three processes each hold the read side at once (the witness counts 3 inside); a
/// writer in one of them waits until the last of them left (the releases of the first
/// two leave it queued), then is alone (witness: 0 readers, 1 writer); readers asking
/// in the other two processes while it writes queue, get nothing from `try_lock`, and
/// are all let in together by its release.
#[test]
fn readers_in_three_processes_overlap_and_a_writer_excludes_them_all() {
    const LOCK: &str = "overlap";
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let (mut p1, id1) = spawn_holder(&url, LOCK, 10_000);
    let (mut p2, id2) = spawn_holder(&url, LOCK, 10_000);
    let (mut p3, _) = spawn_holder(&url, LOCK, 10_000);

    p1.send("read a");
    assert_eq!(expect_in(&p1, "a"), (1, 0, 0));
    p2.send("read b");
    assert_eq!(expect_in(&p2, "b"), (2, 0, 0));
    p3.send("read c");
    assert_eq!(
        expect_in(&p3, "c"),
        (3, 0, 0),
        "three readers of three processes inside at once"
    );
    assert_eq!(hold_fields(&mut con, LOCK).len(), 3);
    assert_eq!(leases(&mut con, LOCK).len(), 3, "a lease per reader");

    // A writer in the first process: it waits for all three.
    p1.send("write w");
    await_queued(&mut con, LOCK, 1, "the writer");
    release(&mut p1, "a");
    release(&mut p2, "b");
    assert_eq!(
        field_of(&mut con, LOCK, "w", &id1),
        None,
        "the writer got in while a reader (c) was still inside"
    );
    assert_eq!(
        support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()),
        1,
        "the writer still waits"
    );
    release(&mut p3, "c");
    assert_eq!(
        expect_in(&p1, "w"),
        (0, 1, 0),
        "the writer is alone inside once the last reader left"
    );

    // Readers of the other processes while it writes: refused, then queued.
    p2.send("tryread t2");
    assert_eq!(expect_words(&p2, "try", "t2")[2], "none");
    p3.send("trywrite t3");
    assert_eq!(expect_words(&p3, "try", "t3")[2], "none");
    p2.send("read d");
    p3.send("read e");
    await_queued(&mut con, LOCK, 2, "two readers behind the writer");
    assert_eq!(
        hold_fields(&mut con, LOCK),
        vec![field_of(&mut con, LOCK, "w", &id1).expect("the writer's hold")],
        "only the writer holds"
    );
    release(&mut p1, "w");
    // The release lets both queued readers in, at once.
    let (r_d, w_d, v_d) = expect_in(&p2, "d");
    let (r_e, w_e, v_e) = expect_in(&p3, "e");
    assert_eq!((w_d, w_e, v_d, v_e), (0, 0, 0, 0));
    assert_eq!(r_d.max(r_e), 2, "both readers inside together");
    assert_eq!(support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()), 0);
    assert!(field_of(&mut con, LOCK, "r", &id2).is_some());
    release(&mut p2, "d");
    release(&mut p3, "e");

    let max = witness_figure(&mut con, LOCK, "max_readers");
    let violations = witness_figure(&mut con, LOCK, "violations");
    eprintln!("overlap: max readers inside at once {max}, violations {violations}");
    assert_eq!(max, 3);
    assert_eq!(violations, 0);
    assert!(
        !support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()),
        "all released: no hash left"
    );
    assert!(
        !support::exists(&mut con, Keys::rw(PREFIX, LOCK).leases()),
        "…and no leases left"
    );
    for mut p in [p1, p2, p3] {
        p.send("exit");
        p.expect("done");
        p.wait_success();
    }
}

// ---------------------------------------------------------------------------------------
// 2. Downgrade.

/// The writer's thread takes the read side (a downgrade) and releases the write side:
/// while it still writes nobody else reads, and a reader of another process queues; the
/// writer's own read is granted at once past that queued reader; releasing the write side
/// lets the queued reader in at once. Then a writer (another thread) waits, readers
/// asking after that writer queued wait behind it, and the writer gets in only when both
/// readers left.
#[test]
fn downgrade_lets_readers_in_but_not_writers() {
    const LOCK: &str = "downgrade";
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let c = CLIENTS.scaled(Duration::from_secs(10)).at(&url);
    let rw = c.read_write_lock(LOCK);
    let (mut other, other_id) = spawn_holder(&url, LOCK, 10_000);

    let w = rw.write_lock().lock().expect("write");
    other.send("tryread x0");
    assert_eq!(
        expect_words(&other, "try", "x0")[2],
        "none",
        "another process read while the lock was written"
    );
    other.send("read x");
    await_queued(&mut con, LOCK, 1, "the other process's reader");

    let (r, took) = support::timed(|| {
        rw.read_lock()
            .lock()
            .expect("read while writing: a downgrade")
    });
    assert!(
        took < Duration::from_millis(100),
        "the downgrade waited {took:?} (behind the queued reader?)"
    );
    assert_eq!(rw.write_lock().hold_count().unwrap(), 1);
    assert_eq!(rw.read_lock().hold_count().unwrap(), 1);
    let h = holds(&mut con, LOCK);
    let writer = h.get("~writer").cloned().expect("the writer mark");
    assert!(writer.starts_with(&format!("{}:", c.id())));
    assert_eq!(h.get(&format!("w:{writer}")).map(String::as_str), Some("1"));
    assert_eq!(h.get(&format!("r:{writer}")).map(String::as_str), Some("1"));
    assert_eq!(
        h.len(),
        3,
        "the write hold, the read hold, the writer mark: {h:?}"
    );
    assert_eq!(
        support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()),
        1,
        "the reader still waits"
    );

    // Releasing the write side lets the queued reader in beside the downgraded one.
    w.unlock().expect("release the write side");
    let (readers, writers, v) = expect_in(&other, "x");
    assert_eq!((writers, v), (0, 0));
    assert_eq!(readers, 1, "the witness counts the other process's section");
    let other_field = field_of(&mut con, LOCK, "r", &other_id).expect("the other reader");
    let h = holds(&mut con, LOCK);
    assert_eq!(
        h,
        HashMap::from([
            (format!("r:{writer}"), "1".to_owned()),
            (other_field, "1".to_owned())
        ]),
        "downgraded: two read holds, no writer"
    );
    assert_eq!(rw.write_lock().hold_count().unwrap(), 0);
    assert_eq!(rw.read_lock().hold_count().unwrap(), 1);

    // A writer (another thread) cannot: it waits.
    let (tx, got) = mpsc::channel();
    let write = rw.write_lock();
    let writer_thread = thread::spawn(move || {
        let none = write.try_lock().map(|g| g.is_none());
        let g = write.lock();
        tx.send(Instant::now()).unwrap();
        (none, g.map(|g| g.unlock()))
    });
    await_queued(&mut con, LOCK, 1, "the writer");
    // A reader asking now queues behind the writer.
    other.send("tryread y");
    assert_eq!(
        expect_words(&other, "try", "y")[2],
        "none",
        "a reader passed a queued writer"
    );
    release(&mut other, "x");
    assert!(
        got.try_recv().is_err() && field_of(&mut con, LOCK, "w", c.id()).is_none(),
        "the writer got in while the downgraded reader still held"
    );
    let released = Instant::now();
    r.unlock().expect("release the downgraded read hold");
    let at = got
        .recv_timeout(Duration::from_secs(2))
        .expect("the writer got the lock once the last reader left");
    eprintln!(
        "downgrade: writer in {:?} after the last read release",
        at.saturating_duration_since(released)
    );
    let (none, unlocked) = writer_thread.join().unwrap();
    assert!(none.unwrap(), "try_lock to write beside a reader succeeded");
    unlocked.unwrap().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
    other.send("exit");
    other.expect("done");
    other.wait_success();
}

/// While downgrading (holding both sides), the writer's thread may still re-enter the
/// write side: that is a re-entry of a hold it has, not an upgrade.
#[test]
fn a_writer_that_also_reads_may_reenter_the_write_side() {
    const LOCK: &str = "reenter";
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS.scaled(Duration::from_secs(10)).at(&server.url());
    let rw = c.read_write_lock(LOCK);
    let w = rw.write_lock().lock().unwrap();
    let r = rw.read_lock().lock().unwrap();
    let again = rw.write_lock().try_lock_for(Duration::from_secs(1));
    let again = match again {
        Ok(Some(g)) => g,
        other => panic!(
            "re-entering the write side while holding both sides: {other:?} (holds: {:?})",
            holds(&mut con, LOCK)
        ),
    };
    assert_eq!(rw.write_lock().hold_count().unwrap(), 2);
    drop(again);
    w.unlock().unwrap();
    r.unlock().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}

// ---------------------------------------------------------------------------------------
// 3. Upgrade.

/// A thread holding only the read side (once or nested) that asks for the write side gets
/// `Error::WouldDeadlock { .. }` from every acquisition method, each in well under 100 ms (even
/// with a wait of 10 s, or none at all: `lock()`), and nothing is written: the hash, the
/// leases and the queue are as before. The error is not sticky: once the read hold is
/// released the same thread writes.
#[test]
fn upgrade_fails_fast_with_would_deadlock_and_writes_nothing() {
    const LOCK: &str = "upgrade";
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS.scaled(Duration::from_secs(10)).at(&server.url());
    let rw = c.read_write_lock(LOCK);
    let outer = rw.read_lock().lock().unwrap();
    let before = (holds(&mut con, LOCK), leases(&mut con, LOCK));
    assert_eq!(before.0.len(), 1, "one read hold: {:?}", before.0);
    let long = Duration::from_secs(10);
    let lease = Duration::from_secs(5);
    let write = rw.write_lock();
    let check = |con: &mut redis::Connection, depth: &str| {
        type Attempt<'a> = (&'a str, Box<dyn Fn() -> Result<bool, Error> + 'a>);
        let attempts: Vec<Attempt> = vec![
            ("lock()", Box::new(|| write.lock().map(|_| true))),
            (
                "try_lock()",
                Box::new(|| write.try_lock().map(|g| g.is_some())),
            ),
            (
                "try_lock_for(10 s)",
                Box::new(|| write.try_lock_for(long).map(|g| g.is_some())),
            ),
            (
                "try_lock_until(now + 10 s)",
                Box::new(|| {
                    write
                        .try_lock_until(Instant::now() + long)
                        .map(|g| g.is_some())
                }),
            ),
            (
                "try_lock_with(lease 5 s)",
                Box::new(|| {
                    write
                        .try_lock_with(redmutex::LockOptions::new().lease(lease))
                        .map(Option::unwrap)
                        .map(|_| true)
                }),
            ),
            (
                "try_lock_with(wait 10 s, lease 5 s)",
                Box::new(|| {
                    write
                        .try_lock_with(redmutex::LockOptions::new().wait_for(long).lease(lease))
                        .map(|g| g.is_some())
                }),
            ),
        ];
        let mut slowest = Duration::ZERO;
        for (what, attempt) in attempts {
            let (r, took) = support::timed(attempt);
            slowest = slowest.max(took);
            assert!(
                matches!(r, Err(Error::WouldDeadlock { .. })),
                "{depth}: {what} while reading gave {r:?}"
            );
            support::assert_under(
                took,
                Duration::from_millis(100),
                format_args!("{depth}: {what} took {took:?} to refuse"),
            );
        }
        assert!(
            !support::exists(con, Keys::rw(PREFIX, LOCK).queue()),
            "{depth}: nobody queued"
        );
        assert!(
            !support::exists(con, Keys::rw(PREFIX, LOCK).waiters()),
            "{depth}: no waiter entry"
        );
        slowest
    };
    let slow1 = check(&mut con, "one read level");
    assert_eq!(
        (holds(&mut con, LOCK), leases(&mut con, LOCK)),
        before,
        "a refused upgrade changed the lock"
    );
    let inner = rw.read_lock().lock().unwrap();
    let nested = holds(&mut con, LOCK);
    assert_eq!(nested.values().collect::<Vec<_>>(), vec!["2"]);
    let slow2 = check(&mut con, "two read levels");
    assert_eq!(holds(&mut con, LOCK), nested);
    assert_eq!(rw.write_lock().hold_count().unwrap(), 0);
    assert_eq!(rw.read_lock().hold_count().unwrap(), 2);
    eprintln!("upgrade: slowest refusal {:?}", slow1.max(slow2));
    drop(inner);
    outer.unlock().unwrap();
    let w = rw
        .write_lock()
        .try_lock()
        .unwrap()
        .expect("writes once the read hold is gone");
    w.unlock().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}

// ---------------------------------------------------------------------------------------
// 4. A writer is not starved by a stream of readers.

/// Six readers (four threads here, two in another process, each on a client of its own)
/// take 50 ms read holds back to back, so the lock is never free of readers. A writer
/// asks five times, each time while at least three readers are inside: every time it gets
/// in within 1 s, alone (witness), and no reader granted after the writer joined the queue
/// got in before it (`late` in the witness). Readers that asked while it waited waited
/// for it (they show as sections that waited > 10 ms).
#[test]
fn a_writer_behind_a_stream_of_readers_gets_in_within_a_bound() {
    const LOCK: &str = "stream";
    const ROUNDS: usize = 5;
    const BOUND: Duration = Duration::from_secs(1);
    const WRITE_SECTION: Duration = Duration::from_millis(20);
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let mut streamer = spawn_child("streamer", &url, LOCK, 10_000);
    streamer.expect("ready");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (url, stop) = (url.clone(), stop.clone());
            thread::spawn(move || stream_reader(&url, LOCK, &stop))
        })
        .collect();

    let c = CLIENTS.scaled(Duration::from_secs(10)).at(&url);
    let write = c.read_write_lock(LOCK).write_lock();
    let mut waits = Vec::new();
    let mut inside_when_asked = Vec::new();
    for round in 0..ROUNDS {
        let mut inside = 0;
        assert!(
            wait_until(SETUP, || {
                inside = witness(&mut con, LOCK, "peek", "r", "", Duration::ZERO).0;
                inside >= 3
            }),
            "round {round}: the readers never overlapped (at most {inside} inside)"
        );
        inside_when_asked.push(inside);
        let asked = Instant::now();
        // Bounded, so that a starved writer fails the test instead of hanging it.
        let g = write.try_lock_for(SETUP).expect("write");
        let waited = asked.elapsed();
        let Some(g) = g else {
            panic!("round {round}: the writer starved: not in after {waited:?}");
        };
        let (r, w, _) = witness(&mut con, LOCK, "enter", "w", c.id(), Duration::ZERO);
        assert_eq!((r, w), (0, 1), "round {round}: the writer was not alone");
        thread::sleep(WRITE_SECTION);
        witness(&mut con, LOCK, "exit", "w", c.id(), Duration::ZERO);
        g.unlock().expect("write unlock");
        waits.push(waited);
    }
    stop.store(true, Ordering::SeqCst);
    let mut stats = StreamStats::default();
    for t in readers {
        let s = t.join().unwrap();
        stats.sections += s.sections;
        stats.waited += s.waited;
        stats.errors += s.errors;
    }
    streamer.send("stop");
    let line = streamer.next_line();
    let child: Vec<u64> = support::child::numbers(&line, "stopped ");
    stats.sections += child[0];
    stats.waited += child[1];
    stats.errors += child[2];
    let violations = witness_figure(&mut con, LOCK, "violations");
    let late = witness_figure(&mut con, LOCK, "late");
    let max = witness_figure(&mut con, LOCK, "max_readers");
    eprintln!(
        "stream: writer waits {waits:?} (readers inside when it asked: {inside_when_asked:?}); \
         {} read sections in both processes, {} of them waited for a writer; max readers inside {max}; \
         late readers {late}; violations {violations}",
        stats.sections, stats.waited
    );
    let slowest = waits.iter().max().copied().unwrap_or_default();
    assert!(
        slowest <= BOUND,
        "a writer waited {slowest:?} behind 50 ms read sections"
    );
    assert_eq!(late, 0, "readers granted after the writer queued passed it");
    assert_eq!(violations, 0);
    assert_eq!(stats.errors, 0);
    assert!(
        stats.waited >= 1,
        "no reader ever asked while the writer waited: the test proved nothing"
    );
    assert!(max >= 3);
    streamer.wait_success();
}

// ---------------------------------------------------------------------------------------
// 5. SIGKILL of a reader.

/// Two reader processes hold the read side with a 1 s watchdog lease, and a writer waits.
/// One reader is SIGKILLed after a renewal: its hold leaves the hash when its own lease
/// ends (its last renewal's lease end, within [-10 ms, +300 ms]; between 0.6 s and 1.4 s
/// after the kill),
/// not before; the survivor's hold stays through six renewal periods, its lease end keeps
/// moving, its thread still counts one level; the writer gets in only when the survivor
/// releases, and then at once.
#[test]
fn a_sigkilled_reader_frees_only_its_own_share() {
    const LOCK: &str = "killed";
    const WATCHDOG: Duration = Duration::from_millis(1_000);
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let (mut p1, id1) = spawn_holder(&url, LOCK, WATCHDOG.as_millis() as u64);
    let (mut p2, id2) = spawn_holder(&url, LOCK, WATCHDOG.as_millis() as u64);
    p1.send("read a");
    expect_in(&p1, "a");
    p2.send("read b");
    assert_eq!(expect_in(&p2, "b").0, 2);
    let dead = field_of(&mut con, LOCK, "r", &id1).expect("the first reader's hold");
    let survivor = field_of(&mut con, LOCK, "r", &id2).expect("the second reader's hold");

    let c = CLIENTS.scaled(Duration::from_secs(10)).at(&url);
    let write = c.read_write_lock(LOCK).write_lock();
    let (tx, got) = mpsc::channel();
    let writer = thread::spawn(move || {
        let g = write.lock();
        tx.send(Instant::now()).unwrap();
        g.map(|g| g.unlock())
    });
    await_queued(&mut con, LOCK, 1, "the writer");

    // Killed once its watchdog renewed its lease at least once: it is the renewed lease
    // that must end, not just the first.
    let first = leases(&mut con, LOCK)[&dead];
    assert!(
        wait_until(WATCHDOG, || leases(&mut con, LOCK)[&dead] > first),
        "the reader's watchdog never renewed its lease"
    );
    signal(&p1, libc::SIGKILL);
    let killed = Instant::now();
    p1.child.wait().expect("reap the killed reader");
    let killed_ms = server_ms(&mut con);
    let lease_end = leases(&mut con, LOCK)
        .get(&dead)
        .copied()
        .expect("the killed reader's lease");
    let mut gone_ms = 0;
    assert!(
        wait_until(Duration::from_secs(5), || {
            let present = holds(&mut con, LOCK).contains_key(&dead);
            if !present {
                gone_ms = server_ms(&mut con);
            }
            !present
        }),
        "the killed reader's hold never left the hash"
    );
    let after_kill = killed.elapsed();
    let vs_lease = gone_ms - lease_end;
    eprintln!(
        "killed reader: its hold left {after_kill:?} after the SIGKILL ({} ms by the \
         server's clock), {vs_lease} ms after its lease end",
        gone_ms - killed_ms
    );
    assert!(
        (-10..=300).contains(&vs_lease),
        "the hold left {vs_lease} ms from its lease end"
    );
    assert!(
        after_kill >= Duration::from_millis(600) && after_kill <= Duration::from_millis(1_400),
        "the hold left {after_kill:?} after the kill, lease {WATCHDOG:?}"
    );
    assert!(!leases(&mut con, LOCK).contains_key(&dead));

    // The survivor keeps its hold through several renewal periods.
    let first_end = leases(&mut con, LOCK)
        .get(&survivor)
        .copied()
        .expect("the survivor's hold went with the killed reader's");
    // Time is the subject: six renewal periods of a 1 s lease.
    thread::sleep(WATCHDOG * 2);
    let now_end = leases(&mut con, LOCK)
        .get(&survivor)
        .copied()
        .expect("the survivor's lease is gone");
    assert!(
        now_end >= first_end + 1_500,
        "the survivor's lease was not renewed: {first_end} -> {now_end}"
    );
    assert_eq!(hold_fields(&mut con, LOCK), vec![survivor.clone()]);
    p2.send("count b");
    assert_eq!(expect_words(&p2, "count", "b")[2], "1");
    assert!(got.try_recv().is_err(), "the writer got in beside a reader");
    assert_eq!(support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()), 1);

    let released = Instant::now();
    release(&mut p2, "b");
    let at = got
        .recv_timeout(Duration::from_secs(2))
        .expect("the writer got in after the survivor's release");
    let handoff = at.saturating_duration_since(released);
    eprintln!("killed reader: writer in {handoff:?} after the survivor's release");
    assert!(handoff < Duration::from_millis(500));
    writer.join().unwrap().unwrap().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
    p2.send("exit");
    p2.expect("done");
    p2.wait_success();
}

// ---------------------------------------------------------------------------------------
// 6. Lost leases of read holds.

/// A read hold with a fixed lease of 300 ms: a writer waiting for it gets in when the
/// lease ends (not before, and within 400 ms after); the read guard then reports its
/// lease lost, and its `unlock()` fails with `LeaseLost` without touching the writer's hold.
#[test]
fn a_fixed_read_lease_that_ends_is_lost() {
    const LOCK: &str = "fixed";
    const LEASE: Duration = Duration::from_millis(300);
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let reader = CLIENTS.scaled(Duration::from_secs(10)).at(&url);
    let writer = CLIENTS.scaled(Duration::from_secs(10)).at(&url);
    let taken = Instant::now();
    let g = reader
        .read_write_lock(LOCK)
        .read_lock()
        .try_lock_with(redmutex::LockOptions::new().lease(LEASE))
        .map(Option::unwrap)
        .unwrap();
    assert!(!g.is_lease_lost());
    let write = writer.read_write_lock(LOCK).write_lock();
    let (tx, got) = mpsc::channel();
    let (go, hold) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let w = write.try_lock_for(Duration::from_secs(3));
        tx.send(Instant::now()).unwrap();
        let w = w.unwrap().expect("the writer got the lock");
        hold.recv().unwrap();
        w.unlock()
    });
    let at = got.recv_timeout(Duration::from_secs(4)).unwrap();
    let after = at.saturating_duration_since(taken);
    eprintln!("fixed read lease {LEASE:?}: the writer got in {after:?} after the read");
    assert!(
        after >= LEASE - Duration::from_millis(10) && after <= LEASE + Duration::from_millis(400),
        "writer in {after:?} after a {LEASE:?} read lease"
    );
    assert!(g.is_lease_lost(), "the read lease ended");
    let writer_hold = holds(&mut con, LOCK);
    assert!(matches!(g.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(
        holds(&mut con, LOCK),
        writer_hold,
        "the writer's hold was touched"
    );
    go.send(()).unwrap();
    t.join().unwrap().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}

/// Two watchdog read holds (900 ms lease, renewed every 300 ms): one's field is deleted
/// behind its back; its watchdog marks it lost within one lease, the other stays held,
/// and its `unlock()` reports `LeaseLost`. Then `force_unlock` frees the other: it is
/// lost too.
#[test]
fn a_watchdog_read_hold_taken_away_is_reported_lost() {
    const LOCK: &str = "taken";
    const WATCHDOG: Duration = Duration::from_millis(900);
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let a = CLIENTS.scaled(WATCHDOG).at(&url);
    // The other reader's lease is longer: a hold whose renewal was not confirmed within
    // its lease is judged lost by the clock (rightly: it may have expired), and on a
    // loaded machine a 900 ms lease with 300 ms command timeouts can run out so; what is
    // asserted of it here is that the first hold's loss does not take it along.
    let b = CLIENTS.scaled(3 * WATCHDOG).at(&url);
    let ga = a.read_write_lock(LOCK).read_lock().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let (go, next) = mpsc::channel::<&str>();
    let rw_b = b.read_write_lock(LOCK);
    let tb = thread::spawn(move || {
        let gb = rw_b.read_lock().lock().unwrap();
        tx.send(()).unwrap();
        // "check": report whether the hold is lost; anything else: unlock and report.
        while let Ok(cmd) = next.recv() {
            if cmd == "check" {
                tx.send(()).unwrap();
                if gb.is_lease_lost() {
                    return Err("lost too early".to_owned());
                }
            } else {
                break;
            }
        }
        let lost = wait_until(Duration::from_secs(3), || gb.is_lease_lost());
        let r = gb.unlock();
        Ok((lost, format!("{r:?}")))
    });
    rx.recv().unwrap();
    let field_a = field_of(&mut con, LOCK, "r", a.id()).unwrap();
    let _: () = redis::pipe()
        .cmd("HDEL")
        .arg(Keys::rw(PREFIX, LOCK).key())
        .arg(&field_a)
        .cmd("ZREM")
        .arg(Keys::rw(PREFIX, LOCK).leases())
        .arg(&field_a)
        .query(&mut con)
        .unwrap();
    let deleted = Instant::now();
    assert!(
        wait_until(Duration::from_secs(3), || ga.is_lease_lost()),
        "the watchdog never noticed the read hold was gone"
    );
    let noticed = deleted.elapsed();
    eprintln!("taken read hold: reported lost {noticed:?} after its field was deleted");
    assert!(noticed <= WATCHDOG, "noticed only after {noticed:?}");
    go.send("check").unwrap();
    rx.recv().unwrap();
    assert!(
        field_of(&mut con, LOCK, "r", b.id()).is_some(),
        "the other reader's hold went too"
    );
    assert!(matches!(ga.unlock(), Err(Error::LeaseLost { .. })));

    assert!(a.read_write_lock(LOCK).write_lock().force_unlock().unwrap());
    go.send("unlock").unwrap();
    let (lost, unlocked) = tb.join().unwrap().unwrap();
    assert!(lost, "a force-unlocked read hold was not reported lost");
    assert_eq!(unlocked, r#"Err(LeaseLost { lock: Some("taken") })"#);
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).leases()));
}

// ---------------------------------------------------------------------------------------
// 7. Lost replies.

/// A client whose connections pass through `proxy`, with the read-write scripts loaded.
fn through(proxy: &FaultProxy) -> Client {
    let c = Clients::new(PREFIX)
        .watchdog(Duration::from_secs(10))
        .command(Duration::from_secs(2))
        .at(&proxy.url());
    let rw = c.read_write_lock("warm-up");
    rw.read_lock().lock().unwrap().unlock().unwrap();
    rw.write_lock().lock().unwrap().unlock().unwrap();
    c
}

/// The one hold field of the lock and its value; panics unless there is exactly one.
fn only_hold(con: &mut redis::Connection, name: &str) -> (String, String) {
    let h: Vec<(String, String)> = holds(con, name)
        .into_iter()
        .filter(|(f, _)| !f.starts_with('~'))
        .collect();
    assert_eq!(h.len(), 1, "expected one hold: {h:?}");
    h.into_iter().next().unwrap()
}

/// Replies of read acquires (outer and nested), write acquires and releases lost on the
/// way back (Redis ran the script; the client repeats it on another connection): every
/// count is right (one level per call, never two), the lock frees, nothing is left.
#[test]
fn lost_replies_leave_no_ghost_hold_and_no_double_count() {
    const LOCK: &str = "lost";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let mut con = server.connection();
    let c = through(&proxy);
    let other = CLIENTS.scaled(Duration::from_secs(10)).at(&server.url());
    let rw = c.read_write_lock(LOCK);
    let acquire = rw_acquire_call(&server);
    let release = rw_release_call(&server);

    proxy.lose_next_reply_to(&acquire);
    let outer = rw.read_lock().lock().expect("the repeated read acquire");
    assert_eq!(proxy.lost_replies(), 1, "the fault was injected");
    assert_eq!(
        rw.read_lock().hold_count().unwrap(),
        1,
        "one level, not two"
    );
    let (field, count) = only_hold(&mut con, LOCK);
    assert!(field.starts_with(&format!("r:{}:", c.id())));
    assert_eq!(count, "1");
    assert_eq!(leases(&mut con, LOCK).len(), 1);

    proxy.lose_next_reply_to(&acquire);
    let inner = rw.read_lock().lock().expect("the repeated nested read");
    assert_eq!(proxy.lost_replies(), 2);
    assert_eq!(
        rw.read_lock().hold_count().unwrap(),
        2,
        "two levels, not three"
    );
    assert_eq!(only_hold(&mut con, LOCK).1, "2");

    proxy.lose_next_reply_to(&release);
    inner.unlock().expect("the repeated nested release");
    assert_eq!(proxy.lost_replies(), 3);
    assert_eq!(
        rw.read_lock().hold_count().unwrap(),
        1,
        "released once, not twice"
    );
    assert_eq!(only_hold(&mut con, LOCK).1, "1");
    assert!(
        other
            .read_write_lock(LOCK)
            .write_lock()
            .try_lock()
            .unwrap()
            .is_none(),
        "a writer got in beside the remaining read level"
    );

    proxy.lose_next_reply_to(&release);
    let r = outer.unlock();
    assert_eq!(proxy.lost_replies(), 4);
    assert!(matches!(r, Ok(()) | Err(Error::NotHeld { .. })), "{r:?}");
    assert!(
        !support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()),
        "the read hold is gone"
    );
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).leases()));

    proxy.lose_next_reply_to(&acquire);
    let w = rw.write_lock().lock().expect("the repeated write acquire");
    assert_eq!(proxy.lost_replies(), 5);
    assert_eq!(
        rw.write_lock().hold_count().unwrap(),
        1,
        "one write level, not two"
    );
    let (field, count) = only_hold(&mut con, LOCK);
    assert!(field.starts_with(&format!("w:{}:", c.id())));
    assert_eq!(count, "1");
    assert!(
        other
            .read_write_lock(LOCK)
            .read_lock()
            .try_lock()
            .unwrap()
            .is_none(),
        "a reader got in beside the writer"
    );
    proxy.lose_next_reply_to(&acquire);
    let w2 = rw.write_lock().lock().expect("the repeated nested write");
    assert_eq!(proxy.lost_replies(), 6);
    assert_eq!(only_hold(&mut con, LOCK).1, "2");
    proxy.lose_next_reply_to(&release);
    w2.unlock().expect("the repeated nested write release");
    assert_eq!(proxy.lost_replies(), 7);
    assert_eq!(only_hold(&mut con, LOCK).1, "1");
    proxy.lose_next_reply_to(&release);
    let r = w.unlock();
    assert_eq!(proxy.lost_replies(), 8);
    assert!(matches!(r, Ok(()) | Err(Error::NotHeld { .. })), "{r:?}");
    assert!(
        !support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()),
        "no ghost hold"
    );
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).leases()));

    // The lock is free for everybody.
    let g = other
        .read_write_lock(LOCK)
        .write_lock()
        .try_lock()
        .unwrap()
        .expect("the lock is free");
    g.unlock().unwrap();
    assert_eq!(rw.read_lock().hold_count().unwrap(), 0);
    assert_eq!(rw.write_lock().hold_count().unwrap(), 0);
}

/// A reader queued behind a writer whose queuing attempt's reply is lost is queued once,
/// and the writer's release hands it the lock.
#[test]
fn a_queued_read_whose_reply_is_lost_queues_once() {
    const LOCK: &str = "lost-join";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let mut con = server.connection();
    let c = through(&proxy);
    let holder = CLIENTS.scaled(Duration::from_secs(10)).at(&server.url());
    // The reader's client listens on the lock already (it waited a moment ago), so its
    // next read queues with its very first attempt: the one whose reply is lost.
    let w = holder.read_write_lock(LOCK).write_lock().lock().unwrap();
    let read = c.read_write_lock(LOCK).read_lock();
    let warm = thread::spawn(move || read.lock().map(|g| g.unlock()));
    await_queued(&mut con, LOCK, 1, "the warm-up reader");
    w.unlock().unwrap();
    warm.join().unwrap().unwrap().unwrap();

    let w = holder.read_write_lock(LOCK).write_lock().lock().unwrap();
    proxy.lose_next_reply_to(&rw_acquire_call(&server));
    let read = c.read_write_lock(LOCK).read_lock();
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let g = read.lock();
        tx.send(()).unwrap();
        g.map(|g| (read.hold_count().unwrap(), g.unlock()))
    });
    assert!(
        wait_until(SETUP, || proxy.lost_replies() == 1),
        "the fault was never injected"
    );
    await_queued(&mut con, LOCK, 1, "the reader");
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the reader got in beside the writer"
    );
    assert_eq!(
        support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()),
        1,
        "queued once, not twice"
    );
    w.unlock().unwrap();
    rx.recv_timeout(Duration::from_secs(2))
        .expect("the release handed the lock to the reader");
    let (count, unlocked) = reader.join().unwrap().unwrap();
    assert_eq!(count, 1);
    unlocked.unwrap();
    assert_eq!(support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()), 0);
    assert!(
        !support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()),
        "no ghost hold"
    );
}

// ---------------------------------------------------------------------------------------
// 8. Bad input.

/// An empty name, a zero or over-long lease: typed errors, nothing written. A read (or
/// write) guard whose hold was force-unlocked and taken by someone else: `LeaseLost`, and
/// the new holder's hold and lease are untouched.
#[test]
fn bad_input_gives_typed_errors_and_changes_nothing() {
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS.scaled(Duration::from_secs(30)).at(&server.url());
    let empty = c.read_write_lock("");
    let (r, w) = (empty.read_lock(), empty.write_lock());
    let name_errors = [
        ("read lock", r.lock().map(|_| ())),
        ("read try_lock", r.try_lock().map(|_| ())),
        ("write lock", w.lock().map(|_| ())),
        (
            "write try_lock_for",
            w.try_lock_for(Duration::from_secs(1)).map(|_| ()),
        ),
        ("is_locked", r.is_locked().map(|_| ())),
        ("hold_count", w.hold_count().map(|_| ())),
        ("force_unlock", w.force_unlock().map(|_| ())),
        ("remaining_lease", r.remaining_lease().map(|_| ())),
    ];
    for (what, r) in name_errors {
        assert!(
            matches!(r, Err(Error::InvalidName(_))),
            "{what} on an empty name: {r:?}"
        );
    }
    let rw = c.read_write_lock("bad");
    let (r, w) = (rw.read_lock(), rw.write_lock());
    let too_long = Duration::from_secs(11 * 365 * 24 * 3600);
    let second = Duration::from_secs(1);
    let lease_errors = [
        (
            "read try_lock_with(lease 0)",
            r.try_lock_with(redmutex::LockOptions::new().lease(Duration::ZERO))
                .map(Option::unwrap)
                .map(|_| ()),
        ),
        (
            "read try_lock_with(lease 11 y)",
            r.try_lock_with(redmutex::LockOptions::new().lease(too_long))
                .map(Option::unwrap)
                .map(|_| ()),
        ),
        (
            "read try_lock_with(wait 1 s, lease 0)",
            r.try_lock_with(
                redmutex::LockOptions::new()
                    .wait_for(second)
                    .lease(Duration::ZERO),
            )
            .map(|_| ()),
        ),
        (
            "write try_lock_with(lease 0)",
            w.try_lock_with(redmutex::LockOptions::new().lease(Duration::ZERO))
                .map(Option::unwrap)
                .map(|_| ()),
        ),
        (
            "write try_lock_with(until now, lease 11 y)",
            w.try_lock_with(
                redmutex::LockOptions::new()
                    .wait_until(Instant::now())
                    .lease(too_long),
            )
            .map(|_| ()),
        ),
        (
            "write try_lock_with(wait MAX, lease 0)",
            w.try_lock_with(
                redmutex::LockOptions::new()
                    .wait_for(Duration::MAX)
                    .lease(Duration::ZERO),
            )
            .map(|_| ()),
        ),
    ];
    for (what, r) in lease_errors {
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what}: {r:?}"
        );
    }
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, 0, "bad input wrote something");

    // A force-unlocked read guard whose lock another reader holds now.
    let other = CLIENTS.scaled(Duration::from_secs(30)).at(&server.url());
    let ga = rw.read_lock().lock().unwrap();
    assert!(other
        .read_write_lock("bad")
        .read_lock()
        .force_unlock()
        .unwrap());
    let rw_o = other.read_write_lock("bad");
    let gb = rw_o.read_lock().lock().unwrap();
    let snapshot = (holds(&mut con, "bad"), leases(&mut con, "bad"));
    assert!(
        matches!(ga.unlock(), Err(Error::LeaseLost { .. })),
        "releasing a force-unlocked read guard"
    );
    assert_eq!(
        (holds(&mut con, "bad"), leases(&mut con, "bad")),
        snapshot,
        "the failed release changed the other reader's hold"
    );
    gb.unlock().unwrap();

    // The same for a write guard.
    let wa = rw.write_lock().lock().unwrap();
    assert!(rw_o.write_lock().force_unlock().unwrap());
    let wb = rw_o.write_lock().lock().unwrap();
    let snapshot = (holds(&mut con, "bad"), leases(&mut con, "bad"));
    assert!(matches!(wa.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(
        (holds(&mut con, "bad"), leases(&mut con, "bad")),
        snapshot,
        "the failed release changed the other writer's hold"
    );
    wb.unlock().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, "bad").key()));
    assert!(
        !rw.read_lock().force_unlock().unwrap(),
        "nothing left to free"
    );
}

// ---------------------------------------------------------------------------------------
// 9. Waiting without polling.

/// A writer blocked behind a reader sends nothing while it waits (counted with INFO
/// commandstats over 800 ms once it settled in the queue), and the reader's release
/// hands it the lock: from the release to the writer holding, the server sees the
/// release script and at most one more top-level command (the writer's confirmation).
#[test]
fn a_blocked_writer_does_not_poll_and_is_handed_the_lock() {
    const LOCK: &str = "quiet";
    let server = RedisServer::new();
    let url = server.url();
    let mut con = server.connection();
    let reader = CLIENTS.scaled(Duration::from_secs(30)).at(&url);
    let writer = CLIENTS.scaled(Duration::from_secs(30)).at(&url);
    // The scripts are loaded first, so the release below is one FCALL, not a load round.
    let warm = reader.read_write_lock("warm-up");
    warm.read_lock().lock().unwrap().unlock().unwrap();
    // And the renewal script, with which the writer confirms the hold handed to it.
    let _: String = redis::Script::new(support::manifest::RENEW.text)
        .prepare_invoke()
        .load(&mut con)
        .unwrap();
    let r = reader.read_write_lock(LOCK).read_lock().lock().unwrap();
    let write = writer.read_write_lock(LOCK).write_lock();
    let (tx, got) = mpsc::channel();
    let (go, done) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let g = write.lock();
        tx.send(Instant::now()).unwrap();
        done.recv().unwrap();
        g.map(|g| g.unlock())
    });
    await_queued(&mut con, LOCK, 1, "the writer");
    // Settled: the queuing attempt's reply is on its way back.
    thread::sleep(Duration::from_millis(200));
    let before = server.total_calls();
    thread::sleep(Duration::from_millis(800));
    let idle = server.total_calls() - before;
    eprintln!("quiet: {idle} commands in 800 ms while the writer waited (1 is INFO itself)");
    assert!(
        idle <= 1,
        "{idle} commands while the writer waited: polling"
    );
    assert!(got.try_recv().is_err());

    let monitor = server.monitor();
    let released = Instant::now();
    r.unlock().unwrap();
    let at = got
        .recv_timeout(Duration::from_secs(2))
        .expect("the writer got the lock");
    let lines = monitor.stop();
    // "<time> [<db> <client>] "CMD" "arg1" ...": the command and its first argument.
    let top: Vec<String> = Monitor::top_level(&lines)
        .into_iter()
        .map(|l| {
            l.split('"')
                .skip(1)
                .step_by(2)
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let scripts = top
        .iter()
        .filter(|l| l.starts_with("FCALL") || l.starts_with("EVALSHA"))
        .count();
    eprintln!(
        "quiet: writer in {:?} after the release; top-level commands meanwhile: {top:?}",
        at.saturating_duration_since(released)
    );
    assert!(
        (1..=2).contains(&scripts) && top.len() <= 2,
        "the handoff took {} top-level commands ({scripts} scripts): {top:?}",
        top.len()
    );
    assert!(field_of(&mut con, LOCK, "w", writer.id()).is_some());
    go.send(()).unwrap();
    t.join().unwrap().unwrap().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}

/// Issue 17, item 1: a reader's nested read fails while another thread of its client waits
/// to write (so the client listens on the lock, and the nested call queues with its first
/// attempt). Before the fix the failed call left with a cancel that said the thread held
/// no read level: `leased_cancel.lua` dropped the outer read hold and handed the lock to
/// the waiting writer, which wrote beside the reader.
#[test]
fn a_failed_nested_read_keeps_the_outer_read_hold() {
    const LOCK: &str = "nested-read-fails";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let mut con = server.connection();
    let c = Clients::new(PREFIX)
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1))
        .at(&proxy.url());
    let rw = c.read_write_lock("warm-up");
    rw.read_lock().lock().unwrap().unlock().unwrap();
    rw.write_lock().lock().unwrap().unlock().unwrap();
    let rw = c.read_write_lock(LOCK);
    let read = rw.read_lock().lock().expect("outer read");

    let (tx, got) = mpsc::channel();
    let write = rw.write_lock();
    let writer = thread::spawn(move || {
        let w = write.lock();
        tx.send(()).unwrap();
        w.map(|w| w.unlock())
    });
    await_queued(&mut con, LOCK, 1, "the writer");

    proxy.fail_next_request_with(&rw_acquire_call(&server), "-ERR injected\r\n");
    let r = rw.read_lock().try_lock_for(Duration::from_millis(300));
    assert!(matches!(r, Err(Error::Redis { .. })), "{r:?}");
    assert_eq!(proxy.failed_requests(), 1, "the fault was injected");

    // Before the fix the clean-up ran within a watchdog round (1 s) and let the writer in.
    assert!(
        got.recv_timeout(Duration::from_millis(1_500)).is_err(),
        "a writer got in beside the reader"
    );
    assert!(!read.is_lease_lost(), "the outer read guard lost its hold");
    assert_eq!(rw.read_lock().hold_count().unwrap(), 1);
    assert!(
        field_of(&mut con, LOCK, "r", c.id()).is_some(),
        "the read hold is gone"
    );
    assert_eq!(
        support::llen(&mut con, &Keys::rw(PREFIX, LOCK).queue()),
        1,
        "the writer kept its place"
    );

    read.unlock().expect("outer read unlock");
    got.recv_timeout(Duration::from_secs(2))
        .expect("the writer got the lock once the reader left");
    writer
        .join()
        .unwrap()
        .expect("writer lock")
        .expect("writer unlock");
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}

/// Issue 17, item 5 (Redisson's testReadLockLeaseTimeout): a read hold with a fixed lease
/// that ran out while its guard is alive no longer counts: the same thread may then take
/// the write lock. Before the fix the stale local registration made it `WouldDeadlock` at
/// once, though Redis held nothing. A live read hold still refuses the write at once.
#[test]
fn a_read_lease_that_ran_out_does_not_block_the_same_threads_write() {
    const LOCK: &str = "read-lease-out";
    const LEASE: Duration = Duration::from_secs(1);
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS.scaled(Duration::from_secs(3)).at(&server.url());
    let rw = c.read_write_lock(LOCK);
    let taken = Instant::now();
    let read = rw
        .read_lock()
        .try_lock_with(
            redmutex::LockOptions::new()
                .wait_for(Duration::from_secs(1))
                .lease(LEASE),
        )
        .unwrap()
        .expect("read");
    let r = rw.write_lock().try_lock_for(Duration::from_millis(100));
    assert!(matches!(r, Err(Error::WouldDeadlock { .. })), "{r:?}");
    assert!(
        taken.elapsed() < LEASE,
        "the check came too late to mean anything"
    );
    assert!(!read.is_lease_lost());

    assert!(
        wait_until(LEASE * 3, || read.is_lease_lost()),
        "the read guard never said its lease ran out"
    );
    let said = taken.elapsed();
    assert!(
        said >= LEASE - Duration::from_millis(50) && said <= LEASE + Duration::from_millis(500),
        "the read lease showed lost after {said:?}"
    );
    assert_eq!(rw.read_lock().hold_count().unwrap(), 0);
    let write = rw
        .write_lock()
        .try_lock_for(Duration::from_secs(1))
        .expect("the write lock after the read lease ran out")
        .expect("acquired");
    assert_eq!(rw.write_lock().hold_count().unwrap(), 1);
    assert!(field_of(&mut con, LOCK, "w", c.id()).is_some());
    assert!(field_of(&mut con, LOCK, "r", c.id()).is_none());
    // The read guard's hold is over: its unlock says so and leaves the write hold alone.
    assert!(matches!(read.unlock(), Err(Error::LeaseLost { .. })));
    assert_eq!(rw.write_lock().hold_count().unwrap(), 1);
    write.unlock().expect("write unlock");
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}

/// Issue 17, item 1, in the scripts: a read-write lock's cancel told fewer read levels
/// than the thread holds by more than the one an attempt can add takes nothing.
#[test]
fn a_cancel_never_takes_read_levels_the_thread_holds() {
    const LOCK: &str = "cancel-miscounted";
    let server = RedisServer::new();
    let mut con = server.connection();
    let c = CLIENTS.scaled(Duration::from_secs(3)).at(&server.url());
    let rw = c.read_write_lock(LOCK);
    let outer = rw.read_lock().lock().unwrap();
    let inner = rw.read_lock().lock().unwrap();
    let field = field_of(&mut con, LOCK, "r", c.id()).expect("read hold");
    let holder = field["r:".len()..].to_owned();
    let cancel = |expected: u32| -> Vec<i64> {
        redis::Script::new(
            &[
                support::SCRIPT_CONSTANTS,
                QUEUE_LUA,
                LEASES_LUA,
                RW_LUA,
                support::manifest::LEASED_CANCEL.text,
            ]
            .concat(),
        )
        .key(Keys::rw(PREFIX, LOCK).key())
        .key(Keys::rw(PREFIX, LOCK).fence())
        .key(Keys::rw(PREFIX, LOCK).queue())
        .key(Keys::rw(PREFIX, LOCK).waiters())
        .key(Keys::rw(PREFIX, LOCK).leases())
        .arg(&holder)
        .arg(expected)
        .arg(3_000)
        .arg(0)
        .arg(5)
        .invoke(&mut server.connection())
        .expect("cancel")
    };
    assert_eq!(cancel(0), vec![0, 0]);
    assert_eq!(
        holds(&mut con, LOCK).get(&field).map(String::as_str),
        Some("2")
    );
    assert_eq!(cancel(1), vec![0, 0]);
    assert_eq!(
        holds(&mut con, LOCK).get(&field).map(String::as_str),
        Some("1")
    );
    let other = CLIENTS.scaled(Duration::from_secs(3)).at(&server.url());
    // A pooled connection first: a single try has no time to connect on a busy machine.
    assert!(other.read_write_lock(LOCK).read_lock().is_locked().unwrap());
    assert!(other
        .read_write_lock(LOCK)
        .write_lock()
        .try_lock()
        .unwrap()
        .is_none());
    assert!(!outer.is_lease_lost());
    drop(inner);
    outer.unlock().unwrap();
    assert!(!support::exists(&mut con, Keys::rw(PREFIX, LOCK).key()));
}
