//! Renderings of a [`Report`]: text (in `report.rs`), JSON, Markdown for a ticket, a
//! self-contained HTML page with SVG charts for a change record, and Prometheus textfile
//! metrics for node_exporter.

use std::fmt::Write as _;
use std::path::Path;

use crate::measure::bench::{BenchResult, ScanResult};
use crate::report::Report;
use crate::support::error::{Error, Result};
use crate::support::units::{human_bytes, human_rate};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum Format {
    Text,
    Json,
    Md,
    Html,
    Prom,
}

pub fn render(r: &Report, f: Format) -> String {
    match f {
        Format::Text => r.to_text(),
        Format::Json => r.to_json() + "\n",
        Format::Md => markdown(r),
        Format::Html => html(r),
        Format::Prom => prometheus(r),
    }
}

fn bench_line(label: &str, b: &BenchResult) -> String {
    let passes: Vec<String> = b
        .passes
        .iter()
        .map(|p| match (p.latency_p50_seconds, p.latency_p99_seconds) {
            (Some(a), Some(c)) => {
                format!("{} (p50 {:.2} ms, p99 {:.2} ms)", human_rate(p.bytes_per_second), a * 1e3, c * 1e3)
            }
            _ => human_rate(p.bytes_per_second),
        })
        .collect();
    format!(
        "  {label}: {} of {} in {} passes of {} blocks at QD{}{}: median {}, min {}, max {} ({})\n",
        human_bytes(b.params.length_bytes),
        b.target,
        b.passes.len(),
        human_bytes(b.params.block_size_bytes),
        b.params.queue_depth,
        if b.virtual_time { " (virtual time)" } else { "" },
        human_rate(b.median_bytes_per_second),
        human_rate(b.min_bytes_per_second),
        human_rate(b.max_bytes_per_second),
        passes.join(", ")
    ) + &b
        .cache
        .as_ref()
        .map(|c| format!("    cache check: {}{}\n", if c.cache_suspected { "UNRELIABLE, " } else { "" }, c.finding))
        .unwrap_or_default()
        + &b.emulated
            .as_ref()
            .map(|e| {
                format!(
                    "    emulated drive (reseq sim serve, time x{}): {} of {} replies late, by {:.1} % of the passes' time\n",
                    e.time_scale,
                    e.late_replies,
                    e.replies,
                    e.late_share * 100.0
                )
            })
            .unwrap_or_default()
}

fn scan_text(label: &str, sc: &ScanResult) -> String {
    let mut s = format!(
        "  {label}: {} regions of {}, reference (fastest quarter) {}, slow below {:.0} % of it: {} slow\n",
        sc.regions.len(),
        sc.target,
        human_rate(sc.reference_bytes_per_second),
        sc.threshold * 100.0,
        sc.slow_regions
    );
    let max = sc.regions.iter().map(|r| r.bytes_per_second).fold(0.0, f64::max).max(1.0);
    for r in &sc.regions {
        let bar = "#".repeat(((r.bytes_per_second / max) * 40.0).round() as usize);
        let _ = writeln!(
            s,
            "    {:>4} {:>12} {:>12}/s {:<40}{}",
            r.index,
            human_bytes(r.offset_bytes),
            human_bytes(r.bytes_per_second as u64),
            bar,
            if r.slow { " SLOW" } else { "" }
        );
    }
    s
}

