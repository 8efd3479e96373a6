//! The engine's invariants (docs/ARCHITECTURE.md, "Invariants"), checked without root
//! and without a guardian: `engine::run`, the function the CLI runs, over a simulated
//! SSD wrapped in a target that logs every read, write and flush, under a scripted
//! `WindowGuard` that freezes nothing but plays the guardian's part (deny a permit at
//! chunk N, overrun the deadline, break the bound, lose the freeze). Every event notes
//! how many `begin` and `done` records the journal file holds at that moment, so the
//! order of journal, permit, write, read-back, thaw, flush and commit can be checked.
//!
//! Runs in well under a second: 16 chunks of 64 KiB per scenario.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::engine::guard::{Reporter, WindowEnd, WindowGuard};
use crate::engine::journal::{self, Journal, RunRecord};
use crate::engine::target::{BlockTarget, ReadTarget};
use crate::engine::trial::{Shape, Trial};
use crate::engine::{self, EngineConfig, EngineStats};
use crate::sim::ftl::Params;
use crate::sim::{SimDevice, SimState};
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;

const CHUNK: u64 = 64 << 10;
const CHUNKS: u64 = 16;
const DEVICE: u64 = CHUNK * CHUNKS;

thread_local! {
    /// The pipeline's depth (`EngineConfig::read_ahead`) of the runs on this thread:
    /// the scenarios run at the old default, 2, and again at other depths below.
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(2) };
    /// Whether the runs on this thread try a second shape (chunks of 2 at depth 1) on
    /// their first stretches of 3 chunks (`engine::trial`).
    static TRIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Journal records at the time of an event: (`begin` lines, `done` lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Records {
    begun: usize,
    done: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Freeze,
    /// A permit asked for the chunk at `offset`; `begun`: its `begin` record was in the
    /// journal file when the guard was asked.
    Permit {
        offset: u64,
        granted: bool,
        begun: bool,
    },
    /// `alone`: no other write was in progress when it began.
    Write {
        offset: u64,
        ok: bool,
        alone: bool,
    },
    Read {
        offset: u64,
    },
    /// `WRITTEN` (from the writer or the verifier).
    Written,
    Thaw,
    Flush,
}

#[derive(Clone)]
struct Log {
    events: Arc<Mutex<Vec<(Ev, Records)>>>,
    journal: PathBuf,
}

impl Log {
    fn push(&self, ev: Ev) {
        let text = std::fs::read_to_string(&self.journal).unwrap_or_default();
        let records = Records {
            begun: text.matches(r#""type":"begin""#).count(),
            done: text.matches(r#""type":"done""#).count(),
        };
        self.events.lock().unwrap().push((ev, records));
    }
    fn events(&self) -> Vec<(Ev, Records)> {
        self.events.lock().unwrap().clone()
    }
    fn journal_has_begin(&self, offset: u64) -> bool {
        let text = std::fs::read_to_string(&self.journal).unwrap_or_default();
        journal_lines(&text).any(|r| matches!(r, journal::Record::Begin { offset: o, .. } if o == offset))
    }
}

fn journal_lines(text: &str) -> impl Iterator<Item = journal::Record> + '_ {
    text.lines().filter_map(|l| serde_json::from_str(l.split_once(' ')?.1).ok())
}

/// The simulated SSD, every call logged; a write at `fail_writes_at` fails (every
/// attempt), a read-back at `differ_at` (a read after a write there) differs by a byte.
struct Logged {
    inner: SimDevice,
    log: Log,
    fail_writes_at: Option<u64>,
    differ_at: Option<u64>,
    /// Writes in progress (one writer: never more than one).
    writing: AtomicUsize,
    /// How long each read and write takes (a device slow enough for windows to end by
    /// their budget).
    delay: Duration,
}

impl ReadTarget for Logged {
    fn mem_align(&self) -> usize {
        self.inner.mem_align()
    }
    fn offset_align(&self) -> u64 {
        self.inner.offset_align()
    }
    fn read_some_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::thread::sleep(self.delay);
        self.inner.read_at(buf, offset)?;
        let written_before =
            self.log.events().iter().any(|(e, _)| matches!(e, Ev::Write { offset: o, ok: true, .. } if *o == offset));
        if self.differ_at == Some(offset) && written_before {
            buf[100] ^= 1;
        }
        self.log.push(Ev::Read { offset });
        Ok(buf.len())
    }
}

impl BlockTarget for Logged {
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let ok = self.fail_writes_at != Some(offset);
        let alone = self.writing.fetch_add(1, Ordering::SeqCst) == 0;
        self.log.push(Ev::Write { offset, ok, alone });
        std::thread::sleep(self.delay);
        let wrote = match ok {
            true => self.inner.write_at(buf, offset),
            false => Err(std::io::Error::from_raw_os_error(nix::libc::EIO)),
        };
        self.writing.fetch_sub(1, Ordering::SeqCst);
        wrote
    }
    fn flush(&self) -> std::io::Result<()> {
        self.log.push(Ev::Flush);
        self.inner.flush()
    }
}

