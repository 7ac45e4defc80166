//! How waiting threads wake up, and how long bounded calls may take, when things go wrong
//! between the client and Redis (issue 6, points 4, 5, 8 and 9): a wake-up consumed by an
//! attempt that then fails, subscriptions that are not yet confirmed by the server, a
//! renewal in flight while its hold is released, a frozen server, a pub/sub reconnect and a
//! holder whose lease runs out without a release message.
//!
//! Faults are injected with the harness's `FaultProxy` (delayed or failed requests) and by
//! freezing real redis-server processes; attempts are counted with `INFO commandstats`.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, LockGuard};
use support::clients::Clients;
use support::keys::{self, Keys};
use support::{FaultProxy, RedisServer};

const PREFIX: &str = "wakeups:";

const CLIENTS: Clients = Clients::new(PREFIX);

/// The common prefix of the lock's channels (one per waiting client: `<key>:to:<id>`).
fn channel(name: &str) -> String {
    format!("{}:to:", Keys::lock(PREFIX, name).key())
}

/// The lock's channel of one client: only its SUBSCRIBE and UNSUBSCRIBE name it in full
/// (the scripts are given the common prefix).
fn channel_of(name: &str, client: &redmutex::Client) -> String {
    format!("{}{}", channel(name), client.id())
}

/// The function that runs the acquire script (see `support::function_name`): what its
/// requests carry.
fn acquire_call(server: &RedisServer) -> String {
    support::function_name(&server.url(), "acquire")
}

/// Loads the scripts, so that every script call counted or trapped is the real call and
/// not a load round followed by a second one.
fn load_scripts(server: &RedisServer) {
    acquire_call(server);
}

/// Script calls (FCALL or EVALSHA) the server has executed so far.
fn script_calls(server: &RedisServer) -> u64 {
    server.script_calls()
}

/// Subscriptions to the lock's channels (`channel` is their common prefix).
fn numsub(server: &RedisServer, channel: &str) -> i64 {
    support::subscribers(&mut server.connection(), channel)
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.connection())
        .expect("PTTL")
}

