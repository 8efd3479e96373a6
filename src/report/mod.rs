//! The report of a run: one document, rendered as text for people or JSON for scripts
//! (see [`render`]). It depends on no command: commands fill it in, renderers read it.
//!
//! Field names are snake_case with units in the names (`_bytes`, `_seconds`). Bump
//! `SCHEMA_VERSION` on any incompatible change.

pub(crate) mod render;

use crate::measure::passes::WriteCost;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::identity::DeviceIdentity;
use crate::engine::{EngineConfig, EngineStats};
use crate::host::device::{BlockDeviceInfo, Medium};
use crate::host::freeze::FreezeBound;
use crate::host::mounts::MountedFs;
use crate::measure::bench::BenchResult;
use crate::measure::scan::{ScanResult, Selection};
use crate::measure::verdict::Verdict;
use crate::support::error::Error;
use crate::support::exit_codes::ExitCode;
use crate::support::units::now_rfc3339;

pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Report {
    pub(crate) schema_version: u32,
    pub(crate) tool: String,
    pub(crate) tool_version: String,
    pub(crate) command: String,
    pub(crate) argv: Vec<String>,
    /// What the command was given to work on (a device, files, sim:STATE), also when it
    /// failed before looking at it.
    #[serde(default)]
    pub(crate) targets: Vec<String>,
    pub(crate) host: String,
    pub(crate) started_at: String,
    pub(crate) finished_at: String,
    pub(crate) duration_seconds: f64,
    /// reseq's own peak resident memory, as the kernel counted it (its guardian apart):
    /// what a run of many files costs.
    #[serde(default)]
    pub(crate) peak_resident_bytes: Option<u64>,
    pub(crate) dry_run: bool,
    pub(crate) device: Option<DeviceReport>,
    pub(crate) plan: Option<PlanReport>,
    /// `rewrite --dry-run`, both modes: what the run will read, write, freeze and take,
    /// and what those figures rest on.
    #[serde(default)]
    pub(crate) prediction: Option<Prediction>,
    /// `rewrite`, both modes: the pipeline's depth (`--read-ahead`) the run uses, and
    /// why: given, or chosen by a probe of the device before the run (its rates).
    #[serde(default)]
    pub(crate) pipeline_depth: Option<crate::measure::depth_probe::DepthChoice>,
    pub(crate) results: Option<EngineStats>,
    /// `passed`, `failed`, `off`, or `incomplete` (stopped before the end).
    #[schemars(with = "String")]
    pub(crate) verification: Verification,
    /// Outcome of re-reading the chunk that was in flight when the previous run stopped:
    /// `intact`, `changed` (something wrote there since), or null.
    pub(crate) in_flight_reverify: Option<String>,
    /// `reseq bench`: the passes.
    pub(crate) bench: Option<BenchResult>,
    /// `reseq scan`: throughput by region.
    pub(crate) scan: Option<ScanResult>,
    /// `reseq scan --by-file`: throughput by file and age band.
    #[serde(default)]
    pub(crate) scan_files: Option<crate::measure::byfile::FileScan>,
    /// `reseq estimate DIR`: cold and slow data by age band, and a full read predicted
    /// now and refreshed.
    #[serde(default)]
    pub(crate) estimate_files: Option<crate::measure::cold_estimate::ColdEstimate>,
    /// `reseq estimate`: a sample and its prediction.
    #[serde(default)]
    pub(crate) estimate: Option<crate::measure::estimate::Estimate>,
    /// `rewrite --bench`: the same reads before and after the rewrite.
    pub(crate) bench_before: Option<BenchResult>,
    pub(crate) bench_after: Option<BenchResult>,
    pub(crate) scan_before: Option<ScanResult>,
    pub(crate) scan_after: Option<ScanResult>,
    pub(crate) verdict: Option<Verdict>,
    pub(crate) write_cost: Option<WriteCost>,
    /// `rewrite`: what was left out as free space, and what FITRIM discarded after.
    pub(crate) space: Option<SpaceReport>,
    /// `bench --trim-impact`: what a trim cost readers on that filesystem.
    #[serde(default)]
    pub(crate) trim_impact: Option<crate::measure::trim_impact::TrimImpact>,
    /// `rewrite --only-slow`: the regions chosen and left alone.
    pub(crate) selection: Option<Selection>,
    /// File mode with `--only-slow` or `--older-than`: which files were chosen, and why.
    #[serde(default)]
    pub(crate) file_selection: Option<FileSelection>,
    /// File mode: what was done to each file.
    pub(crate) files: Option<Vec<FileReport>>,
    /// Every freeze's limits, when the run froze anything.
    #[serde(default)]
    pub(crate) freeze_bound: Option<FreezeBound>,
    /// Where the freeze guardian goes (out of reseq's cgroup, or why it stays), when the
    /// run freezes anything.
    #[serde(default)]
    pub(crate) guardian: Option<String>,
    pub(crate) warnings: Vec<String>,
    pub(crate) outcome: Outcome,
    /// For a dry run, the plan as text (the human rendering of a dry run).
    #[serde(skip)]
    pub(crate) plan_text: Option<String>,
    /// For a dry run, the plan's line for each file (file mode), shown with `-v`.
    #[serde(skip)]
    pub(crate) plan_detail: Option<String>,
    /// The text lists every file of a file-mode run (`-v`), not only those with a problem.
    #[serde(skip)]
    pub(crate) every_file: bool,
}