/// What the scripted guard does, by permit number (0-based, over the run) or window
/// number (1-based).
#[derive(Default, Clone, Copy)]
struct Script {
    deny_permit: Option<usize>,
    lose_at_permit: Option<usize>,
    overrun_window: Option<u64>,
    beyond_bound_window: Option<u64>,
    /// The deadline, and how long each read and write of the target takes (None: an hour,
    /// never reached, and no delay: windows end by the script, not by the clock).
    deadline_and_delay: Option<(Duration, Duration)>,
}

struct Scripted {
    log: Log,
    script: Script,
    permits: usize,
    windows: u64,
    frozen: bool,
    announced: Option<u64>,
}

impl WindowGuard for Scripted {
    fn freezes(&self) -> bool {
        true
    }
    fn deadline(&self) -> Option<Duration> {
        // Unless the script sets one, never reached: windows end by the script, not by
        // the clock of a busy host.
        Some(self.script.deadline_and_delay.map_or(Duration::from_secs(3600), |(d, _)| d))
    }
    fn begin(&mut self) -> Result<()> {
        assert!(!self.frozen, "begin inside a window");
        self.frozen = true;
        self.windows += 1;
        self.log.push(Ev::Freeze);
        Ok(())
    }
    fn announce(&mut self, offset: u64, _len: u64, _hash: &blake3::Hash) {
        self.announced = Some(offset);
    }
    fn may_write(&mut self) -> Result<bool> {
        assert!(self.frozen, "a permit asked for outside a window");
        let n = self.permits;
        self.permits += 1;
        let offset = self.announced.take().expect("every permit names its chunk");
        let begun = self.log.journal_has_begin(offset);
        if self.script.lose_at_permit == Some(n) {
            self.log.push(Ev::Permit { offset, granted: false, begun });
            return Err(Error::FreezeLost {
                filesystem: "/scripted".into(),
                window: 0,
                foreign: false,
                written: Vec::new(),
            });
        }
        let granted = self.script.deny_permit != Some(n);
        self.log.push(Ev::Permit { offset, granted, begun });
        Ok(granted)
    }
    fn wrote(&mut self) -> Result<()> {
        self.log.push(Ev::Written);
        Ok(())
    }
    fn reporter(&self) -> Result<Reporter> {
        let log = self.log.clone();
        Ok(Reporter::new(move || {
            log.push(Ev::Written);
            Ok(())
        }))
    }
    fn end(&mut self) -> Result<WindowEnd> {
        assert!(self.frozen, "end outside a window");
        self.frozen = false;
        self.log.push(Ev::Thaw);
        let bound = Duration::from_millis(1250);
        Ok(WindowEnd {
            frozen: Duration::from_millis(5),
            overran: self.script.overrun_window == Some(self.windows),
            beyond_bound: (self.script.beyond_bound_window == Some(self.windows)).then_some(bound),
        })
    }
    fn recheck(&mut self) -> Result<()> {
        Ok(())
    }
    fn held(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn at_risk(&self) -> Option<Vec<(u64, u64)>> {
        None
    }
}

struct Outcome {
    stats: EngineStats,
    result: Result<()>,
    events: Vec<(Ev, Records)>,
    replay: journal::Replay,
    _dir: tempfile::TempDir,
}

fn run(script: Script, fail_writes_at: Option<u64>, differ_at: Option<u64>, max_overruns: u32) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let log = Log { events: Arc::default(), journal: path.clone() };
    // The model needs room for its garbage collection: the range is its first MiB.
    let params = Params { logical_bytes: 1 << 30, ..Params::preset("consumer-nvme").unwrap() };
    let target = Logged {
        inner: SimDevice::new(SimState::new(params)),
        log: log.clone(),
        fail_writes_at,
        differ_at,
        writing: AtomicUsize::new(0),
        delay: script.deadline_and_delay.map_or(Duration::ZERO, |(_, d)| d),
    };
    let cfg = EngineConfig {
        chunk_size: CHUNK,
        range_start: 0,
        range_end: DEVICE,
        start_offset: 0,
        verify: true,
        read_ahead: DEPTH.get(),
        max_overruns,
        trial: TRIAL.get().then(|| Trial {
            shapes: vec![
                Shape { chunk_size: CHUNK, read_ahead: DEPTH.get() },
                Shape { chunk_size: 2 * CHUNK, read_ahead: 1 },
            ],
            stretch_bytes: 3 * CHUNK,
        }),
        ..EngineConfig::default()
    };
    let mut journal = Journal::create(&path, run_record(&cfg)).unwrap();
    let mut guard = Scripted { log: log.clone(), script, permits: 0, windows: 0, frozen: false, announced: None };
    let (stats, result) = engine::run(
        &target,
        &cfg,
        &mut engine::Everything,
        &mut guard,
        &mut journal,
        &mut Progress::new(DEVICE, 0, true),
        &StopFlag::default(),
    );
    assert!(!guard.frozen, "the run ended inside a window");
    let replay = journal::read(&path).unwrap().expect("the journal exists");
    let events = log.events();
    check_invariants(&events);
    Outcome { stats, result, events, replay, _dir: dir }
}