/// Issue 4: a thread woken by a release whose attempt then fails (here: an error reply)
/// hands the wake-up on to the next waiting thread of its process. Before the fix the
/// wake-up died with the failed attempt and the other waiter slept until the lease it had
/// seen before the release ran out (~10 s).
#[test]
fn a_wake_up_consumed_by_a_failed_attempt_is_passed_on() {
    const NAME: &str = "passed-on";
    let server = RedisServer::new();
    load_scripts(&server);
    let proxy = FaultProxy::new(server.port());
    let holder = CLIENTS
        .watchdog(Duration::from_secs(10))
        .command(Duration::from_secs(1))
        .at(&server.url());
    let waiter = CLIENTS
        .watchdog(Duration::from_secs(10))
        .command(Duration::from_secs(1))
        .at(&proxy.url());
    let acquire = acquire_call(&server);
    proxy.watch(&acquire);
    // Holding the subscription back makes both waiters begin before it is confirmed: the
    // first makes two attempts (before the subscription and after its confirmation), the
    // second waits for the confirmation and queues with its one attempt (issue 38).
    proxy.delay_requests_containing(&channel_of(NAME, &waiter), Duration::from_millis(300));

    let guard = support::leased(
        &holder.lock(NAME),
        Duration::from_secs(10),
        "holder takes the lock",
    );
    let calls = script_calls(&server);

    let (tx, results) = mpsc::channel::<(usize, Result<(), String>, Instant)>();
    let spawn_waiter = |i: usize| {
        let lock = waiter.lock(NAME);
        let tx = tx.clone();
        thread::spawn(move || {
            let r = lock.lock();
            let at = Instant::now();
            match r {
                Ok(g) => {
                    tx.send((i, Ok(()), at)).unwrap();
                    g.unlock().expect("waiter unlock");
                }
                Err(e) => tx.send((i, Err(e.to_string()), at)).unwrap(),
            }
        })
    };
    let first = spawn_waiter(1);
    assert!(
        proxy.wait_seen(&channel_of(NAME, &waiter), 1, Duration::from_secs(5)),
        "the first waiter never subscribed"
    );
    let second = spawn_waiter(2);
    // Both queued: with their queuing attempts (a script call count could include the
    // watchdog's keep-alive of the first one's queue entry).
    let queue = Keys::lock(PREFIX, NAME).queue();
    let llen = |con: &mut redis::Connection| -> i64 {
        redis::cmd("LLEN").arg(&queue).query(con).expect("LLEN")
    };
    let mut con = server.connection();
    assert!(
        support::wait_until(Duration::from_secs(5), || llen(&mut con) == 2),
        "setup: expected both waiters queued, {} are ({} script calls)",
        llen(&mut con),
        script_calls(&server) - calls
    );
    assert_eq!(numsub(&server, &channel(NAME)), 1, "waiters are subscribed");
    assert_eq!(
        proxy.seen(&acquire),
        3,
        "setup: two attempts and one, no more"
    );
    // A plain lock is handed straight to a waiter queued STARVATION_BOUND (2 ms) before
    // the release, and only one that queued later is woken to try: the case here. The
    // steps above take longer than that on a loaded machine, so the entries' queueing
    // time (queue.lua's entry: "<expiry> <since> ...") is moved past the test's end.
    let fresh: i64 = redis::Script::new(
        r"
        local far = string.format('%d', redis.call('time')[1] * 1000 + 600000)
        local n = 0
        for _, holder in ipairs(redis.call('hkeys', KEYS[1])) do
            local v = redis.call('hget', KEYS[1], holder)
            local e, rest = string.match(v, '^(%d+) %d+ (.*)$')
            if string.sub(holder, 1, 1) ~= '~' and e then
                redis.call('hset', KEYS[1], holder, e .. ' ' .. far .. ' ' .. rest)
                n = n + 1
            end
        end
        return n",
    )
    .key(Keys::lock(PREFIX, NAME).waiters())
    .invoke(&mut con)
    .expect("refresh the queue entries");
    assert_eq!(fresh, 2, "setup: the two waiters' queue entries");

    // The next attempt, the one a release wakes, fails with an error reply.
    proxy.fail_next_request_with(&acquire, "-ERR injected\r\n");
    let released = Instant::now();
    guard.unlock().expect("holder unlock");

    // In either order: the failed waiter's queue entry is given up by the watchdog
    // thread while its call returns, so the other waiter may report first.
    let mut outcomes = Vec::new();
    while outcomes.len() < 2 {
        let left = (released + Duration::from_secs(5)).saturating_duration_since(Instant::now());
        match results.recv_timeout(left) {
            Ok(outcome) => outcomes.push(outcome),
            Err(_) => panic!(
                "within 5 s of the release only {outcomes:?}: if one waiter failed, the \
                 wake-up its failed attempt consumed was lost and the other sleeps until the \
                 10 s lease it saw before the release"
            ),
        }
    }
    outcomes.sort_by_key(|(_, r, _)| r.is_ok());
    let (i, failed, _) = &outcomes[0];
    let failed = failed
        .as_ref()
        .expect_err("the woken waiter's attempt was failed by the proxy");
    assert!(failed.contains("injected"), "unexpected error: {failed}");
    assert_eq!(proxy.failed_requests(), 1);
    let (j, r, at) = &outcomes[1];
    assert_ne!(i, j, "one outcome per waiter");
    r.as_ref().expect("the other waiter takes the lock");
    // Against the 10 s lease the lost wake-up cost, with room for a loaded machine.
    assert!(
        *at - released < Duration::from_secs(2),
        "the other waiter got the lock only {:?} after the release",
        *at - released
    );
    first.join().unwrap();
    second.join().unwrap();
}

