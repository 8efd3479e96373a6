//! Every external program reseq runs (losetup, mount, mkfs, e2fsck, dmsetup, busctl,
//! smartctl, itself), run one way.
//!
//! Found the same way from a terminal, cron and a systemd unit: over `$PATH`, then the
//! system directories [`SYSTEM_DIRS`] it lacks. Cron's PATH is `/usr/bin:/bin`, and
//! `dmsetup`, `losetup`, `mkfs.*`, `e2fsck` and `smartctl` live in `/usr/sbin` or `/sbin`:
//! looked for over PATH alone, they are not found there, and a device-mapper device was
//! refused as "unknown". Only absolute PATH entries count (reseq runs as root: a relative
//! one would run whatever the working directory holds).
//!
//! Failing the same way: a program not found names itself and where it was looked for;
//! one that ran and failed, its command line, exit status and the last lines of its
//! stderr; one given a time limit and still running then is killed and says so.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Where a program is looked for after `$PATH`: where distributions install system
/// tools, sbin first.
pub(crate) const SYSTEM_DIRS: [&str; 6] =
    ["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin", "/bin"];

/// The stderr lines a failure shows, from its end.
const STDERR_LINES: usize = 5;

/// Why a program did not run, or did not succeed.
#[derive(Debug)]
pub(crate) enum ToolError {
    NotFound { tool: String, looked_in: Vec<PathBuf> },
    Start { command: String, error: std::io::Error },
    Failed { command: String, status: ExitStatus, stderr: String },
    TimedOut { command: String, limit: Duration },
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::NotFound { tool, looked_in } => {
                let dirs: Vec<_> = looked_in.iter().map(|d| d.display().to_string()).collect();
                write!(f, "{tool} not found (looked in {}): install it, or put its directory on PATH", dirs.join(":"))
            }
            ToolError::Start { command, error } => write!(f, "{command} could not be started: {error}"),
            ToolError::Failed { command, status, stderr } if stderr.is_empty() => {
                write!(f, "{command} failed ({status})")
            }
            ToolError::Failed { command, status, stderr } => write!(f, "{command} failed ({status}): {stderr}"),
            ToolError::TimedOut { command, limit } => {
                write!(f, "{command} did not finish within {} s and was killed", limit.as_secs_f64())
            }
        }
    }
}

impl std::error::Error for ToolError {}