fn run_record(cfg: &EngineConfig) -> RunRecord {
    RunRecord {
        version: journal::JOURNAL_VERSION,
        identity: crate::engine::identity::DeviceIdentity {
            name: "sim".into(),
            dev: "0:0".into(),
            size_bytes: DEVICE,
            ..Default::default()
        },
        chunk_size_bytes: cfg.chunk_size,
        range_start_bytes: cfg.range_start,
        range_end_bytes: cfg.range_end,
        chunks_total: cfg.chunks_total(),
        started_at: "2026-01-01T00:00:00Z".into(),
        files: Vec::new(),
        options: None,
    }
}

/// The invariants every run keeps, whatever stopped it.
fn check_invariants(events: &[(Ev, Records)]) {
    let mut frozen = false;
    // A granted permit not yet used by a write.
    let mut permit: Option<u64> = None;
    let (mut granted, mut written) = (0usize, 0usize);
    // Writes of this window still waiting for their read-back.
    let mut unread: Vec<u64> = Vec::new();
    // Offsets read in this window: a write's bytes must be among them (read while frozen).
    let mut read: Vec<u64> = Vec::new();
    let mut at_thaw: Option<Records> = None;
    let mut flushed_since_thaw = false;
    for (i, (ev, rec)) in events.iter().enumerate() {
        let at = format!("event {i} ({ev:?}) in {events:#?}");
        match ev {
            Ev::Freeze => {
                assert!(!frozen, "{at}: frozen twice");
                frozen = true;
                (granted, written) = (0, 0);
                read.clear();
                at_thaw = None;
            }
            Ev::Permit { offset, granted: g, begun } => {
                assert!(frozen, "{at}: permit outside a window");
                assert!(begun, "{at}: journal `begin` must come before the permit");
                assert_eq!(permit, None, "{at}: a permit granted and not used");
                if *g {
                    permit = Some(*offset);
                    granted += 1;
                }
            }
            Ev::Write { offset, ok, .. } => {
                assert!(frozen, "{at}: nothing may be written after the thaw");
                assert_eq!(permit.take(), Some(*offset), "{at}: a write needs the permit for its chunk");
                assert!(read.contains(offset), "{at}: the bytes written were not read in this window");
                if *ok {
                    unread.push(*offset);
                }
            }
            Ev::Read { offset } => {
                unread.retain(|o| o != offset);
                read.push(*offset);
            }
            Ev::Written => {
                written += 1;
                assert!(written <= granted, "{at}: WRITTEN without a permit");
            }
            Ev::Thaw => {
                assert!(frozen, "{at}: thaw outside a window");
                assert_eq!(permit, None, "{at}: thawed with a permit granted and not used");
                assert_eq!(
                    written, granted,
                    "{at}: every granted write (failed ones too) reports WRITTEN before the thaw"
                );
                assert!(unread.is_empty(), "{at}: thawed before the read-back of {unread:?}");
                frozen = false;
                at_thaw = Some(*rec);
                flushed_since_thaw = false;
            }
            Ev::Flush => {
                assert!(!frozen, "{at}: the device is flushed after the thaw");
                let thaw = at_thaw.expect("a flush follows a window");
                assert_eq!(rec.done, thaw.done, "{at}: `done` records are written after the flush, not before");
                flushed_since_thaw = true;
            }
        }
        if let Some(thaw) = at_thaw {
            assert!(
                rec.done == thaw.done || flushed_since_thaw,
                "{at}: `done` records appeared without a device flush first"
            );
        }
        if frozen {
            let done_at_freeze = events[..=i].iter().rev().find(|(e, _)| *e == Ev::Freeze).unwrap().1.done;
            assert_eq!(
                rec.done, done_at_freeze,
                "{at}: `done` records are committed after the thaw, not in the window"
            );
        }
    }
    assert!(!frozen, "the run ended frozen");
    one_writer_ascending(events);
}

