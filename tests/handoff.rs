//! Issue 18: a hold handed to a waiter by a release, returned without a confirmation round
//! trip when this machine's clock alone shows the grant still has most of its pickup
//! window, then extended by the watchdog like any hold it keeps.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, Kind, Lock};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, FaultProxy, Monitor, RedisServer};

const PREFIX: &str = "handoff:";

const CLIENTS: Clients = Clients::new(PREFIX).command(Duration::from_secs(2));

/// How long setup steps (a waiter showing in the queue) may take before the test fails.
const SETUP: Duration = Duration::from_secs(5);

fn pttl(server: &RedisServer, name: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(Keys::lock(PREFIX, name).key())
        .query(&mut server.connection())
        .unwrap()
}

fn await_queued(server: &RedisServer, name: &str, n: i64) {
    let mut con = server.connection();
    let mut seen = 0;
    let ok = wait_until(SETUP, || {
        seen = redis::cmd("LLEN")
            .arg(Keys::lock(PREFIX, name).queue())
            .query::<i64>(&mut con)
            .unwrap();
        seen == n
    });
    assert!(
        ok,
        "LLEN {} is {seen}, expected {n}",
        Keys::lock(PREFIX, name).queue()
    );
}

/// A plain lock's release hands the lock to its first waiter only once that waiter has
/// been queued for the starvation bound (2 ms) by the server's clock; one queued more
/// recently is woken to try instead (queue.lua's `Q.hand_on`), and takes the free lock
/// with its own attempt. Waits until every waiter of `name` has been queued that long on
/// the server's clock (`now - since`, read as the release script reads them), so that a
/// release from now on hands the lock over.
fn await_queued_past_starvation_bound(server: &RedisServer, name: &str) {
    const STARVATION_BOUND_MS: u64 = 2;
    let mut con = server.connection();
    let mut youngest = None;
    let ok = wait_until(SETUP, || {
        let entries: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(Keys::lock(PREFIX, name).waiters())
            .query(&mut con)
            .unwrap();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
        let now = secs * 1_000 + micros / 1_000;
        // An entry: "<expiry> <since> ..."; fields beginning with '~' are counts.
        youngest = entries
            .iter()
            .filter(|(field, _)| !field.starts_with('~'))
            .filter_map(|(_, entry)| entry.split(' ').nth(1)?.parse::<u64>().ok())
            .max()
            .map(|since| now.saturating_sub(since));
        youngest.is_some_and(|age| age >= STARVATION_BOUND_MS)
    });
    assert!(
        ok,
        "the youngest waiter of {name} was queued {youngest:?} ms ago, expected at least \
         {STARVATION_BOUND_MS} ms"
    );
}

/// Whether a MONITOR line is a call of the renewal script on one lock hold (mode `k`, the
/// way a waiter confirms a handed hold): no other script takes a bare `k` argument.
fn is_hold_renewal(line: &str) -> bool {
    line.contains(" \"k\" ")
}

/// Whether a MONITOR line is a script call a client sent.
fn is_script_call(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    ["\"evalsha\"", "\"eval\"", "\"fcall\"", "\"fcall_ro\""]
        .iter()
        .any(|c| lower.contains(c))
}

/// Two clients pass a `FairLock` back and forth (each: lock, 2 ms, unlock, again): every
/// acquisition but the first is a handoff, whose waiter heard of it a few ms after its
/// queued attempt, well inside the 1 s window. Each costs Redis the release and the
/// releaser's next (queued) attempt, and no confirmation: no renewal call at all.
#[test]
fn a_handed_over_hold_costs_no_confirmation_call() {
    ping_pong("ping-pong", true, Duration::from_millis(2), 20);
}

/// The same with a plain `Lock` and 8 ms holds: a waiter queued during a whole hold has
/// waited past the starvation bound when the holder releases, so the release hands it the
/// lock instead of waking it to try (a try the releaser, taking the lock straight back,
/// would win: one wasted request per release, and the releaser served twice in a row).
#[test]
fn a_plain_lock_under_steady_contention_is_handed_over_in_turn() {
    ping_pong("plain-ping-pong", false, Duration::from_millis(8), 12);
}

