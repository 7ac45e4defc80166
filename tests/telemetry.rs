//! Issue 19, item 6: the spans, events and metrics of acquisitions and releases, seen by a
//! subscriber and a recorder installed for the test's own thread only (so that the tests
//! of this file run in parallel without seeing each other's), against a real redis-server.
//! What the watchdog thread reports (renewals, lost leases) is in tests/telemetry_watchdog.rs,
//! which needs the process-wide recorder.

#[path = "support/capture.rs"]
mod capture;
mod support;

use std::thread;
use std::time::Duration;

use capture::{counter, histogram, metrics_of, observed};
use support::clients::Clients;
use support::keys::Keys;
use support::{wait_until, RedisServer};

const PREFIX: &str = "telemetry:";

const CLIENTS: Clients = Clients::new(PREFIX)
    .watchdog(Duration::from_secs(30))
    .command(Duration::from_secs(2));

fn await_queued(server: &RedisServer, name: &str, n: i64) {
    let queue = Keys::lock(PREFIX, name).queue();
    let mut con = server.connection();
    let mut seen = 0;
    let ok = wait_until(Duration::from_secs(5), || {
        seen = redis::cmd("LLEN").arg(&queue).query(&mut con).unwrap();
        seen == n
    });
    assert!(ok, "LLEN {queue} is {seen}, expected {n}");
}

#[test]
fn an_uncontended_acquisition_has_its_span_its_release_event_and_its_metrics() {
    let (server, c) = CLIENTS.serve();
    let lock = c.lock("free");
    let ((), captured, snapshotter) = observed(|| {
        let guard = lock.lock().unwrap();
        thread::sleep(Duration::from_millis(20));
        guard.unlock().unwrap();
        // A try_lock that finds the lock held ends `timed_out`, not waiting.
        let _held = lock.lock().unwrap();
        let other = thread::scope(|s| s.spawn(|| lock.try_lock().map(|g| g.is_none())).join());
        assert!(other.unwrap().unwrap(), "another thread got a held lock");
    });

    let spans = captured.spans("redmutex.acquire");
    assert_eq!(spans.len(), 2, "{spans:?}");
    let span = &spans[0];
    assert_eq!(span.field("lock"), "free");
    assert_eq!(span.field("kind"), "Lock");
    assert_eq!(span.field("outcome"), "acquired");
    assert_eq!(span.field("contended"), "false");
    assert_eq!(span.field("handoff"), "false");
    let holder = span.field("holder");
    assert!(holder.starts_with(&format!("{}:", c.id())), "{holder}");
    let waited: f64 = span.field("waited_ms").parse().unwrap();
    assert!((0.0..2000.0).contains(&waited), "waited_ms {waited}");
    // The span's end is marked by an event inside it.
    let acquired = captured.events("acquired");
    assert_eq!(acquired.len(), 2, "{acquired:?}");
    assert_eq!(acquired[0].parent.as_deref(), Some("redmutex.acquire"));

    // (The second hold is released as the closure ends.)
    let released = captured.events("released");
    assert_eq!(released.len(), 2, "{released:?}");
    let r = &released[0];
    assert_eq!(r.field("lock"), "free");
    assert_eq!(r.field("kind"), "Lock");
    assert_eq!(r.field("holder"), holder);
    assert_eq!(r.field("outcome"), "released");
    let held: f64 = r.field("held_ms").parse().unwrap();
    assert!(held >= 20.0, "held_ms {held} < the 20 ms it was held");
    // Nothing that names the server.
    let url = server.url();
    for s in spans.iter().chain(&released) {
        assert!(s.fields.values().all(|v| !v.contains(&url)), "{s:?}");
    }

    let m = metrics_of(&snapshotter);
    assert_eq!(
        counter(
            &m,
            "redmutex_acquisitions_total{kind=Lock,outcome=acquired}"
        ),
        2,
        "{m:?}"
    );
    // The other thread's try_lock ran outside the recorder's thread: not seen here.
    assert_eq!(
        counter(
            &m,
            "redmutex_acquisitions_total{kind=Lock,outcome=timed_out}"
        ),
        0
    );
    assert_eq!(counter(&m, "redmutex_waits_total{kind=Lock}"), 0);
    assert_eq!(counter(&m, "redmutex_handoffs_total{kind=Lock}"), 0);
    assert!(histogram(&m, "redmutex_wait_seconds{kind=Lock}").is_empty());
    let holds = histogram(&m, "redmutex_hold_seconds{kind=Lock}");
    assert_eq!(holds.len(), 2, "{holds:?}");
    assert!(holds[0] >= 0.020, "{holds:?}");
}