/// One writer, in ascending order within each window (a retry repeats its offset).
fn one_writer_ascending(events: &[(Ev, Records)]) {
    let mut last: Option<u64> = None;
    for (i, (ev, _)) in events.iter().enumerate() {
        match ev {
            Ev::Freeze => last = None,
            Ev::Write { offset, alone, .. } => {
                assert!(alone, "event {i}: a write began while another was in progress, in {events:#?}");
                assert!(last <= Some(*offset), "event {i}: writes descend within a window, in {events:#?}");
                last = Some(*offset);
            }
            _ => {}
        }
    }
}

fn writes_at(events: &[(Ev, Records)], offset: u64) -> usize {
    events.iter().filter(|(e, _)| matches!(e, Ev::Write { offset: o, .. } if *o == offset)).count()
}

fn count(events: &[(Ev, Records)], want: &Ev) -> usize {
    events.iter().filter(|(e, _)| e == want).count()
}

fn is_thaw(e: &(Ev, Records)) -> bool {
    e.0 == Ev::Thaw
}

#[test]
fn a_clean_run_writes_every_chunk_once_and_journals_it_after_the_thaw() {
    let o = run(Script::default(), None, None, 1);
    o.result.expect("a clean run succeeds");
    assert_eq!(o.stats.windows, 1);
    assert_eq!(o.stats.chunks_written, CHUNKS);
    assert_eq!(o.stats.next_offset_bytes, DEVICE);
    for c in 0..CHUNKS {
        assert_eq!(writes_at(&o.events, c * CHUNK), 1, "chunk {c}");
    }
    assert!(o.replay.finished);
    assert_eq!(o.replay.done_offset, DEVICE);
    assert_eq!(count(&o.events, &Ev::Flush), 1, "one flush, after the window");
}

/// Windows that end by their budget (a 60 ms deadline, 5 ms per read and per write):
/// the reader reads what the writer is expected to write in the window, not chunks the
/// thaw drops and the next window reads again. Before (issue 37) each such window dropped
/// the pool's worth of chunks read ahead, three or four.
#[test]
fn windows_ended_by_their_budget_read_little_they_do_not_write() {
    let script =
        Script { deadline_and_delay: Some((Duration::from_millis(60), Duration::from_millis(5))), ..Script::default() };
    let o = run(script, None, None, 100);
    o.result.expect("a run in short windows succeeds");
    assert!(o.stats.windows >= 3, "the budget should end windows: {} windows", o.stats.windows);
    for c in 0..CHUNKS {
        assert_eq!(writes_at(&o.events, c * CHUNK), 1, "chunk {c}");
    }
    let reads = o.stats.bytes_read / CHUNK;
    eprintln!(
        "{} windows, {reads} chunks read for {CHUNKS}, dropped {}",
        o.stats.windows,
        o.stats.bytes_read_ahead_dropped / CHUNK
    );
    // At most one chunk read in vain per window ended by its budget (a busy host's
    // scheduling can make a chunk slower than predicted), none in the last.
    assert!(
        reads < CHUNKS + o.stats.windows,
        "{reads} chunks read for {CHUNKS} written in {} windows",
        o.stats.windows
    );
    assert_eq!(o.stats.bytes_read - o.stats.bytes_written, o.stats.bytes_read_ahead_dropped);
    assert!(o.replay.finished);
}

