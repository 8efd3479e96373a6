//! Renderings of a [`Report`], one module per format: text for people
//! ([`text`](mod@text)), JSON for scripts, Markdown for a ticket ([`markdown`]), a
//! self-contained HTML page with SVG charts for a change record ([`html`], [`svg`]), and
//! Prometheus textfile metrics for node_exporter ([`prometheus`](mod@prometheus)).
//! Renderers read the report; the report knows none of them.

mod cold;
mod html;
mod markdown;
mod plain;
mod prometheus;
mod svg;
mod text;

use std::path::Path;
use std::str::FromStr;

use crate::host::trim::TrimReport;
use crate::report::Report;
use crate::support::error::{Error, Result};
use crate::support::units::{human_bytes, human_rate};

pub(crate) use prometheus::prometheus;
#[cfg(test)]
pub(crate) use text::text_at;
pub(crate) use text::{prediction, text};

/// A report format, by the name `--format` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Format {
    Text,
    Json,
    Md,
    Html,
    Prom,
}

impl Format {
    /// Every format, in the order `--help` lists them.
    pub(crate) const ALL: [Format; 5] = [Format::Text, Format::Json, Format::Md, Format::Html, Format::Prom];
    /// Their names on the command line, in the same order (the possible values of
    /// `--format`).
    pub(crate) const NAMES: [&'static str; 5] = ["text", "json", "md", "html", "prom"];
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Format, String> {
        match Format::NAMES.iter().position(|n| *n == s) {
            Some(i) => Ok(Format::ALL[i]),
            None => Err(format!("unknown format '{s}' (possible values: {})", Format::NAMES.join(", "))),
        }
    }
}

pub(crate) fn render(r: &Report, f: Format) -> String {
    match f {
        Format::Text => text(r),
        Format::Json => serde_json::to_string_pretty(r).expect("report serializes") + "\n",
        Format::Md => markdown::markdown(r),
        Format::Html => html::html(r),
        Format::Prom => prometheus(r),
    }
}

/// Below this many reads a 99th percentile is the slowest read or two: not shown.
const MIN_READS_FOR_P99: u64 = 100;

/// The Markdown and HTML tables' rows of the rewrite's trim and of `bench --trim-impact`.
/// What a run was over and how long it froze, for the tables: the targets (and how
/// many files, in file mode), and the windows with their longest and total freeze.
fn run_summary_rows(r: &Report) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    if !r.targets.is_empty() {
        let files = r.files.as_ref().map(|f| format!(" ({} file(s))", f.len())).unwrap_or_default();
        rows.push(("targets", format!("{}{files}", r.targets.join(" "))));
    }
    if let Some(x) = &r.results {
        rows.push((
            "windows",
            format!(
                "{} (longest freeze {:.3} s, frozen {:.1} s in all, overruns {})",
                x.windows, x.longest_freeze_seconds, x.total_frozen_seconds, x.windows_overrun
            ),
        ));
    }
    rows
}

fn trim_rows(r: &Report) -> Vec<(&'static str, String)> {
    let trim = r.space.as_ref().and_then(|sp| sp.trim.as_ref()).map(|t| ("trim", trim_summary(t)));
    let impact = r
        .trim_impact
        .as_ref()
        .map(|t| ("trim impact", format!("{} ({}): {}", t.mount_point, t.fs_type, trim_summary(&t.trim))));
    trim.into_iter().chain(impact).collect()
}

/// One line about a sliced trim, for the Markdown and HTML tables.
fn trim_summary(t: &TrimReport) -> String {
    let (bytes, rate) = (human_bytes(t.bytes_trimmed), human_rate(t.bytes_per_second));
    let mut s = format!(
        "{bytes} discarded in {} slice(s), {:.1} s ({rate}), slowest slice {:.3} s, pace {}",
        t.slices, t.seconds, t.slowest_slice_seconds, t.pace
    );
    if let Some(sig) = &t.stopped_by {
        s += &format!(", stopped by {sig}");
    }
    if let Some(p) = t.probe.as_ref().filter(|p| p.before.reads.min(p.during.reads) < MIN_READS_FOR_P99) {
        s += &format!(
            "; read latency: too few probe reads for a p99 (before {}, during {})",
            p.before.reads, p.during.reads
        );
    } else if let Some(p) = &t.probe {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.2} ms", v * 1e3));
        let (b, d) = (&p.before, &p.during);
        let (b50, b99, d50, d99) = (ms(b.p50_seconds), ms(b.p99_seconds), ms(d.p50_seconds), ms(d.p99_seconds));
        s += &format!("; read latency p50/p99 before {b50}/{b99}, during {d50}/{d99}");
    }
    s
}

