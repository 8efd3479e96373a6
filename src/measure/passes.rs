//! The measurements `rewrite --bench` takes before and after (timed passes, then a
//! throughput map), and the write cost of a rewrite (host sectors written, NVMe SMART
//! counters).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::measure::bench::{self, BenchResult};
use crate::measure::{scan, verdict};

use crate::measure::readbench::{Source, Target, resolve_params};
use crate::measure::scan::ScanResult;
use crate::options::bench::BenchOptions;
use crate::support::error::{Error, Result};

/// The measurement `rewrite --bench` takes before and after, of a target opened by the
/// caller: timed passes, then one pass region by region for the throughput map.
pub(crate) fn measure_target(target: &Target, opts: &BenchOptions) -> Result<(BenchResult, ScanResult)> {
    let length = opts.length.map_or(target.len(), |l| l.min(target.len()));
    let params = resolve_params(target, opts.block_size, opts.queue_depth, 0, Some(length))?;
    let b = bench::bench(target, &params, opts.passes.max(1), opts.settle)?;
    let s = scan::scan(target, &params, (opts.regions.max(1), 1), 0.7)?;
    Ok((b, s))
}

/// The written data of `files`, laid end to end: file mode's `--bench` reads the files
/// themselves, through the filesystem (the path a backup or a sequential scan of a
/// database takes), one after the other.
pub(crate) fn files_target(files: &[&Path]) -> Result<Target> {
    let mut sources = files.iter().map(|f| Source::open(f)).collect::<Result<Vec<_>>>()?;
    // Written data only: a sparse file's holes read at memory speed.
    for s in &mut sources {
        let written = s.written_ranges()?;
        s.restrict(&written);
    }
    let target = Target::Real(sources.into_iter().filter(|s| s.len > 0).collect());
    if target.is_empty() {
        return Err(Error::Usage("--bench: the files hold no written data to read (holes only)".into()));
    }
    Ok(target)
}

/// The verdict's second looks, after the after-benchmark: more after-passes when the
/// first were too close to call ([`closer_look`]), then a change measured again
/// `opts.recheck` later (the same bytes, the same passes): the verdict stands only if it
/// lasts. A change is not re-checked where there is none, on a simulated SSD (no cache
/// below it), or with the re-check off. The rewrite is done by then: a look that cannot
/// be taken (a stop signal, files deleted meanwhile) leaves a change "unreliable",
/// saying why, and never fails the run.
pub(crate) fn recheck(
    v: Option<verdict::Verdict>,
    before: &BenchResult,
    after: &BenchResult,
    opts: &BenchOptions,
    stop: &crate::support::signals::StopFlag,
    target: impl Fn() -> Result<Target>,
) -> Option<verdict::Verdict> {
    let v = closer_look(v?, before, after, opts, &target);
    if !v.verdict.is_change() || opts.recheck.is_zero() || after.virtual_time {
        return Some(v);
    }
    match take_recheck(&v, before, after, opts, stop, target) {
        Ok(lasted) => Some(lasted),
        Err(e) => {
            let why = crate::support::error::error_chain(&e);
            log::warn!("the benchmark was not re-checked: {why}");
            let why = format!("not re-checked ({why}): a cache below the device cannot be ruled out");
            Some(verdict::unreliable_after(v, &why))
        }
    }
}