#[test]
fn a_denied_permit_ends_the_window_and_its_chunk_is_written_in_the_next() {
    let o = run(Script { deny_permit: Some(5), ..Script::default() }, None, None, 10);
    o.result.expect("a denied permit is an overrun the run recovers from");
    assert_eq!(o.stats.windows, 2);
    assert_eq!(o.stats.windows_overrun, 1);
    let denied = 5 * CHUNK;
    // Not written in the window that was denied: the only write is after the next freeze.
    let second = o.events.iter().rposition(|(e, _)| *e == Ev::Freeze).unwrap();
    let first_write = o.events.iter().position(|(e, _)| matches!(e, Ev::Write { offset, .. } if *offset == denied));
    assert!(first_write.unwrap() > second, "the denied chunk was written in the window that denied it");
    for c in 0..CHUNKS {
        assert_eq!(writes_at(&o.events, c * CHUNK), 1, "chunk {c}");
    }
    assert!(o.replay.finished);
    assert_eq!(o.replay.done_offset, DEVICE);
}

#[test]
fn an_overrun_window_stops_the_run_after_its_chunks_are_journaled() {
    let o = run(Script { deny_permit: Some(6), overrun_window: Some(1), ..Script::default() }, None, None, 1);
    match o.result {
        Err(Error::WindowOverrun { window: 1, overruns: 1, .. }) => {}
        r => panic!("expected a window overrun, got {r:?}"),
    }
    assert_eq!(o.stats.windows, 1);
    assert_eq!(o.stats.next_offset_bytes, 6 * CHUNK);
    assert_eq!(o.replay.done_offset, 6 * CHUNK, "what the window verified is journaled");
    assert!(!o.replay.finished);
    assert_eq!(count(&o.events, &Ev::Thaw), 1);
}

#[test]
fn a_window_beyond_the_bound_is_an_error_even_when_every_chunk_was_done() {
    let o = run(Script { beyond_bound_window: Some(1), ..Script::default() }, None, None, 10);
    match o.result {
        Err(Error::BoundBroken { window: 1, bound_ms: 1250, .. }) => {}
        r => panic!("expected the bound broken, got {r:?}"),
    }
    // The chunks were verified, so they are journaled; the run is not called finished.
    assert_eq!(o.replay.done_offset, DEVICE);
    assert!(!o.replay.finished);
}

#[test]
fn a_lost_freeze_stops_before_the_write_and_names_the_window_and_bytes() {
    let o = run(Script { lose_at_permit: Some(4), ..Script::default() }, None, None, 10);
    match o.result {
        Err(Error::FreezeLost { window: 1, written, .. }) => assert_eq!(written, vec![(0, 4 * CHUNK)]),
        r => panic!("expected the freeze lost in window 1 after 4 chunks, got {r:?}"),
    }
    assert_eq!(writes_at(&o.events, 4 * CHUNK), 0, "no write without a permit");
    assert_eq!(o.replay.done_offset, 4 * CHUNK);
    assert_eq!(o.stats.next_offset_bytes, 4 * CHUNK);
}

#[test]
fn a_failing_write_reports_written_for_each_attempt_and_the_cursor_stays_before_it() {
    let bad = 3 * CHUNK;
    let o = run(Script::default(), Some(bad), None, 10);
    match o.result {
        Err(Error::WriteFailed { offset, attempts: 3, .. }) => assert_eq!(offset, bad),
        r => panic!("expected the write at {bad} to fail after 3 attempts, got {r:?}"),
    }
    assert_eq!(writes_at(&o.events, bad), engine::WRITE_ATTEMPTS as usize);
    let permits =
        o.events.iter().filter(|(e, _)| matches!(e, Ev::Permit { offset, granted: true, .. } if *offset == bad));
    assert_eq!(permits.count(), 3, "each attempt has its own permit");
    assert!(o.replay.done_offset <= bad, "journal cursor {} past the failed chunk", o.replay.done_offset);
    assert!(o.stats.next_offset_bytes <= bad);
    assert_eq!(o.replay.in_flight.first().map(|c| c.0), Some(bad), "the failed chunk is the one in flight");
}

