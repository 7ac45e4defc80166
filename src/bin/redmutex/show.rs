//! What `status`, `list` and `unlock --force` print: a table for people, JSON (schema 1,
//! documented in docs/cli.md) for scripts.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redmutex::{LockInfo, LockKind};
use serde_json::{json, Value};

/// The version of the JSON `status --json` and `list --json` print: raised when a field
/// changes meaning or goes away (not when one is added).
const SCHEMA: u64 = 1;

/// The JSON `kind` of a library kind: one word each.
fn kind(info: &LockInfo) -> &'static str {
    match info.kind {
        LockKind::Lock => "lock",
        LockKind::ReadWrite => "rwlock",
        LockKind::Semaphore => "semaphore",
        LockKind::CountDownLatch => "latch",
        _ => "foreign",
    }
}

/// A holder or waiter id split into its role and the id proper: a read-write lock's ids
/// carry their side as a prefix (`r:`, `w:`, `u:`).
fn role<'a>(info: &LockInfo, id: &'a str) -> (&'static str, &'a str) {
    match info.kind {
        LockKind::ReadWrite => match id.split_once(':') {
            Some(("r", rest)) => ("read", rest),
            Some(("w", rest)) => ("write", rest),
            Some(("u", rest)) => ("upgradeable", rest),
            _ => ("read", id),
        },
        LockKind::Semaphore => ("permit", id),
        _ => ("exclusive", id),
    }
}

/// What the holder's process recorded beside its hold, as far as it is known.
#[derive(Default)]
pub(crate) struct Process {
    host: Option<String>,
    pid: Option<u64>,
    cmd: Option<Vec<String>>,
    /// The metadata's text as recorded, when it is not the command's JSON.
    text: Option<String>,
    since: Option<SystemTime>,
}

impl Process {
    /// `host:pid command…`, or the free text, or `-`.
    fn describe(&self) -> String {
        let mut out = String::new();
        if let Some(host) = &self.host {
            out.push_str(host);
        }
        if let Some(pid) = self.pid {
            let _ = write!(out, "{}pid {pid}", if out.is_empty() { "" } else { " " });
        }
        if let Some(cmd) = &self.cmd {
            let _ = write!(
                out,
                "{}{}",
                if out.is_empty() { "" } else { ": " },
                cmd.join(" ")
            );
        }
        if out.is_empty() {
            if let Some(text) = &self.text {
                out.push_str(text);
            }
        }
        out
    }

    fn held_for(&self) -> Option<Duration> {
        self.since
            .map(|since| SystemTime::now().duration_since(since).unwrap_or_default())
    }
}

