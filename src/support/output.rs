//! Logging and progress that never write to a frozen filesystem.
//!
//! stderr may be redirected to a file on the very filesystem reseq freezes (a cron job
//! logging to /srv/log...). A write there would block reseq until someone thaws it, and
//! only reseq would. So while a window is frozen, log lines are buffered in memory and
//! released after the thaw. The progress bar is drawn only on a terminal (never a file).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static HOLD: AtomicBool = AtomicBool::new(false);
static HELD: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// The log sink: stderr, or memory while frozen.
struct HeldStderr;

impl Write for HeldStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if HOLD.load(Ordering::SeqCst) {
            held.extend_from_slice(buf);
        } else {
            std::io::stderr().write_all(buf)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Holds log output in memory (call before freezing).
pub(crate) fn hold() {
    HOLD.store(true, Ordering::SeqCst);
}

/// Whether output is held (a window is frozen): stderr must not be written now.
pub(crate) fn is_held() -> bool {
    HOLD.load(Ordering::SeqCst)
}

/// Writes what was held and stops holding (call after thawing).
pub(crate) fn release() {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    HOLD.store(false, Ordering::SeqCst);
    if !held.is_empty() {
        let _ = std::io::stderr().write_all(&held);
        held.clear();
    }
}

/// Sets up env_logger: `-q` warnings only, default info, `-v` debug, `-vv` trace;
/// `RUST_LOG` overrides.
///
/// The lines are plain ("warning: ..." or the message alone) unless `-v` or `RUST_LOG`
/// asks for the log's own: timestamps and module paths are for whoever debugs reseq, not
/// for the admin who reads a job's mail.
pub(crate) fn init_logging(verbose: u8, quiet: bool) {
    let detailed = verbose > 0 || std::env::var_os("RUST_LOG").is_some();
    let mut builder = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(filter(
        verbose,
        quiet,
        std::io::stderr().is_terminal(),
    )));
    builder.target(env_logger::Target::Pipe(Box::new(HeldStderr)));
    if detailed {
        builder.format_timestamp_millis();
    } else {
        // Wrapped as the report is: a mail or a terminal reads it.
        builder.format(|out, record| {
            let line = plain(record.level(), &record.args().to_string());
            writeln!(out, "{}", fit(&line, WIDTH).trim_end())
        });
    }
    let _ = builder.try_init();
}

/// The log's filter when RUST_LOG does not set one.
fn filter(verbose: u8, quiet: bool, terminal: bool) -> String {
    let level = match (quiet, verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        _ => "trace",
    };
    // fuser (`sim serve`) logs every request it does not implement and its mount steps.
    let mut filter = if verbose >= 2 { level.to_string() } else { format!("{level},fuser=error") };
    // Each benchmark pass is a line of progress on a terminal; in a job's mail (no
    // terminal) a `bench = true` run made 12 of them, and the report has every pass and
    // the cache check. Its warnings stay (a scan that cannot tell slow from noise).
    if verbose == 0 && !terminal {
        filter += ",reseq::measure::bench=warn";
    }
    filter
}

/// A log line without `-v`: the message, after its level if it is not plain information.
fn plain(level: log::Level, msg: &str) -> String {
    match level {
        log::Level::Info => msg.to_string(),
        log::Level::Warn => format!("warning: {msg}"),
        log::Level::Error => format!("error: {msg}"),
        _ => format!("{}: {msg}", level.as_str().to_lowercase()),
    }
}

/// Without a terminal (cron, a timer), a progress line at most every this long, and
/// only when a quarter of the bytes more is done: at most three for a run of any length,
/// where one every 10 s made a 1-hour job mail 360 lines.
pub(crate) const LINE_EVERY: Duration = Duration::from_secs(60);

/// Progress of a long run: a bar on a terminal; otherwise a line as each quarter is done
/// (see [`LINE_EVERY`]).
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
    /// Done before this run (a resume): not part of its rate.
    already: u64,
    started: Instant,
    last_line: Instant,
    every: Duration,
    /// Quarters done when the last line was logged.
    quarters_shown: u64,
    /// Kept across several engine runs (file mode's files): `finish` leaves it open.
    spanning: bool,
    /// Said after the bytes (file mode: files done).
    msg: String,
    /// File mode: files finished so far (counted as the run passes them), of how many,
    /// and the count last shown.
    files: Option<(std::sync::Arc<std::sync::atomic::AtomicUsize>, usize, usize)>,
}

