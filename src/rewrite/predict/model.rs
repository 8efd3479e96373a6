//! The run's windows, simulated chunk by chunk the way the engine cuts them: the
//! engine's own pacer (`engine::pace`) decides when a window stops starting chunks, its
//! budget shrinks after an overrun and grows back, chunks halve when one takes more
//! than a quarter of the budget, `--rate` ends windows early and lengthens the pauses,
//! and file mode's planner maps files a tenth of a window at a time, so that a window
//! ends where its map ends. What each step costs comes from the probe's reads and the
//! constants below, measured on real runs.

use std::time::Duration;

use crate::engine::pace::{Pace, Share};
use crate::engine::policy::{self, COMMIT_INTERVAL_BYTES};

/// A chunk costs the writer its bytes at the probe's rate this many times (its read,
/// ahead, by the reader, and its read-back, by the verifier, overlap with the write and
/// with each other), plus its bytes at the write rate this many times (the write, and
/// what it slows the reads by), plus a read's latency once (the three wait side by
/// side). Fitted on ext4 over loop devices on a virtual disk, 4 MiB chunks and 3000
/// small files, at read rates of 1.6-4 GB/s (a virtual disk reads recently written data
/// from its host's cache; its writes ran at 0.6-0.9 GB/s), 2026-11-28.
pub(crate) const READ_SHARE: f64 = 1.0;
pub(crate) const WRITE_SHARE: f64 = 1.35;
/// Without verification: no read-back (measured: 0.75 of the verified run's time).
pub(crate) const READ_SHARE_UNVERIFIED: f64 = 0.4;
/// A dry run cannot write, so writes are taken to go as fast as the probe's reads but
/// no faster than this: sustained writes outlast any write cache (a TLC drive past its
/// SLC cache, a virtual disk past its host's), while recent data may read from one. The
/// low end of the range lifts this cap.
pub(crate) const WRITE_CAP_BYTES_PER_SECOND: f64 = (1u64 << 30) as f64;
/// And this much more, whatever its size: the guardian's permit and the checks before
/// each write (the device's counters and shape).
pub(crate) const PER_CHUNK_SECONDS: f64 = 0.000_35;
/// A read-back, in reads of the same bytes (it runs beside the next write).
const READ_BACK_READS: f64 = 1.8;
/// blake3 of a chunk before its write can start (the first of each window waits for it).
const HASH_BYTES_PER_SECOND: f64 = 1.5e9;
/// Before a window's freeze: syncfs (ext4 commits what the last thaw left) and the
/// guardian's round trip, counted in the window's budget, not in its freeze. FIFREEZE
/// itself (ext4 checkpoints its journal: little after the last window, more after
/// applications wrote), and the thaw. Measured on ext4 over a loop device on a quiet
/// host: 14-45 ms for the two (14 ms when only reseq had written since the last window,
/// 40-45 ms in the first windows after files were written), 1-7 ms for the thaw; under
/// another job's I/O 45-88 ms and 3-11 ms (the range scales them with the host's
/// pressure), 2026-11-28. A dry run freezes nothing, so none is measured on the target.
pub(crate) const FREEZE_BEFORE_SECONDS: f64 = 0.025;
pub(crate) const FREEZE_SECONDS: f64 = 0.020;
pub(crate) const THAW_SECONDS: f64 = 0.004;
/// After each window: the device's flush and the journal's fsync.
const COMMIT_SECONDS: f64 = 0.008;
/// Beyond this many windows or chunks, the rest is extrapolated by bytes.
const MAX_WINDOWS: u64 = 20_000;
const MAX_CHUNKS: u64 = 2_000_000;

/// What one planner hands out: a file (file mode), or everything (device mode).
#[derive(Clone, Debug, Default)]
pub(crate) struct Batch {
    /// Seconds to map it in a window (file mode: open and FIEMAP).
    pub(crate) map_seconds: f64,
    /// Its runs of adjacent bytes, in order, each cut into chunks.
    pub(crate) runs: Vec<Run>,
}

/// Bytes adjacent on the device (and in the run's address space).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Run {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// It continues the run before it (the last of the batch before): when both are in
    /// one window's plan, the engine sees one range, and chunks cross between them.
    pub(crate) joins: bool,
}

