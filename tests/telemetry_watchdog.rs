//! Issue 19, item 6: what the watchdog thread reports (renewals, failed renewals, lost
//! leases), seen by a subscriber and a recorder installed for the whole process. One test,
//! alone in its binary, so that nothing else renews meanwhile and every count is exact.

#[path = "support/capture.rs"]
mod capture;
mod support;

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use capture::{metrics_of, Captured};
use metrics_util::debugging::{DebugValue, Snapshotter};
use redmutex::Error;
use support::clients::Clients;
use support::{wait_until, RedisServer};

const PREFIX: &str = "telemetry-wd:";
// Long enough that a renewal round trip never nears its give-up time (a third of it) on a
// busy machine: a renewal the server ran but the client gave up on would count as failed.
const WATCHDOG: Duration = Duration::from_millis(1500);

/// The counters recorded so far, summed over snapshots (each snapshot takes what it reads).
#[derive(Default)]
struct Counters(HashMap<String, u64>);

impl Counters {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, value) in metrics_of(snapshotter) {
            if let DebugValue::Counter(n) = value {
                *self.0.entry(key).or_default() += n;
            }
        }
    }

    fn get(&self, key: &str) -> u64 {
        self.0.get(key).copied().unwrap_or(0)
    }
}

fn lost_events(captured: &Captured, lock: &str) -> Vec<HashMap<String, String>> {
    captured
        .events("lease lost")
        .into_iter()
        .filter(|e| e.fields.get("lock").is_some_and(|l| l == lock))
        .map(|e| e.fields)
        .collect()
}

#[test]
fn renewals_failed_renewals_and_lost_leases_are_counted_once_each() {
    let (captured, snapshotter) = capture::global();
    let server = RedisServer::new();
    let c = Clients::new(PREFIX)
        .watchdog(WATCHDOG)
        .command(Duration::from_millis(500))
        .at(&server.url());

    // Renewals: every script call while the lock is held (nothing else runs one) renews
    // its one hold, and each is counted. Time is the subject here: rounds every 500 ms.
    let guard = c.lock("renewed").lock().unwrap();
    let mut counters = Counters::default();
    counters.take(&snapshotter);
    let before = server.script_calls();
    thread::sleep(WATCHDOG * 2);
    guard.unlock().unwrap();
    // (The release waited for a renewal in flight: each one is counted by now.)
    let calls = server.script_calls() - before - 1;
    let mut counters = Counters::default();
    counters.take(&snapshotter);
    let renewals = counters.get("redmutex_renewals_total{}");
    assert_eq!(renewals, calls, "{:?}", counters.0);
    assert!(renewals >= 2, "{renewals} renewals in two leases' time");
    assert_eq!(counters.get("redmutex_renewal_failures_total{}"), 0);
    assert_eq!(
        counters.get("redmutex_lease_losses_total{reason=deleted}"),
        0
    );

    // Force-unlocked: the next renewal finds the hold gone; it is lost once, whatever
    // else asks afterwards.
    let guard = c.lock("forced").lock().unwrap();
    let other = Clients::new(PREFIX)
        .watchdog(WATCHDOG)
        .command(Duration::from_millis(500))
        .at(&server.url());
    assert_eq!(other.force_unlock("forced").unwrap().len(), 1);
    assert!(wait_until(WATCHDOG * 5, || guard.is_lease_lost()));
    assert!(guard.is_lease_lost());
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
    let mut counters = Counters::default();
    counters.take(&snapshotter);
    assert_eq!(
        counters.get("redmutex_lease_losses_total{reason=deleted}"),
        1,
        "{:?}",
        counters.0
    );
    let lost = lost_events(&captured, "forced");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["kind"], "Lock");
    assert_eq!(lost[0]["reason"], "deleted");
    let released: Vec<_> = captured
        .events("released")
        .into_iter()
        .filter(|e| e.fields["lock"] == "forced")
        .collect();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].field("outcome"), "lease_lost");

    // Redis frozen: renewals fail, and once no renewal confirmed the lease for a whole
    // lease the hold is lost ("renewal_failed"), once.
    let guard = c.fenced_lock("frozen").lock().unwrap();
    let mut counters = Counters::default();
    counters.take(&snapshotter);
    server.freeze();
    let lost = wait_until(WATCHDOG * 5, || guard.is_lease_lost());
    let failed = wait_until(WATCHDOG * 5, || {
        counters.take(&snapshotter);
        counters.get("redmutex_renewal_failures_total{}") >= 1
    });
    server.thaw();
    assert!(lost, "the lease of a frozen Redis was never said lost");
    assert!(failed, "no failed renewal counted: {:?}", counters.0);
    assert!(matches!(guard.unlock(), Err(Error::LeaseLost { .. })));
    counters.take(&snapshotter);
    assert_eq!(
        counters.get("redmutex_lease_losses_total{reason=renewal_failed}"),
        1,
        "{:?}",
        counters.0
    );
    assert_eq!(
        counters.get("redmutex_lease_losses_total{reason=deleted}"),
        0
    );
    let lost = lost_events(&captured, "frozen");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["kind"], "FencedLock");
    let failures = captured.events("lease renewal failed");
    assert!(!failures.is_empty());
    assert_eq!(failures[0].field("holds"), "1");
    let url = server.url();
    assert!(failures
        .iter()
        .all(|f| f.fields.values().all(|v| !v.contains(&url))));
}
