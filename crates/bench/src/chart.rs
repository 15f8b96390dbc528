//! Charts of sweeps, shaped like the reference systems' figures: rate against thread count
//! (log2 axis), one line per target; the rate axis turns logarithmic when the values span more
//! than a factor of 50. Drawn as SVG, rasterised to PNG with resvg (text in the system fonts).

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::report::{Point, Report, format_rate};

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const FONT: &str = "DejaVu Sans, Liberation Sans, sans-serif";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A rate axis: linear from 0, or log10 over whole decades.
struct Axis {
    log: bool,
    low: f64,
    high: f64,
}

impl Axis {
    fn new(values: &[f64]) -> Axis {
        let max = values.iter().copied().fold(0.0, f64::max).max(1e-9);
        let min_positive =
            values.iter().copied().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        if min_positive.is_finite() && max / min_positive > 50.0 {
            Axis {
                log: true,
                low: 10f64.powf(min_positive.log10().floor()),
                high: 10f64.powf(max.log10().ceil()),
            }
        } else {
            Axis { log: false, low: 0.0, high: nice_ceiling(max) }
        }
    }

    /// 0.0 at the bottom, 1.0 at the top.
    fn fraction(&self, v: f64) -> f64 {
        if self.log {
            let v = v.max(self.low);
            (v.log10() - self.low.log10()) / (self.high.log10() - self.low.log10())
        } else {
            v / self.high
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (self.low.log10().round() as i32, self.high.log10().round() as i32);
            (a..=b).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=5).map(|i| self.high * i as f64 / 5.0).collect()
        }
    }
}

/// Axis labels: 2.5K, 10M, 0.5.
fn format_tick(v: f64) -> String {
    for (scale, suffix) in [(1e9, "G"), (1e6, "M"), (1e3, "K")] {
        if v >= scale {
            let x = v / scale;
            return if x.fract() == 0.0 {
                format!("{x:.0}{suffix}")
            } else {
                format!("{x:.1}{suffix}")
            };
        }
    }
    format_rate(v)
}

/// The smallest of 1, 2, 2.5, 5 × 10^k at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    let magnitude = 10f64.powf(v.log10().floor());
    for step in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if step * magnitude >= v {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

/// One chart: `series` are (label, points sorted by threads).
pub fn line_chart(title: &str, y_label: &str, series: &[(String, Vec<(usize, f64)>)]) -> String {
    let mut threads: Vec<usize> =
        series.iter().flat_map(|(_, p)| p.iter().map(|(t, _)| *t)).collect();
    threads.sort_unstable();
    threads.dedup();
    let values: Vec<f64> = series.iter().flat_map(|(_, p)| p.iter().map(|(_, v)| *v)).collect();
    let axis = Axis::new(&values);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let (x_low, x_high) = (
        (*threads.first().unwrap_or(&1) as f64).log2(),
        (*threads.last().unwrap_or(&1) as f64).log2(),
    );
    let x = |t: usize| {
        if x_high > x_low {
            LEFT + ((t as f64).log2() - x_low) / (x_high - x_low) * plot_w
        } else {
            LEFT + plot_w / 2.0
        }
    };
    let y = |v: f64| TOP + plot_h * (1.0 - axis.fraction(v));

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="28" font-size="18" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    for tick in axis.ticks() {
        let ty = y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{ty:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            ty + 4.0,
            format_tick(tick)
        );
    }
    for &t in &threads {
        let tx = x(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{tx:.1}" y="{}" font-size="12" text-anchor="middle">{t}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">threads (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="20" y="{}" font-size="14" text-anchor="middle" transform="rotate(-90 20 {})">{}{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label),
        if axis.log { " (log scale)" } else { "" }
    );
    for (i, (label, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> =
            points.iter().map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v))).collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2.5"/>"#,
            path.join(" ")
        );
        for (t, v) in points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{}: {} at {t} threads</title></circle>"#,
                x(*t),
                y(*v),
                escape(label),
                format_rate(*v)
            );
        }
        let ly = TOP + 20.0 + i as f64 * 22.0;
        let lx = WIDTH - RIGHT + 20.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}" font-size="12">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&shorten(label, 30))
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn shorten(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        text.to_string()
    } else {
        format!("…{}", text.chars().skip(n - width + 1).collect::<String>())
    }
}

/// Rasterises an SVG. Returns whether any font was found (without one, text is missing).
pub fn svg_to_png(svg: &str, path: &Path) -> io::Result<bool> {
    let mut options = resvg::usvg::Options::default();
    options.fontdb_mut().load_system_fonts();
    let has_fonts = !options.fontdb.is_empty();
    let tree = resvg::usvg::Tree::from_str(svg, &options)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("chart SVG: {e}")))?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| io::Error::other("chart has no area"))?;
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
    let png = pixmap.encode_png().map_err(|e| io::Error::other(format!("PNG encoding: {e}")))?;
    std::fs::write(path, png)?;
    Ok(has_fonts)
}

fn file_stem(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// One SVG and one PNG per phase of a sweep under `dir`; returns the files written.
pub fn sweep_charts(report: &Report, dir: &Path) -> io::Result<(Vec<PathBuf>, bool)> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut fonts = true;
    let mut phases: Vec<&str> = Vec::new();
    for p in &report.points {
        if !phases.contains(&p.phase.as_str()) {
            phases.push(&p.phase);
        }
    }
    for phase in phases {
        let mut series = Vec::new();
        let mut unit = None;
        for target in &report.targets {
            let points: Vec<&Point> = report
                .points
                .iter()
                .filter(|p| p.target == target.label && p.phase == phase)
                .collect();
            if points.is_empty() {
                continue;
            }
            unit = Some(points[0].unit);
            series
                .push((target.label.clone(), points.iter().map(|p| (p.threads, p.rate)).collect()));
        }
        let Some(unit) = unit else { continue };
        let title = format!("stria bench {}: {phase}", report.workload);
        let svg = line_chart(&title, unit.name(), &series);
        let stem = dir.join(file_stem(&format!("{}-{phase}", report.workload)));
        let svg_path = stem.with_extension("svg");
        std::fs::write(&svg_path, &svg)?;
        let png_path = stem.with_extension("png");
        fonts &= svg_to_png(&svg, &png_path)?;
        written.push(svg_path);
        written.push(png_path);
    }
    Ok((written, fonts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_ranges_get_a_log_axis() {
        assert!(Axis::new(&[1.0, 1000.0]).log);
        let linear = Axis::new(&[10.0, 40.0]);
        assert!(!linear.log);
        assert_eq!(linear.high, 50.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
        assert_eq!(nice_ceiling(7300.0), 10000.0);
    }

    #[test]
    fn charts_are_svg_with_a_line_per_series() {
        let svg = line_chart(
            "t <x>",
            "MiB/s",
            &[("a".into(), vec![(1, 10.0), (2, 20.0)]), ("b".into(), vec![(1, 5.0), (2, 9.0)])],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;x&gt;"));
    }
}