/// Issue 4: a subscription counts as armed only once the server confirmed it. A waiter
/// whose confirmation is slow tries when the holder's lease ends, fails (a third client
/// took the lock meanwhile) and must then keep waiting for the confirmation and try once
/// more: the third client's release was published before the server had the waiter's
/// SUBSCRIBE. Before the fix the waiter slept on the unconfirmed subscription until the
/// third client's 10 s lease would have ended.
#[test]
fn a_subscription_counts_as_armed_only_once_confirmed() {
    const NAME: &str = "unconfirmed";
    let server = RedisServer::new();
    load_scripts(&server);
    let proxy = FaultProxy::new(server.port());
    let clients = CLIENTS
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1));
    let h1 = clients.at(&server.url());
    let h2 = clients.at(&server.url());
    let w = clients.at(&proxy.url());
    let acquire = acquire_call(&server);
    proxy.watch(&acquire);

    let g1 = support::leased(
        &h1.lock(NAME),
        Duration::from_millis(500),
        "H1 takes the lock",
    );
    let calls = script_calls(&server);

    // H2 waits too, subscribed directly: the release of H1 wakes it.
    let (h2_tx, h2_took) = mpsc::channel();
    let (release_h2, h2_release) = mpsc::channel::<()>();
    let lock = h2.lock(NAME);
    let h2_thread = thread::spawn(move || {
        let g = lock
            .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_secs(10)))
            .map(Option::unwrap)
            .expect("H2 takes the lock");
        h2_tx.send(Instant::now()).unwrap();
        let _ = h2_release.recv();
        g.unlock().expect("H2 unlock");
        h2_tx.send(Instant::now()).unwrap();
    });
    assert!(
        support::wait_until(Duration::from_secs(2), || {
            numsub(&server, &channel(NAME)) == 1 && script_calls(&server) >= calls + 2
        }),
        "setup: H2 never blocked subscribed"
    );

    // W's subscription reaches Redis 750 ms late (under the reader's 1 s read timeout).
    proxy.delay_requests_containing(&channel_of(NAME, &w), Duration::from_millis(750));
    let (w_tx, w_result) = mpsc::channel();
    let lock = w.lock(NAME);
    let w_thread = thread::spawn(move || {
        let started = Instant::now();
        let r = lock.try_lock_for(Duration::from_secs(5));
        let at = Instant::now();
        let got = matches!(r, Ok(Some(_)));
        w_tx.send((
            started,
            format!("{:?}", r.as_ref().map(Option::is_some)),
            got,
            at,
        ))
        .unwrap();
        if let Ok(Some(g)) = r {
            g.unlock().expect("W unlock");
        }
    });
    assert!(
        proxy.wait_seen(&channel_of(NAME, &w), 1, Duration::from_secs(2)),
        "W never subscribed"
    );
    g1.unlock()
        .expect("setup too slow: H1's 500 ms lease ended before its release");
    h2_took
        .recv_timeout(Duration::from_secs(2))
        .expect("H2 was not woken by H1's release");
    assert_eq!(
        proxy.seen(&acquire),
        1,
        "setup too slow: W tried again before H2 took the lock"
    );
    // W tries once more when H1's lease would have ended; wait until Redis has run it.
    assert!(
        support::wait_until(Duration::from_secs(2), || proxy.seen(&acquire) >= 2),
        "W did not try when H1's lease ended"
    );
    assert_eq!(proxy.seen(&acquire), 2, "the attempt was W's");
    release_h2.send(()).unwrap();
    h2_took
        .recv_timeout(Duration::from_secs(2))
        .expect("H2 released");
    assert_eq!(
        proxy.forwarded(&channel_of(NAME, &w)),
        0,
        "setup too slow: W's SUBSCRIBE reached Redis before H2's release was published"
    );

    let (started, outcome, got, at) = w_result
        .recv_timeout(Duration::from_secs(8))
        .expect("W never returned");
    assert!(
        got && at - started < Duration::from_secs(3),
        "W should take the free lock once its subscription is confirmed (~0.8 s); got \
         {outcome} after {:?}: it slept on an unconfirmed subscription and missed the release",
        at - started
    );
    w_thread.join().unwrap();
    h2_thread.join().unwrap();
}

