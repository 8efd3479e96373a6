//! Job configuration files: `reseq run --config /etc/reseq/NAME.toml`.
//!
//! A job is a `reseq rewrite` with its options written down. Each key is turned into the
//! same command-line option and parsed by the same clap definitions, so a config can
//! express exactly what the command line can, with the same checks and messages, and
//! nothing drifts between the two. One rule: a key is a long option of `reseq rewrite`
//! with `_` for `-` (`bench_passes` is `--bench-passes`), plus `quiet` (`-q`: the log's
//! warnings and errors only, and the summary). Unknown keys are errors (a typo must not
//! silently drop a limit such as `max_freeze`); every error names the line.

use std::path::Path;

use crate::cli::{Cli, Command, RewriteArgs};
use crate::support::error::{Error, Result};

/// Rewrite options a job file does not take: the targets are a list of their own, a dry
/// run is `reseq run --dry-run`, and a scan file or discarding an unfinished run are
/// one-off decisions, not a job's.
const NOT_KEYS: [&str; 4] = ["targets", "dry_run", "from_scan", "restart"];

/// The keys of a job file, from `reseq rewrite`'s own long options (so nothing drifts),
/// and whether they take a value (false: a flag, given as `true`/`false`).
fn keys() -> Vec<(String, bool)> {
    use clap::CommandFactory;
    let cli = Cli::command();
    let rewrite = cli.find_subcommand("rewrite").expect("reseq rewrite");
    let mut keys: Vec<(String, bool)> = rewrite
        .get_arguments()
        .filter(|a| !a.is_global_set())
        .filter_map(|a| Some((a.get_long()?.replace('-', "_"), a.get_action().takes_values())))
        .filter(|(k, _)| !NOT_KEYS.contains(&k.as_str()))
        .collect();
    keys.push(("quiet".into(), false));
    keys
}

/// A job: the rewrite it runs, and whether its log is quiet (`quiet = true`).
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) args: RewriteArgs,
    pub(crate) quiet: bool,
}

fn scalar(key: &str, v: &toml::Value) -> Result<String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        other => {
            Err(Error::Usage(format!("config key `{key}`: expected a string or a number, not {}", other.type_str())))
        }
    }
}

/// The `reseq rewrite` arguments a config file stands for.
pub(crate) fn parse(text: &str, origin: &Path) -> Result<Job> {
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| Error::Usage(format!("{}: {e}", origin.display())))?;
    let argv = argv_of(&table, text, origin)?;
    match Cli::try_parse_given(&argv) {
        Ok(Cli { command: Command::Rewrite(args), quiet, .. }) => Ok(Job { args, quiet }),
        Ok(_) => Err(Error::Internal("a config did not parse into a rewrite".into())),
        Err(e) => {
            let msg = e.to_string().lines().next().unwrap_or_default().to_string();
            // Name the field and its line, not the command-line option clap saw.
            let named = |k: &str| {
                let flag = format!("'--{}", k.replace('_', "-"));
                msg.contains(&format!("{flag} ")) || msg.contains(&format!("{flag}'"))
            };
            let field = keys().into_iter().map(|k| k.0).find(|k| named(k));
            let place = field
                .map(|f| match line_of(text, &f) {
                    Some(n) => format!(" line {n}, field `{f}`"),
                    None => format!(" field `{f}`"),
                })
                .unwrap_or_default();
            Err(Error::Usage(format!("{}:{place}: {msg}", origin.display())))
        }
    }
}

/// The command line a config's table stands for: `reseq rewrite OPTIONS -- TARGETS`.
fn argv_of(table: &toml::Table, text: &str, origin: &Path) -> Result<Vec<String>> {
    let mut argv: Vec<String> = vec!["reseq".into(), "rewrite".into()];
    let mut targets: Vec<String> = Vec::new();
    let keys = keys();
    for (key, value) in table {
        if key == "targets" {
            let list = value
                .as_array()
                .ok_or_else(|| Error::Usage(format!("{}: `targets` must be a list of paths", origin.display())))?;
            targets = list.iter().map(|t| scalar("targets", t)).collect::<Result<_>>()?;
            continue;
        }
        let Some((_, takes_value)) = keys.iter().find(|(k, _)| k == key) else {
            let names: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
            let line = line_of(text, key).map(|n| format!(" line {n}:")).unwrap_or_default();
            return Err(Error::Usage(format!(
                "{}:{line} unknown key `{key}` (keys are the long options of `reseq rewrite` with _ for -: targets, {})",
                origin.display(),
                names.join(", ")
            )));
        };
        push_option(&mut argv, key, *takes_value, value, origin)?;
    }
    if targets.is_empty() {
        return Err(Error::Usage(format!("{}: `targets` is missing or empty", origin.display())));
    }
    argv.push("--".into());
    argv.extend(targets);
    Ok(argv)
}