/// A waiter queued longer than the pickup window (1.5 s behind a holder) is handed the
/// lock: the grant carries the server's time of the handoff and the waiter's queued
/// attempt learned the server's time when it joined, so the waiter can tell from its own
/// clock that the grant is fresh however long it waited. No confirmation call is made, and
/// the hold is sound: held on the server, not lost, released cleanly.
#[test]
fn a_waiter_queued_longer_than_the_window_takes_its_grant_without_a_call() {
    let server = RedisServer::new();
    let holder = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let waiter = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    long_wait(&server, &holder, waiter.fair_lock("long-wait-fair"));
    long_wait(&server, &holder, waiter.lock("long-wait-plain"));
}

fn long_wait<K: Kind>(server: &RedisServer, holder: &Client, lock: Lock<K>) {
    let name = String::from_utf8_lossy(lock.name()).into_owned();
    let guard = holder.lock(&name).lock().expect("holder");
    let (held_tx, held) = mpsc::channel();
    let thread = thread::spawn(move || {
        let g = lock.lock().expect("waiter");
        held_tx.send(g.is_lease_lost()).unwrap();
        g.unlock()
    });
    await_queued(server, &name, 1);
    // Time is the subject: the wait must outlast the pickup window (1 s).
    thread::sleep(Duration::from_millis(1_500));
    let monitor = server.monitor();
    guard.unlock().expect("holder unlock");
    let lost = held
        .recv_timeout(SETUP)
        .expect("the lock was not handed over");
    let unlocked = thread.join().unwrap();
    let lines = monitor.stop();
    let renewals: Vec<_> = Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| is_hold_renewal(l))
        .collect();
    assert!(
        renewals.is_empty(),
        "{name}: the handed-over hold was confirmed with a call: {:?}",
        renewals.first()
    );
    assert!(!lost, "{name}: the handed-over hold looked lost");
    unlocked.expect("the waiter releases the hold it was handed");
}

/// The other side of the rule: a grant whose message is delayed 700 ms (more than half
/// the 1 s window) reaches a waiter whose clock and the grant's server time show less than
/// half the window left. It must be confirmed with the server (one renewal call) before
/// the guard exists, however fresh the waiter's queued attempt.
#[test]
fn a_grant_that_arrives_late_is_confirmed() {
    const NAME: &str = "late-grant";
    let server = RedisServer::new();
    // Renewals are counted: the renewal script is no first call to load on 6.2.
    server.load_scripts();
    let proxy = FaultProxy::new(server.port());
    let holder = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let waiter = CLIENTS.watchdog(Duration::from_secs(30)).at(&proxy.url());
    let guard = holder.fair_lock(NAME).lock().expect("holder");
    let lock = waiter.fair_lock(NAME);
    let thread = thread::spawn(move || {
        let g = lock.lock().expect("waiter");
        let lost = g.is_lease_lost();
        (lost, g.unlock())
    });
    await_queued(&server, NAME, 1);
    proxy.delay_replies_containing(PUSHED_MESSAGE, Duration::from_millis(700));
    let monitor = server.monitor();
    guard.unlock().expect("holder unlock");
    let (lost, unlocked) = thread.join().unwrap();
    proxy.delay_replies_containing(PUSHED_MESSAGE, Duration::ZERO);
    let lines = monitor.stop();
    let renewals = Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| is_hold_renewal(l))
        .count();
    assert_eq!(
        renewals, 1,
        "a grant heard 700 ms late must be confirmed once before it is used"
    );
    assert!(!lost, "the confirmed hold looked lost");
    unlocked.expect("the waiter releases the hold it confirmed");
}