/// A verdict too close to call on the first after-passes ([`verdict::close_call`]),
/// decided again on up to [`verdict::EXTRA_PASSES_PER_PASS`] times as many more. The
/// before-passes cannot be taken again once the data is rewritten, so the extra passes
/// are after-passes, each after a pause as long as a pass: spread out in time, a
/// device's drift widens their spread, which the effect must exceed. Not on a simulated
/// SSD (its passes do not drift), nor for an "unreliable" verdict (more passes would not
/// make it reliable).
fn closer_look(
    v: verdict::Verdict,
    before: &BenchResult,
    after: &BenchResult,
    opts: &BenchOptions,
    target: &impl Fn() -> Result<Target>,
) -> verdict::Verdict {
    if v.verdict == verdict::Finding::Unreliable || after.virtual_time {
        return v;
    }
    let Some(why) = verdict::close_call(&before.rates(), &after.rates(), verdict::cache_bar(before, after).as_ref())
    else {
        return v;
    };
    let max = verdict::EXTRA_PASSES_PER_PASS * opts.passes.max(1);
    let took: f64 = after.passes.iter().map(|p| 2.0 * p.seconds).sum();
    // One line for a job's mail; the why in full with -v.
    log::info!(
        "too close to call at x{:.2} (x{:.2} needed): up to {max} more passes after the rewrite",
        v.speedup,
        v.needed_effect
    );
    log::debug!("too close to call: {why}");
    match target().and_then(|t| bench::more_passes(&t, after, max, took.max(verdict::CLOSER_LOOK_SECONDS))) {
        Ok(extra) => verdict::second_look(&v, before, after, extra, why),
        Err(e) if v.verdict == verdict::Finding::NoMeasurableChange => {
            log::warn!("the close call was not looked at again: {}", crate::support::error::error_chain(&e));
            v
        }
        Err(e) => {
            let (n, error) = (after.passes.len(), crate::support::error::error_chain(&e));
            verdict::unreliable_after(
                v,
                &format!("too close to call on {n} passes ({why}) and not measured again ({error})"),
            )
        }
    }
}

fn take_recheck(
    v: &verdict::Verdict,
    before: &BenchResult,
    after: &BenchResult,
    opts: &BenchOptions,
    stop: &crate::support::signals::StopFlag,
    target: impl Fn() -> Result<Target>,
) -> Result<verdict::Verdict> {
    log::info!(
        "reads after the rewrite x{:.2} those before: reading again in {} s to see that it lasts",
        v.speedup,
        opts.recheck.as_secs_f64()
    );
    log::debug!("re-sequencing lasts; a cache below the device fades");
    let waited = std::time::Instant::now();
    stop.sleep(opts.recheck);
    stop.check("the wait before the re-check")?;
    let waited = waited.elapsed();
    let target = target()?;
    let again = bench::bench(&target, &after.params, after.passes.len(), opts.settle)?;
    Ok(verdict::lasted(v.clone(), before, &again, waited))
}

/// What the rewrite cost the drive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct WriteCost {
    /// Delta of sectors written in `/sys/class/block/<dev>/stat`, in bytes (everything the
    /// host wrote to the device during the run, reseq's writes and anyone else's).
    pub(crate) host_bytes_written: Option<u64>,
    /// NVMe SMART "Data Units Written" (units of 512,000 bytes) before and after; null
    /// where the device is not NVMe or `smartctl --json` is unavailable.
    pub(crate) nvme_data_units_written_before: Option<u64>,
    pub(crate) nvme_data_units_written_after: Option<u64>,
    /// NVMe SMART "Percentage Used" before and after.
    pub(crate) nvme_percentage_used_before: Option<u64>,
    pub(crate) nvme_percentage_used_after: Option<u64>,
}

/// Sectors written so far to a block device, in bytes (`/sys/class/block/NAME/stat`
/// field 7; partitions have their own counters).
pub(crate) fn host_bytes_written(name: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).ok()?;
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

/// (data units written, percentage used) from `smartctl --json -A` output of an NVMe device.
pub(crate) fn parse_smartctl_nvme(json: &str) -> Option<(u64, u64)> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let log = v.get("nvme_smart_health_information_log")?;
    Some((log.get("data_units_written")?.as_u64()?, log.get("percentage_used")?.as_u64()?))
}

/// NVMe SMART counters of the disk holding `name`, through `smartctl --json` where it
/// is installed; None elsewhere (not NVMe, no smartctl, or the device refuses).
pub(crate) fn nvme_smart(name: &str, parent: Option<&str>) -> Option<(u64, u64)> {
    let disk = parent.unwrap_or(name);
    if !disk.starts_with("nvme") {
        return None;
    }
    // Its exit status is a bit mask that can be non-zero with the counters read: the JSON
    // says. A drive that hangs it costs the counters, not the run.
    let smartctl = crate::support::tool::Tool::new("smartctl")
        .args(["--json", "-A"])
        .arg(format!("/dev/{disk}"))
        .output_within(SMARTCTL_LIMIT);
    match smartctl {
        Ok(out) => parse_smartctl_nvme(&String::from_utf8_lossy(&out.stdout)),
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| log::info!("the NVMe write counters are left out (smartmontools): {e}"));
            None
        }
    }
}