/// Issue 4: subscribe confirmations are matched one per channel. redis-rs's sync
/// `PubSub::subscribe(&[a, b])` returns after the first confirmation and leaves the others
/// unread; before the fix the reader's first SUBSCRIBE named the waiting channel and its
/// control channel, and the next channel subscribed right after took the control channel's
/// stale confirmation as its own. Its waiter then tried at once, slept, and missed a release
/// published before the server had its SUBSCRIBE: it waited for the holder's whole lease.
#[test]
fn subscribe_confirmations_are_matched_one_per_channel() {
    const FIRST: &str = "confirm-first";
    const SECOND: &str = "confirm-second";
    let server = RedisServer::new();
    load_scripts(&server);
    let proxy = FaultProxy::new(server.port());
    let clients = CLIENTS
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1));
    let h = clients.at(&server.url());
    let w = clients.at(&proxy.url());
    let _first = support::leased(
        &h.lock(FIRST),
        Duration::from_secs(10),
        "H takes the first lock",
    );
    let second = support::leased(
        &h.lock(SECOND),
        Duration::from_secs(8),
        "H takes the second lock",
    );
    // Both under the pub/sub reader's 1 s read timeout.
    proxy.delay_requests_containing(&channel_of(FIRST, &w), Duration::from_millis(500));
    proxy.delay_requests_containing(&channel_of(SECOND, &w), Duration::from_millis(600));
    proxy.watch("PUBLISH");

    // A waiter on the first lock starts W's pub/sub reader; its SUBSCRIBE is held back.
    let lock = w.lock(FIRST);
    let first_waiter = thread::spawn(move || {
        let r = lock.try_lock_for(Duration::from_millis(1500));
        assert!(matches!(r, Ok(None)), "first lock: {r:?}");
    });
    assert!(
        proxy.wait_seen(&channel_of(FIRST, &w), 1, Duration::from_secs(5)),
        "W's reader never subscribed the first lock"
    );

    // Meanwhile a waiter on the second lock queues its channel (and nudges the reader).
    let (tx, result) = mpsc::channel();
    let lock = w.lock(SECOND);
    let started = Instant::now();
    let second_waiter = thread::spawn(move || {
        let r = lock.try_lock_for(Duration::from_secs(4));
        let at = Instant::now();
        tx.send((
            format!("{:?}", r.as_ref().map(Option::is_some)),
            r.as_ref().is_ok_and(Option::is_some),
            at,
        ))
        .unwrap();
        if let Ok(Some(g)) = r {
            g.unlock().expect("W unlock");
        }
    });
    assert!(
        proxy.wait_seen("PUBLISH", 1, Duration::from_secs(2)),
        "the second waiter never queued its subscription"
    );
    assert_eq!(
        proxy.forwarded(&channel_of(FIRST, &w)),
        0,
        "setup too slow: the first SUBSCRIBE was answered before the second channel was queued"
    );
    // The reader subscribes the second channel right after the first one's confirmation.
    assert!(
        proxy.wait_seen(&channel_of(SECOND, &w), 1, Duration::from_secs(3)),
        "W's reader never subscribed the second lock"
    );
    let subscribing = Instant::now();
    // H releases while that SUBSCRIBE is still on its way: nobody hears the message.
    thread::sleep(Duration::from_millis(250));
    second.unlock().expect("H releases the second lock");
    assert_eq!(
        proxy.forwarded(&channel_of(SECOND, &w)),
        0,
        "setup too slow: the second SUBSCRIBE reached Redis before the release ({:?})",
        subscribing.elapsed()
    );

    let (outcome, got, at) = result
        .recv_timeout(Duration::from_secs(8))
        .expect("the second waiter never returned");
    assert!(
        got && at - started < Duration::from_millis(2500),
        "W should take the second lock once its own SUBSCRIBE is confirmed (~1.1 s); got \
         {outcome} after {:?}: a stale confirmation marked it subscribed too early and the \
         release was missed",
        at - started
    );
    second_waiter.join().unwrap();
    first_waiter.join().unwrap();
}

/// Issue 5: a renewal uses no stale snapshot. Releasing a hold waits for a renewal in
/// flight that includes it, so the renewal cannot land on the thread's next hold. Before
/// the fix the delayed renewal extended an immediate fixed-lease re-take (400 ms) to the
/// watchdog lease (1.5 s).
#[test]
fn a_renewal_in_flight_never_lands_on_a_later_hold() {
    const NAME: &str = "renewal";
    let server = RedisServer::new();
    load_scripts(&server);
    let proxy = FaultProxy::new(server.port());
    // Renewals every 500 ms, each held back 200 ms (under the 500 ms command timeout, and
    // under the re-take's lease, so that a late renewal still finds the re-take's hold).
    let c = CLIENTS
        .watchdog(Duration::from_millis(1500))
        .command(Duration::from_millis(500))
        .at(&proxy.url());
    let renew = support::function_name(&server.url(), "renew");
    proxy.delay_requests_containing(&renew, Duration::from_millis(200));
    let lock = c.lock(NAME);

    let guard = lock.lock().expect("lock");
    assert!(
        proxy.wait_seen(&renew, 1, Duration::from_secs(3)),
        "no renewal was sent"
    );
    assert_eq!(proxy.forwarded(&renew), 0, "the renewal is held back");
    guard.unlock().expect("unlock");
    let retaken = lock
        .try_lock_with(redmutex::LockOptions::new().lease(Duration::from_millis(400)))
        .map(Option::unwrap)
        .expect("re-take with a fixed lease");
    let at = Instant::now();
    assert!(
        proxy.wait_forwarded(&renew, 1, Duration::from_secs(2)),
        "the renewal never reached Redis"
    );
    // The re-take's 400 ms lease is long over 800 ms later, unless a renewal extended it
    // (to the 1.5 s watchdog lease).
    thread::sleep(Duration::from_millis(800).saturating_sub(at.elapsed()));
    let left = pttl(&server, &Keys::lock(PREFIX, NAME).key());
    assert_eq!(
        left, -2,
        "800 ms after a re-take with a 400 ms lease the lock still lives ({left} ms left): \
         the renewal sent for the released hold extended the new one"
    );
    let _ = retaken.unlock();
}

