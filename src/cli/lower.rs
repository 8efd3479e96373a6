//! From parsed arguments to typed options, for every command but a rewrite of a device
//! or files: each bound and cross-flag rule of those commands is here, with the flag it
//! is about in its message, so the layers below take values that are already checked.

use crate::cli::{
    BenchArgs, BenchOpts, EstimateArgs, ReadArgs, RestoreArgs, RewriteArgs, ScanArgs, SimCommand, SimRangeArgs,
    SimulateArgs,
};
use crate::options::bench::{
    BenchCommand, BenchOptions, EstimateOptions, FileSort, ReadOptions, ScanOptions, TrimImpactOptions,
};
use crate::options::restore::RestoreOptions;
use crate::options::sim::{Override, SimRange, SimRewrite, SimStep, SimulateOptions, SlowScan};
use crate::support::error::{Error, Result};
use crate::support::units::parse_size;

/// The `--bench-*` options of a rewrite.
pub(crate) fn bench_options(o: &BenchOpts) -> BenchOptions {
    BenchOptions {
        block_size: o.block_size.bytes(),
        queue_depth: o.queue_depth,
        passes: o.passes,
        settle: o.settle,
        regions: o.regions,
        length: o.length.map(|l| l.bytes()),
        recheck: o.recheck,
    }
}

fn read_options(a: &ReadArgs) -> ReadOptions {
    ReadOptions {
        target: a.target.clone(),
        length: a.length.map(|l| l.bytes()),
        block_size: a.block_size.bytes(),
        queue_depth: a.queue_depth,
        offset: a.offset.bytes(),
        include_free: a.include_free,
    }
}

/// `reseq bench`: `--trim-impact` takes only its own options and the target.
pub(crate) fn bench(a: &BenchArgs) -> BenchCommand {
    if a.trim_impact {
        let size = a.trim_size.bytes();
        let rate = a.trim_rate.map(|r| r.bytes_per_second());
        return BenchCommand::TrimImpact(TrimImpactOptions { target: a.read.target.clone(), size, rate });
    }
    BenchCommand::Passes { read: read_options(&a.read), passes: a.passes, settle: a.settle }
}

/// `reseq scan`.
pub(crate) fn scan(a: &ScanArgs) -> ScanOptions {
    let sort = match a.sort {
        crate::cli::FileOrder::Age => FileSort::Age,
        crate::cli::FileOrder::Throughput => FileSort::Throughput,
    };
    ScanOptions {
        read: read_options(&a.read),
        regions: a.regions,
        threshold: a.threshold,
        by_file: a.by_file.then_some(sort),
    }
}

/// `reseq estimate`.
pub(crate) fn estimate(a: &EstimateArgs) -> EstimateOptions {
    EstimateOptions { target: a.target.clone(), sample: a.sample.bytes(), regions: a.regions }
}

/// `reseq restore`.
pub(crate) fn restore(a: &RestoreArgs) -> RestoreOptions {
    RestoreOptions {
        rescue: a.rescue.clone(),
        force: a.force,
        forget: a.forget,
        device: a.device.clone(),
        max_freeze: a.max_freeze,
        accept_cgroup_risk: a.accept_cgroup_risk,
    }
}

/// `--set KEY=VALUE` overrides: a `*_bytes` key takes a size, any other a JSON value or,
/// failing that, a word.
fn overrides(set: &[String]) -> Result<Vec<Override>> {
    set.iter()
        .map(|o| {
            let (k, v) = o.split_once('=').ok_or_else(|| Error::Usage(format!("--set {o}: expected KEY=VALUE")))?;
            let value = if k.ends_with("_bytes") {
                serde_json::json!(parse_size(v).map_err(|e| Error::Usage(format!("--set {k}: {e}")))?)
            } else {
                serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()))
            };
            Ok(Override { key: k.to_string(), value })
        })
        .collect()
}

/// `reseq simulate`.
pub(crate) fn simulate(a: &SimulateArgs) -> Result<SimulateOptions> {
    Ok(SimulateOptions {
        preset: a.preset.clone(),
        device_size: a.device_size.bytes(),
        set: overrides(&a.set)?,
        // Half the device by default, in whole 4 KiB blocks.
        file_size: a.file_size.map_or((a.device_size.bytes() / 2) & !4095, |f| f.bytes()),
        stages: a.stages.clone(),
        chunk_size: a.chunk_size.bytes(),
        seed: a.seed,
    })
}

fn sim_range(r: &SimRangeArgs) -> SimRange {
    SimRange { offset: r.offset.bytes(), length: r.length.map(|l| l.bytes()) }
}