/// How long `smartctl` may take to read a drive's counters.
const SMARTCTL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the host writes to a device during a run, and the wear its SMART counters show
/// (NVMe): the counters at the start of a run, compared with those at its end.
pub(crate) struct Cost {
    name: String,
    parent: Option<String>,
    host: Option<u64>,
    smart: Option<(u64, u64)>,
}

impl Cost {
    pub(crate) fn start(name: &str, parent: Option<&str>) -> Cost {
        let (host, smart) = (host_bytes_written(name), nvme_smart(name, parent));
        Cost { name: name.into(), parent: parent.map(Into::into), host, smart }
    }

    pub(crate) fn end(self) -> WriteCost {
        let after = Cost::start(&self.name, self.parent.as_deref());
        WriteCost {
            host_bytes_written: self.host.zip(after.host).map(|(a, b)| b.saturating_sub(a)),
            nvme_data_units_written_before: self.smart.map(|s| s.0),
            nvme_data_units_written_after: after.smart.map(|s| s.0),
            nvme_percentage_used_before: self.smart.map(|s| s.1),
            nvme_percentage_used_after: after.smart.map(|s| s.1),
        }
    }
}

/// The cost of runs one after another (file mode's filesystems): the host's bytes
/// added; the drive's counters from the first before to the last after, when every run
/// was on the same drive (`same_drive`), else none.
pub(crate) fn add_cost(total: Option<WriteCost>, next: WriteCost, same_drive: bool) -> WriteCost {
    let Some(t) = total else { return next };
    let smart = |a: Option<u64>, b: Option<u64>| if same_drive { a.or(b) } else { None };
    WriteCost {
        host_bytes_written: t.host_bytes_written.zip(next.host_bytes_written).map(|(a, b)| a + b),
        nvme_data_units_written_before: smart(t.nvme_data_units_written_before, next.nvme_data_units_written_before),
        nvme_data_units_written_after: smart(next.nvme_data_units_written_after, t.nvme_data_units_written_after),
        nvme_percentage_used_before: smart(t.nvme_percentage_used_before, next.nvme_percentage_used_before),
        nvme_percentage_used_after: smart(next.nvme_percentage_used_after, t.nvme_percentage_used_after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_call_reads_more_after_passes_of_the_same_bytes() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, vec![7u8; 2 << 20]).unwrap();
        let rates = |r: &[f64]| r.iter().map(|x| x * 1e6).collect::<Vec<f64>>();
        let before = bench::tests::bench_of(&rates(&[100.0, 101.0, 102.0]));
        let after = bench::tests::bench_of(&rates(&[152.0, 153.0, 154.0]));
        let first = verdict::verdict_of(&before, &after);
        let opts = BenchOptions::default();
        let v = closer_look(first, &before, &after, &opts, &|| files_target(&[file.as_path()]));
        let look = v.closer_look.as_ref().expect("x1.52 is a close call");
        assert_eq!((look.first_verdict, look.passes.len()), (verdict::Finding::Faster, 6), "{v:?}");
        assert!(look.passes.iter().all(|p| p.bytes == 1 << 20), "the same 1 MiB as the after-benchmark");
        assert!(v.rule.contains("9 after-passes"), "{}", v.rule);
        // A clear result is not looked at again.
        let clear = bench::tests::bench_of(&rates(&[300.0, 301.0, 302.0]));
        let v = closer_look(verdict::verdict_of(&before, &clear), &before, &clear, &opts, &|| unreachable!());
        assert!(v.closer_look.is_none() && v.verdict == verdict::Finding::Faster, "{v:?}");
    }

    #[test]
    fn parses_smartctl_nvme_json() {
        // Shape of `smartctl --json -A /dev/nvme0` (smartmontools 7.x).
        let json = r#"{"smartctl":{"version":[7,3]},"device":{"name":"/dev/nvme0","type":"nvme"},
            "nvme_smart_health_information_log":{"critical_warning":0,"temperature":38,
            "percentage_used":3,"data_units_read":123456,"data_units_written":987654}}"#;
        assert_eq!(parse_smartctl_nvme(json), Some((987_654, 3)));
        assert_eq!(parse_smartctl_nvme(r#"{"device":{"type":"sat"}}"#), None);
    }
}
