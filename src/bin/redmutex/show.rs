//! What `status`, `list` and `unlock --force` print: a table for people, JSON for scripts.

use std::fmt::Write;

use redmutex::LockInfo;
use serde_json::{json, Value};

/// One object as JSON; `remaining_lease_ms` is null without a lease.
fn to_json(info: &LockInfo) -> Value {
    json!({
        "name": info.name,
        "kind": info.kind,
        "key": info.key,
        "holders": info
            .holders
            .iter()
            .map(|(id, count)| json!({ "id": id, "count": count }))
            .collect::<Vec<_>>(),
        "remaining_lease_ms": info.remaining_lease.map(|d| d.as_millis() as u64),
        "waiters": info.waiters,
        "token": info.token,
        "count": info.count,
    })
}

/// A free name as JSON: nothing of it exists.
fn free_json(name: &str) -> Value {
    json!({
        "name": name,
        "kind": "free",
        "key": null,
        "holders": [],
        "remaining_lease_ms": null,
        "waiters": [],
        "token": null,
        "count": null,
    })
}

/// The rows of the table for one object.
fn rows(info: &LockInfo, out: &mut Vec<[String; 6]>) {
    let lease = info
        .remaining_lease
        .map_or("-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()));
    let waiters = if info.waiters.is_empty() {
        "-".to_owned()
    } else {
        info.waiters.join(", ")
    };
    let mut kind = info.kind.to_owned();
    if let Some(token) = info.token {
        kind = format!("{kind} (token {token})");
    }
    if let Some(count) = info.count {
        kind = format!("{kind} ({count})");
    }
    if info.holders.is_empty() {
        out.push([
            info.name.clone(),
            kind.clone(),
            "-".to_owned(),
            "-".to_owned(),
            lease.clone(),
            waiters.clone(),
        ]);
    }
    for (i, (id, count)) in info.holders.iter().enumerate() {
        let first = i == 0;
        out.push([
            if first {
                info.name.clone()
            } else {
                String::new()
            },
            if first { kind.clone() } else { String::new() },
            id.clone(),
            count.to_string(),
            if first { lease.clone() } else { String::new() },
            if first {
                waiters.clone()
            } else {
                String::new()
            },
        ]);
    }
}

fn table(rows: &[[String; 6]]) -> String {
    let header = [
        "NAME",
        "KIND",
        "HOLDER",
        "COUNT",
        "LEASE",
        "WAITERS (in order)",
    ];
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header.map(str::to_owned)).chain(rows) {
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
        return format!("{}\n", Value::Array(all));
    }
    let mut found_rows = Vec::new();
    for (name, infos) in found {
        if infos.is_empty() {
            found_rows.push([
                name.clone(),
                "free".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
            ]);
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
        return format!("{}\n", Value::Array(found.iter().map(to_json).collect()));
    }
    let mut found_rows = Vec::new();
    for info in found {
        rows(info, &mut found_rows);
    }
    table(&found_rows)
}

/// `unlock --force`: what each kind freed held before (`freed`: the kinds the library
/// freed, as `LockInfo::kind` names them).
pub(crate) fn removed(name: &str, freed: &[&str], before: &[LockInfo]) -> String {
    let mut out = String::new();
    for kind in freed {
        let holders: Vec<String> = before
            .iter()
            .filter(|i| i.kind == *kind)
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
