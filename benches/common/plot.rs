//! The contention bench's figure, `docs/img/contention.svg` (or the path in
//! `REDMUTEX_CONTENTION_PLOT`): throughput and fairness per lock beside the strict-turns
//! floor, and the distribution of cross-process handoff times beside the handoff floor,
//! all from one run. A picture of the run's tables, so the README can show what a table
//! of percentiles hides: the naive lock's long tail.

use std::path::PathBuf;

use plotters::prelude::*;

/// One lock's share of the figure.
pub struct Series {
    pub name: &'static str,
    pub per_second: f64,
    pub least_most: f64,
    /// Cross-process handoffs, µs.
    pub handoffs: Vec<f64>,
}

/// The floors measured in the same run.
pub struct Floors {
    /// 1 s / (hold + PUBLISH received in another process + one EVALSHA).
    pub turns_per_second: f64,
    /// PUBLISH received in another process + one EVALSHA round trip, median µs.
    pub handoff_us: f64,
}

const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(127, 127, 127),
];

/// Where the figure goes: the committed one unless the environment names another path.
pub fn path() -> PathBuf {
    match std::env::var_os("REDMUTEX_CONTENTION_PLOT") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/img/contention.svg"),
    }
}

pub fn draw(
    path: &std::path::Path,
    caption: &str,
    series: &[Series],
    floors: &Floors,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(caption, ("sans-serif", 17))?;
    let (left, right) = root.split_horizontally(400);

    // Left: acquisitions per second, with each lock's least/most share per process.
    let top = series
        .iter()
        .map(|s| s.per_second)
        .fold(floors.turns_per_second, f64::max)
        * 1.2;
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "acquisitions/s, and least/most acquisitions per process",
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..series.len() as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_labels(series.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 && i < names.len() {
                names[i].to_string()
            } else {
                String::new()
            }
        })
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, s.per_second)],
            COLOURS[i % COLOURS.len()].filled(),
        )))?;
        // Inside the bar: above it, the floor's line and label may already be there.
        chart.draw_series(std::iter::once(Text::new(
            format!("{:.0}/s", s.per_second),
            (x + 0.2, s.per_second * 0.55),
            ("sans-serif", 13).into_font().color(&WHITE),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{:.2}", s.least_most),
            (x + 0.2, s.per_second * 0.45),
            ("sans-serif", 13).into_font().color(&WHITE),
        )))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![
            (0.0, floors.turns_per_second),
            (series.len() as f64, floors.turns_per_second),
        ],
        BLACK.stroke_width(1),
    )))?;
    chart.draw_series(std::iter::once(Text::new(
        format!(
            "strict-turns floor: {:.0}/s (hold + PUBLISH + EVALSHA)",
            floors.turns_per_second
        ),
        (0.05, floors.turns_per_second + top * 0.05),
        ("sans-serif", 12),
    )))?;

    // Right: the share of cross-process handoffs done within x µs.
    let all: Vec<f64> = series.iter().flat_map(|s| s.handoffs.clone()).collect();
    let x_max = crate::common::percentile(&all, 0.98)
        .max(floors.handoff_us * 4.0)
        .min(5_000.0);
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "cross-process handoffs done within x µs (release to next holder)",
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..x_max, 0f64..1.0)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("µs")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{:.0}%", y * 100.0))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let mut v = s.handoffs.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        // At most ~400 steps: the curve's shape, not one point per handoff.
        let stride = (v.len() / 400).max(1);
        let mut points: Vec<(f64, f64)> = vec![(0.0, 0.0)];
        for (k, x) in v.iter().enumerate() {
            if *x > x_max {
                break;
            }
            if k % stride == 0 || k + 1 == v.len() {
                points.push((*x, (k + 1) as f64 / n));
            }
        }
        let last = points.last().map_or(0.0, |p| p.1);
        points.push((x_max, last));
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
            .label(format!("{} (n={})", s.name, v.len()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(floors.handoff_us, 0.0), (floors.handoff_us, 1.0)],
            BLACK.stroke_width(1),
        )))?
        .label(format!(
            "floor: PUBLISH received + EVALSHA, {:.0} µs",
            floors.handoff_us
        ))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
