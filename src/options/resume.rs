//! The options that shape a rewrite, stored with its run so that `--resume` continues
//! an interrupted run as it was started: a timer job resumed with a plain `--resume`
//! must not switch to 5 s windows because its first run said `--max-freeze 300ms`.
//!
//! The rule (documented in the man page): an option left out of the resuming command
//! takes the interrupted run's value; an option given with a value that differs from it
//! is refused (exit 2), since a run half done one way and half another is neither.
//! An option given with its default value is given. Pacing options (`--max-freeze`,
//! `--rate`, `--pause`, `--max-overruns`, `--read-ahead`, `--trim-rate`) say how, not
//! what: given, they replace the run's for this run, with a warning (a later plain
//! `--resume` goes back to the run's own).

use std::fmt::Display;
use std::path::PathBuf;
use std::time::Duration;

use crate::options::rewrite::{self as defaults, Given, RewriteOptions, RunOptions};
use crate::support::error::{Error, Result};
use crate::support::units::format_duration;

/// `v` as one word a shell reads back as `v`: as it is when it holds nothing a shell
/// treats specially, else in single quotes. The options are shown as a command line to
/// paste (`--exclude '#innodb_redo'`: unquoted, `#` would start a comment and the run
/// would rewrite the redo log it was told to leave out).
fn shell_word(v: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c);
    if !v.is_empty() && v.chars().all(plain) {
        return v.to_string();
    }
    format!("'{}'", v.replace('\'', "'\\''"))
}

/// A flag given (`--no-verify`): shown as its name alone.
#[derive(Clone, PartialEq)]
struct Flag;

impl Display for Flag {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

fn flag(b: bool) -> Option<Flag> {
    b.then_some(Flag)
}

/// A value worth showing: one that differs from the default.
fn given<T: PartialEq>(v: T, default: T) -> Option<T> {
    (v != default).then_some(v)
}

/// Durations print as they parse.
#[derive(Clone, Copy, PartialEq)]
struct Dur(Duration);

impl Display for Dur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

/// The merge of a resuming command's options with the run's: the first option given
/// otherwise is the conflict (name and value, what the run had).
#[derive(Default)]
struct Merge {
    conflict: Option<(String, Option<String>)>,
}

impl Merge {
    fn named(name: &str, v: &impl Display) -> String {
        let v = v.to_string();
        if v.is_empty() { name.to_string() } else { format!("{name} {}", shell_word(&v)) }
    }

    /// An option that says what the run does: given otherwise, it is refused.
    fn keep<T: PartialEq + Display>(&mut self, name: &str, given: Option<T>, stored: Option<T>) -> Option<T> {
        match (&given, &stored) {
            (Some(g), Some(s)) if g != s => {
                self.conflict.get_or_insert((Self::named(name, g), Some(s.to_string())));
                given
            }
            (Some(g), None) => {
                self.conflict.get_or_insert((Self::named(name, g), None));
                given
            }
            _ => stored,
        }
    }

    /// Pacing (how fast the run goes and how many overruns it bears, not what it
    /// rewrites) may change on a resume: a host that got busier needs slower windows
    /// or more patience. The change is said.
    fn pace<T: PartialEq + Display>(name: &str, given: Option<T>, stored: Option<T>) -> Option<T> {
        match (&given, &stored) {
            (Some(g), s) if s.as_ref() != Some(g) => {
                let had = s.as_ref().map_or_else(|| "default".to_string(), |s| s.to_string());
                log::warn!("{name} {g} replaces the interrupted run's {had}");
                given
            }
            (Some(_), _) => given,
            (None, _) => stored,
        }
    }

    /// Patterns as a list: `--exclude 'a,b'` is not `--exclude a --exclude b`.
    fn exclude(&mut self, given: &[String], stored: &[String]) {
        if !given.is_empty() && given != stored {
            let shown = |v: &[String]| v.iter().map(|e| format!("'{e}'")).collect::<Vec<_>>().join(" ");
            let had = (!stored.is_empty()).then(|| shown(stored));
            self.conflict.get_or_insert((format!("--exclude {}", shown(given)), had));
        }
    }

