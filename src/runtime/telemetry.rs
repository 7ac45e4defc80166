//! What locks do, told to `tracing` and to the `metrics` facade (feature `metrics`).
//! Every call site elsewhere is one line; without the features these functions are empty
//! (but for the two warnings below) and compile to nothing. With them but no subscriber or
//! recorder installed, a call costs an atomic load or two (`tracing`'s interest cache, the
//! `metrics` recorder slot): nothing is formatted, nothing is sent anywhere.
//!
//! `tracing` is the library's one logging facade: the human-readable messages elsewhere
//! (retries, failovers, a pub/sub reconnection) are `tracing` events too, all under the
//! target `redmutex`. Its `log` feature hands every event to the `log` logger while no
//! `tracing` subscriber is set, so programs that only use `log` keep seeing them (the
//! fields appended to the message as `name=value`); once a subscriber is set, nothing
//! goes to `log`, and nothing is said twice.
//!
//! A lost lease and a failed renewal are said here, once each, at WARN, whatever the
//! features: `lease lost` once per hold (the first time it is marked lost: however it was
//! found, by the watchdog, a `force_unlock`'s message, the clock or a later acquisition)
//! and `lease renewal failed` once per failed renewal call. The rest (feature `tracing`,
//! on by default) is structured, at DEBUG: fields a program can filter and aggregate on.
//!
//! # Spans and events (`tracing`, target `redmutex`)
//!
//! | name | kind | level | fields |
//! |---|---|---|---|
//! | `redmutex.acquire` | span (feature `tracing`), one per acquisition call (`lock*`, `try_lock*`, `acquire*`, read and write sides, `MultiLock`) | DEBUG | `lock`, `kind`, `holder`, then recorded at the end: `outcome`, `waited_ms`, `contended`, `handoff` |
//! | `acquired` / `not acquired` | event at the end of that span (feature `tracing`) | DEBUG | `outcome`, `waited_ms`, `contended`, `handoff` |
//! | `released` | event (feature `tracing`), one per guard or permit released (`unlock` or drop) | DEBUG | `lock`, `kind`, `holder`, `held_ms`, `outcome` |
//! | `lease lost` | event, once per hold | WARN | `lock`, `kind`, `reason` |
//! | `lease renewal failed` | event on the watchdog thread (retried next round) | WARN | `holds`, `error` |
//!
//! `outcome` is `acquired`, `timed_out` (the deadline passed, or a `try_lock` found the
//! lock held), `cancelled` or `error` for an acquisition; `released`, `lease_lost`,
//! `not_held` or `error` for a release. `contended`: the first attempt was refused and
//! the call waited. `handoff`: a release handed the lock to this call while it waited.
//! `lock` is the lock's name and `holder` the holder id (`<client uuid>:<n>`); for a
//! `MultiLock`, its locks' names comma-separated and the holder id on the first one's
//! client (its releases and the handoffs of its members are not reported, and its
//! `handoff` is always false). The Redis URL and credentials are never part of any field.
//!
//! # Metrics (`metrics` facade)
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `redmutex_acquisitions_total` | counter | `kind`, `outcome` | acquisition calls, by how they ended |
//! | `redmutex_waits_total` | counter | `kind` | calls whose first attempt was refused and that waited |
//! | `redmutex_wait_seconds` | histogram | `kind` | for those calls, the time from the call to its outcome |
//! | `redmutex_hold_seconds` | histogram | `kind` | per guard released, the time it was held |
//! | `redmutex_handoffs_total` | counter | `kind` | locks handed to a waiting call by a release |
//! | `redmutex_renewals_total` | counter | | holds whose lease the watchdog renewed (one per hold per round) |
//! | `redmutex_renewal_failures_total` | counter | | holds whose renewal call failed (retried next round) |
//! | `redmutex_lease_losses_total` | counter | `reason` | holds lost, once each |
//! | `redmutex_cancellations_total` | counter | `kind` | waiting calls cancelled |
//!
//! `kind` is `Lock`, `FairLock`, `FencedLock`, `ReadLock`, `WriteLock`, `UpgradeableLock`,
//! `Semaphore` or `MultiLock`;
//! `reason` is the hold's [`LossReason`](crate::LossReason) in snake case:
//! `lease_expired`, `deleted`, `server_lost`, `renewal_failed`, `max_hold` or
//! `client_dropped`. The lock name is deliberately not a label:
//! names are often made of ids (`order:1234`), and a label per name would grow a time
//! series per order in the recorder. The spans carry the name.

use std::fmt;
use std::time::Instant;

use crate::runtime::keys::LockKeys;
use crate::runtime::scripting::scripts::{self, Ops};
use crate::Error;
use crate::LossReason;

