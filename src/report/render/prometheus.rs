//! Prometheus textfile metrics, for node_exporter's textfile collector.

use std::fmt::Write as _;

use crate::host::trim::TrimReport;
use crate::measure::verdict::Finding;
use crate::report::Report;

/// A gauge: name (after `reseq_`), help, value (absent: not written).
type Metric = (&'static str, &'static str, Option<f64>);

/// Prometheus text exposition format, base units, one `target` label.
pub(crate) fn prometheus(r: &Report) -> String {
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
    for (name, help, v) in [run_metrics(r), read_metrics(r), cold_metrics(r), trim_metrics(r)].into_iter().flatten() {
        if let Some(v) = v {
            let _ = writeln!(s, "# HELP reseq_{name} {help}\n# TYPE reseq_{name} gauge\nreseq_{name}{label} {v}");
        }
    }
    s
}

fn unix_seconds(rfc3339: &str) -> f64 {
    humantime::parse_rfc3339(rfc3339)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// When the run ended, how, and what the engine did.
fn run_metrics(r: &Report) -> Vec<Metric> {
    let results = r.results.as_ref();
    vec![
        ("last_run_timestamp_seconds", "Unix time the last run finished.", Some(unix_seconds(&r.finished_at))),
        (
            "last_run_success",
            "1 if the last run succeeded, else 0.",
            Some(f64::from(u8::from(r.outcome.exit_code == 0))),
        ),
        ("last_run_exit_code", "Exit code of the last run.", Some(f64::from(r.outcome.exit_code))),
        ("last_run_duration_seconds", "Wall time of the last run.", Some(r.duration_seconds)),
        ("last_run_rewritten_bytes", "Bytes rewritten by the last run.", results.map(|x| x.bytes_written as f64)),
        (
            "last_run_longest_freeze_seconds",
            "Longest freeze window of the last run.",
            results.map(|x| x.longest_freeze_seconds),
        ),
        (
            "last_run_windows_overrun",
            "Freeze windows that overran their deadline.",
            results.map(|x| x.windows_overrun as f64),
        ),
    ]
}

/// Read throughput and the verdict.
fn read_metrics(r: &Report) -> Vec<Metric> {
    let median = |b: &Option<crate::measure::bench::BenchResult>| b.as_ref().map(|b| b.median_bytes_per_second);
    vec![
        (
            "read_throughput_before_bytes_per_second",
            "Median sequential read throughput before the rewrite.",
            median(&r.bench_before),
        ),
        (
            "read_throughput_after_bytes_per_second",
            "Median sequential read throughput after the rewrite.",
            median(&r.bench_after),
        ),
        ("read_throughput_bytes_per_second", "Median sequential read throughput (bench).", median(&r.bench)),
        (
            "last_run_measurable_change",
            "1 faster, 0 no measurable change, -1 slower (rewrite --bench); absent when unreliable.",
            r.verdict.as_ref().and_then(|v| match v.verdict {
                Finding::Faster => Some(1.0),
                Finding::Slower => Some(-1.0),
                Finding::Unreliable => None,
                Finding::NoMeasurableChange => Some(0.0),
            }),
        ),
        (
            "last_run_bench_unreliable",
            "1 when a cache below the device made the benchmark unreliable (rewrite --bench).",
            r.verdict.as_ref().map(|v| f64::from(u8::from(v.verdict == Finding::Unreliable))),
        ),
    ]
}

/// Cold data: what a per-file scan or estimate found slow, what a rewrite chose.
fn cold_metrics(r: &Report) -> Vec<Metric> {
    let scan = r.scan_files.as_ref().or(r.file_selection.as_ref().and_then(|s| s.scan.as_ref()));
    vec![
        (
            "cold_slow_bytes",
            "Bytes of files read slowly for their age (scan --by-file, rewrite --only-slow) or in slow age bands (estimate DIR).",
            scan.map(|s| s.slow_bytes as f64).or(r.estimate_files.as_ref().map(|e| e.cold_slow_bytes as f64)),
        ),
        (
            "cold_predicted_speedup",
            "A full read of the files refreshed against now (estimate DIR).",
            r.estimate_files.as_ref().map(|e| e.predicted_speedup),
        ),
        (
            "last_run_files_chosen_bytes",
            "Bytes of the files rewrite --only-slow/--older-than chose.",
            r.file_selection.as_ref().map(|s| s.bytes_chosen as f64),
        ),
    ]
}

/// The trim after a rewrite (or of `bench --trim-impact`), and what the host wrote.
fn trim_metrics(r: &Report) -> Vec<Metric> {
    let trim: Option<&TrimReport> =
        r.space.as_ref().and_then(|sp| sp.trim.as_ref()).or(r.trim_impact.as_ref().map(|t| &t.trim));
    let probe = trim.and_then(|t| t.probe.as_ref());
    vec![
        ("last_run_trimmed_bytes", "Bytes FITRIM discarded.", trim.map(|t| t.bytes_trimmed as f64)),
        ("last_run_trim_seconds", "Wall time of the sliced FITRIM, pauses included.", trim.map(|t| t.seconds)),
        (
            "last_run_trim_slowest_slice_seconds",
            "Longest single FITRIM slice (how long a reader could stall).",
            trim.map(|t| t.slowest_slice_seconds),
        ),
        (
            "trim_read_latency_p99_before_seconds",
            "Read latency p99 of the probe just before the trim.",
            probe.and_then(|p| p.before.p99_seconds),
        ),
        (
            "trim_read_latency_p99_during_seconds",
            "Read latency p99 of the probe during the trim.",
            probe.and_then(|p| p.during.p99_seconds),
        ),
        (
            "last_run_host_written_bytes",
            "Bytes the host wrote to the device during the run.",
            r.write_cost.as_ref().and_then(|w| w.host_bytes_written.map(|b| b as f64)),
        ),
    ]
}