/// What `info` records of the process that holds as `id` (the id as `holders` has it).
pub(crate) fn process(info: &LockInfo, id: &str) -> Process {
    let Some(meta) = info.metadata.iter().find(|m| m.holder == id) else {
        return Process::default();
    };
    let mut p = Process {
        since: Some(meta.since),
        ..Process::default()
    };
    // redmutex's own holds record a JSON object (see `crate::metadata`); a program's
    // own text is shown as it is.
    match serde_json::from_str::<Value>(&meta.text) {
        Ok(Value::Object(fields)) if fields.contains_key("pid") => {
            p.host = fields
                .get("host")
                .and_then(Value::as_str)
                .map(str::to_owned);
            p.pid = fields.get("pid").and_then(Value::as_u64);
            p.cmd = fields.get("cmd").and_then(Value::as_array).map(|args| {
                args.iter()
                    .map(|a| a.as_str().unwrap_or_default().to_owned())
                    .collect()
            });
        }
        _ => p.text = Some(meta.text.clone()),
    }
    p
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One object as JSON.
fn to_json(info: &LockInfo) -> Value {
    let semaphore = info.kind == LockKind::Semaphore;
    let holders: Vec<Value> = info
        .holders
        .iter()
        .map(|(raw, count)| {
            let (role, id) = role(info, raw);
            let p = process(info, raw);
            json!({
                "id": id,
                "role": role,
                "count": (!semaphore).then_some(*count),
                "permits": semaphore.then_some(*count),
                "host": p.host,
                "pid": p.pid,
                "cmd": p.cmd,
                "metadata": p.text,
                "since_ms": p.since.map(|s| millis(s.duration_since(UNIX_EPOCH).unwrap_or_default())),
                "held_for_ms": p.held_for().map(millis),
            })
        })
        .collect();
    let waiters: Vec<Value> = info
        .waiters
        .iter()
        .map(|raw| {
            let (role, id) = role(info, raw);
            json!({ "id": id, "role": role })
        })
        .collect();
    json!({
        "name": info.name,
        "kind": kind(info),
        "key": info.key,
        "holders": holders,
        "waiters": waiters,
        "lease_remaining_ms": info.remaining_lease.map(millis),
        "token": info.token,
        "permits": if semaphore { info.count } else { None },
        "count": if info.kind == LockKind::CountDownLatch { info.count } else { None },
    })
}

/// A free name as JSON: nothing of it exists.
fn free_json(name: &str) -> Value {
    json!({
        "name": name,
        "kind": "free",
        "key": null,
        "holders": [],
        "waiters": [],
        "lease_remaining_ms": null,
        "token": null,
        "permits": null,
        "count": null,
    })
}

fn document(objects: Vec<Value>) -> String {
    format!("{}\n", json!({ "schema": SCHEMA, "objects": objects }))
}

const HEADER: [&str; 8] = [
    "NAME", "KIND", "HOLDER", "COUNT", "HELD FOR", "LEASE", "WAITERS", "PROCESS",
];

type Row = [String; 8];

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The rows of the table for one object.
fn rows(info: &LockInfo, out: &mut Vec<Row>) {
    let lease = info.remaining_lease.map_or("-".to_owned(), seconds);
    let waiters = if info.waiters.is_empty() {
        "-".to_owned()
    } else {
        info.waiters.len().to_string()
    };
    let mut kind = kind(info).to_owned();
    if let Some(token) = info.token {
        kind = format!("{kind} (token {token})");
    }
    match (info.kind, info.count) {
        (LockKind::Semaphore, Some(n)) => kind = format!("{kind} ({n} permits)"),
        (LockKind::CountDownLatch, Some(n)) => kind = format!("{kind} (count {n})"),
        _ => {}
    }
    let dash = || "-".to_owned();
    if info.holders.is_empty() {
        out.push([
            info.name.clone(),
            kind.clone(),
            dash(),
            dash(),
            dash(),
            lease.clone(),
            waiters.clone(),
            dash(),
        ]);
    }
    for (i, (raw, count)) in info.holders.iter().enumerate() {
        let first = i == 0;
        let only_first = |s: &String| if first { s.clone() } else { String::new() };
        let (role, id) = role(info, raw);
        let holder = if info.kind == LockKind::ReadWrite {
            format!("{id} ({role})")
        } else {
            id.to_owned()
        };
        let p = process(info, raw);
        let described = p.describe();
        out.push([
            only_first(&info.name),
            only_first(&kind),
            holder,
            count.to_string(),
            p.held_for().map_or_else(dash, seconds),
            only_first(&lease),
            only_first(&waiters),
            if described.is_empty() {
                dash()
            } else {
                described
            },
        ]);
    }
}

fn table(rows: &[Row]) -> String {
    let mut widths = HEADER.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&HEADER.map(str::to_owned)).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// `status`: every object of each name, or "free".
pub(crate) fn status(found: &[(String, Vec<LockInfo>)], json: bool) -> String {
    if json {
        let all: Vec<Value> = found
            .iter()
            .flat_map(|(name, infos)| {
                if infos.is_empty() {
                    vec![free_json(name)]
                } else {
                    infos.iter().map(to_json).collect()
                }
            })
            .collect();
        return document(all);
    }
    let mut found_rows = Vec::new();
    for (name, infos) in found {
        if infos.is_empty() {
            let mut row: Row = Default::default();
            row[0] = name.clone();
            row[1] = "free".to_owned();
            for cell in &mut row[2..] {
                *cell = "-".to_owned();
            }
            found_rows.push(row);
        }
        for info in infos {
            rows(info, &mut found_rows);
        }
    }
    table(&found_rows)
}

/// `list`: the objects found.
pub(crate) fn list(found: &[LockInfo], json: bool) -> String {
    if json {
        return document(found.iter().map(to_json).collect());
    }
    let mut found_rows = Vec::new();
    for info in found {
        rows(info, &mut found_rows);
    }
    table(&found_rows)
}

/// The note a waiter prints after a second: who holds `name` (of the library kind
/// `kind`), since when and where, as `found` (its `inspect`) says.
pub(crate) fn waiting_for(name: &str, kind: LockKind, found: &[LockInfo]) -> String {
    let Some(info) = found.iter().find(|i| i.kind == kind) else {
        return format!("redmutex: waiting for {name}");
    };
    let mut holders: Vec<String> = info
        .holders
        .iter()
        .take(3)
        .map(|(raw, _)| {
            let (_, id) = role(info, raw);
            let p = process(info, raw);
            let mut said = id.to_owned();
            let described = p.describe();
            if !described.is_empty() {
                let _ = write!(said, " ({described})");
            }
            match p.held_for() {
                Some(held) => {
                    let _ = write!(said, " for {}", seconds(held));
                }
                None => {
                    if let Some(lease) = info.remaining_lease {
                        let _ = write!(said, ", lease {} left", seconds(lease));
                    }
                }
            }
            said
        })
        .collect();
    if info.holders.len() > 3 {
        holders.push(format!("{} more", info.holders.len() - 3));
    }
    let mut line = if holders.is_empty() {
        format!("redmutex: waiting for {name}")
    } else {
        format!(
            "redmutex: waiting for {name}, held by {}",
            holders.join("; ")
        )
    };
    if info.waiters.len() > 1 {
        let _ = write!(line, "; {} waiting", info.waiters.len());
    }
    line
}

/// `unlock --force`: what each kind freed held before (`freed`: the kinds the library
/// freed, as `LockKind` names them).
pub(crate) fn removed(name: &str, freed: &[&str], before: &[LockInfo]) -> String {
    let mut out = String::new();
    for kind in freed {
        let holders: Vec<String> = before
            .iter()
            .filter(|i| i.kind.as_str() == *kind)
            .flat_map(|i| i.holders.iter())
            .map(|(id, count)| format!("{id} (count {count})"))
            .collect();
        if holders.is_empty() {
            let _ = writeln!(out, "{name}: {kind} freed");
        } else {
            let _ = writeln!(
                out,
                "{name}: {kind} freed; removed holder {}",
                holders.join(", ")
            );
        }
    }
    out
}