/// Whether what was written was read back and compared: a run's and each file's. In
/// JSON and text the same words, lowercase, as they always were. A report with another
/// word is not one reseq wrote: it does not read back (serde names the word and the ones
/// expected).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verification {
    /// Every chunk written was read back and matched.
    Passed,
    /// A read-back differed, or a write failed.
    Failed,
    /// Nothing was checked: `--no-verify`, a dry run, a command that writes nothing, a
    /// file skipped.
    Off,
    /// Stopped before the end (and a run's state until it ends).
    #[default]
    Incomplete,
}

impl Verification {
    /// A run's verification, one rule for both modes: `ran` says the run got as far as
    /// writing (a device plan, or a file mode run's figures), `verify` that it read back.
    pub(crate) fn of(result: &Result<(), Error>, dry_run: bool, ran: bool, verify: bool) -> Verification {
        match result {
            Err(Error::ChecksumMismatch { .. } | Error::WriteFailed { .. }) => Verification::Failed,
            // Refused (before writing), or nothing read back: nothing verified.
            Err(Error::Refused { .. }) => Verification::Off,
            _ if dry_run || !ran || !verify => Verification::Off,
            Ok(()) => Verification::Passed,
            Err(_) => Verification::Incomplete,
        }
    }
}

impl std::fmt::Display for Verification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verification::Passed => "passed",
            Verification::Failed => "failed",
            Verification::Off => "off",
            Verification::Incomplete => "incomplete",
        })
    }
}

/// What file mode did to one file.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct FileReport {
    pub(crate) path: String,
    pub(crate) size_bytes: u64,
    /// Extents in the first map (null: the file was never mapped).
    pub(crate) extents: Option<usize>,
    pub(crate) bytes_rewritten: u64,
    pub(crate) bytes_skipped_unwritten: u64,
    /// Shared extents another file of this run already rewrote.
    pub(crate) bytes_skipped_shared: u64,
    /// Holes (never allocated, never written), for a file done to its end.
    pub(crate) bytes_skipped_holes: u64,
    /// Why the file was skipped, if it was (its bytes then count as not rewritten).
    pub(crate) skipped_reason: Option<String>,
    /// Why the file was left alone on purpose: empty (nothing to rewrite), or
    /// `--only-slow` and it reads fast enough.
    pub(crate) left_alone: Option<String>,
    /// `--only-slow`: the file's sequential read throughput before the run.
    pub(crate) read_bytes_per_second: Option<f64>,
    /// Resumed from this file offset.
    pub(crate) resumed_from_bytes: u64,
    /// Freezes the file was rewritten in (small files share them).
    pub(crate) windows: u64,
    /// The longest of those freezes, shared ones whole.
    pub(crate) longest_freeze_seconds: f64,
    /// `passed`, `off` or `incomplete`.
    #[schemars(with = "String")]
    pub(crate) verification: Verification,
    /// Finished by the interrupted run this one resumed: not rewritten again.
    #[serde(default)]
    pub(crate) done_earlier: bool,
    /// `--only-slow`/`--older-than`: why the file was chosen (null: not chosen, or
    /// every file was).
    #[serde(default)]
    pub(crate) chosen_because: Option<String>,
}

