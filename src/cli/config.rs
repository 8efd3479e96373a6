//! Job configuration files: `reseq run --config /etc/reseq/NAME.toml`.
//!
//! A job is a `reseq rewrite` with its options written down. Each key is turned into the
//! same command-line option and parsed by the same clap definitions, so a config can
//! express exactly what the command line can, with the same checks and messages, and
//! nothing drifts between the two. Unknown keys are errors (a typo must not silently
//! drop a limit such as `max_freeze`); TOML errors name the line and column.

use std::path::Path;

use crate::cli::{Cli, Command, RewriteArgs};
use crate::support::error::{Error, Result};

/// Keys and whether they take a value (false: a flag, given as `true`/`false`).
const KEYS: [(&str, bool); 22] = [
    ("exclude", true),
    ("chunk_size", true),
    ("max_freeze", true),
    ("pause", true),
    ("rate", true),
    ("max_overruns", true),
    ("read_ahead", true),
    ("no_verify", false),
    ("force", false),
    ("accept_cgroup_risk", false),
    ("resume", false),
    ("state_dir", true),
    ("include_free", false),
    ("no_trim", false),
    ("trim_rate", true),
    ("only_slow", false),
    ("scan_regions", true),
    ("slow_threshold", true),
    ("bench", false),
    ("metrics_file", true),
    ("json", false),
    ("format", true),
];

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
pub fn parse(text: &str, origin: &Path) -> Result<RewriteArgs> {
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| Error::Usage(format!("{}: {e}", origin.display())))?;
    let argv = argv_of(&table, origin)?;
    match Cli::try_parse_given(&argv) {
        Ok(Cli { command: Command::Rewrite(args), .. }) => Ok(args),
        Ok(_) => Err(Error::Internal("a config did not parse into a rewrite".into())),
        Err(e) => {
            let msg = e.to_string().lines().next().unwrap_or_default().to_string();
            // Name the field and its line, not the command-line option clap saw.
            let field = KEYS.iter().map(|k| k.0).find(|k| msg.contains(&format!("--{}", k.replace('_', "-"))));
            let place = field
                .map(|f| match line_of(text, f) {
                    Some(n) => format!(" line {n}, field `{f}`"),
                    None => format!(" field `{f}`"),
                })
                .unwrap_or_default();
            Err(Error::Usage(format!("{}:{place}: {msg}", origin.display())))
        }
    }
}

/// The command line a config's table stands for: `reseq rewrite OPTIONS -- TARGETS`.
fn argv_of(table: &toml::Table, origin: &Path) -> Result<Vec<String>> {
    let mut argv: Vec<String> = vec!["reseq".into(), "rewrite".into()];
    let mut targets = Vec::new();
    for (key, value) in table {
        if key == "targets" {
            let list = value
                .as_array()
                .ok_or_else(|| Error::Usage(format!("{}: `targets` must be a list of paths", origin.display())))?;
            for t in list {
                targets.push(scalar("targets", t)?);
            }
            continue;
        }
        let Some((_, takes_value)) = KEYS.iter().find(|(k, _)| k == key) else {
            return Err(Error::Usage(format!(
                "{}: unknown key `{key}` (keys: targets, {})",
                origin.display(),
                KEYS.map(|k| k.0).join(", ")
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
        (false, toml::Value::Boolean(b)) => {
            if *b {
                argv.push(flag);
            }
        }
        (false, _) => return Err(Error::Usage(format!("{}: `{key}` must be true or false", origin.display()))),
        (true, toml::Value::Array(items)) => {
            for i in items {
                argv.push(flag.clone());
                argv.push(scalar(key, i)?);
            }
        }
        (true, v) => {
            argv.push(flag);
            argv.push(scalar(key, v)?);
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
pub fn load(path: &Path) -> Result<RewriteArgs> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::input(format!("reading {}", path.display()), e))?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../packaging/config/example.toml");
        let a = parse(text, Path::new("example.toml")).unwrap();
        assert_eq!(a.targets, vec![std::path::PathBuf::from("/var/lib/postgresql/15/main/base")]);
        assert_eq!(a.max_freeze, Some(std::time::Duration::from_secs(1)));
        assert_eq!(a.pause, std::time::Duration::from_secs(2));
        assert_eq!(a.rate.map(|r| r.to_string()).as_deref(), Some("100M"));
        assert_eq!(a.exclude, vec!["pg_internal.init".to_string()]);
        assert!(!a.bench);
        assert!(a.output.metrics_file.is_some());
        let t = parse("targets = [\"/dev/sdb\"]\ntrim_rate = \"2G\"", Path::new("j.toml")).unwrap();
        assert_eq!(t.trim_rate.map(|r| r.to_string()).as_deref(), Some("2G"), "the trim's pace is a job option");
    }

    #[test]
    fn broken_configs_name_the_problem() {
        let e = parse("targets = [\"/x\"]\nmax_freeze = = \"1s\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("j.toml") && e.contains("line 2"), "{e}");
        let e = parse("targets = [\"/x\"]\nmax_freze = \"1s\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("unknown key `max_freze`"), "{e}");
        let e = parse("max_freeze = \"1s\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("`targets` is missing"), "{e}");
        let e = parse("targets = [\"/x\"]\nbench = \"yes\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("`bench` must be true or false"), "{e}");
        let e = parse("targets = [\"/x\"]\nread_ahead = \"many\"", Path::new("j.toml")).unwrap_err().to_string();
        assert!(e.contains("line 2, field `read_ahead`"), "{e}");
    }
}
