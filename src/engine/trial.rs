//! The chunk size and depth chosen by the run's own writes (issue 40).
//!
//! Which shape of I/O a device serves fastest depends on how it shares reads, writes and
//! read-backs, which no read-only probe sees (docs/CHUNK-SIZE.md): on a loop device over
//! a virtual disk 64 MiB chunks at depth 1 rewrote 1 GiB 30-40 % faster than 4 MiB ones
//! at depth 2; on a memory-backed one and on the emulated SSD they were 25-45 % slower.
//! So a long run that freezes nothing rewrites its first stretches with each shape, in
//! the order A B B A (a host's drift, such as its write-back of the stretch before, falls
//! on both alike), and the rest with the faster: the run's own shape unless another wrote
//! at least [`MARGIN`] times as fast. Every stretch is a window of its own, with its
//! flush and journal commit, so each shape's time counts everything a chunk costs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A shape must write this much faster than the run's own to replace it: less is within
/// what one stretch's noise makes on a shared host.
const MARGIN: f64 = 1.1;

/// A chunk size and a depth.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub(crate) struct Shape {
    pub(crate) chunk_size: u64,
    /// Chunks read ahead (`--read-ahead`).
    pub(crate) read_ahead: usize,
}

/// The shapes to try and how much each stretch writes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Trial {
    /// The run's own shape first; it is kept unless another is clearly faster.
    pub(crate) shapes: Vec<Shape>,
    /// Bytes each stretch rewrites (whole chunks: at least this much).
    pub(crate) stretch_bytes: u64,
}

/// Runs shorter than this have no trial. What the trial costs does not shrink with the
/// run: on the memory-backed loop device, where 64 MiB chunks are no faster, its stretches
/// and the other shape's 320 MiB of fresh buffers cost a 4 GiB run 0.4-1.2 s (x1.15-1.45)
/// and an 8 GiB one 0.9-1.0 s (x1.2) on the 2-vCPU VM, where touching fresh memory is
/// slow (320 MiB in 0.14-0.67 s; measured with 128 MiB stretches, on small pages); a
/// 16 GiB run takes 9 s or more there, and the trial's 2 GiB are at most an eighth.
pub(crate) const TRIAL_FROM: u64 = 16 << 30;
/// Bytes a stretch rewrites: eight large chunks. A stretch's first read and last
/// read-back overlap nothing, which the rest of the run pays only once every 256 MiB:
/// with stretches of two 64 MiB chunks that cost the large shape a fifth of its rate on
/// the disk-backed loop device (693-718 MiB/s in the stretches where whole runs of 64
/// MiB chunks wrote 890) and the trial kept 4 MiB chunks on runs 20 % slower; with
/// eight, its stretches wrote 821-834 MiB/s.
pub(crate) const STRETCH: u64 = 8 * LARGE.chunk_size;
/// The other shape tried: large chunks, one read ahead (measured best on a loop device
/// over a virtual disk, docs/CHUNK-SIZE.md).
const LARGE: Shape = Shape { chunk_size: 64 << 20, read_ahead: 1 };

impl Trial {
    /// A trial of `own` against [`LARGE`] in stretches of `stretch` bytes over a run of
    /// `bytes`, if it is `from` long or longer, the trial's stretches are at most half of
    /// it, and `own` is not already that shape.
    pub(crate) fn offer(own: Shape, bytes: u64, from: u64, stretch: u64) -> Option<Trial> {
        if bytes < from || bytes < 8 * stretch || own == LARGE {
            return None;
        }
        Some(Trial { shapes: vec![own, LARGE], stretch_bytes: stretch })
    }

    /// In words, for the plan.
    pub(crate) fn describe(&self) -> String {
        let shapes: Vec<String> = self.shapes.iter().map(|&s| label(s)).collect();
        format!(
            "{} rewrite two stretches of {} each, in turn and back (A B B A); the rest of the run uses the faster (another must be x{MARGIN} as fast as the run's own)",
            shapes.join(" and "),
            crate::support::units::human_bytes(self.stretch_bytes)
        )
    }

    /// The stretches the whole trial runs: the run's windows are this many more.
    pub(crate) fn stretches(&self) -> usize {
        self.order().len()
    }

    /// The shapes in the order their stretches run: A B B A (A B C C B A for three).
    fn order(&self) -> Vec<usize> {
        let n = self.shapes.len();
        (0..n).chain((0..n).rev()).collect()
    }
}