/// File mode's selection by `--only-slow` (a per-file scan) and `--older-than`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct FileSelection {
    /// The rule and its outcome, in words.
    pub(crate) rule: String,
    pub(crate) only_slow: bool,
    pub(crate) older_than_seconds: Option<f64>,
    pub(crate) files_chosen: usize,
    pub(crate) files_all: usize,
    pub(crate) bytes_chosen: u64,
    /// Bytes of all the files given: `bytes_chosen / bytes_all` is the share of a full
    /// rewrite.
    pub(crate) bytes_all: u64,
    /// Why a re-run with `--older-than` chooses the same files again.
    pub(crate) ages_after_rewrite: String,
    /// `--only-slow`: the per-file scan the choice was made on (as `scan --by-file`).
    pub(crate) scan: Option<crate::measure::byfile::FileScan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct DeviceReport {
    pub(crate) path: String,
    #[serde(flatten)]
    pub(crate) identity: DeviceIdentity,
    pub(crate) medium: Medium,
    pub(crate) dio_mem_align_bytes: u32,
    pub(crate) dio_offset_align_bytes: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct PlanReport {
    /// Device mode: the byte range rewritten; null in file mode (files are laid end to end,
    /// a run per filesystem).
    pub(crate) range_start_bytes: Option<u64>,
    pub(crate) range_end_bytes: Option<u64>,
    pub(crate) chunk_size_bytes: u64,
    /// Device mode: the range's chunks; file mode: the chunks the files' written extents
    /// make as mapped at the plan (a small file shares a chunk with its neighbours).
    pub(crate) chunks_total: u64,
    /// Device mode; 0 in file mode (see `files[].resumed_from_bytes`).
    pub(crate) resume_from_chunk: u64,
    pub(crate) verify: bool,
    pub(crate) read_ahead_chunks: usize,
    pub(crate) memory_bytes: u64,
    /// Null when nothing is mounted: no freeze, no windows.
    pub(crate) max_freeze_seconds: Option<f64>,
    pub(crate) pause_seconds: f64,
    pub(crate) hung_task_timeout_seconds: Option<u64>,
    pub(crate) filesystems_frozen: Vec<MountedFs>,
    /// Device mode: the journal; file mode: the run's record (each filesystem's journal
    /// lies beside it).
    pub(crate) journal_path: String,
    /// File mode: every file found, and what the run does with it; null in device mode.
    #[serde(default)]
    pub(crate) files: Option<Vec<PlannedFile>>,
    /// The chunk sizes and depths the run's first stretches try, the faster kept for the
    /// rest (`results.chunk_trial` says what they measured); null: none.
    #[serde(default)]
    pub(crate) chunk_trial: Option<crate::engine::trial::Trial>,
    /// Device mode: never-written space, the holes of the device's backing file: mapped
    /// or why not, what they leave out and what is left to rewrite; null in file mode.
    #[serde(default)]
    pub(crate) holes: Option<crate::host::holes::HolesPlanned>,
}

/// A file in a file-mode plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct PlannedFile {
    pub(crate) path: String,
    /// The mount point of its filesystem.
    pub(crate) filesystem: String,
    pub(crate) size_bytes: u64,
    /// Its written extents as mapped at the plan (holes, unwritten extents and ranges
    /// shared with a file before it left out); 0 when left alone or done earlier.
    pub(crate) bytes_to_rewrite: u64,
    /// Why the run leaves it alone (empty; not chosen by `--only-slow`/`--older-than`).
    pub(crate) left_alone: Option<String>,
    /// Finished by the interrupted run this one resumes: not rewritten again.
    pub(crate) done_earlier: bool,
    /// Where the interrupted run stopped in it: the resumed run starts there.
    pub(crate) resumed_from_bytes: u64,
}