/// What a bounded call may return from a frozen server.
fn gave_up(r: &Result<Option<LockGuard>, Error>) -> bool {
    matches!(
        r,
        Ok(None) | Err(Error::Timeout { .. }) | Err(Error::Pool { .. })
    )
}

fn default_timeouts(url: &str) -> Client {
    // Default connect (5 s) and command (3 s) timeouts.
    Client::builder()
        .url(url)
        .key_prefix(PREFIX)
        .watchdog_timeout(Duration::from_secs(10))
        .build()
        .expect("build client")
}

/// Issue 8: bounded calls return within their bound plus about a round trip against a
/// frozen server: a warm client's `try_lock_for(100 ms)` and `try_lock()`, and a cold
/// client (no connection yet). Before the fix they blocked for the command timeout (3 s)
/// or the connect timeout (5 s).
#[test]
fn bounded_calls_return_in_time_from_a_frozen_server() {
    let server = RedisServer::new();
    let warm = default_timeouts(&server.url());
    warm.lock("warm-up")
        .lock()
        .expect("warm-up lock")
        .unlock()
        .expect("warm-up unlock");
    let cold = default_timeouts(&server.url());

    server.freeze();
    let _thaw = support::Thaw(&server);

    let t = Instant::now();
    let r = warm
        .lock("frozen-warm")
        .try_lock_for(Duration::from_millis(100));
    let took = t.elapsed();
    assert!(gave_up(&r), "warm try_lock_for: {r:?}");
    assert!(
        took < Duration::from_millis(500),
        "warm try_lock_for(100 ms) took {took:?} against a frozen server"
    );

    let t = Instant::now();
    let r = cold
        .lock("frozen-cold")
        .try_lock_for(Duration::from_millis(100));
    let took = t.elapsed();
    assert!(gave_up(&r), "cold try_lock_for: {r:?}");
    assert!(
        took < Duration::from_millis(500),
        "cold try_lock_for(100 ms) took {took:?} against a frozen server"
    );

    let (r, took) = support::timed(|| warm.lock("frozen-try").try_lock());
    assert!(gave_up(&r), "warm try_lock: {r:?}");
    assert!(
        took < Duration::from_millis(500),
        "try_lock took {took:?} against a frozen server"
    );
}

/// Issue 8: a waiter's `try_lock_for(300 ms)` stays bounded when the server freezes after
/// its first attempt, while it nudges its pub/sub thread (a PUBLISH on a pooled
/// connection). Before the fix the nudge and the next attempt each blocked for the 3 s
/// command timeout.
#[test]
fn a_bounded_wait_stays_bounded_when_the_server_freezes_while_it_subscribes() {
    const NAME: &str = "frozen-waiter";
    let server = RedisServer::new();
    load_scripts(&server);
    let proxy = FaultProxy::new(server.port());
    let holder = CLIENTS
        .watchdog(Duration::from_secs(10))
        .command(Duration::from_secs(1))
        .at(&server.url());
    let waiter = default_timeouts(&proxy.url());
    let _held = support::leased(
        &holder.lock(NAME),
        Duration::from_secs(20),
        "holder takes the lock",
    );
    let _other = support::leased(
        &holder.lock("warm-up"),
        Duration::from_secs(20),
        "holder takes the warm-up lock",
    );
    // Waiting once connects the waiter's pub/sub thread, so the next wait nudges it.
    let r = waiter
        .lock("warm-up")
        .try_lock_for(Duration::from_millis(200));
    assert!(matches!(r, Ok(None)), "warm-up wait: {r:?}");
    assert_eq!(numsub(&server, &channel("warm-up")), 1);

    proxy.delay_requests_containing("PUBLISH", Duration::from_millis(300));
    let _thaw = support::Thaw(&server);
    let (r, took) = thread::scope(|s| {
        let freezer = s.spawn(|| {
            // The nudge is held back at the proxy: freeze before it reaches Redis.
            let seen = proxy.wait_seen("PUBLISH", 1, Duration::from_secs(10));
            if seen {
                server.freeze();
            }
            seen
        });
        let (r, took) =
            support::timed(|| waiter.lock(NAME).try_lock_for(Duration::from_millis(300)));
        assert!(
            freezer.join().unwrap(),
            "the waiter never nudged its pub/sub thread"
        );
        (r, took)
    });
    assert!(gave_up(&r), "waiter: {r:?}");
    assert!(
        took < Duration::from_millis(700),
        "try_lock_for(300 ms) took {took:?} when the server froze during its subscription"
    );
}

