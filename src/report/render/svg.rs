//! The SVG charts of the HTML page: throughput by region, by file age, and each pass's
//! throughput.

use super::esc;
use crate::measure::bench::BenchResult;
use crate::measure::byfile::FileScan;
use crate::measure::scan::ScanResult;
use crate::support::units::{human_bytes, human_rate};

/// A chart's series: label, colour, data.
pub(crate) type Series<'a, T> = (&'a str, &'a str, &'a T);

/// The region chart's plot area and scales.
struct Frame {
    w: f64,
    h: f64,
    pad: f64,
    /// A wider left margin holds the axis labels ("2.3 GiB/s").
    left: f64,
    /// The top of the y axis and its tick step.
    max: f64,
    step: f64,
    /// Points on the x axis (at least two).
    n: usize,
}

impl Frame {
    fn x(&self, i: usize) -> f64 {
        self.left + (self.w - self.left - self.pad) * i as f64 / (self.n - 1) as f64
    }

    fn y(&self, v: f64) -> f64 {
        self.h - self.pad - (self.h - 2.0 * self.pad) * v / self.max
    }
}

/// An SVG chart of throughput by region: one polyline per series.
pub(crate) fn region_chart(series: &[Series<ScanResult>]) -> String {
    let top = series.iter().flat_map(|(_, _, s)| s.regions.iter().map(|r| r.bytes_per_second)).fold(1.0, f64::max);
    // Round ticks (1, 2 or 5 x a power of ten, in MiB/s) up to just above the top.
    let step = nice_step(top / 4.0);
    let max = (top * 1.05 / step).ceil().max(1.0) * step;
    let n = series.iter().map(|(_, _, s)| s.regions.len()).max().unwrap_or(1).max(2);
    let f = Frame { w: 880.0, h: 320.0, pad: 50.0, left: 90.0, max, step, n };
    let mut s = format!(
        r##"<svg id="regions" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>Read throughput by region</title>"##,
        w = f.w,
        h = f.h
    );
    s += &y_axis(&f);
    if let Some((_, _, first)) = series.first() {
        s += &x_labels(&f, first);
    }
    for (li, (label, color, sc)) in series.iter().enumerate() {
        s += &region_line(&f, li, label, color, sc);
    }
    // Every mark has a legend entry: the red dots too.
    if let Some((_, _, sc)) = series.iter().find(|(_, _, sc)| sc.regions.iter().any(|r| r.slow)) {
        let x = f.left + 160.0 * series.len() as f64;
        s += &format!(
            r##"<circle cx="{}" cy="16" r="4" fill="#d62728"/><text x="{}" y="20" font-size="12">slow region: below {:.0} % of the fastest quarter ({})</text>"##,
            x + 4.0,
            x + 12.0,
            sc.threshold * 100.0,
            esc(&human_rate(sc.reference_bytes_per_second))
        );
    }
    let in_use = series.iter().any(|(_, _, sc)| sc.regions.iter().any(|r| !r.device_ranges.is_empty()));
    s += &format!(
        r##"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#555">{}</text></svg>"##,
        f.w / 2.0,
        f.h - 10.0,
        if in_use {
            "region start, in bytes in use (free space not read)"
        } else {
            "region start (offset on the target)"
        }
    );
    s
}

/// The plot's background and its horizontal grid lines with their labels.
fn y_axis(f: &Frame) -> String {
    let (w, h, pad, left) = (f.w, f.h, f.pad, f.left);
    let mut s = format!(
        r##"<rect x="{left}" y="{pad}" width="{}" height="{}" fill="#f7f7f9" stroke="#ccc"/>"##,
        w - left - pad,
        h - 2.0 * pad
    );
    // The y axis's title, along it.
    s += &format!(
        r##"<text transform="translate(14 {:.1}) rotate(-90)" font-size="11" text-anchor="middle" fill="#555">read throughput, per second</text>"##,
        h / 2.0
    );
    let ticks = (f.max / f.step).round() as usize;
    for k in 0..=ticks {
        let v = f.step * k as f64;
        s += &format!(
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e3e3e8"/><text x="{}" y="{}" font-size="11" text-anchor="end" fill="#555">{}</text>"##,
            w - pad,
            left - 6.0,
            f.y(v) + 4.0,
            esc(&round_rate(v)),
            y = f.y(v)
        );
    }
    s
}

