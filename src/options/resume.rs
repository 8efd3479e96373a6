//! The options that shape a rewrite, stored with its run so that `--resume` continues
//! an interrupted run as it was started: a timer job resumed with a plain `--resume`
//! must not switch to 5 s windows because its first run said `--max-freeze 300ms`.
//!
//! The rule (documented in the man page): an option left out of the resuming command
//! takes the interrupted run's value; an option given with a value that differs from it
//! is refused (exit 2), since a run half done one way and half another is neither.
//! Options at their default count as left out. Pacing options (`--rate`, `--pause`,
//! `--max-overruns`, `--read-ahead`, `--trim-rate`) say how, not what: given, they
//! replace the run's, with a warning.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cli::{self, RewriteArgs};
use crate::support::error::{Error, Result};
use crate::support::units;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    pub chunk_size: String,
    pub max_freeze: Option<String>,
    pub rate: Option<String>,
    pub pause: String,
    pub max_overruns: u32,
    pub read_ahead: usize,
    pub no_verify: bool,
    pub include_free: bool,
    pub no_trim: bool,
    /// `--trim-rate` (pacing; absent from runs recorded before it existed).
    #[serde(default)]
    pub trim_rate: Option<String>,
    pub only_slow: bool,
    pub from_scan: Option<PathBuf>,
    pub scan_regions: usize,
    pub slow_threshold: f64,
    pub exclude: Vec<String>,
}

/// A numeric option: given (not at its default) or the run's, through `take`.
fn number<T: PartialEq + ToString + std::str::FromStr>(
    take: &mut impl FnMut(&str, Kind, Option<String>, Option<String>) -> Option<String>,
    name: &str,
    given: T,
    stored: T,
    default: T,
) -> T {
    let given = (given != default).then(|| given.to_string());
    take(name, Kind::Plain, given, Some(stored.to_string())).and_then(|v| v.parse().ok()).unwrap_or(default)
}

// slow_threshold is checked to lie in (0, 1]: never NaN.
impl Eq for RunOptions {}

/// How two values of an option compare: sizes and durations by what they mean
/// (`300ms` is `0.3s`), the rest as written.
#[derive(Clone, Copy)]
enum Kind {
    Size,
    /// A size per second: `100M` or `100M/s`.
    Rate,
    Duration,
    Plain,
}

fn same(kind: Kind, a: &str, b: &str) -> bool {
    match kind {
        Kind::Size => units::parse_size(a).ok().zip(units::parse_size(b).ok()).is_some_and(|(x, y)| x == y) || a == b,
        Kind::Rate => {
            let r = |s: &str| units::parse_size(s.trim_end_matches("/s")).ok();
            r(a).zip(r(b)).is_some_and(|(x, y)| x == y) || a == b
        }
        Kind::Duration => {
            units::parse_duration(a).ok().zip(units::parse_duration(b).ok()).is_some_and(|(x, y)| x == y) || a == b
        }
        Kind::Plain => a == b,
    }
}

impl RunOptions {
    pub fn of(args: &RewriteArgs) -> RunOptions {
        RunOptions {
            chunk_size: args.chunk_size.clone(),
            max_freeze: args.max_freeze.clone(),
            rate: args.rate.clone(),
            pause: args.pause.clone(),
            max_overruns: args.max_overruns,
            read_ahead: args.read_ahead,
            no_verify: args.no_verify,
            include_free: args.include_free,
            no_trim: args.no_trim,
            trim_rate: args.trim_rate.clone(),
            only_slow: args.only_slow,
            from_scan: args.from_scan.clone(),
            scan_regions: args.scan_regions,
            slow_threshold: args.slow_threshold,
            exclude: args.exclude.clone(),
        }
    }