    fn into_result(self) -> Result<()> {
        let Some((given, had)) = self.conflict else { return Ok(()) };
        let name = given.split(' ').next().unwrap_or_default().to_string();
        let what = match had {
            Some(h) => format!("{given} differs from the interrupted run's {h}"),
            None => format!("{given} was not an option of the interrupted run"),
        };
        Err(Error::Usage(format!(
            "{what}: --resume continues a run with the options it was started with (leave {name} out to keep them, or pass --restart to start over with new ones)"
        )))
    }
}

impl RunOptions {
    /// The options as command-line text, for messages and `reseq status`.
    pub(crate) fn describe(&self) -> String {
        let mut s = vec![format!("--chunk-size {}", self.chunk_size)];
        let mut opt = |name: &str, v: Option<String>| s.extend(v.map(|v| Merge::named(name, &v)));
        opt("--max-freeze", self.max_freeze.map(format_duration));
        opt("--rate", self.rate.map(|r| r.to_string()));
        opt("--pause", given(self.pause, defaults::DEFAULT_PAUSE).map(format_duration));
        opt("--max-overruns", given(self.max_overruns, defaults::DEFAULT_MAX_OVERRUNS).map(|v| v.to_string()));
        opt("--read-ahead", given(self.read_ahead, defaults::DEFAULT_READ_AHEAD).map(|v| v.to_string()));
        opt("--no-verify", self.no_verify.then(String::new));
        opt("--include-free", self.include_free.then(String::new));
        opt("--no-trim", self.no_trim.then(String::new));
        opt("--trim-rate", self.trim_rate.map(|r| r.to_string()));
        opt("--only-slow", self.only_slow.then(String::new));
        opt("--from-scan", self.from_scan.as_ref().map(|p| p.display().to_string()));
        opt("--older-than", self.older_than.map(format_duration));
        opt("--scan-regions", given(self.scan_regions, defaults::DEFAULT_SCAN_REGIONS).map(|v| v.to_string()));
        opt("--slow-threshold", given(self.slow_threshold, defaults::DEFAULT_SLOW_THRESHOLD).map(|v| v.to_string()));
        for e in &self.exclude {
            opt("--exclude", Some(e.clone()));
        }
        opt("--bench", self.bench.then(String::new));
        s.join(" ")
    }

    /// `o` with this run's options in place of those left out; an error naming the
    /// first option given with another value. `default_max_freeze` is the mode's (a run
    /// started without `--max-freeze` had it).
    pub(crate) fn apply(&self, o: &RewriteOptions, default_max_freeze: Duration) -> Result<RewriteOptions> {
        let mut m = Merge::default();
        let (g, given) = (&o.run, o.given);
        let mut out = o.clone();
        let run = &mut out.run;
        run.chunk_size = m
            .keep("--chunk-size", given.chunk_size.then_some(g.chunk_size), Some(self.chunk_size))
            .unwrap_or(defaults::DEFAULT_CHUNK_SIZE);
        self.apply_pacing(g, given, run, default_max_freeze);
        run.no_verify = m.keep("--no-verify", flag(g.no_verify), flag(self.no_verify)).is_some();
        run.include_free = m.keep("--include-free", flag(g.include_free), flag(self.include_free)).is_some();
        run.no_trim = m.keep("--no-trim", flag(g.no_trim), flag(self.no_trim)).is_some();
        run.only_slow = m.keep("--only-slow", flag(g.only_slow), flag(self.only_slow)).is_some();
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        run.from_scan = m.keep("--from-scan", path(&g.from_scan), path(&self.from_scan)).map(PathBuf::from);
        run.older_than = m.keep("--older-than", g.older_than.map(Dur), self.older_than.map(Dur)).map(|d| d.0);
        run.scan_regions = m
            .keep("--scan-regions", given.scan_regions.then_some(g.scan_regions), Some(self.scan_regions))
            .unwrap_or(defaults::DEFAULT_SCAN_REGIONS);
        run.slow_threshold = m
            .keep("--slow-threshold", given.slow_threshold.then_some(g.slow_threshold), Some(self.slow_threshold))
            .unwrap_or(defaults::DEFAULT_SLOW_THRESHOLD);
        run.bench = m.keep("--bench", flag(g.bench), flag(self.bench)).is_some();
        m.exclude(&g.exclude, &self.exclude);
        run.exclude = self.exclude.clone();
        m.into_result().map(|()| out)
    }

