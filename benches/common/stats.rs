//! Statistics of the samples: fairness, percentiles, interleaved timing.

use std::time::Instant;

pub fn least_most(counts: &[u64]) -> f64 {
    let most = counts.iter().copied().max().unwrap_or(0);
    let least = counts.iter().copied().min().unwrap_or(0);
    if most == 0 {
        return f64::NAN;
    }
    least as f64 / most as f64
}

/// Jain's fairness index: (Σx)² / (n·Σx²), 1 when all are equal, 1/n when one gets all.
pub fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return f64::NAN;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// One timed operation of an uncontended table.
pub type Op<'a> = Box<dyn FnMut() + 'a>;

/// Times `ops` (each warmed up `warmup` times first) in `rounds` interleaved rounds of
/// `per_round` calls each, so a slow phase of a noisy machine hits every figure alike:
/// each operation's samples, in µs.
pub fn interleaved(
    ops: &mut [(&str, Op)],
    warmup: usize,
    rounds: usize,
    per_round: usize,
) -> Vec<Vec<f64>> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
    for (_, op) in ops.iter_mut() {
        for _ in 0..warmup {
            op();
        }
    }
    for _ in 0..rounds {
        for (i, (_, op)) in ops.iter_mut().enumerate() {
            for _ in 0..per_round {
                let t = Instant::now();
                op();
                samples[i].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    samples
}

pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