/// Issue 9: after a pub/sub reconnect only channels with waiters get a wake-up. Before the
/// fix a lingering channel (subscribed, nobody waiting) got one too, and the next waiter
/// on that lock made a spurious attempt (three instead of at most two).
#[test]
fn a_reconnect_wakes_no_channel_nobody_waits_on() {
    const NAME: &str = "lingering";
    let server = RedisServer::new();
    load_scripts(&server);
    let clients = CLIENTS
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1));
    let h = clients.at(&server.url());
    let w = clients.at(&server.url());
    let _held = support::leased(&h.lock(NAME), Duration::from_secs(20), "H takes the lock");
    let lock = w.lock(NAME);
    let r = lock.try_lock_with(
        redmutex::LockOptions::new()
            .wait_for(Duration::from_millis(300))
            .lease(Duration::from_secs(1)),
    );
    assert!(matches!(r, Ok(None)), "first wait: {r:?}");
    // Nobody waits now, but the channel stays subscribed for a while (~5 s).
    assert_eq!(numsub(&server, &channel(NAME)), 1);

    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.connection())
        .expect("CLIENT KILL");
    // W's, and H's: a client listens on its own channel while it holds anything.
    assert!(
        (1..=2).contains(&killed),
        "W's and H's pub/sub connections: {killed}"
    );
    assert!(
        support::wait_until(Duration::from_secs(3), || numsub(&server, &channel(NAME))
            == 1),
        "W's pub/sub thread did not resubscribe"
    );
    // Wait until the reader handled that confirmation (and any reconnect wake-up with
    // it): a channel asked for now is subscribed only after it, since the reader takes
    // new channels once it has re-subscribed all the old ones.
    let _marker = support::leased(
        &h.lock("marker"),
        Duration::from_secs(20),
        "H takes the marker lock",
    );
    let r = w.lock("marker").try_lock_for(Duration::from_millis(100));
    assert!(matches!(r, Ok(None)), "marker wait: {r:?}");
    assert!(
        support::wait_until(Duration::from_secs(3), || numsub(
            &server,
            &channel("marker")
        ) == 1),
        "W's pub/sub thread did not subscribe to the marker lock's channel"
    );

    // Attempts are the acquire script's calls on this lock: the watchdog's keep-alive
    // of the queue entry (renew.lua) and the cancel of the give-up are script calls too.
    let monitor = server.monitor();
    let r = lock.try_lock_with(
        redmutex::LockOptions::new()
            .wait_for(Duration::from_millis(500))
            .lease(Duration::from_secs(1)),
    );
    let lines = monitor.stop();
    let (acquire, lock_key) = (
        acquire_call(&server),
        format!("\"{}\"", Keys::lock(PREFIX, NAME).key()),
    );
    let attempts = support::Monitor::top_level(&lines)
        .into_iter()
        .filter(|l| l.contains(&acquire) && l.contains(&lock_key))
        .count();
    assert!(matches!(r, Ok(None)), "second wait: {r:?}");
    assert!(attempts >= 1, "the monitor saw no attempt on {lock_key}");
    assert!(
        attempts <= 2,
        "{attempts} attempts in a 500 ms wait on a lock held for 20 s: a wake-up queued by \
         the reconnect for a channel nobody waited on made a spurious one"
    );
}

