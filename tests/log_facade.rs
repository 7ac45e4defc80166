//! Issue 28: the library speaks through one facade, `tracing`, whose `log` feature hands
//! its events to a `log` logger when no `tracing` subscriber is set. A program that only
//! installs a `log` logger still hears of a lost lease: once, at WARN, by the lock's name.
//! (Alone in its binary: the logger is process-wide. With a subscriber:
//! tests/log_facade_tracing.rs.)

#[path = "support/lose.rs"]
mod lose;
mod support;

use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// A record as the logger was given it.
#[derive(Debug)]
struct Kept {
    level: Level,
    target: String,
    text: String,
}

/// A `log` logger that keeps every record.
struct Keeper(Mutex<Vec<Kept>>);

impl Log for Keeper {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        self.0.lock().unwrap().push(Kept {
            level: record.level(),
            target: record.target().to_owned(),
            text: record.args().to_string(),
        });
    }

    fn flush(&self) {}
}

static KEEPER: Keeper = Keeper(Mutex::new(Vec::new()));

#[test]
fn a_log_logger_alone_hears_a_lost_lease_once_at_warn_by_name() {
    log::set_logger(&KEEPER).expect("one logger");
    log::set_max_level(LevelFilter::Trace);
    let _alive = lose::lose_a_lease("log-facade:");
    let kept = KEEPER.0.lock().unwrap();
    let warnings: Vec<&Kept> = kept
        .iter()
        .filter(|k| k.level == Level::Warn && k.text.contains(lose::NAME))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let w = warnings[0];
    assert_eq!(w.target, "redmutex", "{w:?}");
    // Its fields reach `log` in the record's text.
    assert!(w.text.contains(&format!("lock={}", lose::NAME)), "{w:?}");
    assert!(w.text.contains("reason=deleted"), "{w:?}");
    // By its name, not its key (`log-facade:{facade-lost}`).
    assert!(!w.text.contains('{'), "{w:?}");
    // And nothing else of the library's is a warning or an error.
    let others: Vec<&Kept> = kept
        .iter()
        .filter(|k| k.target.starts_with("redmutex") && k.level <= Level::Warn)
        .filter(|k| !std::ptr::eq(*k, w))
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}