    /// The options as command-line text, for messages and `reseq status`.
    pub fn describe(&self) -> String {
        let mut s = vec![format!("--chunk-size {}", self.chunk_size)];
        let mut opt = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                s.push(if v.is_empty() { name.to_string() } else { format!("{name} {v}") });
            }
        };
        opt("--max-freeze", self.max_freeze.clone());
        opt("--rate", self.rate.clone());
        opt("--pause", (self.pause != cli::DEFAULT_PAUSE).then(|| self.pause.clone()));
        opt("--max-overruns", (self.max_overruns != cli::DEFAULT_MAX_OVERRUNS).then(|| self.max_overruns.to_string()));
        opt("--read-ahead", (self.read_ahead != cli::DEFAULT_READ_AHEAD).then(|| self.read_ahead.to_string()));
        opt("--no-verify", self.no_verify.then(String::new));
        opt("--include-free", self.include_free.then(String::new));
        opt("--no-trim", self.no_trim.then(String::new));
        opt("--trim-rate", self.trim_rate.clone());
        opt("--only-slow", self.only_slow.then(String::new));
        opt("--from-scan", self.from_scan.as_ref().map(|p| p.display().to_string()));
        opt("--scan-regions", (self.scan_regions != cli::DEFAULT_SCAN_REGIONS).then(|| self.scan_regions.to_string()));
        opt(
            "--slow-threshold",
            (self.slow_threshold != cli::DEFAULT_SLOW_THRESHOLD).then(|| self.slow_threshold.to_string()),
        );
        for e in &self.exclude {
            opt("--exclude", Some(e.clone()));
        }
        s.join(" ")
    }

    /// `args` with this run's options in place of those left out; an error naming the
    /// first option given with another value. `default_max_freeze` is the mode's (a run
    /// started without `--max-freeze` had it).
    pub fn apply(&self, args: &RewriteArgs, default_max_freeze: &str) -> Result<RewriteArgs> {
        let mut out = args.clone();
        // The first option given otherwise: (name and value, what the run had).
        let mut conflict: Option<(String, Option<String>)> = None;
        let mut take = |name: &str, kind: Kind, given: Option<String>, stored: Option<String>| -> Option<String> {
            let named = |g: &str| if g.is_empty() { name.to_string() } else { format!("{name} {g}") };
            match (&given, &stored) {
                (Some(g), Some(s)) if !same(kind, g, s) => {
                    conflict.get_or_insert((named(g), Some(s.clone())));
                    given
                }
                (Some(g), None) => {
                    conflict.get_or_insert((named(g), None));
                    given
                }
                _ => stored,
            }
        };
        let given = |set: bool, v: String| set.then_some(v);
        let flag = |b: bool| b.then(String::new);
        out.chunk_size = take(
            "--chunk-size",
            Kind::Size,
            given(args.chunk_size != cli::DEFAULT_CHUNK_SIZE, args.chunk_size.clone()),
            Some(self.chunk_size.clone()),
        )
        .unwrap_or_else(|| cli::DEFAULT_CHUNK_SIZE.into());
        let stored_freeze = self.max_freeze.clone().unwrap_or_else(|| default_max_freeze.to_string());
        out.max_freeze = take("--max-freeze", Kind::Duration, args.max_freeze.clone(), Some(stored_freeze))
            .filter(|_| self.max_freeze.is_some() || args.max_freeze.is_some());
        // Pacing (how fast the run goes and how many overruns it bears, not what it
        // rewrites) may change on a resume: a host that got busier needs slower windows
        // or more patience. The change is said.
        let mut pace = |name: &str, kind: Kind, given: Option<String>, stored: Option<String>| -> Option<String> {
            match (&given, &stored) {
                (Some(g), s) if s.as_deref().is_none_or(|s| !same(kind, g, s)) => {
                    log::warn!("{name} {g} replaces the interrupted run's {}", s.as_deref().unwrap_or("default"));
                    given
                }
                (Some(_), _) => given,
                (None, _) => stored,
            }
        };
        out.rate = pace("--rate", Kind::Rate, args.rate.clone(), self.rate.clone());
        out.trim_rate = pace("--trim-rate", Kind::Rate, args.trim_rate.clone(), self.trim_rate.clone());
        out.pause = pace(
            "--pause",
            Kind::Duration,
            given(args.pause != cli::DEFAULT_PAUSE, args.pause.clone()),
            Some(self.pause.clone()),
        )
        .unwrap_or_else(|| cli::DEFAULT_PAUSE.into());
        out.max_overruns =
            number(&mut pace, "--max-overruns", args.max_overruns, self.max_overruns, cli::DEFAULT_MAX_OVERRUNS);
        out.read_ahead = number(&mut pace, "--read-ahead", args.read_ahead, self.read_ahead, cli::DEFAULT_READ_AHEAD);
        out.no_verify = take("--no-verify", Kind::Plain, flag(args.no_verify), flag(self.no_verify)).is_some();
        out.include_free =
            take("--include-free", Kind::Plain, flag(args.include_free), flag(self.include_free)).is_some();
        out.no_trim = take("--no-trim", Kind::Plain, flag(args.no_trim), flag(self.no_trim)).is_some();
        out.only_slow = take("--only-slow", Kind::Plain, flag(args.only_slow), flag(self.only_slow)).is_some();
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        out.from_scan =
            take("--from-scan", Kind::Plain, path(&args.from_scan), path(&self.from_scan)).map(PathBuf::from);
        out.scan_regions =
            number(&mut take, "--scan-regions", args.scan_regions, self.scan_regions, cli::DEFAULT_SCAN_REGIONS);
        out.slow_threshold = number(
            &mut take,
            "--slow-threshold",
            args.slow_threshold,
            self.slow_threshold,
            cli::DEFAULT_SLOW_THRESHOLD,
        );
        // Patterns as a list: `--exclude 'a,b'` is not `--exclude a --exclude b`.
        if !args.exclude.is_empty() && args.exclude != self.exclude {
            let shown = |v: &[String]| v.iter().map(|e| format!("'{e}'")).collect::<Vec<_>>().join(" ");
            let had = (!self.exclude.is_empty()).then(|| shown(&self.exclude));
            conflict.get_or_insert((format!("--exclude {}", shown(&args.exclude)), had));
        }
        out.exclude = self.exclude.clone();
        if let Some((given, had)) = conflict {
            let name = given.split(' ').next().unwrap_or_default().to_string();
            let what = match had {
                Some(h) => format!("{given} differs from the interrupted run's {h}"),
                None => format!("{given} was not an option of the interrupted run"),
            };
            return Err(Error::Usage(format!(
                "{what}: --resume continues a run with the options it was started with (leave {name} out to keep them, or pass --restart to start over with new ones)"
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> RewriteArgs {
        let argv = ["reseq", "rewrite", "/dev/null"].iter().chain(extra);
        match cli::Cli::try_parse_from(argv).unwrap().command {
            cli::Command::Rewrite(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn options_left_out_take_the_runs_and_a_different_one_is_refused() {
        let stored = RunOptions::of(&args(&["--max-freeze", "300ms", "--include-free", "--chunk-size", "1M"]));
        let got = stored.apply(&args(&["--resume"]), "5s").unwrap();
        assert_eq!(got.max_freeze.as_deref(), Some("300ms"));
        assert!(got.include_free && got.resume);
        assert_eq!(got.chunk_size, "1M");
        // The same meaning, written otherwise, is the same option.
        let got = stored.apply(&args(&["--max-freeze", "0.3s", "--chunk-size", "1024K"]), "5s").unwrap();
        assert_eq!(got.max_freeze.as_deref(), Some("300ms"));
        let e = stored.apply(&args(&["--max-freeze", "2s"]), "5s").unwrap_err().to_string();
        assert!(e.contains("--max-freeze 2s differs from the interrupted run's 300ms"), "{e}");
        let e = stored.apply(&args(&["--no-verify"]), "5s").unwrap_err().to_string();
        assert!(e.contains("--no-verify was not an option of the interrupted run"), "{e}");
        // Pacing may change: a busier host needs slower windows or more overruns.
        let got = stored.apply(&args(&["--rate", "10M", "--max-overruns", "50", "--trim-rate", "1G"]), "5s").unwrap();
        assert_eq!((got.rate.as_deref(), got.max_overruns), (Some("10M"), 50));
        assert_eq!(got.trim_rate.as_deref(), Some("1G"), "--trim-rate is pacing: it may change");
        let trimmed = RunOptions::of(&args(&["--trim-rate", "200M"]));
        assert_eq!(trimmed.apply(&args(&["--resume"]), "5s").unwrap().trim_rate.as_deref(), Some("200M"), "kept");
        assert!(trimmed.describe().ends_with("--trim-rate 200M"));
        // A run recorded before --trim-rate existed reads back without it.
        let old = r#"{"chunk_size":"4M","max_freeze":null,"rate":null,"pause":"0s","max_overruns":3,"read_ahead":2,"no_verify":false,"include_free":false,"no_trim":false,"only_slow":false,"from_scan":null,"scan_regions":64,"slow_threshold":0.7,"exclude":[]}"#;
        assert_eq!(serde_json::from_str::<RunOptions>(old).unwrap().trim_rate, None);
        // The mode's default --max-freeze, given, is what a run without one had.
        let plain = RunOptions::of(&args(&[]));
        assert!(plain.apply(&args(&["--max-freeze", "1s"]), "1s").is_ok());
        assert!(plain.apply(&args(&["--max-freeze", "2s"]), "1s").is_err());
        let rated = RunOptions::of(&args(&["--rate", "100M"]));
        assert!(rated.apply(&args(&["--rate", "100M/s"]), "5s").is_ok(), "the same rate, written otherwise");
        let ex = RunOptions::of(&args(&["--exclude", "a", "--exclude", "b"]));
        assert!(ex.apply(&args(&["--exclude", "a,b"]), "1s").is_err(), "one pattern is not two");
        assert_eq!(ex.apply(&args(&[]), "1s").unwrap().exclude, ["a", "b"]);
        assert_eq!(stored.describe(), "--chunk-size 1M --max-freeze 300ms --include-free", "options as a command line");
    }
}