impl Progress {
    pub(crate) fn new(total: u64, already_done: u64, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_position(already_done);
            // Done before this run (a resume) is not part of its rate: the estimator
            // records the position now, then starts its clock afresh.
            b.tick();
            b.reset_eta();
            b
        });
        Progress {
            bar,
            total,
            done: already_done,
            already: already_done,
            started: Instant::now(),
            last_line: Instant::now(),
            every: LINE_EVERY,
            quarters_shown: 4 * already_done / total.max(1),
            spanning: false,
            msg: String::new(),
            files: None,
        }
    }

    /// One progress over several engine runs (each calls `finish`): ended by `close`.
    pub(crate) fn spanning(mut self) -> Progress {
        self.spanning = true;
        self
    }

    /// Shows "N of `total` files" after the bytes, N read from `finished` as it grows.
    pub(crate) fn count_files(&mut self, finished: std::sync::Arc<std::sync::atomic::AtomicUsize>, total: usize) {
        let now = finished.load(std::sync::atomic::Ordering::SeqCst);
        self.files = Some((finished, total, now));
        self.set_message(format!("{now} of {total} files"));
    }

    /// The files counter's news, if it has any.
    fn files_changed(&mut self) {
        let Some((finished, total, shown)) = &mut self.files else { return };
        let now = finished.load(std::sync::atomic::Ordering::SeqCst);
        if now != *shown {
            *shown = now;
            let msg = format!("{now} of {total} files");
            self.set_message(msg);
        }
    }

    pub(crate) fn set_message(&mut self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg.clone());
        }
        self.msg = msg;
    }

    /// Bytes done so far (those done before the run included).
    pub(crate) fn done(&self) -> u64 {
        self.done
    }

    /// Bytes to do in all.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn advance(&mut self, bytes: u64) {
        // A window's bytes can exceed an estimated total (used space maps again while
        // frozen): the bar stops at its end rather than wrapping.
        self.done = (self.done + bytes).min(self.total.max(self.done));
        self.files_changed();
        if let Some(b) = &self.bar {
            b.set_position(self.done);
        } else if self.last_line.elapsed() >= self.every
            && 4 * self.done / self.total.max(1) > self.quarters_shown
            && self.done < self.total
        {
            self.last_line = Instant::now();
            self.quarters_shown = 4 * self.done / self.total.max(1);
            let secs = self.started.elapsed().as_secs_f64();
            let rate = self.done.saturating_sub(self.already) as f64 / secs.max(1e-9);
            let eta = if rate > 0.0 { self.total.saturating_sub(self.done) as f64 / rate } else { f64::NAN };
            use crate::support::units::{human_bytes, human_rate};
            let (done, total, rate) = (human_bytes(self.done), human_bytes(self.total), human_rate(rate));
            let share = 100.0 * self.done as f64 / self.total.max(1) as f64;
            let msg = if self.msg.is_empty() { String::new() } else { format!(", {}", self.msg) };
            log::info!("progress: {done} of {total} ({share:.1}%){msg}, {rate}, ETA {eta:.0} s");
        }
    }

    /// The end of an engine run: the bar goes, unless it spans several (`close` ends it).
    pub(crate) fn finish(&self) {
        if !self.spanning {
            self.close();
        }
    }

    pub(crate) fn close(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The widest line of the default text: what a terminal shows without wrapping.
pub(crate) const WIDTH: usize = 100;

/// Wraps each line longer than `width` at spaces, the rest of it indented 4 more than the
/// line (a hanging indent); a word longer than a line stays whole.
pub(crate) fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        if body.chars().count() <= width {
            out += line;
            continue;
        }
        let indent = body.len() - body.trim_start().len();
        let hang = " ".repeat(indent + 4);
        let mut cur = body[..indent].to_string();
        let mut first = true;
        for word in words(body.trim_start()) {
            let start = if first { indent } else { hang.len() };
            if cur.chars().count() > start && cur.chars().count() + 1 + word.chars().count() > width {
                out += cur.trim_end();
                out += "\n";
                cur = hang.clone();
                first = false;
            } else if cur.chars().count() > start {
                cur.push(' ');
            }
            cur += &word;
        }
        out += cur.trim_end();
        if line.ends_with('\n') {
            out += "\n";
        }
    }
    out
}