/// One shape's stretches, as timed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct ShapeRate {
    pub(crate) shape: Shape,
    /// Bytes its stretches rewrote.
    pub(crate) bytes: u64,
    /// Seconds they took, each its whole window (every read, write and read-back, the
    /// flush and the commit; its buffers were allocated before).
    pub(crate) seconds: f64,
    pub(crate) bytes_per_second: f64,
}

/// What the trial measured and chose.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct TrialOutcome {
    /// Bytes each stretch was to rewrite.
    pub(crate) stretch_bytes: u64,
    /// False: the run stopped inside the trial (`measured` counts the stretches that
    /// ended; `chosen` is the run's own shape, whose chunk size a resumed run keeps).
    /// Reports from before this field had only complete trials.
    #[serde(default = "complete_by_default")]
    pub(crate) complete: bool,
    /// Each shape, the run's own first.
    pub(crate) measured: Vec<ShapeRate>,
    /// The shape the rest of the run used.
    pub(crate) chosen: Shape,
    /// In words.
    pub(crate) why: String,
}

/// The trial as it runs: which stretch is next, and what each shape took so far.
pub(super) struct Trying {
    trial: Trial,
    order: Vec<usize>,
    next: usize,
    took: Vec<(u64, Duration)>,
}

impl Trying {
    pub(super) fn new(trial: Trial) -> Trying {
        let order = trial.order();
        let took = vec![(0, Duration::ZERO); trial.shapes.len()];
        Trying { trial, order, next: 0, took }
    }

    /// The next stretch: the index of its shape and its bytes. None: the trial is over.
    pub(super) fn step(&self) -> Option<(usize, u64)> {
        self.order.get(self.next).map(|&i| (i, self.trial.stretch_bytes))
    }

    /// The stretch just run wrote `bytes` in `took`.
    pub(super) fn record(&mut self, bytes: u64, took: Duration) {
        if let Some(&i) = self.order.get(self.next) {
            self.took[i].0 += bytes;
            self.took[i].1 += took;
            self.next += 1;
        }
    }

    /// After the last stretch: the shape to keep, its index, and why.
    pub(super) fn outcome(&self) -> (usize, TrialOutcome) {
        let measured = self.measured();
        let own = measured[0].bytes_per_second;
        let best = (1..measured.len())
            .filter(|&i| measured[i].bytes_per_second >= MARGIN * own && own > 0.0)
            .max_by(|&a, &b| measured[a].bytes_per_second.total_cmp(&measured[b].bytes_per_second))
            .unwrap_or(0);
        let why = match best {
            0 => format!(
                "{}; none wrote x{MARGIN} as fast as the run's own: kept {}",
                rates(&measured),
                label(measured[0].shape)
            ),
            i => format!(
                "{}; {} wrote x{:.2} as fast as the run's own: the rest of the run uses it",
                rates(&measured),
                label(measured[i].shape),
                measured[i].bytes_per_second / own
            ),
        };
        let chosen = measured[best].shape;
        (best, TrialOutcome { stretch_bytes: self.trial.stretch_bytes, complete: true, measured, chosen, why })
    }

    /// When the run ended inside the trial: what its finished stretches measured (the
    /// one it ended in is not counted), nothing chosen. None before the first ended.
    pub(super) fn cut_short(&self) -> Option<TrialOutcome> {
        if self.next == 0 {
            return None;
        }
        let measured = self.measured();
        let own = measured[0].shape;
        let why = format!(
            "the run stopped after {} of the trial's {} stretches ({}): nothing was chosen; a resumed run keeps the run's own chunk size, {} (its depth is probed again)",
            self.next,
            self.order.len(),
            rates(&measured),
            crate::support::units::human_bytes(own.chunk_size)
        );
        Some(TrialOutcome { stretch_bytes: self.trial.stretch_bytes, complete: false, measured, chosen: own, why })
    }

    /// Each shape's stretches so far.
    fn measured(&self) -> Vec<ShapeRate> {
        self.trial
            .shapes
            .iter()
            .zip(&self.took)
            .map(|(&shape, &(bytes, took))| ShapeRate {
                shape,
                bytes,
                seconds: took.as_secs_f64(),
                bytes_per_second: if took.is_zero() { 0.0 } else { bytes as f64 / took.as_secs_f64() },
            })
            .collect()
    }

    /// Whether every stretch has run.
    pub(super) fn done(&self) -> bool {
        self.next >= self.order.len()
    }
}