/// Bench, scan, verdict, write cost and files, for the text rendering.
pub fn measurements_text(r: &Report) -> String {
    let mut s = String::new();
    if let Some(files) = &r.files {
        let total: u64 = files.iter().map(|f| f.bytes_rewritten).sum();
        s += &format!("reseq rewrite: {} file(s), {} rewritten\n", files.len(), human_bytes(total));
        for f in files {
            let mut line = format!(
                "  {}: {} of {}, {} extent(s), {} window(s), longest freeze {:.3} s, verification {}",
                f.path,
                human_bytes(f.bytes_rewritten),
                human_bytes(f.size_bytes),
                f.extents.unwrap_or(0),
                f.windows,
                f.longest_freeze_seconds,
                f.verification
            );
            if f.bytes_skipped_unwritten > 0 {
                line += &format!(", {} unwritten skipped", human_bytes(f.bytes_skipped_unwritten));
            }
            if f.bytes_skipped_shared > 0 {
                line += &format!(", {} shared (done with another file)", human_bytes(f.bytes_skipped_shared));
            }
            if let Some(why) = &f.skipped_reason {
                line += &format!(", SKIPPED: {why}");
            }
            if f.done_earlier {
                line += ", done by the interrupted run this one resumed";
            }
            s += &line;
            s += "\n";
        }
    }
    if let Some(b) = &r.bench {
        s += &bench_line("read", b);
    }
    if let Some(sc) = &r.scan {
        s += &scan_text("scan", sc);
    }
    if let Some(e) = &r.estimate {
        s += &format!(
            "  estimate: {} sampled in {} places of {}: median {}, fastest quarter {}{}\n  {}\n",
            human_bytes(e.sample_bytes),
            e.regions.len(),
            e.target,
            human_rate(e.median_bytes_per_second),
            human_rate(e.reference_bytes_per_second),
            if e.virtual_time { " (virtual time)" } else { "" },
            e.advice
        );
    }
    if let Some(t) = &r.trim_impact {
        s += &t.text();
    }
    if let Some(b) = &r.bench_before {
        s += &bench_line("before", b);
    }
    if let Some(b) = &r.bench_after {
        s += &bench_line("after", b);
    }
    if let Some(v) = &r.verdict {
        s += &format!("  verdict: {} (x{:.2}; {})\n", v.verdict.replace('_', " "), v.speedup, v.rule);
    }
    if let Some(t) = r.space.as_ref().and_then(|sp| sp.trim.as_ref()) {
        s += &t.text();
    }
    if let Some(w) = &r.write_cost {
        s += &format!(
            "  write cost: {} written by the host{}\n",
            w.host_bytes_written.map(human_bytes).unwrap_or_else(|| "unknown".into()),
            match (w.nvme_data_units_written_before, w.nvme_data_units_written_after) {
                (Some(a), Some(b)) => format!(", NVMe data units written +{} ({} bytes)", b - a, (b - a) * 512_000),
                _ => String::new(),
            }
        );
    }
    s
}

fn markdown(r: &Report) -> String {
    let mut s = format!("### reseq {} — {}\n\n", r.command, r.outcome_text());
    s += "| | |\n|---|---|\n";
    let mut row = |k: &str, v: String| {
        let _ = writeln!(s, "| {k} | {} |", v.replace('|', "\\|"));
    };
    row("host", r.host.clone());
    row("started", r.started_at.clone());
    row("duration", format!("{:.1} s", r.duration_seconds));
    if let Some(d) = &r.device {
        row("device", format!("`{}` ({}, {})", d.path, d.identity.dev, human_bytes(d.identity.size_bytes)));
    }
    if let Some(p) = &r.plan {
        row("chunks", format!("{} x {}", p.chunks_total, human_bytes(p.chunk_size_bytes)));
        let fs: Vec<String> =
            p.filesystems_frozen.iter().map(|f| format!("`{}` ({})", f.mount_point.display(), f.fs_type)).collect();
        row("frozen", if fs.is_empty() { "nothing mounted".into() } else { fs.join(", ") });
    }
    if let Some(x) = &r.results {
        row("rewritten", human_bytes(x.bytes_written));
        row(
            "windows",
            format!("{} (longest freeze {:.3} s, overruns {})", x.windows, x.longest_freeze_seconds, x.windows_overrun),
        );
        row("verification", r.verification.clone());
    }
    for (k, b) in [("read", &r.bench), ("read before", &r.bench_before), ("read after", &r.bench_after)] {
        if let Some(b) = b {
            row(
                k,
                format!(
                    "median {} (min {}, max {}; {} passes, {} at QD{})",
                    human_rate(b.median_bytes_per_second),
                    human_rate(b.min_bytes_per_second),
                    human_rate(b.max_bytes_per_second),
                    b.passes.len(),
                    human_bytes(b.params.block_size_bytes),
                    b.params.queue_depth
                ),
            );
        }
    }
    if let Some(v) = &r.verdict {
        row("verdict", format!("**{}** x{:.2} ({})", v.verdict.replace('_', " "), v.speedup, v.rule));
    }
    if let Some(sc) = &r.scan {
        row(
            "scan",
            format!(
                "{} regions, {} slow (below {:.0} % of {})",
                sc.regions.len(),
                sc.slow_regions,
                sc.threshold * 100.0,
                human_rate(sc.reference_bytes_per_second)
            ),
        );
    }
    if let Some(w) = &r.write_cost {
        row("host bytes written", w.host_bytes_written.map(human_bytes).unwrap_or_else(|| "unknown".into()));
    }
    if let Some(t) = r.space.as_ref().and_then(|sp| sp.trim.as_ref()) {
        row("trim", trim_summary(t));
    }
    if let Some(t) = &r.trim_impact {
        row("trim impact", format!("{} ({}): {}", t.mount_point, t.fs_type, trim_summary(&t.trim)));
    }
    row("exit", format!("{} ({:?})", r.outcome.exit_code, r.outcome.status));
    if let Some(m) = &r.outcome.message {
        row("message", m.clone());
    }
    for w in &r.warnings {
        s += &format!("\n> warning: {w}\n");
    }
    s
}

