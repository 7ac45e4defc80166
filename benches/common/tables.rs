//! The printed tables: a grid of figures per kind, targets checked, number formats.

use std::fmt::Write as _;

/// A table of figures per kind.
pub struct Grid {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Grid {
    pub fn new(header: &[&str]) -> Grid {
        Grid {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, name: &str, cells: Vec<String>) {
        let mut row = vec![name.to_owned()];
        row.extend(cells);
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let all = || std::iter::once(&self.header).chain(&self.rows);
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| all().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in all() {
            let mut line = format!("  {:<w$}", r[0], w = widths[0]);
            for (cell, w) in r.iter().zip(&widths).skip(1) {
                let _ = write!(line, "  {cell:>w$}");
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[derive(Default)]
pub struct Targets {
    rows: Vec<[String; 5]>,
}

impl Targets {
    pub fn check(&mut self, name: &str, value: String, target: &str, ok: bool, note: &str) {
        let ok = if ok { "PASS" } else { "FAIL <<<" };
        self.rows.push([
            name.to_owned(),
            value,
            target.to_owned(),
            ok.to_owned(),
            note.to_owned(),
        ]);
    }

    /// A figure printed among the targets that is no target (a floor): neither PASS nor
    /// FAIL.
    pub fn info(&mut self, name: &str, value: String, note: &str) {
        self.rows.push([
            name.to_owned(),
            value,
            "-".to_owned(),
            "info".to_owned(),
            note.to_owned(),
        ]);
    }

    pub fn render(&self) -> String {
        let w0 = self.rows.iter().map(|r| r[0].chars().count()).max();
        let w0 = w0.unwrap_or(0).max("targets".len());
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<w0$}  {:>10}  {:>10}  ok",
            "targets", "measured", "target"
        );
        for [name, value, target, ok, note] in &self.rows {
            let note = if note.is_empty() {
                String::new()
            } else {
                format!("  ({note})")
            };
            let line = format!("{name:<w0$}  {value:>10}  {target:>10}  {ok:<8}{note}");
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let count = |ok: &str| self.rows.iter().filter(|r| r[3].starts_with(ok)).count();
        let _ = writeln!(
            out,
            "targets: {} PASS, {} FAIL",
            count("PASS"),
            count("FAIL")
        );
        out
    }
}

pub fn f1(v: f64) -> String {
    format!("{v:.1}")
}

pub fn f2(v: f64) -> String {
    format!("{v:.2}")
}

pub fn f3(v: f64) -> String {
    format!("{v:.3}")
}