/// One key as its option: a flag when true, or the option once per value.
fn push_option(argv: &mut Vec<String>, key: &str, takes_value: bool, value: &toml::Value, origin: &Path) -> Result<()> {
    let flag = format!("--{}", key.replace('_', "-"));
    match (takes_value, value) {
        (false, toml::Value::Boolean(b)) => argv.extend(b.then_some(flag)),
        (false, _) => return Err(Error::Usage(format!("{}: `{key}` must be true or false", origin.display()))),
        (true, v) => {
            for item in v.as_array().map_or(std::slice::from_ref(v), Vec::as_slice) {
                argv.extend([flag.clone(), scalar(key, item)?]);
            }
        }
    }
    Ok(())
}

/// The 1-based line where `key` is set.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| l.trim_start().strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('=')))
        .map(|i| i + 1)
}

/// Reads and parses a config file.
pub(crate) fn load(path: &Path) -> Result<Job> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::input(format!("reading {}", path.display()), e))?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../packaging/config/example.toml");
        let a = parse(text, Path::new("example.toml")).unwrap().args;
        assert_eq!(a.targets, vec![std::path::PathBuf::from("/var/lib/postgresql/15/main/base")]);
        assert_eq!(a.max_freeze, Some(std::time::Duration::from_secs(1)));
        assert_eq!(a.pause, std::time::Duration::from_secs(2));
        assert_eq!(a.rate.map(|r| r.to_string()).as_deref(), Some("100M"));
        assert_eq!(a.exclude, vec!["pg_internal.init".to_string()]);
        assert!(!a.bench);
        assert!(a.output.metrics_file.is_some());
        let t = parse("targets = [\"/dev/sdb\"]\ntrim_rate = \"2G\"", Path::new("j.toml")).unwrap().args;
        assert_eq!(t.trim_rate.map(|r| r.to_string()).as_deref(), Some("2G"), "the trim's pace is a job option");
    }

    #[test]
    fn broken_configs_name_the_problem() {
        let e = parse("targets = [\"/x\"]\nmax_freeze = = \"1s\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("j.toml") && e.contains("line 2"), "{e}");
        let e = parse("targets = [\"/x\"]\nmax_freze = \"1s\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("line 2: unknown key `max_freze`"), "{e}");
        assert!(e.contains("bench_passes") && !e.contains(" passes,"), "the long options' names: {e}");
        let e = parse("max_freeze = \"1s\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("`targets` is missing"), "{e}");
        let e = parse("targets = [\"/x\"]\nbench = \"yes\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("`bench` must be true or false"), "{e}");
        let e = parse("targets = [\"/x\"]\nread_ahead = \"many\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("line 2, field `read_ahead`"), "{e}");
        let e = parse("targets = [\"/x\"]\ndry_run = true", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("unknown key `dry_run`"), "{e}");
    }

    /// Every key the job files took before they were generated from the clap options.
    #[test]
    fn the_keys_are_the_rewrite_options() {
        let keys = keys();
        for (key, takes) in [("exclude", true), ("max_freeze", true), ("no_verify", false), ("metrics_file", true)]
            .into_iter()
            .chain([("json", false), ("format", true), ("accept_cgroup_risk", false), ("trim_rate", true)])
        {
            assert!(keys.contains(&(key.to_string(), takes)), "{key}: {keys:?}");
        }
        assert!(keys.iter().all(|(k, _)| !NOT_KEYS.contains(&k.as_str())));
    }

    /// The benchmark's options, whose clap ids are not their long names, and `quiet`.
    #[test]
    fn a_job_sets_its_benchmark_and_its_quiet_by_the_long_names() {
        let text = "targets = [\"/x\"]\nbench = true\nbench_passes = 5\nbench_block_size = \"2M\"\nbench_queue_depth = 4\nbench_settle = \"1s\"\nbench_regions = 16\nbench_length = \"1G\"\nbench_recheck = \"0s\"\nquiet = true";
        let job = parse(text, Path::new("j.toml")).unwrap();
        assert!(job.quiet);
        assert_eq!(job.args.bench_opts.passes, 5);
        assert_eq!(job.args.bench_opts.regions, 16);
        assert!(!parse("targets = [\"/x\"]", Path::new("j.toml")).unwrap().quiet);
    }
}
