//! A `tracing` layer and a `metrics` recorder that keep what they are given, for the
//! telemetry tests (included by path: only those builds have `tracing` and `metrics`).

// Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span or an event as the test subscriber saw it: its name (an event's message), and
/// every field it was given, as text (strings as they are).
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub name: String,
    pub fields: HashMap<String, String>,
    // An event's enclosing span.
    pub parent: Option<String>,
}

impl Seen {
    pub fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("no field {name} in {self:?}"))
    }
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.name = text;
        } else {
            self.fields.insert(field.name().to_owned(), text);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .insert(field.name().to_owned(), value.to_owned());
    }
}

/// What the capturing layer kept: closed spans and events, in order.
#[derive(Clone, Default)]
pub struct Captured {
    open: Arc<Mutex<HashMap<u64, Seen>>>,
    closed: Arc<Mutex<Vec<Seen>>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

impl Captured {
    pub fn spans(&self, name: &str) -> Vec<Seen> {
        let closed = self.closed.lock().unwrap();
        closed.iter().filter(|s| s.name == name).cloned().collect()
    }

    pub fn events(&self, name: &str) -> Vec<Seen> {
        let events = self.events.lock().unwrap();
        events.iter().filter(|s| s.name == name).cloned().collect()
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            ..Seen::default()
        };
        attrs.record(&mut seen);
        self.open.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(seen);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut seen = Seen {
            parent: ctx.event_span(event).map(|s| s.name().to_owned()),
            ..Seen::default()
        };
        event.record(&mut seen);
        self.events.lock().unwrap().push(seen);
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(seen) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(seen);
        }
    }
}

/// Installs a capturing subscriber and a debugging recorder for the whole process (for
/// what other threads, such as the watchdog, report); once per test binary.
pub fn global() -> (Captured, Snapshotter) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("one global recorder");
    (captured, snapshotter)
}

/// Runs `f` with a capturing subscriber and a debugging recorder set for this thread only.
pub fn observed<T>(f: impl FnOnce() -> T) -> (T, Captured, Snapshotter) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let out = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, f)
    });
    (out, captured, snapshotter)
}

/// The metrics recorded since the last snapshot, keyed `name{label=value,...}` (labels
/// sorted): a counter's increments, a histogram's values.
pub fn metrics_of(snapshotter: &Snapshotter) -> HashMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

pub fn counter(m: &HashMap<String, DebugValue>, key: &str) -> u64 {
    match m.get(key) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{key} is not a counter: {other:?}"),
    }
}

pub fn histogram(m: &HashMap<String, DebugValue>, key: &str) -> Vec<f64> {
    match m.get(key) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
        None => Vec::new(),
        Some(other) => panic!("{key} is not a histogram: {other:?}"),
    }
}
