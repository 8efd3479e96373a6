//! From the command line's values to the options of a run, in one place (as ripgrep's
//! `HiArgs::from_low_args`): the mode the targets call for and the rules across flags
//! that no single value parser can check. The bounds of single values (sizes, durations,
//! counts) are the value parsers' in `cli/mod.rs`.

use crate::cli::RewriteArgs;
use crate::options::bench::BenchOptions;
use crate::options::rewrite::{Given, Mode, RewriteOptions, RunOptions};
use crate::options::sim::{SimRewrite, sim_state};
use crate::support::error::{Error, Result};

/// What `reseq rewrite` was asked for: the one place that tells a simulated SSD
/// (`sim:STATE`) from devices and files.
pub(crate) enum Rewrite {
    Sim(SimRewrite, Option<BenchOptions>),
    Run(RewriteOptions),
}

pub(crate) fn rewrite(args: &RewriteArgs) -> Result<Rewrite> {
    match sim_state(args.device()) {
        Some(state) => crate::cli::lower::sim_rewrite(args, state).map(|(rw, bench)| Rewrite::Sim(rw, bench)),
        None => rewrite_options(args).map(Rewrite::Run),
    }
}

/// Which options with a default `rewrite`'s matches have from the command line (or a job
/// file, turned into one), by their clap ids: the one place they are named, since clap's
/// derive gives them no type.
pub(crate) fn given(sub: &clap::ArgMatches) -> Given {
    let on_command_line = |id: &str| {
        // A debug build knows the ids: a misspelt one is caught by the tests.
        debug_assert!(sub.try_get_raw(id).is_ok(), "{id} is not an option of rewrite");
        sub.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
    Given {
        chunk_size: on_command_line("chunk_size"),
        pause: on_command_line("pause"),
        max_overruns: on_command_line("max_overruns"),
        read_ahead: on_command_line("read_ahead"),
        scan_regions: on_command_line("scan_regions"),
        slow_threshold: on_command_line("slow_threshold"),
    }
}

/// `reseq rewrite`'s arguments for devices or files as options, with the flags the mode
/// does not take refused.
pub(crate) fn rewrite_options(args: &RewriteArgs) -> Result<RewriteOptions> {
    let o = lower(args, Mode::of(&args.targets));
    refuse_for_mode(&o)?;
    Ok(o)
}

/// The values as they are, typed already.
fn lower(a: &RewriteArgs, mode: Mode) -> RewriteOptions {
    RewriteOptions {
        mode,
        targets: a.targets.clone(),
        run: RunOptions {
            chunk_size: a.chunk_size,
            max_freeze: a.max_freeze,
            rate: a.rate,
            pause: match mode {
                Mode::Files if !a.given.pause => crate::options::rewrite::DEFAULT_FILE_PAUSE,
                _ => a.pause,
            },
            max_overruns: a.max_overruns,
            read_ahead: a.read_ahead,
            no_verify: a.no_verify,
            include_free: a.include_free,
            no_trim: a.no_trim,
            trim_rate: a.trim_rate,
            only_slow: a.only_slow,
            from_scan: a.from_scan.clone(),
            older_than: a.older_than,
            scan_regions: a.scan_regions,
            slow_threshold: a.slow_threshold,
            exclude: a.exclude.clone(),
            bench: a.bench,
        },
        force: a.force,
        accept_cgroup_risk: a.accept_cgroup_risk,
        dry_run: a.dry_run,
        resume: a.resume,
        restart: a.restart,
        state_dir: a.state_dir.clone(),
        bench_opts: crate::cli::lower::bench_options(&a.bench_opts),
        given: a.given,
    }
}

/// Which mode refuses which flags: file mode has no device regions and no FITRIM of its
/// own. (A simulated SSD's refusals are `cli::lower::sim_rewrite`'s, which builds its
/// options.)
fn refuse_for_mode(o: &RewriteOptions) -> Result<()> {
    match o.mode {
        Mode::Files if o.run.from_scan.is_some() || o.run.include_free || o.run.trim_rate.is_some() => Err(Error::Usage(
            "file mode does not take --from-scan, --include-free or --trim-rate (they are about a device's regions and the FITRIM after a device run)".into(),
        )),
        Mode::Device if o.run.older_than.is_some() => Err(Error::Usage(
            "--older-than chooses files by their age: give files or directories on mounted ext4/xfs (a block device has no file ages; --only-slow chooses a device's slow regions)".into(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(argv: &[&str]) -> RewriteArgs {
        match crate::cli::Cli::try_parse_from(["reseq", "rewrite"].iter().chain(argv)).unwrap().command {
            crate::cli::Command::Rewrite(a) => a,
            _ => unreachable!(),
        }
    }

    /// The clap defaults and `RewriteOptions::default()` are the same values.
    #[test]
    fn clap_defaults_are_the_typed_defaults() {
        let o = rewrite_options(&args(&["/dev/null"])).unwrap();
        let d = RewriteOptions::default();
        assert_eq!(
            (o.run.chunk_size, o.run.max_freeze, o.run.pause, o.run.rate),
            (d.run.chunk_size, d.run.max_freeze, d.run.pause, d.run.rate)
        );
        assert_eq!(
            (o.run.max_overruns, o.run.read_ahead, o.run.scan_regions),
            (d.run.max_overruns, d.run.read_ahead, d.run.scan_regions)
        );
        assert_eq!((o.run.slow_threshold, &o.state_dir), (d.run.slow_threshold, &d.state_dir));
        assert_eq!(o.bench_opts, d.bench_opts, "the --bench-* defaults");
        assert_eq!(o.mode, Mode::Device, "a character device goes to device mode, which says it is none");
    }

    /// Each option with a default, given (with its default value, too), is given; left
    /// out, it is not. A misspelt clap id in [`given`] would leave one false.
    #[test]
    fn every_option_with_a_default_is_told_given() {
        let parse = |argv: &[&str]| {
            let m = crate::cli::Cli::try_parse_given(["reseq", "rewrite"].iter().chain(argv)).unwrap();
            match m.command {
                crate::cli::Command::Rewrite(a) => rewrite_options(&a).unwrap().given,
                _ => unreachable!(),
            }
        };
        assert_eq!(parse(&["/dev/null"]), Given::default(), "nothing given");
        let all = [
            "--chunk-size=4M",
            "--pause=0s",
            "--max-overruns=3",
            "--read-ahead=2",
            "--scan-regions=64",
            "--slow-threshold=0.7",
        ];
        let every = Given {
            chunk_size: true,
            pause: true,
            max_overruns: true,
            read_ahead: true,
            scan_regions: true,
            slow_threshold: true,
        };
        assert_eq!(parse(&[&all[..], &["/dev/null"]].concat()), every, "the defaults, given");
        for (i, flag) in all.iter().enumerate() {
            let one = parse(&[flag, "/dev/null"]);
            let told =
                [one.chunk_size, one.pause, one.max_overruns, one.read_ahead, one.scan_regions, one.slow_threshold];
            assert_eq!(told.iter().filter(|g| **g).count(), 1, "{flag}: {one:?}");
            assert!(told[i], "{flag} is told given: {one:?}");
        }
    }

    #[test]
    fn modes_refuse_the_flags_they_do_not_take() {
        let e = rewrite_options(&args(&["--include-free", "/etc/hostname"])).unwrap_err().to_string();
        assert!(e.contains("file mode does not take"), "{e}");
        let e = rewrite_options(&args(&["--older-than", "90d", "/dev/null"])).unwrap_err().to_string();
        assert!(e.contains("--older-than chooses files"), "{e}");
        let o = rewrite_options(&args(&["--older-than", "6months", "--only-slow", "/etc/hostname"])).unwrap();
        assert_eq!(o.run.older_than.map(|d| d.as_secs() / 86_400), Some(182), "humantime's month is 30.44 days");
        let e = crate::cli::Cli::try_parse_from(["reseq", "rewrite", "--older-than", "old", "x"]).unwrap_err();
        assert!(e.to_string().contains("'--older-than <DURATION>'"), "{e}");
        assert!(matches!(rewrite(&args(&["sim:x"])).unwrap(), Rewrite::Sim(..)));
        assert!(matches!(rewrite(&args(&["/dev/sim:x"])).unwrap(), Rewrite::Run(_)));
        let e = crate::cli::Cli::try_parse_from(["reseq", "rewrite", "--chunk-size", "2G", "x"]).unwrap_err();
        assert!(e.to_string().contains("between 1 sector and 1 GiB"), "{e}");
    }
}