/// Issue 9: when a holder's lease runs out without a release message (a crashed holder),
/// one waiting thread per process wakes and tries. Before the fix all eight waiting
/// threads tried at the same instant.
#[test]
fn an_expired_lease_wakes_one_thread_per_process() {
    const NAME: &str = "crashed-holder";
    const THREADS: usize = 8;
    let server = RedisServer::new();
    load_scripts(&server);
    let clients = CLIENTS
        .watchdog(Duration::from_secs(3))
        .command(Duration::from_secs(1));
    let h = clients.at(&server.url());
    let w = clients.at(&server.url());
    let lease = Duration::from_millis(1000);
    let taken = Instant::now();
    // Never released: the holder "crashed" with the lock.
    let _crashed = support::leased(&h.lock(NAME), lease, "H takes the lock");
    let calls = script_calls(&server);

    let (tx, granted) = mpsc::channel();
    let mut stops = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..THREADS {
        let (stop, stopped) = mpsc::channel::<()>();
        stops.push(stop);
        let lock = w.lock(NAME);
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let r = lock.try_lock_with(
                redmutex::LockOptions::new()
                    .wait_for(Duration::from_secs(5))
                    .lease(Duration::from_secs(3)),
            );
            if let Ok(Some(g)) = r {
                let _ = tx.send(Instant::now());
                // Hold until the counting is over.
                let _ = stopped.recv();
                let _ = g.unlock();
            }
        }));
    }
    assert!(
        support::wait_until(Duration::from_millis(700), || {
            numsub(&server, &channel(NAME)) == 1 && script_calls(&server) >= calls + THREADS as u64
        }),
        "setup too slow: the waiters did not block well before the lease ran out"
    );
    // Lease expiry is the subject: wait until just before it.
    thread::sleep(
        (taken + lease - Duration::from_millis(150)).saturating_duration_since(Instant::now()),
    );
    // Acquire attempts only: the watchdog's renewals (queue entries, the winner's
    // extension a third into its pickup window) may fall in the window too.
    let acquire = acquire_call(&server);
    let monitor = server.monitor();
    assert!(
        pttl(&server, &Keys::lock(PREFIX, NAME).key()) > 20,
        "setup too slow: the lease ran out before the count started"
    );

    granted
        .recv_timeout(Duration::from_secs(3))
        .expect("no waiter took the lock after the lease ran out");
    // The winner holds 3 s: nothing else should try in this window.
    thread::sleep(Duration::from_millis(300));
    let lines = monitor.stop();
    let attempts = support::Monitor::top_level(&lines)
        .iter()
        .filter(|l| {
            // FCALL <function>, or EVALSHA <sha1> on a server without functions.
            let l = l.to_ascii_lowercase();
            l.contains(&format!("\"fcall\" \"{acquire}\""))
                || l.contains(&format!("\"evalsha\" \"{acquire}\""))
        })
        .count();
    drop(stops);
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        (1..=2).contains(&attempts),
        "{attempts} attempts when the lease of a crashed holder ran out: every waiting \
         thread of the process woke and tried, not one (and at least the one that took it)"
    );
}

// ---------------------------------------------------------------------------------------
// A process stopped and continued (SIGSTOP/SIGCONT: a debugger, `kill -STOP`, a job shell).

const ROLE: &str = "REDMUTEX_WAKEUPS_ROLE";
const URL: &str = "REDMUTEX_WAKEUPS_URL";
const STOPPED_LOCK: &str = "stopped";