/// One engine run: what it rewrites, and what planning a window costs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Layout {
    pub(crate) batches: Vec<Batch>,
    /// Every window's planning, whatever it maps (device mode: GETFSMAP).
    pub(crate) plan_seconds: f64,
    /// File mode: a window maps batches until this much time has gone (the planner's
    /// tenth of a window); None: all of them at once.
    pub(crate) plan_time: Option<f64>,
}

impl Layout {
    pub(crate) fn bytes(&self) -> u64 {
        self.batches.iter().flat_map(|b| &b.runs).map(|r| r.len).sum()
    }

    /// The chunks a window planning everything would cut, in order: (device offset,
    /// length).
    pub(crate) fn chunks(&self, chunk_size: u64) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for r in self.batches.iter().flat_map(|b| &b.runs) {
            match ranges.last_mut() {
                Some(last) if r.joins => last.1 += r.len,
                _ => ranges.push((r.offset, r.len)),
            }
        }
        let cut = |&(at, len): &(u64, u64)| {
            (0..len.div_ceil(chunk_size.max(1)))
                .map(move |i| (at + i * chunk_size, (len - i * chunk_size).min(chunk_size)))
        };
        ranges.iter().flat_map(cut).collect()
    }
}

/// What a read costs (the probe's fit), the write rate taken, and factors on every
/// chunk's time and on every window's own (the range; a host's load slows both).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Costs {
    pub(crate) latency: f64,
    pub(crate) bytes_per_second: f64,
    pub(crate) write_bytes_per_second: f64,
    /// What each read of the run's reader, a normal thread, waits for a CPU.
    pub(crate) penalty: f64,
    pub(crate) scale: f64,
    pub(crate) fixed_scale: f64,
}

impl Costs {
    fn read(&self, len: u64) -> f64 {
        (self.latency + len as f64 / self.bytes_per_second.max(1.0)) * self.scale
    }
    /// A chunk's time in the pipeline: the writer's, unless the reader, waiting for a CPU
    /// after each read on a busy host, cannot keep up (small chunks).
    fn step(&self, len: u64, verify: bool) -> f64 {
        let reads = if verify { READ_SHARE } else { READ_SHARE_UNVERIFIED };
        let read = len as f64 / self.bytes_per_second.max(1.0);
        let write = len as f64 / self.write_bytes_per_second.max(1.0);
        let writer = (PER_CHUNK_SECONDS + self.latency + reads * read + WRITE_SHARE * write) * self.scale;
        writer.max(self.read(len) + self.penalty)
    }
    fn fixed(&self, seconds: f64) -> f64 {
        seconds * self.fixed_scale
    }
}

/// The run's pacing options.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) chunk_size: u64,
    pub(crate) align: u64,
    pub(crate) verify: bool,
    /// `--max-freeze` (None: nothing is frozen, one long window).
    pub(crate) deadline: Option<f64>,
    pub(crate) pause: f64,
    pub(crate) rate: Option<f64>,
    pub(crate) max_overruns: u32,
    pub(crate) read_ahead: usize,
}

/// What the simulated run came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) windows: u64,
    pub(crate) frozen: f64,
    pub(crate) longest: f64,
    /// The whole run, pauses included.
    pub(crate) seconds: f64,
    pub(crate) overruns: u64,
    /// It stops at `--max-overruns` overruns (exit 7).
    pub(crate) stopped: bool,
    pub(crate) bytes: u64,
    pub(crate) chunks: u64,
    /// Read ahead at a window's end and dropped (read again in the next).
    pub(crate) dropped: u64,
}

/// Runs the layout through the engine's pacing.
pub(crate) fn simulate(layout: &Layout, costs: Costs, settings: &Settings) -> Outcome {
    let mut sim = Sim::new(layout, costs, settings);
    while sim.batch < layout.batches.len() && !sim.out.stopped {
        sim.window();
        if sim.out.bytes > 0 && (sim.out.windows >= MAX_WINDOWS || sim.out.chunks >= MAX_CHUNKS) {
            return sim.extrapolated(layout.bytes());
        }
    }
    // A run that stops at its overruns (exit 7) is counted up to there.
    sim.out
}