#[test]
fn a_try_lock_of_a_held_lock_is_timed_out_and_not_a_wait() {
    let (_server, c) = CLIENTS.serve();
    let lock = c.lock("held");
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let lock = lock.clone();
        thread::spawn(move || {
            let _g = lock.lock().unwrap();
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
        })
    };
    rx.recv().unwrap();
    let (got, captured, snapshotter) = observed(|| {
        let none = lock.try_lock().unwrap();
        let later = lock.try_lock_for(Duration::from_millis(100)).unwrap();
        (none.is_none(), later.is_none())
    });
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(got, (true, true));
    let spans = captured.spans("redmutex.acquire");
    assert_eq!(spans.len(), 2);
    assert!(
        spans.iter().all(|s| s.field("outcome") == "timed_out"),
        "{spans:?}"
    );
    assert_eq!(spans[0].field("contended"), "false");
    assert_eq!(spans[1].field("contended"), "true");
    assert_eq!(captured.events("not acquired").len(), 2);
    let m = metrics_of(&snapshotter);
    assert_eq!(
        counter(
            &m,
            "redmutex_acquisitions_total{kind=Lock,outcome=timed_out}"
        ),
        2,
        "{m:?}"
    );
    // Only the call that could wait counts as a wait, with the time it waited.
    assert_eq!(counter(&m, "redmutex_waits_total{kind=Lock}"), 1);
    let waits = histogram(&m, "redmutex_wait_seconds{kind=Lock}");
    assert_eq!(waits.len(), 1);
    assert!(waits[0] >= 0.100, "{waits:?}");
}

#[test]
fn a_cancelled_wait_is_counted_and_its_span_says_cancelled() {
    let (server, holder) = CLIENTS.serve();
    let _held = holder.lock("cancelled").lock().unwrap();
    let c = CLIENTS.at(&server);
    let lock = c.lock("cancelled");
    let token = redmutex::CancellationToken::new();
    let (got, captured, snapshotter) = observed(|| {
        thread::scope(|s| {
            s.spawn(|| {
                await_queued(&server, "cancelled", 1);
                token.cancel();
            });
            // On the observed thread: its span and metrics are the ones captured.
            let outcome = lock
                .try_lock_with(redmutex::LockOptions::new().cancellable(&token))
                .map(Option::unwrap)
                .map(|_| ());
            matches!(outcome, Err(redmutex::Error::Cancelled { .. }))
        })
    });
    assert!(got, "the wait was not cancelled");
    let spans = captured.spans("redmutex.acquire");
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0].field("outcome"), "cancelled");
    let m = metrics_of(&snapshotter);
    assert_eq!(
        counter(&m, "redmutex_cancellations_total{kind=Lock}"),
        1,
        "{m:?}"
    );
    assert_eq!(
        counter(
            &m,
            "redmutex_acquisitions_total{kind=Lock,outcome=cancelled}"
        ),
        1
    );
}

#[test]
fn a_contended_fair_lock_handed_over_says_so_in_its_span_and_counts_a_handoff() {
    let (server, c) = CLIENTS.serve();
    let lock = c.fair_lock("queue");
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let lock = lock.clone();
        thread::spawn(move || {
            let g = lock.lock().unwrap();
            held_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            g.unlock().unwrap();
        })
    };
    held_rx.recv().unwrap();
    // The holder releases once this thread is queued.
    let ((), captured, snapshotter) = observed(|| {
        thread::scope(|scope| {
            scope.spawn(|| {
                await_queued(&server, "queue", 1);
                go_tx.send(()).unwrap();
            });
            drop(lock.lock().unwrap());
        })
    });
    holder.join().unwrap();

    let spans = captured.spans("redmutex.acquire");
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = &spans[0];
    assert_eq!(span.field("lock"), "queue");
    assert_eq!(span.field("kind"), "FairLock");
    assert_eq!(span.field("outcome"), "acquired");
    assert_eq!(span.field("contended"), "true");
    assert_eq!(span.field("handoff"), "true");
    let m = metrics_of(&snapshotter);
    assert_eq!(
        counter(
            &m,
            "redmutex_acquisitions_total{kind=FairLock,outcome=acquired}"
        ),
        1,
        "{m:?}"
    );
    assert_eq!(counter(&m, "redmutex_waits_total{kind=FairLock}"), 1);
    assert_eq!(counter(&m, "redmutex_handoffs_total{kind=FairLock}"), 1);
    assert_eq!(
        histogram(&m, "redmutex_wait_seconds{kind=FairLock}").len(),
        1
    );
    assert_eq!(
        histogram(&m, "redmutex_hold_seconds{kind=FairLock}").len(),
        1
    );
}