/// What a dry run predicts of the run (`rewrite --dry-run`, both modes): its figures are
/// those of `results`, so that a run can be held against its plan. Each range is
/// `low`, `expected`, `high`: wider on a busy host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct Prediction {
    /// What the plan rewrites: the bytes in use (device mode with mounted ext4/xfs), the
    /// files' written extents (file mode), or the whole range.
    pub(crate) bytes_to_rewrite: u64,
    /// Read (what a window read ahead and dropped at its end counts again), written
    /// once, and read back (0 with `--no-verify`); short of `bytes_to_rewrite` only
    /// when the run stops at its overruns.
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_verified: u64,
    /// Chunks the bytes come in (file mode: pieces of files, joined where they are
    /// adjacent on the device, cut at the chunk size).
    pub(crate) chunks: u64,
    pub(crate) windows: CountRange,
    pub(crate) frozen_seconds: SecondsRange,
    pub(crate) longest_freeze_seconds: f64,
    /// The whole run: windows, the pauses between them (`--pause`, `--rate`) and the
    /// commits after them; not the benchmarks of `--bench`, nor the FITRIM after
    /// (unless `--trim-rate` sets its pace).
    pub(crate) duration_seconds: SecondsRange,
    /// Windows that would overrun their deadline, expected.
    pub(crate) windows_overrun: u64,
    /// The run would stop when `--max-overruns` windows had overrun (exit 7), before
    /// the end: the figures are up to there.
    pub(crate) stops_at_overruns: bool,
    /// The probe of each device: what the times rest on (empty: nothing to read).
    pub(crate) probes: Vec<crate::measure::plan_probe::PlanProbe>,
    /// What the figures rest on, in words (the dry run's text says the same).
    pub(crate) basis: Vec<String>,
}

/// A count predicted: what to expect, and the range it may fall in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct CountRange {
    pub(crate) low: u64,
    pub(crate) expected: u64,
    pub(crate) high: u64,
}

/// A time predicted, in seconds: what to expect, and the range it may fall in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct SecondsRange {
    pub(crate) low: f64,
    pub(crate) expected: f64,
    pub(crate) high: f64,
}

/// Used-space mode: free space skipped and trimmed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct SpaceReport {
    /// `used_space` (free space of mounted ext4/xfs left out) or `everything`.
    pub(crate) mode: String,
    /// Bytes passed over because the filesystems reported them FREE while frozen.
    pub(crate) bytes_skipped_as_free: u64,
    /// Bytes passed over because the device's backing file held no data there (holes,
    /// mapped in each window): never written, so never rewritten.
    #[serde(default)]
    pub(crate) bytes_skipped_as_holes: u64,
    /// Bytes FITRIM reported discarded after the run (null: not run).
    pub(crate) bytes_trimmed: Option<u64>,
    /// The FITRIM's slices, pace and cost (null: not run).
    #[serde(default)]
    pub(crate) trim: Option<crate::host::trim::TrimReport>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct Outcome {
    pub(crate) exit_code: i32,
    pub(crate) status: ExitCode,
    pub(crate) message: Option<String>,
    /// The device offset an error concerns, when there is one.
    pub(crate) offset_bytes: Option<u64>,
    /// Which stop, where the exit code has several causes: exit 7's `window_overruns`
    /// (`--max-overruns` windows overran), `bound_broken` (a window outlasted its hard
    /// bound) or `freeze_stuck` (a filesystem's freeze did not finish within the bound; the
    /// others were thawed at it). Null otherwise.
    #[serde(default)]
    pub(crate) cause: Option<String>,
}

/// What a rewrite planned, in either mode, as [`Report::set_plan`] records it. Borrowed
/// from the plan (rewrite's type, which depends on this module, not the other way round).
pub(crate) struct Planned<'a> {
    /// Device mode: the device and its range (the engine's); None in file mode, where the
    /// files are laid end to end, a run per filesystem, and each names its own.
    pub(crate) device: Option<&'a BlockDeviceInfo>,
    /// The engine's configuration: device mode's run; file mode's largest run. Its
    /// chunking, depth, verification, pause, chunk trial and memory are the plan's.
    pub(crate) engine: &'a EngineConfig,
    /// Device mode: the range's chunks; file mode: those its runs' written extents make.
    pub(crate) chunks_total: u64,
    /// File mode: every file found, and what the run does with it.
    pub(crate) files: Option<Vec<PlannedFile>>,
    /// Frozen in every window; empty when nothing is mounted.
    pub(crate) filesystems: &'a [MountedFs],
    /// Chunks an earlier run finished (0: a fresh run).
    pub(crate) resume_from_chunk: u64,
    /// The deadline of a window (None: nothing is frozen).
    pub(crate) max_freeze: Option<Duration>,
    pub(crate) hung_task_timeout: Option<Duration>,
    pub(crate) journal_path: &'a Path,
    pub(crate) warnings: &'a [String],
    /// Device mode: never-written space (None: file mode).
    pub(crate) holes: Option<&'a crate::host::holes::HolesPlanned>,
}