/// Describes the metrics (units, help texts) to the recorder installed by now: a recorder
/// that exports them (Prometheus' HELP lines) shows what they mean. Once per client built.
#[inline]
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::{describe_counter, describe_histogram, Unit};
        describe_counter!(
            "redmutex_acquisitions_total",
            "Acquisition calls, by kind and outcome (acquired, timed_out, cancelled, error)"
        );
        describe_counter!(
            "redmutex_waits_total",
            "Acquisition calls whose first attempt was refused and that waited"
        );
        describe_histogram!(
            "redmutex_wait_seconds",
            Unit::Seconds,
            "Time from the call to its outcome, of the calls that waited"
        );
        describe_histogram!(
            "redmutex_hold_seconds",
            Unit::Seconds,
            "Time each guard or permit was held, at its release"
        );
        describe_counter!(
            "redmutex_handoffs_total",
            "Locks handed to a waiting call by a release"
        );
        describe_counter!(
            "redmutex_renewals_total",
            "Leases renewed by the watchdog (one per hold per round)"
        );
        describe_counter!(
            "redmutex_renewal_failures_total",
            "Leases whose renewal call failed (tried again next round)"
        );
        describe_counter!(
            "redmutex_lease_losses_total",
            "Holds lost, once each, by reason (gone, lease_over, unrenewed, abandoned)"
        );
        describe_counter!(
            "redmutex_cancellations_total",
            "Waiting acquisition calls cancelled"
        );
    }
}

/// A lock's name as a field: printed only when a subscriber takes it.
pub(crate) struct Name<'a>(pub(crate) &'a [u8]);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.0))
    }
}

/// The names of a `MultiLock`'s locks, comma-separated.
pub(crate) struct Names<I>(pub(crate) I);

impl<'a, I: Iterator<Item = &'a [u8]> + Clone> fmt::Display for Names<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, name) in self.0.clone().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            fmt::Display::fmt(&Name(name), f)?;
        }
        Ok(())
    }
}

/// A holder id (`<client id>:<token>`, as `keys::holder_id` makes it), formatted only
/// when a subscriber takes it.
pub(crate) struct Holder<'a>(pub(crate) &'a str, pub(crate) u64);

impl fmt::Display for Holder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.0, self.1)
    }
}

// What the Wait of the acquisition under way on this thread reported (bits below): read
// and reset by `acquisition`, set by `waiting` and `handoff`.
#[cfg(any(feature = "tracing", feature = "metrics"))]
thread_local! {
    static FLAGS: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}
#[cfg(any(feature = "tracing", feature = "metrics"))]
const CONTENDED: u8 = 1;
#[cfg(any(feature = "tracing", feature = "metrics"))]
const HANDOFF: u8 = 2;

#[cfg(any(feature = "tracing", feature = "metrics"))]
fn flag(bit: u8) {
    FLAGS.with(|f| f.set(f.get() | bit));
}

/// Runs one acquisition call `run` of a lock of kind `kind` inside its span, and records
/// its outcome.
#[inline]
pub(crate) fn acquisition<G>(
    kind: &'static str,
    lock: &dyn fmt::Display,
    holder: &dyn fmt::Display,
    run: impl FnOnce() -> Result<Option<G>, Error>,
) -> Result<Option<G>, Error> {
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    {
        let _ = (kind, lock, holder);
        run()
    }
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    {
        let start = Instant::now();
        #[cfg(feature = "tracing")]
        let span = tracing::debug_span!(
            target: "redmutex",
            "redmutex.acquire",
            %lock,
            %kind,
            %holder,
            outcome = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            contended = tracing::field::Empty,
            handoff = tracing::field::Empty,
        );
        #[cfg(not(feature = "tracing"))]
        let _ = (lock, holder);
        // An acquisition never runs inside another on the same thread, but the flags are
        // kept as they were all the same.
        let outer = FLAGS.with(|f| f.replace(0));
        #[cfg(feature = "tracing")]
        let result = span.in_scope(run);
        #[cfg(not(feature = "tracing"))]
        let result = run();
        let flags = FLAGS.with(|f| f.replace(outer));
        let waited = start.elapsed();
        let outcome = match &result {
            Ok(Some(_)) => "acquired",
            Ok(None) => "timed_out",
            Err(e) => error_outcome(e),
        };
        let contended = flags & CONTENDED != 0;
        let handoff = flags & HANDOFF != 0;
        #[cfg(feature = "tracing")]
        {
            span.record("outcome", tracing::field::display(outcome));
            span.record("waited_ms", ms(waited));
            span.record("contended", contended);
            span.record("handoff", handoff);
            // The fields are the span's: the event only marks the end.
            let _in = span.enter();
            if outcome == "acquired" {
                tracing::debug!(target: "redmutex", "acquired");
            } else {
                tracing::debug!(target: "redmutex", "not acquired");
            }
        }
        #[cfg(feature = "metrics")]
        {
            metrics::counter!("redmutex_acquisitions_total", "kind" => kind, "outcome" => outcome)
                .increment(1);
            if contended {
                metrics::counter!("redmutex_waits_total", "kind" => kind).increment(1);
                metrics::histogram!("redmutex_wait_seconds", "kind" => kind)
                    .record(waited.as_secs_f64());
            }
            if handoff {
                metrics::counter!("redmutex_handoffs_total", "kind" => kind).increment(1);
            }
            if outcome == "cancelled" {
                metrics::counter!("redmutex_cancellations_total", "kind" => kind).increment(1);
            }
        }
        result
    }
}