    /// The pacing options given (`g`) replace the run's where given, with a warning.
    /// `--max-freeze` is one: it bounds how long each window freezes, not what is
    /// rewritten, and every window is checked against the bound in force (a shorter one
    /// is the safe direction; a longer one is what a busy host needs after overruns).
    fn apply_pacing(&self, g: &RunOptions, given: Given, run: &mut RunOptions, default_max_freeze: Duration) {
        let stored_freeze = Dur(self.max_freeze.unwrap_or(default_max_freeze));
        run.max_freeze = Merge::pace("--max-freeze", g.max_freeze.map(Dur), Some(stored_freeze))
            .map(|d| d.0)
            .filter(|_| self.max_freeze.is_some() || g.max_freeze.is_some());
        run.rate = Merge::pace("--rate", g.rate, self.rate);
        run.trim_rate = Merge::pace("--trim-rate", g.trim_rate, self.trim_rate);
        run.pause = Merge::pace("--pause", given.pause.then_some(g.pause).map(Dur), Some(Dur(self.pause)))
            .map_or(defaults::DEFAULT_PAUSE, |d| d.0);
        run.max_overruns =
            Merge::pace("--max-overruns", given.max_overruns.then_some(g.max_overruns), Some(self.max_overruns))
                .unwrap_or(defaults::DEFAULT_MAX_OVERRUNS);
        run.read_ahead = Merge::pace("--read-ahead", given.read_ahead.then_some(g.read_ahead), Some(self.read_ahead))
            .unwrap_or(defaults::DEFAULT_READ_AHEAD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::units;

    fn args(extra: &[&str]) -> RewriteOptions {
        let argv = ["reseq", "rewrite", "/dev/null"].iter().chain(extra);
        match crate::cli::Cli::try_parse_given(argv).unwrap().command {
            crate::cli::Command::Rewrite(a) => crate::cli::hiargs::rewrite_options(&a).unwrap(),
            _ => unreachable!(),
        }
    }

    fn d(text: &str) -> Duration {
        units::parse_duration(text).unwrap()
    }

    fn text<T: Display>(v: Option<T>) -> Option<String> {
        v.map(|v| v.to_string())
    }

    #[test]
    fn options_left_out_take_the_runs_and_a_different_one_is_refused() {
        let stored = args(&["--max-freeze", "300ms", "--include-free", "--chunk-size", "1M"]).run;
        let got = stored.apply(&args(&["--resume"]), d("5s")).unwrap();
        assert_eq!(got.run.max_freeze.map(format_duration).as_deref(), Some("300ms"));
        assert!(got.run.include_free && got.resume);
        assert_eq!(got.run.chunk_size.to_string(), "1M");
        // The same meaning, written otherwise, is the same option.
        let got = stored.apply(&args(&["--max-freeze", "0.3s", "--chunk-size", "1024K"]), d("5s")).unwrap();
        assert_eq!(got.run.max_freeze.map(format_duration).as_deref(), Some("300ms"));
        // --max-freeze is pacing: longer (a busy host) and shorter (safer) are both taken.
        for given in ["2s", "100ms"] {
            let got = stored.apply(&args(&["--max-freeze", given]), d("5s")).unwrap();
            assert_eq!(got.run.max_freeze.map(format_duration).as_deref(), Some(given));
        }
        let e = stored.apply(&args(&["--no-verify"]), d("5s")).unwrap_err().to_string();
        assert!(e.contains("--no-verify was not an option of the interrupted run"), "{e}");
        // Pacing may change: a busier host needs slower windows or more overruns.
        let got =
            stored.apply(&args(&["--rate", "10M", "--max-overruns", "50", "--trim-rate", "1G"]), d("5s")).unwrap();
        assert_eq!((text(got.run.rate).as_deref(), got.run.max_overruns), (Some("10M"), 50));
        assert_eq!(text(got.run.trim_rate).as_deref(), Some("1G"), "--trim-rate is pacing: it may change");
        let trimmed = args(&["--trim-rate", "200M"]).run;
        assert_eq!(
            trimmed.apply(&args(&["--resume"]), d("5s")).unwrap().run.trim_rate.map(|r| r.to_string()).as_deref(),
            Some("200M"),
            "kept"
        );
        assert!(trimmed.describe().ends_with("--trim-rate 200M"));
        // A run recorded before --trim-rate existed reads back without it.
        let old = r#"{"chunk_size":"4M","max_freeze":null,"rate":null,"pause":"0s","max_overruns":3,"read_ahead":2,"no_verify":false,"include_free":false,"no_trim":false,"only_slow":false,"from_scan":null,"scan_regions":64,"slow_threshold":0.7,"exclude":[]}"#;
        assert_eq!(serde_json::from_str::<RunOptions>(old).unwrap().trim_rate, None);
        // And is written as it always was: sizes and durations as text.
        let json = serde_json::to_string(&stored).unwrap();
        assert!(json.contains(r#""chunk_size":"1M","max_freeze":"300ms","rate":null,"pause":"0s""#), "{json}");
        // The mode's default --max-freeze, given, is what a run without one had.
        let plain = args(&[]).run;
        assert!(plain.apply(&args(&["--max-freeze", "1s"]), d("1s")).is_ok());
        assert_eq!(plain.apply(&args(&[]), d("1s")).unwrap().run.max_freeze, None, "the mode's default, kept");
        let rated = args(&["--rate", "100M"]).run;
        assert!(rated.apply(&args(&["--rate", "100M/s"]), d("5s")).is_ok(), "the same rate, written otherwise");
        let ex = args(&["--exclude", "a", "--exclude", "b"]).run;
        assert!(ex.apply(&args(&["--exclude", "a,b"]), d("1s")).is_err(), "one pattern is not two");
        assert_eq!(ex.apply(&args(&[]), d("1s")).unwrap().run.exclude, ["a", "b"]);
        assert_eq!(stored.describe(), "--chunk-size 1M --max-freeze 300ms --include-free", "options as a command line");
    }

    #[test]
    fn options_shown_as_a_command_line_paste_back_as_they_were() {
        let exclude = vec!["#innodb_redo".into(), "ib_logfile*".into(), "it's".into(), "pg_wal".into()];
        let shown = RunOptions { exclude, ..Default::default() }.describe();
        assert!(
            shown.ends_with(r"--exclude '#innodb_redo' --exclude 'ib_logfile*' --exclude 'it'\''s' --exclude pg_wal"),
            "{shown}"
        );
    }

    #[test]
    fn an_option_given_with_its_default_value_is_given() {
        let stored = args(&["--pause", "2s", "--chunk-size", "1M", "--max-overruns", "9"]).run;
        let got = stored.apply(&args(&["--resume", "--pause", "0s", "--max-overruns", "3"]), d("5s")).unwrap();
        assert_eq!((got.run.pause, got.run.max_overruns), (Duration::ZERO, 3), "pacing given is pacing used");
        let e = stored.apply(&args(&["--resume", "--chunk-size", "4M"]), d("5s")).unwrap_err().to_string();
        assert!(e.contains("--chunk-size 4M differs from the interrupted run's 1M"), "{e}");
        let got = stored.apply(&args(&["--resume"]), d("5s")).unwrap();
        assert_eq!(
            (got.run.pause, got.run.max_overruns, got.run.chunk_size.to_string()),
            (d("2s"), 9, "1M".to_string())
        );
    }

    /// Every option with a default, given with its default value against a run that had
    /// another, is seen: refused, or (pacing) taken. The check once named options by
    /// string, and a misspelt name meant "not given": the run's value, silently.
    #[test]
    fn each_option_with_a_default_given_at_its_default_is_seen() {
        let run = ["--scan-regions", "32", "--slow-threshold", "0.5", "--read-ahead", "8", "--chunk-size", "1M"];
        let stored = args(&run).run;
        for (flag, value) in [("--scan-regions", "64"), ("--slow-threshold", "0.7"), ("--chunk-size", "4M")] {
            let e = stored.apply(&args(&["--resume", flag, value]), d("5s")).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(&format!("{flag} {value} ")), "{flag}: {e}");
        }
        let got = stored.apply(&args(&["--resume", "--read-ahead", "2"]), d("5s")).unwrap();
        assert_eq!((got.run.read_ahead, got.run.scan_regions, got.run.slow_threshold), (2, 32, 0.5));
    }
}