/// A grant whose server time places it after its own arrival (as when the grant and the
/// queued attempt were stamped by two servers whose clocks disagree, across a failover):
/// the two readings cannot be set against each other, so the waiter confirms with the
/// server instead of taking the hold on its word. Here the message is forged with a time
/// 5 s ahead while another client still holds the lock: the confirmation finds nothing
/// and the waiter waits on, until the real release.
#[test]
fn a_grant_stamped_after_its_arrival_is_confirmed() {
    const NAME: &str = "ahead-grant";
    let server = RedisServer::new();
    // Renewals are counted: the renewal script is no first call to load on 6.2.
    server.load_scripts();
    let holder = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let waiter = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let guard = holder.fair_lock(NAME).lock().expect("holder");
    let lock = waiter.fair_lock(NAME);
    let (held_tx, held) = mpsc::channel();
    let thread = thread::spawn(move || {
        let g = lock.lock().expect("waiter");
        held_tx.send(()).unwrap();
        g.unlock()
    });
    await_queued(&server, NAME, 1);
    let mut con = server.connection();
    let entries: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(Keys::lock(PREFIX, NAME).waiters())
        .query(&mut con)
        .unwrap();
    let (id, entry) = entries
        .into_iter()
        .find(|(field, _)| !field.starts_with('~'))
        .expect("the waiter's entry");
    let (client_id, token) = id.rsplit_once(':').unwrap();
    let ticket = entry.split(' ').nth(4).expect("the entry's ticket");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let ahead = secs * 1_000 + micros / 1_000 + 5_000;
    let monitor = server.monitor();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(format!("{}:to:{client_id}", Keys::lock(PREFIX, NAME).key()))
        .arg(format!("g {token} {ticket} 0 {ahead}"))
        .query(&mut con)
        .unwrap();
    let early = held.recv_timeout(Duration::from_millis(500)).is_ok();
    let lines = monitor.stop();
    assert!(
        !early,
        "the waiter's lock() returned on a grant stamped 5 s ahead while another client \
         held the lock"
    );
    guard.unlock().expect("holder unlock");
    held.recv_timeout(SETUP)
        .expect("the waiter gets the lock at the real release");
    thread.join().unwrap().expect("waiter unlock");
    let renewals = Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| is_hold_renewal(l))
        .count();
    assert_eq!(
        renewals, 1,
        "the forged grant is confirmed once, and refused"
    );
}

/// One client's side of a ping-pong: `rounds` times lock, note `i` in `order`, hold for
/// `hold`, unlock.
fn take_turns<K: Kind>(
    lock: Lock<K>,
    i: usize,
    order: Arc<Mutex<Vec<usize>>>,
    hold: Duration,
    rounds: usize,
    turns: Arc<Turns>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut con = redis::Client::open(turns.url.as_str())
            .and_then(|c| c.get_connection())
            .expect("a connection to watch the queue");
        for _ in 0..rounds {
            let g = lock.lock().expect("lock");
            order.lock().unwrap().push(i);
            thread::sleep(hold);
            turns.await_other(&mut con);
            g.unlock().expect("unlock");
        }
        turns.done.fetch_add(1, Ordering::SeqCst);
    })
}

/// What two threads taking turns share: before each release a thread waits until the
/// other has asked again (its next attempt is in the lock's queue) or has done all its
/// rounds. The order the test checks is then the lock's, not the scheduler's: on a
/// loaded machine the releasing thread of the round before can sleep past this whole
/// hold before it asks again, and a release that finds nobody queued rightly frees the
/// lock for the releaser's own next attempt (seen: "only 35 handoffs", with a core
/// loaded and another suite running).
struct Turns {
    url: String,
    queue: String,
    done: AtomicUsize,
}

impl Turns {
    fn await_other(&self, con: &mut redis::Connection) {
        let ok = wait_until(SETUP, || {
            self.done.load(Ordering::SeqCst) > 0 || support::llen(con, &self.queue) >= 1
        });
        assert!(ok, "the other thread neither queued nor finished");
    }
}