#[test]
fn semaphore_and_read_write_acquisitions_are_told_apart_by_kind() {
    let (_server, c) = CLIENTS.serve();
    let ((), captured, snapshotter) = observed(|| {
        let permit = c.semaphore("pool", 2).acquire().unwrap();
        permit.release().unwrap();
        let rw = c.read_write_lock("doc");
        drop(rw.read_lock().lock().unwrap());
        drop(rw.write_lock().lock().unwrap());
    });
    let kinds: Vec<String> = captured
        .spans("redmutex.acquire")
        .iter()
        .map(|s| s.field("kind").to_owned())
        .collect();
    assert_eq!(kinds, ["Semaphore", "ReadLock", "WriteLock"]);
    let m = metrics_of(&snapshotter);
    for kind in ["Semaphore", "ReadLock", "WriteLock"] {
        let key = format!("redmutex_acquisitions_total{{kind={kind},outcome=acquired}}");
        assert_eq!(counter(&m, &key), 1, "{key}: {m:?}");
        assert_eq!(
            histogram(&m, &format!("redmutex_hold_seconds{{kind={kind}}}")).len(),
            1
        );
    }
}

#[test]
fn a_fixed_lease_that_ran_out_is_lost_once_however_often_it_is_found() {
    let (_server, c) = CLIENTS.serve();
    let lock = c.lock("fixed");
    let lease = Duration::from_secs(1);
    let ((), captured, snapshotter) = observed(|| {
        let old = lock
            .try_lock_with(redmutex::LockOptions::new().lease(lease))
            .map(Option::unwrap)
            .unwrap();
        assert!(!old.is_lease_lost());
        // Time is the subject: the lease runs out (bounded from above with a margin).
        assert!(wait_until(lease * 3, || old.is_lease_lost()));
        // Taken again while the old guard lives: Redis shows no earlier level, which
        // finds the old hold gone a second time.
        let new = lock.lock().unwrap();
        assert!(old.is_lease_lost());
        assert!(matches!(
            old.unlock(),
            Err(redmutex::Error::LeaseLost { .. })
        ));
        new.unlock().unwrap();
    });
    let m = metrics_of(&snapshotter);
    assert_eq!(
        counter(&m, "redmutex_lease_losses_total{reason=lease_expired}"),
        1,
        "{m:?}"
    );
    assert_eq!(
        counter(&m, "redmutex_lease_losses_total{reason=deleted}"),
        0
    );
    let lost = captured.events("lease lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].field("lock"), "fixed");
    assert_eq!(lost[0].field("reason"), "lease_expired");
    let released = captured.events("released");
    assert_eq!(released[0].field("outcome"), "lease_lost");
    assert_eq!(released[1].field("outcome"), "released");
}

#[test]
fn a_multilock_acquisition_has_one_span_naming_its_locks() {
    let (_server, c) = CLIENTS.serve();
    let multi = redmutex::MultiLock::new([c.lock("m1"), c.lock("m2")]).unwrap();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let ((), captured, snapshotter) = observed(|| {
        drop(multi.lock().unwrap());
        let c = &c;
        thread::scope(|s| {
            s.spawn(move || {
                let _g = c.lock("m2").lock().unwrap();
                held_tx.send(()).unwrap();
                done_rx.recv().unwrap();
            });
            held_rx.recv().unwrap();
            // m2 held elsewhere: no quorum (both are needed) within the wait.
            let none = multi.try_lock_for(Duration::from_millis(100)).unwrap();
            assert!(none.is_none());
            done_tx.send(()).unwrap();
        });
    });
    let spans = captured.spans("redmutex.acquire");
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_eq!(spans[0].field("lock"), "m1,m2");
    assert_eq!(spans[0].field("kind"), "MultiLock");
    assert_eq!(spans[0].field("outcome"), "acquired");
    assert_eq!(spans[0].field("contended"), "false");
    assert_eq!(spans[1].field("outcome"), "timed_out");
    assert_eq!(spans[1].field("contended"), "true");
    let m = metrics_of(&snapshotter);
    assert_eq!(
        counter(
            &m,
            "redmutex_acquisitions_total{kind=MultiLock,outcome=acquired}"
        ),
        1,
        "{m:?}"
    );
    assert_eq!(counter(&m, "redmutex_waits_total{kind=MultiLock}"), 1);
}

#[test]
fn the_metrics_are_described_with_their_units_to_the_recorder() {
    let server = RedisServer::new();
    let ((), _, snapshotter) = observed(|| {
        // Described as the client is built: the recorder is installed by then.
        let c = CLIENTS.at(&server);
        c.lock("described").lock().unwrap().unlock().unwrap();
    });
    let hold = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == "redmutex_hold_seconds")
        .expect("a hold time recorded");
    assert_eq!(hold.1, Some(metrics::Unit::Seconds));
    assert!(hold.2.is_some_and(|help| help.contains("held")));
}