/// The child side of [`a_stopped_and_continued_process_keeps_its_waiters_places`]; a no-op
/// in a normal run. Told "wait <i>", a thread waits for the fair lock and says "got <i>"
/// once it holds it, then releases it; told "exit", it ends once they all did.
#[test]
fn wakeups_entry() {
    let Some((role, url)) = support::child::entry(ROLE, URL) else {
        return;
    };
    assert_eq!(role, "waiters");
    let c = std::sync::Arc::new(
        CLIENTS
            .watchdog(Duration::from_secs(10))
            .command(Duration::from_secs(2))
            .at(&url),
    );
    let mut threads = Vec::new();
    for line in std::io::BufRead::lines(std::io::stdin().lock()) {
        let line = line.expect("stdin");
        if let Some(i) = line.strip_prefix("wait ") {
            let (c, i) = (c.clone(), i.to_owned());
            threads.push(thread::spawn(move || {
                let g = c.fair_lock(STOPPED_LOCK).lock().expect("wait");
                support::child::say(&format!("got {i}"));
                g.unlock().expect("unlock");
            }));
        } else if line == "exit" {
            break;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// The ids of the server's pub/sub connections.
fn pubsub_ids(server: &RedisServer) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.connection())
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

fn subscribes(server: &RedisServer) -> u64 {
    server
        .command_calls()
        .get("subscribe")
        .copied()
        .unwrap_or(0)
}

/// A process with three threads queued on a fair lock is stopped for 300 ms and continued
/// (far within its 10 s queue entries). Its pub/sub reader's blocked read returns EINTR
/// then: that is no broken connection. The process keeps its one pub/sub connection (no
/// new one, no SUBSCRIBE sent again: before the fix it reconnected and resubscribed, and a
/// release landing in that gap dropped its waiters from the queue as dead), and its
/// threads get the lock in their queue order.
#[test]
fn a_stopped_and_continued_process_keeps_its_waiters_places() {
    use support::child::ChildProc;
    let server = RedisServer::new();
    let holder = CLIENTS
        .watchdog(Duration::from_secs(10))
        .command(Duration::from_secs(2))
        .at(&server.url());
    let held = holder.fair_lock(STOPPED_LOCK).lock().expect("holder");
    // The holder's own pub/sub connection (a client listens on its own channel while it
    // holds anything), subscribed before the counts below are taken.
    let own = keys::control_channel(PREFIX, &holder);
    assert!(
        support::wait_until(Duration::from_secs(5), || numsub(&server, &own) == 1),
        "the holder's client never listened on its own channel"
    );
    let parent = pubsub_ids(&server);
    let url = server.url();
    let mut child = ChildProc::spawn("wakeups_entry", &[(ROLE, "waiters"), (URL, &url)]);
    let queue = Keys::lock(PREFIX, STOPPED_LOCK).queue();
    let llen = |con: &mut redis::Connection| -> i64 {
        redis::cmd("LLEN").arg(&queue).query(con).expect("LLEN")
    };
    let mut con = server.connection();
    for i in 1..=3 {
        child.send(&format!("wait {i}"));
        assert!(
            support::wait_until(Duration::from_secs(5), || llen(&mut con) == i),
            "waiter {i} never queued"
        );
    }
    let child_ids = |server: &RedisServer| -> Vec<String> {
        let mut ids = pubsub_ids(server);
        ids.retain(|id| !parent.contains(id));
        ids
    };
    let ids = child_ids(&server);
    assert_eq!(ids.len(), 1, "the child's one pub/sub connection: {ids:?}");
    let subscribed = subscribes(&server);

    let pid = libc::pid_t::try_from(child.child.id()).expect("pid");
    // SAFETY: kill(2) on our own child, not reaped before `child` drops.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // The stop is the subject; it stays far below every lease and queue entry (10 s).
    thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    held.unlock().expect("holder unlock");

    let order: Vec<String> = (0..3)
        .map(|_| {
            child
                .try_line(Duration::from_secs(5))
                .expect("a waiter never got the lock")
        })
        .collect();
    // Every grant went through the reader: it has read past the interrupted read.
    let now = child_ids(&server);
    let resubscribed = subscribes(&server) - subscribed;
    child.send("exit");
    child.wait_success();
    assert_eq!(
        (now.clone(), resubscribed),
        (ids.clone(), 0),
        "the stop and continue cost the child its pub/sub connection ({ids:?} -> {now:?}, \
         {resubscribed} SUBSCRIBEs again)"
    );
    assert_eq!(
        order,
        ["got 1", "got 2", "got 3"],
        "grants out of queue order"
    );
}

/// A channel nobody waits on any more stays subscribed a while (a lock waited on again
/// soon costs no SUBSCRIBE), then goes, each in its own time: the reader looks for such
/// channels only when one may be due (not on every message), and must still find each.
#[test]
fn lingering_channels_go_each_in_its_own_time() {
    const LINGER: Duration = Duration::from_secs(5);
    // The reader looks at most every 0.5 s, and may be blocked on the socket for its 1 s
    // read tick; a busy machine adds to that.
    const LATE: Duration = Duration::from_millis(3_000);
    let server = RedisServer::new();
    let url = server.url();
    let holder = CLIENTS
        .watchdog(Duration::from_secs(30))
        .command(Duration::from_secs(5))
        .at(&url);
    let waiter = CLIENTS
        .watchdog(Duration::from_secs(30))
        .command(Duration::from_secs(5))
        .at(&url);
    let subscribed = |name: &str| numsub(&server, &channel_of(name, &waiter)) > 0;
    let wait_once = |name: &str| -> Instant {
        let held = support::leased(&holder.lock(name), Duration::from_secs(60), "hold");
        let got = waiter
            .lock(name)
            .try_lock_for(Duration::from_millis(300))
            .expect("wait");
        assert!(got.is_none(), "the lock is held by the other client");
        let idle = Instant::now();
        assert!(subscribed(name), "the waiter subscribed while it waited");
        held.unlock().expect("unlock");
        idle
    };
    let gone_after = |name: &str, idle: Instant| -> Duration {
        assert!(
            support::wait_until(LINGER + LATE + Duration::from_secs(2), || !subscribed(name)),
            "{name}'s channel never went"
        );
        idle.elapsed()
    };

    let a = wait_once("a");
    thread::sleep(Duration::from_secs(3));
    let b = wait_once("b");
    let a_after = gone_after("a", a);
    assert!(
        subscribed("b"),
        "b's channel went with a's, {a_after:?} after a's wait"
    );
    let b_after = gone_after("b", b);
    for (name, after) in [("a", a_after), ("b", b_after)] {
        assert!(
            after >= LINGER - Duration::from_millis(300) && after <= LINGER + LATE,
            "{name}'s channel went {after:?} after its wait; expected {LINGER:?} to {:?}",
            LINGER + LATE
        );
    }
}