/// Two clients, each looping `rounds` times on the lock `name` (fair or plain) with holds
/// of `hold`: the lock goes back and forth, each handoff costing Redis two script calls
/// (the release and the releaser's next, queued, attempt) and no renewal.
fn ping_pong(name: &str, fair: bool, hold: Duration, rounds: usize) {
    let server = RedisServer::new();
    // A long watchdog: no renewal round falls inside the run.
    let clients = [
        CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url()),
        CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url()),
    ];
    // Both start queued behind a third client's hold (so both listen on the lock, and the
    // run starts with a handoff); the recording starts after their first attempts.
    let holder = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let guard = holder.lock(name).lock().expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let turns = Arc::new(Turns {
        url: server.url(),
        queue: Keys::lock(PREFIX, name).queue(),
        done: AtomicUsize::new(0),
    });
    let threads: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (order, turns) = (order.clone(), turns.clone());
            if fair {
                take_turns(c.fair_lock(name), i, order, hold, rounds, turns)
            } else {
                take_turns(c.lock(name), i, order, hold, rounds, turns)
            }
        })
        .collect();
    await_queued(&server, name, 2);
    let monitor = server.monitor();
    guard.unlock().expect("holder unlock");
    for t in threads {
        t.join().unwrap();
    }
    let lines = monitor.stop();
    let order = order.lock().unwrap().clone();
    let handoffs = order.windows(2).filter(|w| w[0] != w[1]).count();
    let top = Monitor::top_level(&lines);
    let scripts = top.iter().filter(|l| is_script_call(l)).count();
    let renewals: Vec<_> = top.iter().filter(|l| is_hold_renewal(l)).collect();
    eprintln!(
        "{name}: {} acquisitions, {handoffs} handoffs, {scripts} script calls",
        order.len()
    );
    assert_eq!(order.len(), 2 * rounds);
    assert!(
        renewals.is_empty(),
        "{name}: {} renewal calls for {handoffs} handoffs, e.g. {:?}",
        renewals.len(),
        renewals.first()
    );
    // Per acquisition: the acquirer's queued attempt and the release (the holder's
    // release for the first).
    assert!(
        scripts <= 2 * order.len() + 2,
        "{name}: {scripts} script calls for {} acquisitions ({handoffs} handoffs)",
        order.len()
    );
    // Strict turns (the one left may run alone once the other is done).
    assert!(
        handoffs >= 2 * rounds - 3,
        "{name}: only {handoffs} handoffs in {order:?}"
    );
}

/// Issue 7's "a handed-over hold outlives the pickup window", as issue 18 made it: a
/// hold handed over without confirmation and kept 2.5 s, past its 1 s pickup window:
/// the watchdog extends it a third into the window, so its key never runs low, nobody
/// else gets the lock meanwhile, and the guard never says it is lost. With a fixed lease
/// longer than the window, the extension keeps exactly that lease, counted from before
/// the grant (its waiter's queued attempt): not the window, not a lease restarted later.
#[test]
fn a_handed_over_hold_kept_past_its_window_is_extended() {
    let server = RedisServer::new();
    let (holder, waiter, other) = (
        CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url()),
        CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url()),
        CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url()),
    );
    for (name, lease) in [("kept-watchdog", None), ("kept-fixed", Some(5_000u64))] {
        let guard = holder.fair_lock(name).lock().expect("holder");
        let lock = waiter.fair_lock(name);
        let (held_tx, held) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            let g = lock
                .try_lock_with(support::lease_or_watchdog(lease))
                .map(Option::unwrap)
                .expect("waiter");
            held_tx.send(Instant::now()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(20));
            let lost = g.is_lease_lost();
            (g.unlock(), lost)
        });
        await_queued(&server, name, 1);
        let queued = Instant::now();
        guard.unlock().expect("holder unlock");
        let returned = held
            .recv_timeout(Duration::from_millis(500))
            .expect("the lock was not handed over");
        // Another client waits meanwhile: it must not get the lock while the waiter keeps it.
        let contender = other.fair_lock(name);
        let contend = thread::spawn(move || {
            contender
                .try_lock_for(Duration::from_millis(2_000))
                .map(|g| g.is_some())
        });
        for at in [1_300, 2_300] {
            thread::sleep(
                (returned + Duration::from_millis(at)).saturating_duration_since(Instant::now()),
            );
            let left = pttl(&server, name);
            match lease {
                None => assert!(
                    left > 5_000,
                    "{name}: {at} ms after the handoff the lease was not extended (PTTL {left})"
                ),
                Some(ms) => {
                    // The lease counts from the waiter's queued attempt, at most `queued`
                    // ago... and no earlier than the waiter's queued attempt (before
                    // `queued`): within [ms - elapsed since queued, ms - at].
                    let at_least = ms as i64 - queued.elapsed().as_millis() as i64 - 300;
                    let at_most = ms as i64 - at as i64 + 50;
                    assert!(
                        (at_least..=at_most).contains(&left),
                        "{name}: {at} ms after the handoff PTTL is {left}, expected the \
                         fixed lease's rest, {at_least}..={at_most}"
                    );
                }
            }
        }
        assert!(
            !contend.join().unwrap().expect("contender"),
            "{name}: another client took a lock still held"
        );
        release.send(()).unwrap();
        let (unlocked, lost) = thread.join().unwrap();
        assert!(!lost, "{name}: the extended hold looked lost");
        unlocked.expect("the holder releases its extended hold");
    }
}