/// The `outcome` of an acquisition that failed with `e`.
#[cfg(any(feature = "tracing", feature = "metrics"))]
fn error_outcome(e: &Error) -> &'static str {
    match e {
        Error::Cancelled { .. } => "cancelled",
        _ => "error",
    }
}

/// The acquisition under way on this thread found the lock held at its first attempt and
/// goes on to wait (`once`: it is a single attempt, which never waits).
#[inline]
pub(crate) fn waiting(once: bool) {
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    if !once {
        flag(CONTENDED);
    }
    #[cfg(not(any(feature = "tracing", feature = "metrics")))]
    let _ = once;
}

/// A release handed the lock to the acquisition under way on this thread.
#[inline]
pub(crate) fn handoff() {
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    flag(HANDOFF);
}

/// A guard of a lock of kind `kind` taken at `acquired` was released with `outcome`.
#[inline]
pub(crate) fn released(
    kind: &'static str,
    keys: &LockKeys,
    holder: &str,
    acquired: Instant,
    outcome: &Result<(), Error>,
) {
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    {
        let held = acquired.elapsed();
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "redmutex",
            lock = %String::from_utf8_lossy(keys.name()),
            %kind,
            %holder,
            held_ms = ms(held),
            outcome = %match outcome {
                Ok(()) => "released",
                Err(Error::LeaseLost { .. }) => "lease_lost",
                Err(Error::NotHeld { .. }) => "not_held",
                Err(_) => "error",
            },
            "released"
        );
        #[cfg(feature = "metrics")]
        metrics::histogram!("redmutex_hold_seconds", "kind" => kind).record(held.as_secs_f64());
    }
    let _ = (kind, keys, holder, acquired, outcome);
}

/// A hold of the lock `keys` was lost for `reason` (called once per hold, by the hold's
/// [`Loss`](crate::runtime::holds::loss::Loss) the first time it is marked): the one WARN that
/// says so, by the lock's name (never its key).
#[inline]
pub(crate) fn lease_lost(keys: &LockKeys, reason: LossReason) {
    let label = match reason {
        LossReason::LeaseExpired => "lease_expired",
        LossReason::Deleted => "deleted",
        LossReason::ServerLost => "server_lost",
        LossReason::RenewalFailed => "renewal_failed",
        LossReason::MaxHold => "max_hold",
        LossReason::ClientDropped => "client_dropped",
    };
    tracing::warn!(
        target: "redmutex",
        lock = %Name(keys.name()),
        kind = %kind_of(keys.ops),
        reason = %label,
        "lease lost"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("redmutex_lease_losses_total", "reason" => label).increment(1);
}

/// A renewal call renewed `holds` leases.
#[inline]
pub(crate) fn renewed(holds: usize) {
    #[cfg(feature = "metrics")]
    if holds > 0 {
        metrics::counter!("redmutex_renewals_total").increment(holds as u64);
    }
    let _ = holds;
}

/// A renewal call for `holds` leases failed with `e` (tried again next round): the one
/// WARN that says so.
#[inline]
pub(crate) fn renewal_failed(holds: usize, e: &Error) {
    tracing::warn!(target: "redmutex", holds, error = %e, "lease renewal failed");
    #[cfg(feature = "metrics")]
    if holds > 0 {
        metrics::counter!("redmutex_renewal_failures_total").increment(holds as u64);
    }
}

/// `d` in milliseconds, to the microsecond.
#[cfg(feature = "tracing")]
fn ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}

/// The kind of lock whose scripts are `ops` (for events that only have the keys).
fn kind_of(ops: &'static Ops) -> &'static str {
    let kinds: [(&'static Ops, &'static str); 8] = [
        (&scripts::PLAIN, "Lock"),
        (&scripts::FAIR, "FairLock"),
        (&scripts::FENCED, "FencedLock"),
        (&scripts::READ, "ReadLock"),
        (&scripts::WRITE, "WriteLock"),
        (&scripts::UPGRADEABLE, "UpgradeableLock"),
        (&scripts::UPGRADE, "WriteLock"),
        (&scripts::PERMITS, "Semaphore"),
    ];
    kinds
        .iter()
        .find(|(o, _)| std::ptr::eq(*o, ops))
        .map_or("other", |(_, name)| name)
}
