//! Telling slow data from a busy host. One reading of a place on a shared host is noise:
//! a loop device, which has no FTL, read "x1.8 faster at its fastest quarter" before any
//! rewrite, and two scans back to back agreed on 28 of 64 slow regions. So places are read
//! more than once, in alternating order (forward, backward, forward: a drive's read cache
//! never serves the next reading), and:
//! - a place is **slow** only if it is slow every time it is read (its fastest reading);
//! - the **reference** (what this device reads at its best) counts a place only at its
//!   slowest reading, and never a place where a read returned only zeros (unwritten or
//!   trimmed blocks read from nowhere, as the holes of a loop device's file do: a place
//!   half journal, half hole read x2.6 faster than data here);
//! - the **spread** (how much one place's readings differ) says how sure a call is.
//!
//! A busy host can only slow a read, and a cache makes later readings fast: both move a
//! slow-every-time/fast-every-time comparison towards "no difference", never towards a
//! false "worth it".

use serde::{Deserialize, Serialize};

use crate::support::error::Result;

/// `Err(Stopped)` once a stop signal came (where a command installed the handlers): a
/// Ctrl-C stops a measurement between reads.
pub(crate) fn stopped() -> Result<()> {
    crate::support::signals::StopFlag::installed().check("the benchmark")
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The median of the fastest quarter of `rates` (at least one): what re-sequenced data
/// reads at on this drive (a quarter, not the single fastest, so that one lucky read does
/// not flag the rest).
pub(crate) fn fastest_quarter(rates: &[f64]) -> f64 {
    let mut s = rates.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    median(&s[..s.len().div_ceil(4)])
}

/// Readings per place of an estimate, and of a scan's places that are not clearly fast.
pub(crate) const ROUNDS: usize = 3;

/// Above this median spread, readings of one place differ more than what makes a place
/// slow (below 70 % of the reference, `scan`'s default): slow cannot be told from noise.
/// Seen here: 1.02 to 1.25 on a quiet loop device and on the emulated SSD under load, 2
/// to 7 with two CPU busy loops on two cores.
pub(crate) const NOISY: f64 = 1.0 / 0.7;

/// One place's readings.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Place {
    /// Bytes per second, one per reading, in the order read.
    pub(crate) rates: Vec<f64>,
    /// A read command of some reading returned only zeros.
    pub(crate) zeros: bool,
}

impl Place {
    /// The fastest reading: slow only if slow at it.
    pub(crate) fn best(&self) -> f64 {
        self.rates.iter().copied().fold(0.0, f64::max)
    }

    /// The slowest reading: fast only if fast at it.
    pub(crate) fn worst(&self) -> f64 {
        self.rates.iter().copied().fold(f64::INFINITY, f64::min).min(self.best())
    }
}

/// Reads `n` places in rounds: round 0 reads all, each later one (backward, then forward)
/// only those `again` names after what was read so far. `read(i)` returns the rate and
/// whether a read command returned only zeros.
pub(crate) fn read_rounds(
    n: usize,
    rounds: usize,
    mut read: impl FnMut(usize) -> Result<(f64, bool)>,
    again: impl Fn(&[Place]) -> Vec<bool>,
) -> Result<Vec<Place>> {
    let mut places = vec![Place::default(); n];
    for round in 0..rounds.max(1) {
        let wanted = if round == 0 { vec![true; n] } else { again(&places) };
        let order: Vec<usize> = if round % 2 == 1 { (0..n).rev().collect() } else { (0..n).collect() };
        for i in order.into_iter().filter(|&i| wanted[i]) {
            stopped()?;
            let (rate, zeros) = read(i)?;
            places[i].rates.push(rate);
            places[i].zeros |= zeros;
        }
    }
    Ok(places)
}

/// Reads `n` places of a target and `m` places around it, [`ROUNDS`] times each, the two
/// kinds interleaved by their position: a busy spell of the host then slows both alike
/// (read one after the other, a quiet spell made the places around a file x1.6 faster
/// than the file, on a device without an FTL).
pub(crate) fn read_interleaved(
    (n, m): (usize, usize),
    mut read: impl FnMut(usize) -> Result<(f64, bool)>,
    mut read_around: impl FnMut(usize) -> Result<(f64, bool)>,
) -> Result<(Vec<Place>, Vec<Place>)> {
    let pos = |i: usize, of: usize| (2 * i + 1) as f64 / (2 * of) as f64;
    let mut order: Vec<(bool, usize)> = (0..n).map(|i| (false, i)).chain((0..m).map(|j| (true, j))).collect();
    order.sort_by(|a, b| {
        let (pa, pb) = (pos(a.1, if a.0 { m } else { n }), pos(b.1, if b.0 { m } else { n }));
        pa.total_cmp(&pb)
    });
    let places = read_rounds(
        order.len(),
        ROUNDS,
        |k| if order[k].0 { read_around(order[k].1) } else { read(order[k].1) },
        |p| vec![true; p.len()],
    )?;
    let (mut own, mut around) = (vec![Place::default(); n], vec![Place::default(); m]);
    for (k, p) in places.into_iter().enumerate() {
        let (is_around, i) = order[k];
        if is_around { around[i] = p } else { own[i] = p }
    }
    Ok((own, around))
}

/// The reference of `places`: the median of the fastest quarter of their slowest readings,
/// places with zeros left out (None: every place had some).
pub(crate) fn reference(places: &[Place]) -> Option<f64> {
    let worst: Vec<f64> = places.iter().filter(|p| !p.zeros).map(Place::worst).collect();
    (!worst.is_empty()).then(|| fastest_quarter(&worst))
}