struct Sim<'a> {
    layout: &'a Layout,
    costs: Costs,
    s: &'a Settings,
    pace: Pace,
    share: Share,
    chunk: u64,
    /// The engine's decaying estimate of a chunk's time, which sets the chunk size.
    estimate: Duration,
    /// The cursor: batch, run in it, bytes of that run done.
    batch: usize,
    run: usize,
    offset: u64,
    out: Outcome,
}

/// Why a window's writer stopped.
#[derive(PartialEq)]
enum Flow {
    Complete,
    BudgetSpent,
    Overrun,
}

impl<'a> Sim<'a> {
    fn new(layout: &'a Layout, costs: Costs, s: &'a Settings) -> Sim<'a> {
        let (pace, share) = (Pace::default(), Share::default());
        let out = Outcome::default();
        Sim {
            layout,
            costs,
            s,
            pace,
            share,
            chunk: s.chunk_size,
            estimate: Duration::ZERO,
            batch: 0,
            run: 0,
            offset: 0,
            out,
        }
    }

    /// One window: pause, freeze, map, chunks until the pacer stops them, thaw, commit.
    fn window(&mut self) {
        let budget = self.s.deadline.map(|d| d * self.share.get());
        self.pause_before();
        self.pace.fade();
        let freezes = self.s.deadline.is_some();
        let before = if freezes { self.costs.fixed(FREEZE_BEFORE_SECONDS) } else { 0.0 };
        let mut t = before + if freezes { self.costs.fixed(FREEZE_SECONDS) } else { 0.0 };
        let horizon = self.plan(&mut t);
        let (flow, last) = self.chunks(&mut t, horizon, budget, before);
        // The last read-back is waited for before the thaw.
        if last > 0 && self.s.verify {
            t += READ_BACK_READS * self.costs.read(last);
        }
        if freezes {
            t += self.costs.fixed(THAW_SECONDS);
            self.pace.thawed(seconds(self.costs.fixed(THAW_SECONDS)));
        }
        if flow == Flow::Complete {
            (self.batch, self.run, self.offset) = (horizon, 0, 0);
        } else {
            self.out.dropped += self.read_ahead_of(horizon);
        }
        self.account(flow, t, before, budget);
    }

    /// `--pause`, or longer when the run is ahead of `--rate` (not before the first).
    fn pause_before(&mut self) {
        if self.out.windows == 0 {
            return;
        }
        let pause =
            policy::pause_before_window(seconds(self.s.pause), self.s.rate, self.out.bytes, seconds(self.out.seconds));
        self.out.seconds += pause.as_secs_f64();
    }

    /// The window's planning; returns the batch its plan ends before.
    fn plan(&mut self, t: &mut f64) -> usize {
        *t += self.costs.fixed(self.layout.plan_seconds);
        let Some(limit) = self.layout.plan_time else { return self.layout.batches.len() };
        let (mut b, mut spent) = (self.batch, 0.0);
        while b < self.layout.batches.len() && (b == self.batch || spent < limit) {
            spent += self.costs.fixed(self.layout.batches[b].map_seconds);
            b += 1;
        }
        *t += spent;
        b
    }

    /// The run after the cursor's (in this batch or a later one before `horizon`).
    fn run_after(&self, (b, r): (usize, usize), horizon: usize) -> Option<(usize, usize)> {
        let batches = &self.layout.batches;
        if r + 1 < batches[b].runs.len() {
            return Some((b, r + 1));
        }
        (b + 1..horizon).find(|&n| !batches[n].runs.is_empty()).map(|n| (n, 0))
    }

    /// The next chunk's length before `horizon` (runs that join are one range), the
    /// cursor first moved past what is done.
    fn next_chunk(&mut self, horizon: usize) -> Option<u64> {
        let batches = &self.layout.batches;
        while self.batch < horizon && batches[self.batch].runs.get(self.run).is_none_or(|r| self.offset >= r.len) {
            match self.run_after((self.batch, self.run), horizon) {
                Some((b, r)) => (self.batch, self.run, self.offset) = (b, r, 0),
                None => (self.batch, self.run, self.offset) = (horizon, 0, 0),
            }
        }
        if self.batch >= horizon {
            return None;
        }
        let (mut at, mut len) = ((self.batch, self.run), batches[self.batch].runs[self.run].len - self.offset);
        while len < self.chunk {
            match self.run_after(at, horizon) {
                Some((b, r)) if batches[b].runs[r].joins => (at, len) = ((b, r), len + batches[b].runs[r].len),
                _ => break,
            }
        }
        Some(len.min(self.chunk))
    }

    /// What the reader holds when a window stops short: the chunks after the cursor, as
    /// many as the engine's pool lets it read ahead (its read-ahead, the one it is
    /// reading and the one the writer would have taken next).
    fn read_ahead_of(&mut self, horizon: usize) -> u64 {
        let at = (self.batch, self.run, self.offset);
        let mut held = 0;
        for _ in 0..self.s.read_ahead + 2 {
            let Some(len) = self.next_chunk(horizon) else { break };
            self.advance(len);
            held += len;
        }
        (self.batch, self.run, self.offset) = at;
        held
    }

    /// Moves the cursor `len` bytes on (a chunk may end in a later run).
    fn advance(&mut self, mut len: u64) {
        let batches = &self.layout.batches;
        while len > 0 {
            let left = batches[self.batch].runs[self.run].len - self.offset;
            if len < left {
                self.offset += len;
                return;
            }
            len -= left;
            match self.run_after((self.batch, self.run), batches.len()) {
                Some((b, r)) => (self.batch, self.run, self.offset) = (b, r, 0),
                None => (self.batch, self.run, self.offset) = (batches.len(), 0, 0),
            }
        }
    }

    /// The writer's loop: chunks until the plan ends, the pacer or `--rate` stops the
    /// window, or the guardian would refuse a permit. Returns why, and the length of the
    /// last chunk written (0: none).
    fn chunks(&mut self, t: &mut f64, horizon: usize, budget: Option<f64>, before: f64) -> (Flow, u64) {
        let Some(first) = self.next_chunk(horizon) else { return (Flow::Complete, 0) };
        // The first write waits for its chunk's read and hash.
        *t += self.costs.read(first) + self.costs.fixed(first as f64 / HASH_BYTES_PER_SECOND);
        let (mut wrote, mut since_commit, mut last) = (0u64, 0u64, 0u64);
        while let Some(len) = self.next_chunk(horizon) {
            let read_backs = if self.s.verify { 2 } else { 0 };
            if let Some(b) = budget
                && wrote > 0
                && !self.pace.fits(seconds(*t), seconds(b), len, read_backs)
            {
                return (Flow::BudgetSpent, last);
            }
            if wrote > 0 && self.ahead_of_rate(len, *t) {
                return (Flow::BudgetSpent, last);
            }
            if self.s.deadline.is_some_and(|d| *t - before > d) {
                return (Flow::Overrun, last);
            }
            self.write(t, len);
            (wrote, since_commit, last) = (wrote + len, since_commit + len, len);
            if since_commit >= COMMIT_INTERVAL_BYTES && budget.is_none() {
                (*t, since_commit) = (*t + self.costs.fixed(COMMIT_SECONDS), 0);
            }
        }
        (Flow::Complete, last)
    }

    /// One chunk written (and read back): the pacer learns what it cost.
    fn write(&mut self, t: &mut f64, len: u64) {
        let step = self.costs.step(len, self.s.verify);
        *t += step;
        self.pace.write.learn(len, seconds(step), self.chunk);
        if self.s.verify {
            self.pace.read_back.learn(len, seconds(READ_BACK_READS * self.costs.read(len)), self.chunk);
        }
        self.estimate = policy::chunk_time(self.estimate, seconds(step));
        self.advance(len);
        self.out.bytes += len;
        self.out.chunks += 1;
    }

    /// As the engine: [`policy::ahead_of_rate`].
    fn ahead_of_rate(&self, len: u64, t: f64) -> bool {
        policy::ahead_of_rate(self.s.rate, self.out.bytes, len, seconds(self.out.seconds + t))
    }

    /// The window's freeze counted, its overrun judged, the chunk size adapted.
    fn account(&mut self, flow: Flow, t: f64, before: f64, budget: Option<f64>) {
        self.out.windows += 1;
        self.out.seconds += t + self.costs.fixed(COMMIT_SECONDS);
        let Some(deadline) = self.s.deadline else { return };
        let frozen = t - before;
        self.out.frozen += frozen;
        self.out.longest = self.out.longest.max(frozen);
        let overran = flow == Flow::Overrun || frozen > deadline;
        self.adapt_chunk(budget.unwrap_or(deadline), overran);
        if !overran {
            self.share.clean();
            return;
        }
        self.out.overruns += 1;
        self.share.overran();
        self.out.stopped = self.out.overruns >= u64::from(self.s.max_overruns);
    }

    /// As the engine: [`policy::adapt_chunk`].
    fn adapt_chunk(&mut self, budget: f64, overran: bool) {
        let (budget, max) = (seconds(budget), self.s.chunk_size);
        (self.chunk, self.estimate) =
            policy::adapt_chunk(self.chunk, self.estimate, budget, overran, max, self.s.align);
    }

    /// A run too long to simulate whole: the rest at the rate of what was simulated.
    fn extrapolated(mut self, total: u64) -> Outcome {
        let f = total as f64 / self.out.bytes.max(1) as f64;
        let o = &mut self.out;
        (o.windows, o.chunks) = ((o.windows as f64 * f).ceil() as u64, (o.chunks as f64 * f).ceil() as u64);
        (o.frozen, o.seconds, o.bytes) = (o.frozen * f, o.seconds * f, total);
        o.dropped = (o.dropped as f64 * f) as u64;
        o.overruns = (o.overruns as f64 * f) as u64;
        self.out
    }
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn one_batch(runs: &[u64]) -> Layout {
        let runs = runs.iter().scan(0, |at, &len| {
            *at += len;
            Some(Run { offset: *at - len, len, joins: false })
        });
        Layout { batches: vec![Batch { map_seconds: 0.0, runs: runs.collect() }], plan_seconds: 0.0, plan_time: None }
    }

    fn settings(deadline: Option<f64>) -> Settings {
        Settings {
            chunk_size: 4 * MIB,
            align: 512,
            verify: true,
            deadline,
            pause: 0.0,
            rate: None,
            max_overruns: 3,
            read_ahead: 2,
        }
    }

    /// 2.3 ms a 4 MiB read, as a loop device over a virtual disk.
    const COSTS: Costs = Costs {
        latency: 0.0,
        bytes_per_second: 1.8e9,
        write_bytes_per_second: 1.0e9,
        penalty: 0.0,
        scale: 1.0,
        fixed_scale: 1.0,
    };

    #[test]
    fn windows_fill_their_budget_and_none_overruns() {
        let layout = one_batch(&[292 * MIB]);
        let o = simulate(&layout, COSTS, &settings(Some(0.25)));
        assert_eq!((o.bytes, o.chunks, o.overruns), (292 * MIB, 73, 0));
        // Measured on that device: 5-7 windows, 0.8-1.06 s frozen.
        assert!((4..=8).contains(&o.windows), "{o:?}");
        assert!(o.longest <= 0.25 && o.frozen > 0.5 && o.frozen < 1.3, "{o:?}");
        assert!(o.seconds > o.frozen);
        // Each window that stops short drops what was read ahead: 4 chunks here.
        assert_eq!(o.dropped, (o.windows - 1) * 4 * 4 * MIB, "{o:?}");
        // Longer windows: fewer of them, about as long frozen.
        let long = simulate(&layout, COSTS, &settings(Some(5.0)));
        assert_eq!(long.windows, 1);
        assert!((long.frozen - o.frozen).abs() < o.frozen, "{long:?}");
    }

    #[test]
    fn an_unmounted_device_is_one_window_never_frozen() {
        let o = simulate(&one_batch(&[MIB, 700 * MIB]), COSTS, &settings(None));
        assert_eq!((o.windows, o.frozen, o.chunks), (1, 0.0, 1 + 175));
        assert!(o.seconds > 175.0 * (4 << 20) as f64 * (1.0 / 1.8e9 + 1.2 / 1.0e9));
    }

    #[test]
    fn a_rate_of_one_byte_a_second_takes_years_one_chunk_a_window() {
        let mut s = settings(Some(1.0));
        s.rate = Some(1.0);
        let o = simulate(&one_batch(&[480 * MIB]), COSTS, &s);
        assert_eq!((o.windows, o.chunks), (120, 120), "each window writes its first chunk, then is ahead");
        let years = o.seconds / (365.25 * 86_400.0);
        assert!((15.0..17.0).contains(&years), "{years}");
        // A rate that one window keeps up with: the run takes what its bytes take at it.
        s.rate = Some(100e6);
        let o = simulate(&one_batch(&[480 * MIB]), COSTS, &s);
        assert!((o.seconds - 480.0 * MIB as f64 / 100e6).abs() < 0.5, "{o:?}");
        assert!(o.windows >= 10, "a window ends a quarter second ahead of the rate: {o:?}");
    }

    #[test]
    fn a_window_ends_where_its_map_ends() {
        // 400 files of 64 KiB, 1 ms to map each: a 1 s window maps 100 ms of them.
        let file =
            |i: u64| Batch { map_seconds: 0.001, runs: vec![Run { offset: i * 4 * MIB, len: 64 << 10, joins: false }] };
        let layout = Layout { batches: (0..400).map(file).collect(), plan_seconds: 0.0, plan_time: Some(0.1) };
        let o = simulate(&layout, COSTS, &settings(Some(1.0)));
        assert_eq!((o.chunks, o.overruns), (400, 0));
        assert!((4..=5).contains(&o.windows), "400 ms of mapping, 100 ms a window: {o:?}");
    }

    #[test]
    fn files_that_continue_each_other_are_one_range_in_one_window() {
        let file =
            |i: u64| Batch { map_seconds: 0.0, runs: vec![Run { offset: i * 3 * MIB, len: 3 * MIB, joins: i > 0 }] };
        let layout = Layout { batches: (0..4).map(file).collect(), plan_seconds: 0.0, plan_time: Some(0.1) };
        assert_eq!(layout.chunks(4 * MIB), vec![(0, 4 * MIB), (4 * MIB, 4 * MIB), (8 * MIB, 4 * MIB)]);
        let o = simulate(&layout, COSTS, &settings(Some(1.0)));
        assert_eq!((o.windows, o.chunks, o.bytes), (1, 3, 12 * MIB));
    }

    #[test]
    fn windows_too_short_for_their_freeze_overrun_until_the_run_stops() {
        let o = simulate(&one_batch(&[64 * MIB]), COSTS, &settings(Some(0.01)));
        // The freeze alone outlasts the deadline: the guardian refuses the first permit
        // of every window, and the run stops at the third (exit 7), having written nothing;
        // each window read ahead four chunks, halved after each overrun.
        assert!(o.stopped, "{o:?}");
        assert_eq!((o.overruns, o.windows, o.bytes, o.dropped), (3, 3, 0, 4 * (4 + 2 + 1) * MIB), "{o:?}");
    }

    #[test]
    fn a_reader_waiting_for_a_cpu_sets_the_pace_of_small_chunks_not_of_large_ones() {
        let busy = Costs { penalty: 0.002, ..COSTS };
        let small = Layout {
            batches: vec![Batch {
                map_seconds: 0.0,
                runs: (0..1000).map(|i| Run { offset: i * MIB, len: 64 << 10, joins: false }).collect(),
            }],
            plan_seconds: 0.0,
            plan_time: None,
        };
        let (quiet, loaded) = (simulate(&small, COSTS, &settings(None)), simulate(&small, busy, &settings(None)));
        assert!(loaded.seconds > 2.0 * quiet.seconds, "{quiet:?} {loaded:?}");
        let large = one_batch(&[400 * MIB]);
        let (quiet, loaded) = (simulate(&large, COSTS, &settings(None)), simulate(&large, busy, &settings(None)));
        assert!((loaded.seconds - quiet.seconds).abs() < 1e-9, "the writer is the slower stage: {quiet:?} {loaded:?}");
    }

    #[test]
    fn a_huge_run_is_extrapolated_not_simulated_chunk_by_chunk() {
        let mut s = settings(Some(5.0));
        s.chunk_size = 64 << 10;
        let o = simulate(&one_batch(&[1 << 40]), COSTS, &s);
        assert_eq!(o.bytes, 1 << 40);
        assert!(o.chunks >= (1 << 40) / (64 << 10), "{o:?}");
        assert!(o.seconds > (1u64 << 40) as f64 / 1.8e9, "{o:?}");
    }
}