pub(crate) fn hostname() -> String {
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
}

impl Report {
    pub(crate) fn new(command: &str, dry_run: bool) -> Report {
        Report {
            schema_version: SCHEMA_VERSION,
            tool: "reseq".into(),
            tool_version: env!("CARGO_PKG_VERSION").into(),
            command: command.into(),
            argv: std::env::args().collect(),
            host: hostname(),
            started_at: now_rfc3339(),
            dry_run,
            verification: Verification::Incomplete,
            ..Report::default()
        }
    }

    /// Runs `body`, which fills in the report of `command` on `targets`, and records how
    /// it ended: a command's report holds its outcome too, also when it failed.
    pub(crate) fn of_run(
        command: &str,
        dry_run: bool,
        targets: &[impl AsRef<Path>],
        body: impl FnOnce(&mut Report) -> Result<(), Error>,
    ) -> (Report, Result<(), Error>) {
        let started = std::time::Instant::now();
        let mut report = Report::new(command, dry_run);
        report.targets = targets.iter().map(|t| t.as_ref().display().to_string()).collect();
        let result = body(&mut report);
        report.finish(started.elapsed(), &result);
        (report, result)
    }

    /// Records what `reseq rewrite` planned, in either mode: its device (device mode),
    /// its chunks, what it freezes, its files (file mode), and its warnings.
    pub(crate) fn set_plan(&mut self, plan: Planned<'_>) {
        self.device = plan.device.map(|d| DeviceReport {
            path: d.path.display().to_string(),
            identity: d.identity.clone(),
            medium: d.medium.clone(),
            dio_mem_align_bytes: d.dio_mem_align,
            dio_offset_align_bytes: d.dio_offset_align,
        });
        let e = plan.engine;
        let range = plan.device.map(|_| (e.range_start, e.range_end));
        self.plan = Some(PlanReport {
            range_start_bytes: range.map(|r| r.0),
            range_end_bytes: range.map(|r| r.1),
            chunk_size_bytes: e.chunk_size,
            chunks_total: plan.chunks_total,
            resume_from_chunk: plan.resume_from_chunk,
            verify: e.verify,
            read_ahead_chunks: e.read_ahead,
            memory_bytes: e.peak_memory_bytes(),
            max_freeze_seconds: plan.max_freeze.map(|m| m.as_secs_f64()),
            pause_seconds: e.pause.as_secs_f64(),
            hung_task_timeout_seconds: plan.hung_task_timeout.map(|t| t.as_secs()),
            filesystems_frozen: plan.filesystems.to_vec(),
            journal_path: plan.journal_path.display().to_string(),
            files: plan.files,
            chunk_trial: e.trial.clone(),
            holes: plan.holes.cloned(),
        });
        self.warnings.extend(plan.warnings.iter().cloned());
    }

    /// Records how the run ended.
    pub(crate) fn finish(&mut self, elapsed: Duration, result: &Result<(), Error>) {
        self.finished_at = now_rfc3339();
        self.duration_seconds = elapsed.as_secs_f64();
        self.peak_resident_bytes = crate::sys::process::peak_resident_bytes().ok();
        let verify_on = self.plan.as_ref().is_some_and(|p| p.verify);
        // How far it got: device mode writes once planned; file mode once it has figures
        // (its plan comes before the checks that may refuse every file).
        let ran = self.plan.as_ref().is_some_and(|p| p.files.is_none() || self.results.is_some());
        self.verification = Verification::of(result, self.dry_run, ran, verify_on);
        self.outcome = match result {
            Ok(()) => Outcome::default(),
            Err(e) => Outcome {
                exit_code: e.exit_code().code(),
                status: e.exit_code(),
                message: Some(crate::support::error::error_chain(e)),
                cause: e.cause().map(String::from),
                offset_bytes: match e {
                    Error::Io { offset, .. } => *offset,
                    Error::ChecksumMismatch { offset, .. } | Error::WriteFailed { offset, .. } => Some(*offset),
                    _ => None,
                },
            },
        };
    }

