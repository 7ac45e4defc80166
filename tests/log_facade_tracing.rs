//! Issue 28: with a `tracing` subscriber installed, a lost lease is one WARN event (with
//! its `lock`, `kind` and `reason` fields) and nothing reaches `log` besides: a program
//! with both set up sees it once. (Alone in its binary: the subscriber and the logger are
//! process-wide, and the loss is told on the library's own threads. With a `log` logger
//! only: tests/log_facade.rs.)

#[path = "support/lose.rs"]
mod lose;
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// An event as the subscriber saw it.
#[derive(Debug, Default)]
struct Seen {
    level: Option<Level>,
    target: String,
    fields: HashMap<String, String>,
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.fields
            .insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .insert(field.name().to_owned(), value.to_owned());
    }
}

/// A layer that keeps every event.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut seen = Seen {
            level: Some(*event.metadata().level()),
            target: event.metadata().target().to_owned(),
            ..Seen::default()
        };
        event.record(&mut seen);
        self.0.lock().unwrap().push(seen);
    }
}

/// A `log` logger that counts the library's records (none should come).
struct Counter(Mutex<Vec<String>>);

impl log::Log for Counter {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.target().starts_with("redmutex") || record.args().to_string().contains(lose::NAME)
        {
            self.0.lock().unwrap().push(format!(
                "{} {}: {}",
                record.level(),
                record.target(),
                record.args()
            ));
        }
    }

    fn flush(&self) {}
}

static COUNTER: Counter = Counter(Mutex::new(Vec::new()));

#[test]
fn a_subscriber_hears_a_lost_lease_as_one_warn_event_and_log_hears_nothing() {
    let events = Events::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(events.clone()))
        .expect("one subscriber");
    log::set_logger(&COUNTER).expect("one logger");
    log::set_max_level(log::LevelFilter::Trace);
    let _alive = lose::lose_a_lease("log-facade-tracing:");
    let seen = events.0.lock().unwrap();
    let warnings: Vec<&Seen> = seen
        .iter()
        .filter(|e| e.level == Some(Level::WARN))
        .filter(|e| e.fields.values().any(|v| v.contains(lose::NAME)))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let w = warnings[0];
    assert_eq!(w.target, "redmutex", "{w:?}");
    assert_eq!(
        w.fields.get("lock").map(String::as_str),
        Some(lose::NAME),
        "{w:?}"
    );
    assert_eq!(
        w.fields.get("kind").map(String::as_str),
        Some("Lock"),
        "{w:?}"
    );
    assert_eq!(
        w.fields.get("reason").map(String::as_str),
        Some("deleted"),
        "{w:?}"
    );
    let records = COUNTER.0.lock().unwrap();
    assert!(records.is_empty(), "{records:#?}");
}