/// One line about a sliced trim, for the Markdown and HTML tables.
fn trim_summary(t: &crate::host::trim::TrimReport) -> String {
    let mut s = format!(
        "{} discarded in {} slice(s), {:.1} s ({}), slowest slice {:.3} s, pace {}",
        human_bytes(t.bytes_trimmed),
        t.slices,
        t.seconds,
        human_rate(t.bytes_per_second),
        t.slowest_slice_seconds,
        t.pace
    );
    if let Some(sig) = &t.stopped_by {
        s += &format!(", stopped by {sig}");
    }
    if let Some(p) = &t.probe {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.2} ms", v * 1e3));
        s += &format!(
            "; read latency p50/p99 before {}/{}, during {}/{}",
            ms(p.before.p50_seconds),
            ms(p.before.p99_seconds),
            ms(p.during.p50_seconds),
            ms(p.during.p99_seconds)
        );
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// An SVG chart of throughput by region: one polyline per series.
fn region_chart(series: &[(&str, &str, &ScanResult)]) -> String {
    // A wider left margin holds the axis labels ("2.3 GiB/s").
    let (w, h, pad, left) = (880.0, 320.0, 50.0, 90.0);
    let top = series.iter().flat_map(|(_, _, s)| s.regions.iter().map(|r| r.bytes_per_second)).fold(1.0, f64::max);
    // Round ticks (1, 2 or 5 x a power of ten, in MiB/s) up to just above the top.
    let step = nice_step(top / 4.0);
    let max = (top * 1.05 / step).ceil().max(1.0) * step;
    let n = series.iter().map(|(_, _, s)| s.regions.len()).max().unwrap_or(1).max(2);
    let x = |i: usize| left + (w - left - pad) * i as f64 / (n - 1) as f64;
    let y = |v: f64| h - pad - (h - 2.0 * pad) * v / max;
    let mut s = format!(
        r##"<svg id="regions" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img"><title>Read throughput by region</title>"##
    );
    s += &format!(
        r##"<rect x="{left}" y="{pad}" width="{}" height="{}" fill="#f7f7f9" stroke="#ccc"/>"##,
        w - left - pad,
        h - 2.0 * pad
    );
    let ticks = (max / step).round() as usize;
    for k in 0..=ticks {
        let v = step * k as f64;
        s += &format!(
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e3e3e8"/><text x="{}" y="{}" font-size="11" text-anchor="end" fill="#555">{}</text>"##,
            w - pad,
            left - 6.0,
            y(v) + 4.0,
            esc(&round_rate(v)),
            y = y(v)
        );
    }
    // Offsets under the x axis: where regions start (in-use bytes when only the ranges in
    // use were read).
    if let Some((_, _, first)) = series.first() {
        let regs = &first.regions;
        for i in [0, regs.len() / 4, regs.len() / 2, regs.len() * 3 / 4, regs.len().saturating_sub(1)] {
            if let Some(r) = regs.get(i) {
                s += &format!(
                    r##"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle" fill="#555">{}</text>"##,
                    x(r.index),
                    h - pad + 16.0,
                    esc(&human_bytes(r.offset_bytes))
                );
            }
        }
    }
    for (li, (label, color, sc)) in series.iter().enumerate() {
        let pts: Vec<String> =
            sc.regions.iter().map(|r| format!("{:.1},{:.1}", x(r.index), y(r.bytes_per_second))).collect();
        s += &format!(r##"<polyline fill="none" stroke="{color}" stroke-width="2.5" points="{}"/>"##, pts.join(" "));
        for r in sc.regions.iter().filter(|r| r.slow) {
            s += &format!(
                r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#d62728"><title>slow region {}</title></circle>"##,
                x(r.index),
                y(r.bytes_per_second),
                r.index
            );
        }
        s += &format!(
            r##"<rect x="{}" y="14" width="14" height="4" fill="{color}"/><text x="{}" y="20" font-size="12">{}</text>"##,
            left + 160.0 * li as f64,
            left + 160.0 * li as f64 + 18.0,
            esc(label)
        );
    }
    // Every mark has a legend entry: the red dots too.
    if let Some((_, _, sc)) = series.iter().find(|(_, _, sc)| sc.regions.iter().any(|r| r.slow)) {
        s += &format!(
            r##"<circle cx="{}" cy="16" r="4" fill="#d62728"/><text x="{}" y="20" font-size="12">slow region: below {:.0} % of the fastest quarter ({})</text>"##,
            left + 160.0 * series.len() as f64 + 4.0,
            left + 160.0 * series.len() as f64 + 12.0,
            sc.threshold * 100.0,
            esc(&human_rate(sc.reference_bytes_per_second))
        );
    }
    let in_use = series.iter().any(|(_, _, sc)| sc.regions.iter().any(|r| !r.device_ranges.is_empty()));
    s += &format!(
        r##"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="#555">{}</text></svg>"##,
        w / 2.0,
        h - 10.0,
        if in_use {
            "region start, in bytes in use (free space not read)"
        } else {
            "region start (offset on the target)"
        }
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

/// An SVG bar chart of each pass's throughput.
fn pass_chart(series: &[(&str, &str, &BenchResult)]) -> String {
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

fn html(r: &Report) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>reseq {}</h1><p class=\"outcome {}\">{} (exit {})</p>",
        esc(&r.command),
        if r.outcome.exit_code == 0 { "ok" } else { "bad" },
        esc(&r.outcome_text()),
        r.outcome.exit_code
    );
    if let Some(v) = &r.verdict {
        let _ = write!(
            body,
            "<p class=\"verdict\">Verdict: <b>{}</b> — median read throughput ×{:.2} ({})</p>",
            esc(&v.verdict.replace('_', " ")),
            v.speedup,
            esc(&v.rule)
        );
    }
    let mut rows = vec![
        ("host", r.host.clone()),
        ("started", r.started_at.clone()),
        ("finished", r.finished_at.clone()),
        ("duration", format!("{:.1} s", r.duration_seconds)),
        ("command line", r.argv.join(" ")),
    ];
    if let Some(d) = &r.device {
        rows.push((
            "device",
            format!(
                "{} ({}, {}, serial {})",
                d.path,
                d.identity.dev,
                human_bytes(d.identity.size_bytes),
                d.identity.serial.clone().unwrap_or_else(|| "n/a".into())
            ),
        ));
    }
    if !r.targets.is_empty() {
        rows.push(("targets", r.targets.join(" ")));
    }
    if let Some(p) = &r.plan {
        let verify = if p.verify { "on" } else { "off" };
        rows.push((
            "chunks",
            format!("{} x {}, verification {verify}", p.chunks_total, human_bytes(p.chunk_size_bytes)),
        ));
        rows.push((
            "windows",
            match p.max_freeze_seconds {
                Some(m) => format!("at most {m:.3} s frozen each, pause {:.3} s between", p.pause_seconds),
                None => "one, unfrozen (nothing mounted; the device held exclusively)".into(),
            },
        ));
        let fs: Vec<String> =
            p.filesystems_frozen.iter().map(|f| format!("{} ({})", f.mount_point.display(), f.fs_type)).collect();
        rows.push(("frozen", if fs.is_empty() { "nothing mounted".into() } else { fs.join(", ") }));
    }
    if let Some(sp) = &r.space {
        rows.push((
            "space",
            format!(
                "{}: {} left out as free; TRIM {}",
                sp.mode,
                human_bytes(sp.bytes_skipped_as_free),
                sp.bytes_trimmed.map(|b| format!("discarded {}", human_bytes(b))).unwrap_or_else(|| "not run".into())
            ),
        ));
    }
    if let Some(t) = r.space.as_ref().and_then(|sp| sp.trim.as_ref()) {
        rows.push(("trim", trim_summary(t)));
    }
    if let Some(t) = &r.trim_impact {
        rows.push(("trim impact", format!("{} ({}): {}", t.mount_point, t.fs_type, trim_summary(&t.trim))));
    }
    for (k, b) in [("measured", &r.bench), ("measured before", &r.bench_before), ("measured after", &r.bench_after)] {
        if let Some(b) = b {
            let cache = b.cache.as_ref().map(|c| format!("; cache check: {}", c.finding)).unwrap_or_default();
            rows.push((k, format!("{} of {}{cache}", human_bytes(b.params.length_bytes), b.target)));
        }
    }
    if let Some(x) = &r.results {
        rows.push((
            "rewritten",
            format!(
                "{} (read {}, verified {})",
                human_bytes(x.bytes_written),
                human_bytes(x.bytes_read),
                human_bytes(x.bytes_verified)
            ),
        ));
        rows.push((
            "freeze windows",
            format!("{} (longest {:.3} s, overruns {})", x.windows, x.longest_freeze_seconds, x.windows_overrun),
        ));
        rows.push(("verification", r.verification.clone()));
    }
    if let Some(w) = &r.write_cost {
        rows.push(("host bytes written", w.host_bytes_written.map(human_bytes).unwrap_or_else(|| "unknown".into())));
    }
    body += "<table>";
    for (k, v) in rows {
        let _ = write!(body, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    }
    body += "</table>";
    let mut scans: Vec<(&str, &str, &ScanResult)> = Vec::new();
    if let Some(s) = &r.scan_before {
        scans.push(("before", "#9a9a9a", s));
    }
    if let Some(s) = &r.scan_after {
        scans.push(("after", "#1f77b4", s));
    }
    if let Some(s) = &r.scan {
        scans.push(("throughput", "#1f77b4", s));
    }
    if !scans.is_empty() {
        body += "<h2>Read throughput by region</h2>";
        body += &region_chart(&scans);
    }
    let mut benches: Vec<(&str, &str, &BenchResult)> = Vec::new();
    if let Some(b) = &r.bench_before {
        benches.push(("before", "#9a9a9a", b));
    }
    if let Some(b) = &r.bench_after {
        benches.push(("after", "#1f77b4", b));
    }
    if let Some(b) = &r.bench {
        benches.push(("pass", "#1f77b4", b));
    }
    if !benches.is_empty() {
        body += "<h2>Sequential read, each pass</h2>";
        body += &pass_chart(&benches);
    }
    for w in &r.warnings {
        let _ = write!(body, "<p class=\"warn\">warning: {}</p>", esc(w));
    }
    if let Some(m) = &r.outcome.message {
        let _ = write!(body, "<pre>{}</pre>", esc(m));
    }
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>reseq {} report</title><style>\
body{{font-family:system-ui,sans-serif;margin:2em;color:#222;background:#fff}}table{{border-collapse:collapse;margin:1em 0}}\
th,td{{border:1px solid #ddd;padding:4px 10px;text-align:left;font-size:14px}}th{{background:#f3f3f5}}\
.ok{{color:#2a7}}.bad{{color:#c22}}.verdict{{font-size:18px}}.warn{{color:#a60}}svg{{display:block;margin:1em 0}}</style></head>\
<body>{body}</body></html>\n",
        esc(&r.command)
    )
}

fn unix_seconds(rfc3339: &str) -> f64 {
    humantime::parse_rfc3339(rfc3339)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Prometheus text exposition format, base units, one `target` label.
pub fn prometheus(r: &Report) -> String {
    let target = r
        .device
        .as_ref()
        .map(|d| d.path.clone())
        .or_else(|| (!r.targets.is_empty()).then(|| r.targets.join(" ")))
        .or_else(|| r.bench.as_ref().map(|b| b.target.clone()))
        .or_else(|| r.scan.as_ref().map(|s| s.target.clone()))
        .unwrap_or_default();
    let label =
        format!("{{command=\"{}\",target=\"{}\"}}", r.command, target.replace('\\', "\\\\").replace('"', "\\\""));
    let mut s = String::new();
    let mut metric = |name: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            let _ = writeln!(s, "# HELP reseq_{name} {help}\n# TYPE reseq_{name} gauge\nreseq_{name}{label} {v}");
        }
    };
    metric("last_run_timestamp_seconds", "Unix time the last run finished.", Some(unix_seconds(&r.finished_at)));
    metric(
        "last_run_success",
        "1 if the last run succeeded, else 0.",
        Some(f64::from(u8::from(r.outcome.exit_code == 0))),
    );
    metric("last_run_exit_code", "Exit code of the last run.", Some(f64::from(r.outcome.exit_code)));
    metric("last_run_duration_seconds", "Wall time of the last run.", Some(r.duration_seconds));
    metric(
        "last_run_rewritten_bytes",
        "Bytes rewritten by the last run.",
        r.results.as_ref().map(|x| x.bytes_written as f64),
    );
    metric(
        "last_run_longest_freeze_seconds",
        "Longest freeze window of the last run.",
        r.results.as_ref().map(|x| x.longest_freeze_seconds),
    );
    metric(
        "last_run_windows_overrun",
        "Freeze windows that overran their deadline.",
        r.results.as_ref().map(|x| x.windows_overrun as f64),
    );
    metric(
        "read_throughput_before_bytes_per_second",
        "Median sequential read throughput before the rewrite.",
        r.bench_before.as_ref().map(|b| b.median_bytes_per_second),
    );
    metric(
        "read_throughput_after_bytes_per_second",
        "Median sequential read throughput after the rewrite.",
        r.bench_after.as_ref().map(|b| b.median_bytes_per_second),
    );
    metric(
        "read_throughput_bytes_per_second",
        "Median sequential read throughput (bench).",
        r.bench.as_ref().map(|b| b.median_bytes_per_second),
    );
    metric(
        "last_run_measurable_change",
        "1 faster, 0 no measurable change, -1 slower (rewrite --bench); absent when unreliable.",
        r.verdict.as_ref().and_then(|v| match v.verdict.as_str() {
            "faster" => Some(1.0),
            "slower" => Some(-1.0),
            "unreliable" => None,
            _ => Some(0.0),
        }),
    );
    metric(
        "last_run_bench_unreliable",
        "1 when a cache below the device made the benchmark unreliable (rewrite --bench).",
        r.verdict.as_ref().map(|v| f64::from(u8::from(v.verdict == "unreliable"))),
    );
    let trim = r.space.as_ref().and_then(|sp| sp.trim.as_ref()).or(r.trim_impact.as_ref().map(|t| &t.trim));
    metric("last_run_trimmed_bytes", "Bytes FITRIM discarded.", trim.map(|t| t.bytes_trimmed as f64));
    metric("last_run_trim_seconds", "Wall time of the sliced FITRIM, pauses included.", trim.map(|t| t.seconds));
    metric(
        "last_run_trim_slowest_slice_seconds",
        "Longest single FITRIM slice (how long a reader could stall).",
        trim.map(|t| t.slowest_slice_seconds),
    );
    let probe = trim.and_then(|t| t.probe.as_ref());
    metric(
        "trim_read_latency_p99_before_seconds",
        "Read latency p99 of the probe just before the trim.",
        probe.and_then(|p| p.before.p99_seconds),
    );
    metric(
        "trim_read_latency_p99_during_seconds",
        "Read latency p99 of the probe during the trim.",
        probe.and_then(|p| p.during.p99_seconds),
    );
    metric(
        "last_run_host_written_bytes",
        "Bytes the host wrote to the device during the run.",
        r.write_cost.as_ref().and_then(|w| w.host_bytes_written.map(|b| b as f64)),
    );
    s
}

/// Writes `text` to `path` atomically: a temporary file in the same directory, fsync,
/// then rename, so node_exporter never reads half a file.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".reseq-")
        .tempfile_in(dir)
        .map_err(|e| Error::io(format!("creating a temporary file in {}", dir.display()), e))?;
    // Readable by node_exporter, which does not run as root (tempfile makes 0600).
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .and_then(|()| tmp.write_all(text.as_bytes()))
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::io("writing metrics", e))?;
    tmp.persist(path).map_err(|e| Error::io(format!("renaming metrics into {}", path.display()), e.error))?;
    Ok(())
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