#[test]
fn a_differing_read_back_keeps_the_cursor_before_it_though_later_chunks_verify() {
    let bad = 3 * CHUNK;
    let o = run(Script::default(), None, Some(bad), 10);
    match o.result {
        Err(Error::ChecksumMismatch { offset, .. }) => assert_eq!(offset, bad),
        r => panic!("expected a checksum mismatch at {bad}, got {r:?}"),
    }
    assert_eq!(writes_at(&o.events, bad), 1, "a differing read-back is never written again");
    assert_eq!(o.replay.done_offset, bad, "chunks before it are done, none after");
    assert_eq!(o.stats.next_offset_bytes, bad);
    assert!(o.events.iter().filter(|e| is_thaw(e)).count() == 1);
}

/// Every scenario keeps the invariants and comes out the same at other depths: serial
/// (`--read-ahead 0`), and deep pipelines of 4 and 8 readers side by side, whose chunks
/// reach the hasher out of order.
#[test]
fn every_depth_keeps_the_invariants() {
    for depth in [0, 8, 16] {
        DEPTH.set(depth);
        eprintln!("depth {depth}");
        a_clean_run_writes_every_chunk_once_and_journals_it_after_the_thaw();
        windows_ended_by_their_budget_read_little_they_do_not_write();
        a_denied_permit_ends_the_window_and_its_chunk_is_written_in_the_next();
        an_overrun_window_stops_the_run_after_its_chunks_are_journaled();
        a_window_beyond_the_bound_is_an_error_even_when_every_chunk_was_done();
        a_lost_freeze_stops_before_the_write_and_names_the_window_and_bytes();
        a_failing_write_reports_written_for_each_attempt_and_the_cursor_stays_before_it();
        a_differing_read_back_keeps_the_cursor_before_it_though_later_chunks_verify();
    }
}

/// The chunk-size trial: each stretch is a window of its own at its shape, A B B A, and
/// the rest of the run uses the shape kept; every byte is written once, in ascending
/// order, every invariant holds, and the journal is done to the end. A failing write and
/// a differing read-back inside a stretch stop the run as they do anywhere.
#[test]
fn a_chunk_trial_writes_each_stretch_in_its_own_window_and_every_byte_once() {
    TRIAL.set(true);
    for depth in [2, 0, 8] {
        DEPTH.set(depth);
        let o = run(Script::default(), None, None, 1);
        o.result.expect("a run with a trial succeeds");
        let t = o.stats.chunk_trial.as_ref().expect("the trial's outcome is reported");
        let large = t.chosen.chunk_size == 2 * CHUNK;
        assert!(t.complete, "{}", t.why);
        assert_eq!(o.stats.windows, 5, "four stretches and the rest: {}", t.why);
        let writes: Vec<u64> = o
            .events
            .iter()
            .filter_map(|(e, _)| match e {
                Ev::Write { offset, ok: true, .. } => Some(offset / CHUNK),
                _ => None,
            })
            .collect();
        // A: 0 1 2, B: 3 5, B: 7 9, A: 11 12 13, the rest in the shape kept.
        let rest: &[u64] = if large { &[14] } else { &[14, 15] };
        assert_eq!(writes, [&[0, 1, 2, 3, 5, 7, 9, 11, 12, 13][..], rest].concat(), "{}", t.why);
        assert_eq!(t.measured.iter().map(|m| m.bytes).collect::<Vec<_>>(), vec![6 * CHUNK, 8 * CHUNK]);
        assert!(t.measured.iter().all(|m| m.seconds > 0.0 && m.bytes_per_second > 0.0), "{:?}", t.measured);
        assert_eq!(o.stats.bytes_written, DEVICE);
        assert!(o.replay.finished);
        assert_eq!(o.replay.done_offset, DEVICE);
        assert_eq!(count(&o.events, &Ev::Flush), 5, "each stretch flushed and committed");
        let bad = 7 * CHUNK;
        let o = run(Script::default(), Some(bad), None, 10);
        assert!(matches!(o.result, Err(Error::WriteFailed { offset, .. }) if offset == bad), "{:?}", o.result);
        assert_eq!(o.replay.done_offset, bad, "the stretches before it are done");
        let cut = o.stats.chunk_trial.as_ref().expect("a trial cut short is reported");
        assert!(!cut.complete && cut.chosen.chunk_size == CHUNK, "{}", cut.why);
        assert_eq!(cut.measured.iter().map(|m| m.bytes).collect::<Vec<_>>(), vec![3 * CHUNK, 4 * CHUNK], "{}", cut.why);
        assert!(cut.why.contains("stopped after 2 of the trial's 4 stretches"), "{}", cut.why);
        let o = run(Script::default(), None, Some(bad), 10);
        assert!(matches!(o.result, Err(Error::ChecksumMismatch { offset, .. }) if offset == bad), "{:?}", o.result);
        assert_eq!(o.replay.done_offset, bad);
    }
    DEPTH.set(2);
    TRIAL.set(false);
}