/// Escapes text for HTML and SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Writes `text` to `path` whole (see [`crate::support::atomic::replace`]), so that
/// node_exporter never reads half a file; readable by node_exporter, which does not run
/// as root.
pub(crate) fn write_atomically(path: &Path, text: &str) -> Result<()> {
    crate::support::atomic::replace(path, 0o644, |f| std::io::Write::write_all(f, text.as_bytes()))
        .map_err(|e| Error::io(format!("writing metrics to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_their_names_only() {
        assert_eq!(Format::NAMES.map(|n| n.parse::<Format>().unwrap()), Format::ALL);
        let e = "markdown".parse::<Format>().unwrap_err();
        assert!(e.contains("text, json, md, html, prom"), "{e}");
        assert!("Json".parse::<Format>().is_err(), "names are case-sensitive, as clap's value enum was");
    }

    #[test]
    fn a_p99_of_a_few_reads_is_not_shown() {
        use crate::host::trim::{LatencySample, ProbeComparison, TrimReport};
        let sample = |n: usize| LatencySample::of(&vec![0.001; n]);
        let report = |before: usize, during: usize| TrimReport {
            pace: "idle 4x".into(),
            rate_limit_bytes_per_second: None,
            bytes_trimmed: 1 << 20,
            slices: 1,
            seconds: 0.1,
            busy_seconds: 0.1,
            slowest_slice_seconds: 0.1,
            bytes_per_second: 1e7,
            stopped_by: None,
            filesystems: Vec::new(),
            probe: Some(ProbeComparison {
                target: "t".into(),
                block_size_bytes: 4096,
                interval_seconds: 0.005,
                before: sample(before),
                during: sample(during),
                p50_ratio: None,
                p99_ratio: None,
            }),
        };
        let few = trim_summary(&report(400, 12));
        assert!(
            few.contains("too few probe reads for a p99 (before 400, during 12)") && !few.contains("p50/p99"),
            "{few}"
        );
        assert!(trim_summary(&report(400, 300)).contains("read latency p50/p99 before"));
    }

    /// Under an unreliable verdict the HTML marks no region slow and says why, above the
    /// region and the pass charts alike.
    #[test]
    fn charts_draw_nothing_as_slow_that_the_verdict_does_not_stand_behind() {
        use crate::measure::scan::{Region, ScanResult};
        use crate::measure::verdict::Finding;
        let region = |index: usize, rate: f64, slow: bool| Region {
            index,
            bytes_per_second: rate,
            slow,
            length_bytes: 1 << 20,
            ..Region::default()
        };
        let scan = ScanResult {
            target: "t".into(),
            virtual_time: false,
            params: Default::default(),
            reference_bytes_per_second: 4e8,
            threshold: 0.7,
            regions: vec![region(0, 4e8, false), region(1, 1e8, true)],
            slow_regions: 1,
            sureness: Default::default(),
            host_pressure: None,
        };
        let mut r = Report::new("rewrite", false);
        (r.scan_before, r.scan_after) = (Some(scan.clone()), Some(scan));
        let before = crate::measure::bench::tests::bench_of(&[100.0, 101.0, 102.0]);
        let after = crate::measure::bench::tests::bench_of(&[50.0, 51.0, 52.0]);
        r.verdict = Some(crate::measure::verdict::verdict_of(&before, &after));
        (r.bench_before, r.bench_after) = (Some(before), Some(after));
        assert!(render(&r, Format::Html).contains("slow region"), "a verdict that stands marks them");
        r.verdict.as_mut().unwrap().verdict = Finding::Unreliable;
        let html = render(&r, Format::Html);
        assert!(!html.contains("slow region"), "{html}");
        assert_eq!(html.matches("calls this comparison unreliable").count(), 2, "{html}");
    }

    /// A run stopped by exit 7 after verifying every chunk it wrote: no renderer says a
    /// check failed, and each names the cause (overruns or the hard bound), not the other.
    #[test]
    fn a_stop_after_verified_writes_is_not_called_a_failed_check_and_names_its_cause() {
        let stops = [
            (
                Error::WindowOverrun { window: 4, overruns: 3, deadline_ms: 1000 },
                "overran their deadline",
                "hard bound",
            ),
            (Error::BoundBroken { window: 2, frozen_ms: 2293, bound_ms: 2000 }, "outlasted its hard bound", "overran"),
        ];
        for (e, said, not_said) in stops {
            let mut r = Report::new("rewrite", false);
            r.results = Some(crate::engine::EngineStats {
                bytes_written: 64 << 20,
                bytes_verified: 64 << 20,
                windows: 5,
                ..Default::default()
            });
            r.finish(std::time::Duration::from_secs(3), &Err(e));
            // What a device run (with its plan, verifying) records for a stop.
            r.verification = crate::report::Verification::Incomplete;
            assert_eq!(r.outcome.exit_code, 7);
            for f in Format::ALL.into_iter().filter(|f| *f != Format::Prom) {
                let out = render(&r, f);
                assert!(!out.contains("did not pass"), "{f:?}: {out}");
                if f != Format::Json {
                    assert!(out.contains(said) && !out.contains(not_said), "{f:?} must say {said:?}: {out}");
                }
            }
            assert!(render(&r, Format::Html).contains("every byte written was read back"));
            let cause = if said.contains("bound") { "bound_broken" } else { "window_overruns" };
            assert!(render(&r, Format::Json).contains(&format!("\"cause\": \"{cause}\"")));
        }
        // A read-back that differed is a failed check, and says so.
        let mut r = Report::new("rewrite", false);
        r.results = Some(crate::engine::EngineStats { bytes_written: 1 << 20, ..Default::default() });
        r.verification = crate::report::Verification::Failed;
        assert!(render(&r, Format::Html).contains("did not pass"));
    }
}