/// A hold handed over without confirmation whose extension reaches Redis only after the
/// pickup window (the waiter's renewals delayed 1.5 s): the grant lapses on the server
/// and another client takes the lock. By then the waiter's guard must say its lease is
/// lost (its window is counted from before the grant), and its release must fail so.
#[test]
fn a_handed_over_hold_extended_too_late_says_lost_before_another_holds() {
    const NAME: &str = "late-extension";
    let server = RedisServer::new();
    let renew = support::function_name(&server.url(), "renew");
    let proxy = FaultProxy::new(server.port());
    let holder = CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url());
    let other = CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url());
    let waiter = CLIENTS.watchdog(Duration::from_secs(10)).at(&proxy.url());
    let guard = holder.fair_lock(NAME).lock().expect("holder");
    let lock = waiter.fair_lock(NAME);
    let other_holds = Arc::new(AtomicBool::new(false));
    let flag = other_holds.clone();
    let (held_tx, held) = mpsc::channel();
    let (check, check_rx) = mpsc::channel::<()>();
    let thread = thread::spawn(move || {
        let g = lock.lock().expect("waiter");
        held_tx.send(()).unwrap();
        let _ = check_rx.recv_timeout(Duration::from_secs(10));
        // Told once the other client holds the lock.
        let beside_other = flag.load(Ordering::SeqCst);
        (beside_other, g.is_lease_lost(), g.unlock())
    });
    await_queued(&server, NAME, 1);
    proxy.delay_requests_containing(&renew, Duration::from_millis(1_500));
    let released = Instant::now();
    guard.unlock().expect("holder unlock");
    held.recv_timeout(Duration::from_millis(500))
        .expect("the handed hold was not returned at once");
    let taken = other
        .fair_lock(NAME)
        .try_lock_for(Duration::from_secs(5))
        .expect("other")
        .expect("the unextended grant never passed on");
    let took = released.elapsed();
    other_holds.store(true, Ordering::SeqCst);
    check.send(()).unwrap();
    let (beside_other, lost, unlocked) = thread.join().unwrap();
    taken.unlock().expect("other unlock");
    proxy.delay_requests_containing(&renew, Duration::ZERO);
    eprintln!("the other client took the lock {took:?} after the release");
    assert!(
        beside_other,
        "checked before the other client held the lock"
    );
    assert!(
        took >= Duration::from_millis(900),
        "the grant passed on {took:?} after the release, inside its window"
    );
    assert!(lost, "the waiter's guard did not say its lease was lost");
    assert!(
        matches!(unlocked, Err(Error::LeaseLost { .. })),
        "the waiter's release: {unlocked:?}"
    );
}

/// Every pub/sub message a client receives carries this (RESP: `*3 $7 message ...`).
const PUSHED_MESSAGE: &str = "\r\nmessage\r\n";

