//! What a run cost the Redis server (CPU, commands, requests), and its table rows.

use super::{f2, parse_u64, Grid};
use std::collections::BTreeMap;

/// What the Redis server reports about itself at one moment (`INFO all`, one request):
/// its process CPU, the calls per command (those run inside scripts included) and its
/// request counters. Two of them around a run give [`ServerCost`].
pub struct ServerSnapshot {
    cpu_s: f64,
    calls: BTreeMap<String, u64>,
    commands: u64,
    reads: u64,
}

impl ServerSnapshot {
    /// Takes one snapshot on `con`. Keep `con` otherwise idle between the two snapshots
    /// of a run: whatever it sends in between is counted as the run's.
    pub fn take(con: &mut redis::Connection) -> ServerSnapshot {
        let info: String = redis::cmd("INFO").arg("all").query(con).expect("INFO all");
        let field = |name: &str| -> &str {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {name} in INFO all"))
        };
        let secs = |name: &str| -> f64 {
            field(name)
                .parse()
                .unwrap_or_else(|_| panic!("{name} is not a number"))
        };
        let calls = info
            .lines()
            .filter_map(|line| {
                let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let n = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_ascii_lowercase(), n.parse().ok()?))
            })
            .collect();
        ServerSnapshot {
            cpu_s: secs("used_cpu_user") + secs("used_cpu_sys"),
            calls,
            commands: parse_u64(field("total_commands_processed")),
            reads: parse_u64(field("total_reads_processed")),
        }
    }

    /// What the server did from `before` to this snapshot, less the snapshots' own
    /// traffic: `before`'s INFO is counted once it has run (so it lands in the
    /// difference), and this one's request was read before it ran.
    pub fn since(&self, before: &ServerSnapshot) -> ServerCost {
        let mut executed = BTreeMap::new();
        for (name, &n) in &self.calls {
            let mut d = n.saturating_sub(before.calls.get(name).copied().unwrap_or(0));
            if name == "info" {
                d = d.saturating_sub(1);
            }
            if d > 0 {
                executed.insert(name.clone(), d);
            }
        }
        ServerCost {
            cpu_us: (self.cpu_s - before.cpu_s).max(0.0) * 1e6,
            executed,
            commands: self.commands.saturating_sub(before.commands + 1),
            reads: self.reads.saturating_sub(before.reads + 1),
        }
    }
}

/// What one run cost the Redis server, from two [`ServerSnapshot`]s.
#[derive(Default, Clone)]
pub struct ServerCost {
    /// Server process CPU, user + sys (`INFO cpu`), µs. Every thread of the process, so
    /// background work (expiry, lazy free) the run caused counts too.
    pub cpu_us: f64,
    /// Commands executed, by name (`INFO commandstats`): those run inside scripts
    /// included, each script call counted once more as itself.
    pub executed: BTreeMap<String, u64>,
    /// `total_commands_processed` (INFO stats); Redis 7 counts script-internal ones too.
    pub commands: u64,
    /// Read events on client sockets (`total_reads_processed`): one per request for
    /// clients that wait for each reply, as these do (no pipelining), so "requests".
    pub reads: u64,
}

impl ServerCost {
    /// Snapshot, run `f`, snapshot: what `f` cost the server, and what it returned.
    pub fn measure<T>(con: &mut redis::Connection, f: impl FnOnce() -> T) -> (ServerCost, T) {
        let before = ServerSnapshot::take(con);
        let out = f();
        (ServerSnapshot::take(con).since(&before), out)
    }

    /// [`ServerCost::measure`] over several servers (a RedLock's masters): their costs
    /// summed.
    pub fn measure_all<T>(
        cons: &mut [redis::Connection],
        f: impl FnOnce() -> T,
    ) -> (ServerCost, T) {
        let before: Vec<ServerSnapshot> = cons.iter_mut().map(ServerSnapshot::take).collect();
        let out = f();
        let mut sum = ServerCost::default();
        for (con, b) in cons.iter_mut().zip(&before) {
            sum.add(&ServerSnapshot::take(con).since(b));
        }
        (sum, out)
    }

    /// Adds `other`'s run to this one (runs measured in chunks, interleaved with another
    /// kind's so that a slow phase of a busy machine weighs on both alike).
    pub fn add(&mut self, other: &ServerCost) {
        self.cpu_us += other.cpu_us;
        for (name, n) in &other.executed {
            *self.executed.entry(name.clone()).or_insert(0) += n;
        }
        self.commands += other.commands;
        self.reads += other.reads;
    }

    pub fn executed_total(&self) -> u64 {
        self.executed.values().sum()
    }

    /// Redis CPU µs per operation.
    pub fn cpu_per(&self, ops: u64) -> f64 {
        self.cpu_us / ops.max(1) as f64
    }

    /// Executed commands (script-internal included) per operation.
    pub fn executed_per(&self, ops: u64) -> f64 {
        self.executed_total() as f64 / ops.max(1) as f64
    }

    /// Requests (socket reads) per operation.
    pub fn requests_per(&self, ops: u64) -> f64 {
        self.reads as f64 / ops.max(1) as f64
    }

    /// Executed commands per operation by name, most first: `hget 6.29, exists 4.65, ...`.
    pub fn breakdown(&self, ops: u64) -> String {
        let mut v: Vec<(&String, &u64)> = self.executed.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = v
            .iter()
            .map(|(name, &n)| format!("{name} {:.2}", n as f64 / ops.max(1) as f64))
            .collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// The server-cost rows of a table, one column per cost: Redis CPU µs, executed
/// commands and requests per operation, and each kind's CPU as a multiple of `floor`'s
/// (the naive lock measured in the same run).
pub fn server_cost_rows(
    grid: &mut Grid,
    columns: &[(&ServerCost, u64)],
    floor: Option<(&ServerCost, u64)>,
) {
    let floors: Vec<(&str, &ServerCost, u64)> =
        floor.into_iter().map(|(c, n)| ("naive", c, n)).collect();
    server_cost_rows_vs(grid, columns, &floors);
}

/// [`server_cost_rows`] with each kind's CPU and executed commands as multiples of every
/// one of `floors` (name, cost, operations), all measured in the same run.
pub fn server_cost_rows_vs(
    grid: &mut Grid,
    columns: &[(&ServerCost, u64)],
    floors: &[(&str, &ServerCost, u64)],
) {
    let col = |f: &dyn Fn(&ServerCost, u64) -> String| -> Vec<String> {
        columns.iter().map(|&(c, n)| f(c, n)).collect()
    };
    type Per = fn(&ServerCost, u64) -> f64;
    let rows: [(&str, &str, Per, usize); 2] = [
        ("Redis CPU µs/op", "Redis CPU", ServerCost::cpu_per, 1),
        (
            "executed commands/op (scripts incl.)",
            "executed",
            ServerCost::executed_per,
            2,
        ),
    ];
    for (label, what, per, digits) in rows {
        grid.row(label, col(&|c, n| format!("{:.*}", digits, per(c, n))));
        for &(name, fc, fn_) in floors {
            let base = per(fc, fn_);
            grid.row(
                &format!("  x {name} ({what})"),
                col(&|c, n| format!("{:.2}x", per(c, n) / base)),
            );
        }
    }
    grid.row(
        "requests/op (socket reads)",
        col(&|c, n| f2(c.requests_per(n))),
    );
}
