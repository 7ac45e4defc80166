//! `cargo bench --bench telemetry --features metrics`: what the spans, events and metrics
//! of issue 19 (item 6) cost an uncontended `lock()` + `unlock()`, in one run against a
//! real redis-server (spawned here, or the one at `REDIS_URL`).
//!
//! Both features are compiled in. Measured in interleaved rounds (a slow phase of a noisy
//! machine hits every figure alike): a PING round trip; lock + unlock with no subscriber
//! and no recorder installed (what every program that does not look pays); and the same
//! with a `tracing` subscriber that formats every DEBUG event (to a sink) and a `metrics`
//! recorder that keeps every value. Before any of that, the same lock + unlock is timed
//! once more while no subscriber has ever existed in the process (`tracing`'s callsites
//! then skip even the per-thread look-up that a scoped subscriber forces on them).
//! Prints medians, p99s and the ratios; it measures, it does not gate.

use metrics_util::debugging::DebuggingRecorder;
use redmutex::Client;

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{interleaved, median, percentile, unique_prefix, Op};

const WARMUP_OPS: usize = 500;
const ROUNDS: usize = 8;
const OPS_PER_ROUND: usize = 750;

fn main() {
    let (url, _server) = support::redis_url_or_spawn();
    let client = Client::builder()
        .url(url.as_str())
        .key_prefix(unique_prefix("telemetry", "lock"))
        .use_functions(common::use_functions())
        .build()
        .expect("build client");
    let lock = client.lock("bench");
    let lock_unlock = || lock.lock().unwrap().unlock().unwrap();

    // No subscriber has existed yet in this process: the pristine path. First the
    // primitives the library calls per lock + unlock (two `metrics` calls, three `tracing`
    // callsites), alone, in ns.
    let primitives = nothing_installed_ns();
    let pristine = {
        let mut ops: Vec<(&str, Op)> = vec![("lock+unlock, pristine", Box::new(lock_unlock))];
        interleaved(&mut ops, WARMUP_OPS, ROUNDS / 2, OPS_PER_ROUND).remove(0)
    };

    let mut con = common::connect(&url);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let dispatch = tracing::Dispatch::new(subscriber);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut ops: Vec<(&str, Op)> = vec![
        (
            "PING",
            Box::new(|| {
                let _: String = redis::cmd("PING").query(&mut con).unwrap();
            }),
        ),
        ("lock+unlock, nothing installed", Box::new(lock_unlock)),
        (
            "lock+unlock, subscriber + recorder",
            Box::new(|| {
                tracing::dispatcher::with_default(&dispatch, || {
                    metrics::with_local_recorder(&recorder, lock_unlock)
                })
            }),
        ),
    ];
    let samples = interleaved(&mut ops, WARMUP_OPS, ROUNDS, OPS_PER_ROUND);
    let recorded = snapshotter.snapshot().into_vec().len();
    assert!(
        recorded > 0,
        "the recorder saw nothing: the bench measures nothing"
    );

    let ping = median(&samples[0]);
    let off = median(&samples[1]);
    let on = median(&samples[2]);
    let clean = median(&pristine);
    println!(
        "redmutex telemetry bench: {} ops per figure",
        ROUNDS * OPS_PER_ROUND
    );
    println!(
        "{:<40} {:>10} {:>10} {:>8}",
        "operation", "median µs", "p99 µs", "/ PING"
    );
    let row = |name: &str, s: &[f64]| {
        println!(
            "{name:<40} {:>10.1} {:>10.1} {:>8.2}",
            median(s),
            percentile(s, 0.99),
            median(s) / ping
        );
    };
    row("PING", &samples[0]);
    row("lock+unlock, no subscriber ever", &pristine);
    row("lock+unlock, nothing installed", &samples[1]);
    row("lock+unlock, subscriber + recorder", &samples[2]);
    println!(
        "nothing installed, per call: a metrics counter {:.1} ns, a tracing event {:.1} ns, a tracing span {:.1} ns",
        primitives.0, primitives.1, primitives.2
    );
    println!(
        "with / without: {:.3} (+{:.1} µs per lock+unlock); nothing installed / pristine: {:.3}",
        on / off,
        on - off,
        off / clean
    );
}

/// ns per call, with no recorder and no subscriber installed, of a labelled `metrics`
/// counter, a `tracing` DEBUG event with fields and a DEBUG span with fields, as the
/// library makes them.
fn nothing_installed_ns() -> (f64, f64, f64) {
    const N: u32 = 2_000_000;
    let kind = std::hint::black_box("Lock");
    let time = |f: &dyn Fn()| {
        let t = std::time::Instant::now();
        for _ in 0..N {
            f();
        }
        t.elapsed().as_secs_f64() * 1e9 / f64::from(N)
    };
    let counter = time(&|| {
        metrics::counter!("redmutex_acquisitions_total", "kind" => kind, "outcome" => "acquired")
            .increment(1)
    });
    let event = time(
        &|| tracing::debug!(target: "redmutex", lock = %kind, %kind, held_ms = 1.0, "released"),
    );
    let span = time(&|| {
        let span =
            tracing::debug_span!(target: "redmutex", "redmutex.acquire", lock = %kind, %kind);
        span.in_scope(|| std::hint::black_box(()));
    });
    (counter, event, span)
}