/// A grant for an earlier attempt of the same waiting call, delivered after a later
/// attempt queued again, says nothing about that later attempt: it was made before it ran,
/// and lapsed before it (or the later attempt would have found the thread holding). The
/// waiter must not count its window from the later attempt.
///
/// The holder keeps the lock on a 3 s fixed lease and releases it 1 s in, while the
/// waiter's grant messages are delayed 2.25 s: the grant lapses (2 s) and another client
/// takes the lock; the waiter's timer for the holder's lease (3 s) makes it try again,
/// which queues it behind that client; the stale grant arrives 0.25 s later. Its call's
/// ticket alone would pass it as fresh.
#[test]
fn a_stale_grant_of_an_earlier_attempt_is_not_taken_for_a_fresh_one() {
    const NAME: &str = "stale-grant";
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let holder = CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url());
    let other = CLIENTS.watchdog(Duration::from_secs(10)).at(&server.url());
    let waiter = CLIENTS.watchdog(Duration::from_secs(10)).at(&proxy.url());
    let held_at = Instant::now();
    let guard = support::leased(&holder.fair_lock(NAME), Duration::from_secs(3), "holder");
    let lock = waiter.fair_lock(NAME);
    let other_holds = Arc::new(AtomicBool::new(false));
    let flag = other_holds.clone();
    let (done, returned) = mpsc::channel();
    let thread = thread::spawn(move || {
        let g = lock.lock().expect("waiter");
        let beside_other = flag.load(Ordering::SeqCst);
        let lost = g.is_lease_lost();
        done.send(Instant::now()).unwrap();
        (beside_other, lost, g.unlock())
    });
    await_queued(&server, NAME, 1);
    proxy.delay_replies_containing(PUSHED_MESSAGE, Duration::from_millis(2_250));
    thread::sleep((held_at + Duration::from_secs(1)).saturating_duration_since(Instant::now()));
    guard.unlock().expect("holder unlock");
    let taken = support::take_lapsed_grant(&other, NAME);
    other_holds.store(true, Ordering::SeqCst);
    // Past the stale grant's arrival (3.25 s) and the waiter's answer to it.
    let early = returned
        .recv_timeout((held_at + Duration::from_secs(4)).saturating_duration_since(Instant::now()))
        .is_ok();
    proxy.delay_replies_containing(PUSHED_MESSAGE, Duration::ZERO);
    other_holds.store(false, Ordering::SeqCst);
    taken.unlock().expect("other unlock");
    let (beside_other, lost, unlocked) = thread.join().unwrap();
    assert!(
        !early && !beside_other,
        "the waiter's lock() returned on a stale grant while another client held the lock"
    );
    assert!(!lost, "the waiter's hold looks lost");
    unlocked.expect("the waiter releases its hold");
}