impl From<ToolError> for std::io::Error {
    fn from(e: ToolError) -> std::io::Error {
        let kind = match e {
            ToolError::NotFound { .. } => std::io::ErrorKind::NotFound,
            ToolError::TimedOut { .. } => std::io::ErrorKind::TimedOut,
            ToolError::Start { .. } | ToolError::Failed { .. } => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// The directories a program is looked for in: `path` (a `$PATH` value; its absolute
/// entries), then the [`SYSTEM_DIRS`] it does not hold.
pub(crate) fn search_dirs(path: Option<&OsStr>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let given = path.map(|p| std::env::split_paths(p).collect::<Vec<_>>()).unwrap_or_default();
    for d in given.into_iter().filter(|d| d.is_absolute()).chain(SYSTEM_DIRS.map(PathBuf::from)) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// The first executable file called `name` in `dirs`.
pub(crate) fn find_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let executable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    dirs.iter().map(|d| d.join(name)).find(|p| executable(p))
}

/// `name` found over this process's `$PATH` and the system directories.
pub(crate) fn find(name: &str) -> Option<PathBuf> {
    find_in(name, &search_dirs(std::env::var_os("PATH").as_deref()))
}

/// One external program to run, built as a [`Command`] is (`arg`, `args`), found when
/// made. Its stdin is /dev/null.
pub(crate) struct Tool {
    /// Its name and where it was looked for, when it was not found.
    missing: Option<(String, Vec<PathBuf>)>,
    cmd: Command,
}

impl Tool {
    /// `name`, found over `$PATH` and the system directories.
    pub(crate) fn new(name: &str) -> Tool {
        let dirs = search_dirs(std::env::var_os("PATH").as_deref());
        match find_in(name, &dirs) {
            Some(path) => Tool::at(path),
            None => Tool { missing: Some((name.to_string(), dirs)), cmd: Command::new(name) },
        }
    }

    /// The program at `path` (this program itself, say).
    pub(crate) fn at(path: PathBuf) -> Tool {
        let mut cmd = Command::new(path);
        cmd.stdin(Stdio::null());
        Tool { missing: None, cmd }
    }

    pub(crate) fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Tool {
        self.cmd.arg(arg);
        self
    }

    pub(crate) fn args<S: AsRef<OsStr>>(&mut self, args: impl IntoIterator<Item = S>) -> &mut Tool {
        self.cmd.args(args);
        self
    }

    /// Runs it to the end; its stdout if it exits 0, else why not.
    pub(crate) fn run(&mut self) -> Result<String, ToolError> {
        let out = self.output()?;
        checked(command_line(&self.cmd), out)
    }

    /// Runs it to the end, whatever its exit status (for a program whose status says
    /// more than success, or a cleanup that may fail).
    pub(crate) fn output(&mut self) -> Result<Output, ToolError> {
        self.found()?;
        self.cmd.output().map_err(|error| ToolError::Start { command: command_line(&self.cmd), error })
    }

    /// As [`Tool::output`], killed (an error) if still running after `limit`.
    pub(crate) fn output_within(&mut self, limit: Duration) -> Result<Output, ToolError> {
        self.found()?;
        let command = command_line(&self.cmd);
        let start = |e| ToolError::Start { command: command.clone(), error: e };
        let mut child = self.cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(start)?;
        let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
        let deadline = Instant::now() + limit;
        let status = loop {
            match child.try_wait().map_err(start)? {
                Some(status) => break status,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ToolError::TimedOut { command, limit });
                }
            }
        };
        let joined = |t: std::thread::JoinHandle<Vec<u8>>| t.join().unwrap_or_default();
        Ok(Output { status, stdout: joined(stdout), stderr: joined(stderr) })
    }

    /// Starts it in the background, its stdout to /dev/null (stderr is this process's).
    pub(crate) fn spawn(&mut self) -> Result<Child, ToolError> {
        self.found()?;
        let command = command_line(&self.cmd);
        self.cmd.stdout(Stdio::null()).spawn().map_err(|error| ToolError::Start { command, error })
    }

    /// Not found is an error each time it is run.
    fn found(&self) -> Result<(), ToolError> {
        match &self.missing {
            None => Ok(()),
            Some((tool, looked_in)) => Err(ToolError::NotFound { tool: tool.clone(), looked_in: looked_in.clone() }),
        }
    }
}

/// Runs a command built elsewhere (the tests' own), checked as every tool's run is: its
/// stdout if it exits 0, else its command line, status and stderr.
pub fn run_command(cmd: &mut Command) -> std::io::Result<String> {
    let command = command_line(cmd);
    let out = cmd.output().map_err(|error| ToolError::Start { command: command.clone(), error })?;
    Ok(checked(command, out)?)
}

/// The stdout of a run that exited 0; else the failure, with stderr's last lines.
fn checked(command: String, out: Output) -> Result<String, ToolError> {
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(STDERR_LINES)..].join("; ");
        return Err(ToolError::Failed { command, status: out.status, stderr: tail });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The command as a shell would take it (arguments with spaces or quotes quoted).
fn command_line(cmd: &Command) -> String {
    let quoted = |s: &OsStr| {
        let s = s.to_string_lossy();
        if s.is_empty() || s.contains(|c: char| c.is_whitespace() || "'\"\\$`".contains(c)) {
            format!("'{}'", s.replace('\'', r"'\''"))
        } else {
            s.into_owned()
        }
    };
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(quoted).collect::<Vec<_>>().join(" ")
}

/// A thread reading a child's pipe to its end.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program is found over a PATH of its own, then in the system directories; a file
    /// that is not executable, and a relative PATH entry, are passed over.
    #[test]
    fn a_program_is_found_over_path_then_the_system_directories() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("reseq-fake-tool");
        std::fs::write(&tool, "#!/bin/sh\necho fake\n").unwrap();
        let plain = dir.path().join("reseq-plain-file");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([Path::new("relative"), Path::new("/nonexistent"), dir.path()]).unwrap();
        let dirs = search_dirs(Some(&path));
        assert_eq!(dirs[..2], [PathBuf::from("/nonexistent"), dir.path().to_path_buf()], "PATH first, in order");
        assert_eq!(dirs[2..], SYSTEM_DIRS.map(PathBuf::from), "then the system directories");
        assert_eq!(find_in("reseq-fake-tool", &dirs), Some(tool.clone()));
        assert_eq!(find_in("reseq-plain-file", &dirs), None, "not executable");
        // Cron's PATH: sh is in /bin or /usr/bin, and a system directory holds it either way.
        let cron = search_dirs(Some(OsStr::new("/usr/bin:/bin")));
        assert!(find_in("sh", &cron).is_some());
        assert_eq!(cron.len(), SYSTEM_DIRS.len(), "no directory twice");
        let no_path = search_dirs(None);
        assert_eq!(find_in("reseq-fake-tool", &no_path), None);
        assert_eq!(Tool::at(tool).run().unwrap(), "fake\n");
    }

    #[test]
    fn failures_name_the_tool_and_say_why() {
        let e = Tool::new("reseq-no-such-tool").arg("x").run().unwrap_err().to_string();
        assert!(e.starts_with("reseq-no-such-tool not found (looked in "), "{e}");
        assert!(e.contains(":/usr/sbin:") && e.contains(":/sbin"), "the system directories too: {e}");
        let script = "echo one >&2; echo two >&2; exit 3";
        let e = Tool::new("sh").args(["-c", script]).run().unwrap_err().to_string();
        // (Another test may have left this process in a removed directory: sh says so first.)
        assert!(e.contains("sh -c 'echo one >&2; echo two >&2; exit 3' failed (exit status: 3): "), "{e}");
        assert!(e.ends_with("one; two"), "the last lines of stderr: {e}");
        let out = Tool::new("sh").args(["-c", "echo out; exit 1"]).output().unwrap();
        assert_eq!((out.status.code(), &out.stdout[..]), (Some(1), &b"out\n"[..]), "output() takes any status");
        let t = Instant::now();
        let e = Tool::new("sleep").arg("10").output_within(Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ToolError::TimedOut { .. }) && t.elapsed() < Duration::from_secs(5), "{e}");
        assert!(e.to_string().ends_with("sleep 10 did not finish within 0.2 s and was killed"), "{e}");
        let out = Tool::new("sh").args(["-c", "echo fast"]).output_within(Duration::from_secs(10)).unwrap();
        assert_eq!(out.stdout, b"fast\n");
        let e = run_command(Command::new("false").arg("a b")).unwrap_err().to_string();
        assert_eq!(e, "false 'a b' failed (exit status: 1)");
    }
}