/// Offsets under the x axis: where regions start (in-use bytes when only the ranges in
/// use were read).
fn x_labels(f: &Frame, first: &ScanResult) -> String {
    let mut s = String::new();
    let regs = &first.regions;
    for i in [0, regs.len() / 4, regs.len() / 2, regs.len() * 3 / 4, regs.len().saturating_sub(1)] {
        if let Some(r) = regs.get(i) {
            s += &format!(
                r##"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle" fill="#555">{}</text>"##,
                f.x(r.index),
                f.h - f.pad + 16.0,
                esc(&human_bytes(r.offset_bytes))
            );
        }
    }
    s
}

/// One series: its line, a red dot on each slow region, and its legend entry.
fn region_line(f: &Frame, li: usize, label: &str, color: &str, sc: &ScanResult) -> String {
    let pts: Vec<String> =
        sc.regions.iter().map(|r| format!("{:.1},{:.1}", f.x(r.index), f.y(r.bytes_per_second))).collect();
    let mut s = format!(r##"<polyline fill="none" stroke="{color}" stroke-width="2.5" points="{}"/>"##, pts.join(" "));
    for r in sc.regions.iter().filter(|r| r.slow) {
        s += &format!(
            r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#d62728"><title>slow region {}</title></circle>"##,
            f.x(r.index),
            f.y(r.bytes_per_second),
            r.index
        );
    }
    s += &format!(
        r##"<rect x="{}" y="14" width="14" height="4" fill="{color}"/><text x="{}" y="20" font-size="12">{}</text>"##,
        f.left + 160.0 * li as f64,
        f.left + 160.0 * li as f64 + 18.0,
        esc(label)
    );
    s
}

/// A round step for an axis: 1, 2 or 5 x a power of ten, in the unit its labels use
/// (GiB/s from half a GiB/s, MiB/s, KiB/s), so that every tick reads round.
fn nice_step(raw: f64) -> f64 {
    let unit = match raw {
        r if r >= (512u64 << 20) as f64 => (1u64 << 30) as f64,
        r if r >= (1u64 << 20) as f64 => (1u64 << 20) as f64,
        _ => 1024.0,
    };
    let x = (raw / unit).max(1e-3);
    let p = 10f64.powf(x.log10().floor());
    let m = [1.0, 2.0, 5.0, 10.0].into_iter().find(|m| m * p >= x * 0.999).unwrap_or(10.0);
    m * p * unit
}

/// "500 MiB/s", "1.5 GiB/s": tick labels without needless decimals.
fn round_rate(v: f64) -> String {
    let mib = v / (1 << 20) as f64;
    if v == 0.0 {
        "0".into()
    } else if mib >= 1024.0 {
        format!("{} GiB/s", trim_zeros(mib / 1024.0))
    } else if mib >= 1.0 {
        format!("{} MiB/s", trim_zeros(mib))
    } else {
        format!("{} KiB/s", trim_zeros(v / 1024.0))
    }
}

fn trim_zeros(x: f64) -> String {
    let t = format!("{x:.2}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Ages marked on the scatter's x axis, with their labels; the bands' bounds among them.
const AGE_TICKS: [(f64, &str); 7] = [
    (3600.0, "1 h"),
    (86_400.0, "1 day"),
    (7.0 * 86_400.0, "1 week"),
    (30.0 * 86_400.0, "1 month"),
    (182.0 * 86_400.0, "6 months"),
    (365.0 * 86_400.0, "1 year"),
    (3.0 * 365.0 * 86_400.0, "3 years"),
];

/// An SVG scatter of each file's throughput against its age (log scale, from an hour
/// to the oldest file), slow files in red, the slow line dashed, band bounds marked.
pub(crate) fn age_chart(sc: &FileScan) -> String {
    let top = sc.files.iter().map(|f| f.bytes_per_second).fold(sc.reference_bytes_per_second, f64::max).max(1.0);
    let step = nice_step(top / 4.0);
    let max = (top * 1.05 / step).ceil().max(1.0) * step;
    let f = Frame { w: 880.0, h: 340.0, pad: 50.0, left: 90.0, max, step, n: 2 };
    let oldest = sc.files.iter().map(|f| f.age_seconds).fold(30.0 * 86_400.0, f64::max) * 1.5;
    let (lo, hi) = (3600f64.ln(), oldest.ln());
    let x = |age: f64| f.left + (f.w - f.left - f.pad) * ((age.max(3600.0).ln() - lo) / (hi - lo)).clamp(0.0, 1.0);
    let mut s = format!(
        r##"<svg id="ages" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>Read throughput by file age</title>"##,
        w = f.w,
        h = f.h
    );
    s += &y_axis(&f);
    for (age, label) in AGE_TICKS.iter().filter(|(a, _)| *a <= oldest) {
        s += &format!(
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="#d0d0d8" stroke-dasharray="2 3"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle" fill="#555">{label}</text>"##,
            f.pad,
            f.h - f.pad,
            f.h - f.pad + 16.0,
            x = x(*age)
        );
    }
    let limit = sc.threshold * sc.reference_bytes_per_second;
    s += &format!(
        r##"<line x1="{}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#d62728" stroke-dasharray="6 4"/>"##,
        f.left,
        f.w - f.pad,
        y = f.y(limit)
    );
    for file in &sc.files {
        let color = if file.slow { "#d62728" } else { "#1f77b4" };
        s += &format!(
            r##"<circle cx="{:.1}" cy="{:.1}" r="{}" fill="{color}" fill-opacity="0.7"><title>{}: {} ({})</title></circle>"##,
            x(file.age_seconds),
            f.y(file.bytes_per_second),
            if file.timed_alone { 4 } else { 2 },
            esc(&file.path),
            esc(&human_rate(file.bytes_per_second)),
            esc(&human_bytes(file.size_bytes))
        );
    }
    s += &format!(
        r##"<circle cx="{}" cy="16" r="4" fill="#d62728"/><text x="{}" y="20" font-size="12">slow file: below {:.0} % of {} ({}), the dashed line</text>"##,
        f.left + 4.0,
        f.left + 12.0,
        sc.threshold * 100.0,
        esc(&human_rate(sc.reference_bytes_per_second)),
        esc(&sc.reference)
    );
    s += &format!(
        r##"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#555">file age (newest of mtime and ctime), log scale; small dots: small files timed with their band</text></svg>"##,
        f.w / 2.0,
        f.h - 10.0
    );
    s
}

/// An SVG bar chart of each pass's throughput.
pub(crate) fn pass_chart(series: &[Series<BenchResult>]) -> String {
    let bars: Vec<(String, &str, f64)> = series
        .iter()
        .flat_map(|(label, color, b)| {
            b.passes.iter().enumerate().map(move |(i, p)| (format!("{label} {}", i + 1), *color, p.bytes_per_second))
        })
        .collect();
    let (w, h, pad) = (880.0, 260.0, 50.0);
    let max = bars.iter().map(|b| b.2).fold(1.0, f64::max) * 1.1;
    let bw = (w - 2.0 * pad) / bars.len().max(1) as f64;
    let mut s = format!(
        r##"<svg id="passes" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>Throughput of each pass</title>"##
    );
    for (i, (label, color, v)) in bars.iter().enumerate() {
        let bh = (h - 2.0 * pad) * v / max;
        let x0 = pad + i as f64 * bw + bw * 0.15;
        s += &format!(
            r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{color}"><title>{}: {}</title></rect>"##,
            h - pad - bh,
            bw * 0.7,
            esc(label),
            esc(&human_rate(*v))
        );
        s += &format!(
            r##"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            x0 + bw * 0.35,
            h - pad + 14.0,
            esc(label)
        );
        s += &format!(
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#333">{}</text>"##,
            x0 + bw * 0.35,
            h - pad - bh - 4.0,
            esc(&human_rate(*v))
        );
    }
    s += "</svg>";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_steps_are_round() {
        const MIB: f64 = (1 << 20) as f64;
        assert_eq!(nice_step(230.0 * MIB), 500.0 * MIB);
        assert_eq!(nice_step(90.0 * MIB), 100.0 * MIB);
        assert_eq!(nice_step(1.5 * MIB), 2.0 * MIB);
        // From half a GiB/s the step is in GiB/s: ticks 1, 2, 3 GiB/s, not 1000, 1.95, 2.93.
        assert_eq!(nice_step(700.0 * MIB), 1024.0 * MIB);
        assert_eq!(nice_step(600.0 * 1024.0 * MIB), 1000.0 * 1024.0 * MIB);
        assert_eq!(round_rate(2048.0 * MIB), "2 GiB/s");
        assert_eq!(round_rate(0.0), "0");
        assert_eq!(round_rate(1536.0 * MIB), "1.5 GiB/s");
        assert_eq!(round_rate(500.0 * MIB), "500 MiB/s");
    }
}