/// Issue 26, item 6: a grant timed by another server's clock. The waiter queued on one
/// server and was granted by another whose clock is ahead by δ (a failover, a slot's move
/// during the wait); the grant's message took δ or more to arrive, so "placed after its
/// own arrival" cannot see it. Placed δ later than it began, the hold's extension (a
/// third into the window) would land after the window closed on the server, and another
/// client could take the lock while this guard said held. The waiter's client saw the
/// deployment change during the wait (here a reconnect: a reply lost, the connection
/// closed), so it confirms the grant with the server, placing the hold from the
/// confirmation's own send time. One server plays both: the fault proxy moves the grant's
/// time δ ahead and delays its message by δ. `change` makes the waiter's client see the
/// change while it waits.
fn grant_timed_by_a_clock_ahead(name: &str, change: impl FnOnce(&FaultProxy, &Client)) {
    // Past two thirds of the pickup window (1 s): an extension a third into a window
    // placed this late lands after the window's end on the server.
    const AHEAD: Duration = Duration::from_millis(850);
    let server = RedisServer::new();
    // Renewals are counted: the renewal script is no first call to load on 6.2.
    server.load_scripts();
    let proxy = FaultProxy::new(server.port());
    let holder = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let waiter = CLIENTS.watchdog(Duration::from_secs(30)).at(&proxy.url());
    let other = CLIENTS.watchdog(Duration::from_secs(30)).at(&server.url());
    let guard = holder.lock(name).lock().expect("holder");
    let lock = waiter.lock(name);
    let (got_tx, got) = mpsc::channel();
    let (ask_tx, ask) = mpsc::channel::<()>();
    let (lost_tx, lost) = mpsc::channel();
    let thread = thread::spawn(move || {
        let g = lock.lock().expect("waiter");
        got_tx.send((Instant::now(), g.is_lease_lost())).unwrap();
        while ask.recv().is_ok() {
            lost_tx.send(g.is_lease_lost()).unwrap();
        }
        g.unlock()
    });
    await_queued(&server, name, 1);
    change(&proxy, &waiter);

    let channel = format!("{}:to:{}", Keys::lock(PREFIX, name).key(), waiter.id());
    proxy.shift_grant_times(&channel, AHEAD);
    proxy.delay_replies_containing(&channel, AHEAD);
    // A plain lock: the release must hand it over (a grant), not wake the waiter to try,
    // which it does when the waiter queued less than the starvation bound before (the
    // steps above can take less than that): the waiter would then take the free lock by
    // its own attempt once the delayed wake came, and no grant would be shifted.
    await_queued_past_starvation_bound(&server, name);
    let monitor = server.monitor();
    let released = Instant::now();
    guard.unlock().expect("holder unlock");
    let (returned, lost_at_once) = got.recv_timeout(SETUP).expect("the waiter's grant");
    let after = returned - released;
    assert_eq!(
        proxy.shifted_grants(),
        1,
        "the grant's time was not shifted"
    );
    assert!(
        after >= AHEAD && after < AHEAD + Duration::from_millis(900),
        "the waiter got the lock {after:?} after the release (its grant delayed {AHEAD:?})"
    );
    assert!(!lost_at_once, "the waiter's guard said lost at once");

    // Past the grant's window on the server, and past a late extension.
    let taken = other
        .lock(name)
        .try_lock_for(Duration::from_millis(1_500))
        .expect("another client's try");
    let taken_after = released.elapsed();
    ask_tx.send(()).unwrap();
    let waiter_lost = lost.recv().unwrap();
    let lines = monitor.stop();
    let renewals = Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| is_hold_renewal(l))
        .count();
    if let Some(g) = taken {
        assert!(
            waiter_lost,
            "another client took the lock {taken_after:?} after the release while the \
             waiter's guard (returned {after:?} after it) still said held"
        );
        drop(g);
        panic!("the grant was not confirmed: its hold lapsed and passed on");
    }
    assert!(!waiter_lost, "the confirmed hold said lost");
    assert_eq!(
        renewals, 1,
        "a grant heard after the deployment changed must be confirmed once before it is \
         used"
    );
    drop(ask_tx);
    thread
        .join()
        .unwrap()
        .expect("the waiter releases its hold");
}

/// The change is a reconnect: a reply of the waiter's client lost, its connection closed,
/// the call run again on another.
#[test]
fn a_grant_timed_by_a_clock_ahead_after_a_reconnect_is_confirmed() {
    grant_timed_by_a_clock_ahead("clock-ahead-reconnect", |proxy, waiter| {
        const PROBE: &str = "reconnect-probe";
        proxy.lose_next_reply_to(PROBE);
        assert!(!waiter.lock(PROBE).is_locked().expect("probe, run again"));
        assert_eq!(proxy.lost_replies(), 1, "the probe's reply was not lost");
    });
}

/// The change is a refusal of a settling deployment (`TRYAGAIN`, as for a slot that
/// migrates), waited out and the call run again.
#[test]
fn a_grant_timed_by_a_clock_ahead_after_a_tryagain_is_confirmed() {
    grant_timed_by_a_clock_ahead("clock-ahead-tryagain", |proxy, waiter| {
        const PROBE: &str = "tryagain-probe";
        proxy.fail_next_request_with(
            PROBE,
            "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
        );
        assert!(!waiter.lock(PROBE).is_locked().expect("probe, run again"));
        assert_eq!(proxy.failed_requests(), 1, "the probe was not refused");
    });
}