/// The best reference outside the target: the second fastest of `places` at their slowest
/// readings (two places must agree), zeros left out.
pub(crate) fn best_elsewhere(places: &[Place]) -> Option<f64> {
    let mut worst: Vec<f64> = places.iter().filter(|p| !p.zeros).map(Place::worst).collect();
    worst.sort_by(|a, b| b.total_cmp(a));
    worst.get(1).copied()
}

/// How much one place's readings differ: the median, over places read more than once, of
/// fastest / slowest reading (1.0: none was read twice).
pub(crate) fn spread(places: &[Place]) -> f64 {
    let s: Vec<f64> =
        places.iter().filter(|p| p.rates.len() > 1).map(|p| p.best() / p.worst().max(f64::MIN_POSITIVE)).collect();
    if s.is_empty() { 1.0 } else { median(&s) }
}

/// Of the places, those slow every time they were read: below `threshold` x `reference`
/// at their fastest reading.
pub(crate) fn slow_every_time(places: &[Place], reference: f64, threshold: f64) -> Vec<bool> {
    places.iter().map(|p| p.best() < threshold * reference).collect()
}

/// How the readings were taken and how far they agree, for a report.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Sureness {
    /// Most readings of one place.
    pub(crate) readings_per_place: usize,
    /// Median over places read more than once of their fastest / slowest reading.
    pub(crate) spread: f64,
    /// Places left out of the reference because a read of theirs returned only zeros.
    pub(crate) zero_places: usize,
    /// In words.
    pub(crate) words: String,
}

impl Sureness {
    pub(crate) fn of(places: &[Place]) -> Sureness {
        let readings_per_place = places.iter().map(|p| p.rates.len()).max().unwrap_or(0);
        let spread = spread(places);
        let zero_places = places.iter().filter(|p| p.zeros).count();
        let words = format!(
            "each place read up to {readings_per_place} times; one place's readings differ by x{spread:.2} (median){}",
            if spread >= NOISY { ", more than what makes a place slow: the host is too busy to tell" } else { "" }
        );
        Sureness { readings_per_place, spread, zero_places, words }
    }

    pub(crate) fn noisy(&self) -> bool {
        self.spread >= NOISY
    }

    /// The effect a call on these readings needs: `floor`, and no less than one place's
    /// readings differ. On a host too noisy or, by its CPU pressure, too `busy` to tell,
    /// as much again as makes a place slow: under load, the places of a loop device (which
    /// has no FTL) that take more requests read slow at every reading, x2.13 against a
    /// spread of x1.79 once, x1.58 against x1.32 another time with the CPU 43 % busy.
    pub(crate) fn effect_needed(&self, floor: f64, busy: bool) -> f64 {
        floor.max(self.spread * if self.unsure(busy) { NOISY } else { 1.0 })
    }

    /// Too noisy, or too `busy`, to tell slow data from the host's load.
    pub(crate) fn unsure(&self, busy: bool) -> bool {
        self.noisy() || busy
    }

    /// The words, and the CPU pressure of a host too busy to tell.
    pub(crate) fn words_with(&self, busy: Option<f64>) -> String {
        match busy {
            Some(cpu) => format!("{}; the CPU was busy {:.0} % of the time: too busy to tell", self.words, cpu * 100.0),
            None => self.words.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(rates: &[f64]) -> Place {
        Place { rates: rates.to_vec(), zeros: false }
    }

    #[test]
    fn a_place_is_slow_only_if_slow_every_time() {
        let places = [place(&[100.0, 100.0]), place(&[40.0, 100.0]), place(&[40.0, 45.0])];
        assert_eq!(slow_every_time(&places, 100.0, 0.7), [false, false, true]);
    }

    #[test]
    fn the_reference_counts_a_place_at_its_slowest_and_never_zeros() {
        let mut places = vec![place(&[100.0, 50.0]), place(&[60.0, 60.0])];
        assert_eq!(reference(&places), Some(60.0));
        places.push(Place { rates: vec![5000.0; 2], zeros: true });
        assert_eq!(reference(&places), Some(60.0), "a place of zeros read from nowhere");
        assert_eq!(best_elsewhere(&places), Some(50.0));
        assert_eq!(reference(&places[2..]), None);
    }

    #[test]
    fn places_around_are_read_between_the_targets() {
        let seen = std::cell::RefCell::new(Vec::new());
        let (own, around) = read_interleaved(
            (4, 2),
            |i| {
                seen.borrow_mut().push(format!("t{i}"));
                Ok((1.0, false))
            },
            |j| {
                seen.borrow_mut().push(format!("a{j}"));
                Ok((2.0, false))
            },
        )
        .unwrap();
        assert_eq!(seen.borrow()[..6], ["t0", "a0", "t1", "t2", "a1", "t3"]);
        assert_eq!((own.len(), around.len(), own[0].rates.len()), (4, 2, ROUNDS));
        assert_eq!(around[1].best(), 2.0);
    }

    #[test]
    fn rounds_alternate_and_read_again_only_what_is_asked() {
        let mut order = Vec::new();
        let places = read_rounds(
            3,
            3,
            |i| {
                order.push(i);
                Ok((10.0 * (i + 1) as f64, i == 0))
            },
            |p| p.iter().map(|p| p.best() < 25.0).collect(),
        )
        .unwrap();
        assert_eq!(order, [0, 1, 2, 1, 0, 0, 1]);
        assert_eq!(places[2].rates.len(), 1);
        assert!(places[0].zeros && !places[1].zeros);
        assert!((spread(&places) - 1.0).abs() < 1e-9);
        assert!(!Sureness::of(&places).noisy());
    }
}