/// The words of a line, a unit kept with its number ("1.000 s", "4.0 MiB"): a line never
/// breaks between them.
fn words(line: &str) -> Vec<String> {
    const UNITS: [&str; 11] = ["s", "ms", "B", "KiB", "MiB", "GiB", "TiB", "%", "KiB/s", "MiB/s", "GiB/s"];
    let mut out: Vec<String> = Vec::new();
    for w in line.split(' ') {
        let after_number = out.last().is_some_and(|p| p.ends_with(|c: char| c.is_ascii_digit()));
        match out.last_mut() {
            Some(prev) if after_number && UNITS.contains(&w) => {
                prev.push(' ');
                prev.push_str(w);
            }
            _ => out.push(w.to_string()),
        }
    }
    out
}

/// A message for stderr (`reseq: …` and its hint): at a terminal, wrapped to its width
/// (at most [`WIDTH`]) with a hanging indent; elsewhere (a log, a pipe, journald) one line
/// per message, whole, for grep.
pub(crate) fn for_stderr(text: &str) -> String {
    use std::io::IsTerminal;
    let err = std::io::stderr();
    if !err.is_terminal() {
        return text.to_string();
    }
    match terminal_size::terminal_size_of(&err) {
        Some((w, _)) if w.0 > 0 => fit(text, (w.0 as usize).clamp(40, WIDTH)),
        _ => fit(text, WIDTH),
    }
}

/// A long line up to its first "; ", without its asides in parentheses (" (...)"; a
/// "file(s)" stays).
pub(crate) fn cut(line: &str) -> String {
    let head = line.split("; ").next().unwrap_or(line);
    let (mut out, mut depth) = (String::new(), 0);
    let mut chars = head.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' if depth == 0 && chars.peek() == Some(&'(') => {
                chars.next();
                depth = 1;
            }
            '(' if depth > 0 => depth += 1,
            ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_plain_and_bench_passes_stay_off_a_mail() {
        assert_eq!(plain(log::Level::Warn, "x"), "warning: x");
        assert_eq!(plain(log::Level::Info, "progress: 1 of 2"), "progress: 1 of 2");
        assert!(filter(0, false, false).contains("reseq::measure::bench=warn"));
        assert!(!filter(0, false, true).contains("bench"), "a terminal sees each pass");
        assert!(!filter(1, false, false).contains("bench"), "-v sees each pass");
    }

    #[test]
    fn a_long_line_wraps_under_itself_and_never_between_a_number_and_its_unit() {
        let line = "rewriting /dev/loop0 (128.0 MiB) in 32 chunks of 4.0 MiB, freezing for at most 1.000 s\n";
        let text = fit(line, 84);
        assert_eq!(
            text,
            "rewriting /dev/loop0 (128.0 MiB) in 32 chunks of 4.0 MiB, freezing for at most\n    1.000 s\n"
        );
        assert_eq!(fit("  a b\n", 100), "  a b\n");
        // A unit-like word after a word, not a number, is a word like any other.
        assert_eq!(fit("aaaa s", 5), "aaaa\n    s");
    }

    #[test]
    fn the_files_counter_follows_the_files_finished() {
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(2));
        let mut p = Progress::new(100, 0, true);
        p.count_files(std::sync::Arc::clone(&finished), 10);
        assert_eq!(p.msg, "2 of 10 files");
        finished.store(7, std::sync::atomic::Ordering::SeqCst);
        p.advance(10);
        assert_eq!(p.msg, "7 of 10 files", "updated as bytes come, not at the end of a filesystem");
        assert_eq!((p.done(), p.total()), (10, 100));
    }

    #[test]
    fn without_a_terminal_a_line_comes_per_quarter_and_not_too_often() {
        let mut p = Progress::new(100, 0, true);
        p.every = Duration::ZERO;
        p.last_line -= Duration::from_secs(1);
        for _ in 0..100 {
            p.advance(1);
        }
        assert_eq!(p.quarters_shown, 3, "lines at 25, 50 and 75 %: the summary says the rest");
        let mut p = Progress::new(100, 0, true);
        p.advance(60);
        assert_eq!(p.quarters_shown, 0, "none within {LINE_EVERY:?} of the start");
    }
}