    /// How the run ended, by its cause where the exit code has several.
    pub(crate) fn outcome_cause(&self) -> &'static str {
        self.outcome.status.describe_cause(self.outcome.cause.as_deref())
    }

    /// What happened, in words that fit the command (a run that froze nothing says
    /// nothing of a thaw): a scan or a dry run wrote nothing,
    /// and a run without verification did not verify.
    pub(crate) fn outcome_text(&self) -> String {
        if self.outcome.exit_code != 0 && self.freeze_bound.is_none() {
            return without_thaw(self.outcome_cause());
        }
        if self.outcome.exit_code != 0 {
            return self.outcome_cause().into();
        }
        let written = self.results.as_ref().map_or(0, |r| r.bytes_written);
        // File mode and simulated drives have no plan: what was read back says it.
        let verified = self.results.as_ref().is_none_or(|r| r.bytes_verified >= r.bytes_written);
        match self.command.as_str() {
            "rewrite" if self.dry_run => "success: planned; nothing was written or frozen (dry run)".into(),
            "rewrite" if written == 0 && self.selection.is_some() => {
                "success: nothing read slowly, so nothing was rewritten".into()
            }
            "rewrite" if self.file_selection.as_ref().is_some_and(|s| s.files_chosen == 0) => {
                "success: no file was chosen, so nothing was rewritten".into()
            }
            "rewrite" if self.file_selection.is_some() => match verified {
                true => "success: the chosen files were rewritten and verified".into(),
                false => "success: the chosen files were rewritten (verification off)".into(),
            },
            "rewrite" if !verified => "success: everything was rewritten (verification off)".into(),
            "rewrite" => self.outcome.status.describe().into(),
            "bench" if self.trim_impact.is_some() => {
                "success: measured; the scratch file written for it was trimmed and removed".into()
            }
            _ => "success: measured; nothing was written".into(),
        }
    }
}

/// An outcome's words for a run that froze nothing (an unmounted device, a refusal
/// before the first window): "thawed" would not be true.
fn without_thaw(words: &str) -> String {
    [("stopped and thawed", "stopped"), ("stopped, thawed;", "stopped;"), ("; thawed;", ";"), ("; thawed,", ";")]
        .iter()
        .fold(words.to_string(), |w, (from, to)| w.replace(from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_froze_nothing_says_nothing_of_a_thaw() {
        for code in [ExitCode::Interrupted, ExitCode::Internal, ExitCode::IoError] {
            let mut r = Report::new("rewrite", false);
            (r.outcome.exit_code, r.outcome.status) = (code.code(), code);
            let words = r.outcome_text();
            assert!(!words.contains("thaw"), "{words}");
            assert!(words.len() > 10, "{words}");
        }
        assert_eq!(without_thaw(ExitCode::Interrupted.describe()), "interrupted by a signal; resumable with --resume");
    }

    /// The words are the JSON's and the text's, as reports always had them: old reports
    /// read back, and a word no reseq wrote is refused by name.
    #[test]
    fn one_verification_rule_for_both_modes() {
        let stopped = Err(Error::Stopped { signal: "SIGINT".into(), what: String::new() });
        let mismatch = Err(Error::Internal("x".into()));
        assert_eq!(Verification::of(&Ok(()), false, true, true), Verification::Passed);
        assert_eq!(Verification::of(&Ok(()), false, true, false), Verification::Off, "--no-verify");
        assert_eq!(Verification::of(&stopped, false, true, true), Verification::Incomplete);
        assert_eq!(Verification::of(&stopped, false, true, false), Verification::Off, "nothing read back");
        assert_eq!(Verification::of(&mismatch, false, false, true), Verification::Off, "refused before writing");
        assert_eq!(Verification::of(&Ok(()), true, true, true), Verification::Off, "a dry run");
    }

    #[test]
    fn verification_is_the_words_reports_always_had() {
        use Verification::*;
        let all = [Passed, Failed, Off, Incomplete];
        let json = serde_json::to_string(&all).unwrap();
        assert_eq!(json, r#"["passed","failed","off","incomplete"]"#);
        assert_eq!(serde_json::from_str::<Vec<Verification>>(&json).unwrap(), all);
        assert_eq!(all.map(|v| v.to_string()), ["passed", "failed", "off", "incomplete"]);
        let e = serde_json::from_str::<Verification>(r#""partial""#).unwrap_err().to_string();
        assert!(e.contains("unknown variant `partial`, expected one of `passed`"), "{e}");
    }
}