/// One step of `reseq sim …`.
pub(crate) fn sim_step(c: &SimCommand) -> Result<SimStep> {
    Ok(match c {
        SimCommand::Create { state, preset, device_size, set } => SimStep::Create {
            state: state.clone(),
            preset: preset.clone(),
            device_size: device_size.bytes(),
            set: overrides(set)?,
        },
        SimCommand::Write { state, range } => SimStep::Write { state: state.clone(), range: sim_range(range) },
        SimCommand::Fragment { state, range, random_writes, seed } => SimStep::Fragment {
            state: state.clone(),
            range: sim_range(range),
            random_writes: random_writes.bytes(),
            seed: *seed,
        },
        SimCommand::Read { state, range, block_size, queue_depth } => SimStep::Read {
            state: state.clone(),
            range: sim_range(range),
            block_size: block_size.bytes(),
            queue_depth: *queue_depth,
        },
        SimCommand::Rewrite { state, range, chunk_size, no_verify, only_slow, scan_regions, slow_threshold } => {
            SimStep::Rewrite(SimRewrite {
                state: state.clone(),
                range: sim_range(range),
                chunk_size: chunk_size.bytes(),
                verify: !no_verify,
                only_slow: only_slow.then_some(SlowScan { regions: *scan_regions, threshold: *slow_threshold }),
            })
        }
        SimCommand::Info { state } => SimStep::Info { state: state.clone() },
        SimCommand::Age { state, days } => SimStep::Age { state: state.clone(), days: *days },
        SimCommand::Serve { state, mount_dir, time_scale } => {
            SimStep::Serve { state: state.clone(), mount_dir: mount_dir.clone(), time_scale: *time_scale }
        }
    })
}

/// `reseq rewrite sim:STATE`: the whole simulated device, with the options that apply to
/// it (chunk size, verification, --only-slow, --bench); device-only options are refused.
pub(crate) fn sim_rewrite(a: &RewriteArgs, state: std::path::PathBuf) -> Result<(SimRewrite, Option<BenchOptions>)> {
    if a.from_scan.is_some() || a.resume || a.dry_run || a.older_than.is_some() {
        return Err(Error::Usage(
            "on a simulated SSD, rewrite takes --chunk-size, --no-verify, --only-slow and --bench".into(),
        ));
    }
    let rewrite = SimRewrite {
        state,
        range: SimRange::default(),
        chunk_size: a.chunk_size.bytes(),
        verify: !a.no_verify,
        only_slow: a.only_slow.then_some(SlowScan { regions: a.scan_regions, threshold: a.slow_threshold }),
    };
    Ok((rewrite, a.bench.then(|| bench_options(&a.bench_opts))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn command(argv: &[&str]) -> Command {
        Cli::try_parse_from(["reseq"].iter().chain(argv)).unwrap().command
    }

    #[test]
    fn defaults_are_the_command_lines() {
        let Command::Simulate(a) = command(&["simulate"]) else { panic!("simulate") };
        assert_eq!(simulate(&a).unwrap(), SimulateOptions::default());
        let Command::Simulate(a) = command(&["simulate", "--device-size", "512M"]) else { panic!("simulate") };
        assert_eq!(simulate(&a).unwrap().file_size, 256 << 20);
        let Command::Rewrite(a) = command(&["rewrite", "/dev/null"]) else { panic!("rewrite") };
        assert_eq!(bench_options(&a.bench_opts), BenchOptions::default());
    }

    #[test]
    fn bad_values_name_their_flag() {
        // Sizes are typed by clap's value parser: its error names the flag.
        let e = Cli::try_parse_from(["reseq", "simulate", "--file-size", "4Q"]).unwrap_err().to_string();
        assert!(e.contains("'--file-size <SIZE>'"), "{e}");
        let Command::Simulate(a) = command(&["simulate", "--set", "flash_bytes=x"]) else { panic!("simulate") };
        assert!(simulate(&a).unwrap_err().to_string().starts_with("--set flash_bytes: "));
        let Command::Simulate(a) = command(&["simulate", "--set", "t_read_us"]) else { panic!("simulate") };
        assert!(simulate(&a).unwrap_err().to_string().contains("expected KEY=VALUE"));
        let e = Cli::try_parse_from(["reseq", "bench", "/x", "--trim-impact", "--trim-size", "512K"]).unwrap_err();
        assert!(e.to_string().contains("must be at least 1M"), "{e}");
        let e = Cli::try_parse_from(["reseq", "restore", "/x", "--max-freeze", "5ms"]).unwrap_err().to_string();
        assert!(e.contains("'--max-freeze <DURATION>'") && e.contains("outside 10ms..1h"), "{e}");
    }

    #[test]
    fn a_sim_rewrite_refuses_what_only_a_device_has() {
        let Command::Rewrite(a) = command(&["rewrite", "sim:/tmp/s", "--resume"]) else { panic!("rewrite") };
        assert!(sim_rewrite(&a, "/tmp/s".into()).unwrap_err().to_string().contains("on a simulated SSD"));
        let Command::Rewrite(a) = command(&["rewrite", "sim:/tmp/s", "--only-slow", "--bench"]) else {
            panic!("rewrite")
        };
        let (rw, bench) = sim_rewrite(&a, "/tmp/s".into()).unwrap();
        assert_eq!(rw.state, std::path::PathBuf::from("/tmp/s"));
        assert_eq!(rw.only_slow, Some(SlowScan { regions: 64, threshold: 0.7 }));
        assert_eq!(bench, Some(BenchOptions::default()));
    }
}