/// The checks themselves catch what they claim to: a log that breaks each rule fails.
#[test]
fn the_invariant_checks_reject_broken_orders() {
    let r = |begun, done| Records { begun, done };
    let ok = vec![
        (Ev::Freeze, r(0, 0)),
        (Ev::Read { offset: 0 }, r(0, 0)),
        (Ev::Permit { offset: 0, granted: true, begun: true }, r(1, 0)),
        (Ev::Write { offset: 0, ok: true, alone: true }, r(1, 0)),
        (Ev::Read { offset: 0 }, r(1, 0)),
        (Ev::Written, r(1, 0)),
        (Ev::Thaw, r(1, 0)),
        (Ev::Flush, r(1, 0)),
    ];
    check_invariants(&ok);
    let broken: Vec<(&str, Vec<(Ev, Records)>)> = vec![
        ("permit before begin", with(&ok, 2, (Ev::Permit { offset: 0, granted: true, begun: false }, r(0, 0)))),
        ("write without permit", with(&ok, 2, (Ev::Permit { offset: 0, granted: false, begun: true }, r(1, 0)))),
        ("no WRITTEN", without(&ok, 5)),
        ("read-back after thaw", swap(&ok, 4, 6)),
        ("write after thaw", swap(&ok, 3, 6)),
        ("done before the flush", with(&ok, 7, (Ev::Flush, r(1, 1)))),
        ("done in the window", with(&ok, 5, (Ev::Written, r(1, 1)))),
        ("two writers", with(&ok, 3, (Ev::Write { offset: 0, ok: true, alone: false }, r(1, 0)))),
        ("descending writes", descending(&ok)),
        ("bytes read before the freeze", swap(&ok, 0, 1)),
        ("bytes never read", without(&ok, 1)),
    ];
    for (what, events) in broken {
        let caught = std::panic::catch_unwind(|| check_invariants(&events)).is_err();
        assert!(caught, "{what} was not caught");
    }
}

/// `ok` with a second chunk, at CHUNK, written before the first.
fn descending(ok: &[(Ev, Records)]) -> Vec<(Ev, Records)> {
    let r = Records { begun: 2, done: 0 };
    let mut v = ok.to_vec();
    let second = [
        (Ev::Read { offset: CHUNK }, r),
        (Ev::Permit { offset: CHUNK, granted: true, begun: true }, r),
        (Ev::Write { offset: CHUNK, ok: true, alone: true }, r),
        (Ev::Read { offset: CHUNK }, r),
        (Ev::Written, r),
    ];
    v.splice(1..1, second);
    v
}

fn with(ev: &[(Ev, Records)], i: usize, e: (Ev, Records)) -> Vec<(Ev, Records)> {
    let mut v = ev.to_vec();
    v[i] = e;
    v
}

fn without(ev: &[(Ev, Records)], i: usize) -> Vec<(Ev, Records)> {
    let mut v = ev.to_vec();
    v.remove(i);
    v
}

fn swap(ev: &[(Ev, Records)], i: usize, j: usize) -> Vec<(Ev, Records)> {
    let mut v = ev.to_vec();
    v.swap(i, j);
    v
}