/// "4 MiB at depth 2".
pub(crate) fn label(s: Shape) -> String {
    format!("{} at depth {}", crate::support::units::human_bytes(s.chunk_size), s.read_ahead)
}

fn complete_by_default() -> bool {
    true
}

/// "4 MiB at depth 2: 415 MiB/s, 64 MiB at depth 1: not tried".
fn rates(measured: &[ShapeRate]) -> String {
    let rate = |m: &ShapeRate| match m.bytes {
        0 => "not tried".to_string(),
        _ => format!("{:.0} MiB/s", m.bytes_per_second / 1048576.0),
    };
    let each: Vec<String> = measured.iter().map(|m| format!("{}: {}", label(m.shape), rate(m))).collect();
    each.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trying(rates: &[(u64, f64)]) -> (usize, TrialOutcome) {
        let shapes = vec![Shape { chunk_size: 4 << 20, read_ahead: 2 }, Shape { chunk_size: 64 << 20, read_ahead: 1 }];
        let mut t = Trying::new(Trial { shapes, stretch_bytes: 256 << 20 });
        assert_eq!(t.order, vec![0, 1, 1, 0]);
        for &(bytes, secs) in rates {
            assert!(!t.done());
            t.record(bytes, Duration::from_secs_f64(secs));
        }
        assert!(t.done());
        t.outcome()
    }

    #[test]
    fn the_run_keeps_its_own_shape_unless_another_is_clearly_faster() {
        // A B B A: 4 MiB at 1.0 and 1.0 s, 64 MiB at 0.95 and 0.95 s: within the margin.
        let (i, o) = trying(&[(256 << 20, 1.0), (256 << 20, 0.95), (256 << 20, 0.95), (256 << 20, 1.0)]);
        assert_eq!((i, o.chosen.chunk_size), (0, 4 << 20), "{}", o.why);
        assert!(o.why.contains("kept 4.0 MiB at depth 2"), "{}", o.why);
        // 64 MiB twice as fast.
        let (i, o) = trying(&[(256 << 20, 1.0), (256 << 20, 0.5), (256 << 20, 0.5), (256 << 20, 1.0)]);
        assert_eq!((i, o.chosen.chunk_size, o.chosen.read_ahead), (1, 64 << 20, 1), "{}", o.why);
        assert!((o.measured[1].bytes_per_second - 512.0 * 1048576.0).abs() < 1.0, "{:?}", o.measured);
        assert!(o.why.contains("64.0 MiB at depth 1 wrote x2.00"), "{}", o.why);
        // Slower: kept.
        let (i, _) = trying(&[(256 << 20, 1.0), (256 << 20, 2.0), (256 << 20, 2.0), (256 << 20, 1.0)]);
        assert_eq!(i, 0);
    }

    #[test]
    fn a_trial_is_offered_to_long_runs_only() {
        let own = Shape { chunk_size: 4 << 20, read_ahead: 2 };
        assert_eq!(Trial::offer(own, (16 << 30) - 1, TRIAL_FROM, STRETCH), None);
        assert_eq!(Trial::offer(LARGE, 32 << 30, TRIAL_FROM, STRETCH), None, "nothing else to try");
        let t = Trial::offer(own, 16 << 30, TRIAL_FROM, STRETCH).unwrap();
        assert_eq!((t.shapes.clone(), t.stretch_bytes, t.stretches()), (vec![own, LARGE], 512 << 20, 4));
        // A small run (tests lower the floor and the stretch): the trial is at most half of it.
        assert_eq!(Trial::offer(own, 1 << 30, 0, 128 << 20).unwrap().stretch_bytes, 128 << 20);
        assert_eq!(Trial::offer(own, 1023 << 20, 0, 128 << 20), None, "the trial would be more than half the run");
    }

    #[test]
    fn a_trial_cut_short_keeps_the_runs_own_shape() {
        let shapes = vec![Shape { chunk_size: 4 << 20, read_ahead: 2 }, Shape { chunk_size: 64 << 20, read_ahead: 1 }];
        let mut t = Trying::new(Trial { shapes, stretch_bytes: 256 << 20 });
        t.record(256 << 20, Duration::from_secs(1));
        assert_eq!(t.step(), Some((1, 256 << 20)));
        let (i, o) = t.outcome();
        assert_eq!(i, 0, "{}", o.why);
        assert_eq!(o.measured[1].bytes_per_second, 0.0);
    }
}
