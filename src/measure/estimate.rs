//! `reseq estimate DEV|FILE`: is a rewrite worth it, from a sample rather than a pass.
//!
//! The sample's places are read [`noise::ROUNDS`] times (see [`crate::measure::noise`]). What a
//! full read gets now is the places' median at their fastest readings; what it would get
//! re-sequenced is the reference: what this device reads at its best, counted at its
//! slowest readings. The reference is the fastest quarter of the target's own places; for
//! a file, also places of the device under it (its filesystem's data in use), so that a
//! file slow all over is compared with the rest of the drive, not only with itself.

use serde::{Deserialize, Serialize};

use crate::measure::bench::{HostPressure, Watch};
use crate::measure::noise::{self, Place, Sureness, median};

use crate::measure::scan::Region;

use crate::measure::readbench::{CacheCheck, Target, read_span};
use crate::measure::verdict::MIN_EFFECT;
use crate::support::error::{Error, Result};
use crate::support::units::human_rate;

/// `reseq estimate`: a sample, not a full pass, and what it predicts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Estimate {
    pub(crate) target: String,
    pub(crate) virtual_time: bool,
    /// The sampled places: each `sample_bytes / regions` long, spread evenly; `slow` when
    /// slow at every reading.
    pub(crate) regions: Vec<Region>,
    pub(crate) sample_bytes: u64,
    /// Median of the places at their fastest readings: what a sequential read gets now.
    pub(crate) median_bytes_per_second: f64,
    /// What re-sequenced data reads at on this drive, at the slowest readings.
    pub(crate) reference_bytes_per_second: f64,
    /// Where the reference comes from, in words.
    #[serde(default)]
    pub(crate) reference: String,
    /// How much faster a full read could be: the places' time now over their time with
    /// none slower than the reference (a low estimate: the reference at its slowest
    /// readings, now at its fastest).
    pub(crate) predicted_speedup: f64,
    /// Places slow at every reading (below [`THRESHOLD`] x the reference).
    #[serde(default)]
    pub(crate) slow_regions: usize,
    /// The slow places alone: their read now / re-sequenced (null: none is slow).
    #[serde(default)]
    pub(crate) slow_speedup: Option<f64>,
    /// In words, for the admin: "worth it", "looks flat" or "cannot tell".
    pub(crate) advice: String,
    pub(crate) cache: Option<CacheCheck>,
    /// How often each place was read and how far its readings agree.
    #[serde(default)]
    pub(crate) sureness: Sureness,
    /// How loaded the host was while reading (null: no PSI, or a simulated SSD).
    #[serde(default)]
    pub(crate) host_pressure: Option<HostPressure>,
}

/// Below this predicted speed-up a simulated drive looks flat. A real one must show
/// [`MIN_EFFECT`], as a verdict must.
pub(crate) const WORTH_IT: f64 = 1.3;
/// A place is slow below this fraction of the reference (`scan`'s default).
pub(crate) const THRESHOLD: f64 = 0.7;
/// Places of the device around a file, read for the reference, at least.
const ELSEWHERE: usize = 8;

/// Where a sample's places lie: `n` evenly spread spans of `each` bytes.
pub(crate) struct Sample {
    pub(crate) at: Vec<u64>,
    pub(crate) each: u64,
}

fn sample(target: &Target, block: u64, sample: u64, n: usize) -> Result<Sample> {
    let (align, len, n) = (target.offset_align(), target.len(), n.max(1) as u64);
    let each = (sample / n).max(block).min(len / n) / align * align;
    if each == 0 {
        return Err(Error::Usage(format!("{} is too small to sample", target.describe())));
    }
    let at = (0..n).map(|i| (len - each) / (n - 1).max(1) * i / align * align).collect();
    Ok(Sample { at, each })
}

/// Reads place `i` of `s` once: its rate, and whether a read returned only zeros.
pub(crate) fn read_place(target: &Target, block: u64, s: &Sample, i: usize) -> Result<(f64, bool)> {
    read_span(target, block.min(s.each), 1, s.at[i], s.each).map(|t| (t.rate(), t.zeros))
}

/// The places of the device around a target read for a reference: as long as the
/// target's own (`each` bytes: a short read has more overhead per byte; 1 MiB places read
/// x1.75 slower than 8 MiB ones here), half as many (at least [`ELSEWHERE`]).
pub(crate) fn sample_around(dev: &Target, block: u64, (each, regions): (u64, usize)) -> Result<Sample> {
    let n = (regions / 2).max(ELSEWHERE);
    sample(dev, block, each * n as u64, n)
}

/// Estimates `target` from about `sample` bytes in `regions` places; `around`: the device
/// under a file target, for a reference beyond the file.
pub(crate) fn estimate(
    target: &Target,
    around: Option<&Target>,
    block: u64,
    (sample_bytes, regions): (u64, usize),
) -> Result<Estimate> {
    let cache = crate::measure::readbench::cache_check(target, block, 1)?;
    let watch = Watch::start(target);
    let s = sample(target, block, sample_bytes, regions)?;
    let a = around.map(|dev| sample_around(dev, block, (s.each, regions))).transpose()?;
    let (places, elsewhere) = noise::read_interleaved(
        (s.at.len(), a.as_ref().map_or(0, |a| a.at.len())),
        |i| read_place(target, block, &s, i),
        |j| read_place(around.expect("places around a device"), block, a.as_ref().expect("a sample"), j),
    )?;
    let elsewhere = around.is_some().then_some(elsewhere);
    let (reference, words) = reference(&places, elsewhere.as_deref(), around);
    let slow = noise::slow_every_time(&places, reference, THRESHOLD);
    let figures = Figures::of(&places, &slow, reference);
    let mut all = places.clone();
    all.extend(elsewhere.unwrap_or_default());
    let sureness = Sureness::of(&all);
    let host_pressure = watch.host_pressure(target);
    let busy = watch.busy(host_pressure.as_ref());
    let call = Call { cache: cache.as_ref(), virtual_time: target.is_virtual(), sureness: &sureness, busy };
    let advice = call.advice(&figures, &words);
    Ok(Estimate {
        target: target.describe(),
        virtual_time: target.is_virtual(),
        sample_bytes: s.each * s.at.len() as u64,
        regions: regions_of(&s, &places, &slow),
        median_bytes_per_second: median(&places.iter().map(Place::best).collect::<Vec<_>>()),
        reference_bytes_per_second: reference,
        reference: words,
        predicted_speedup: figures.speedup,
        slow_regions: figures.slow,
        slow_speedup: (figures.slow > 0).then_some(figures.slow_speedup),
        advice,
        cache,
        sureness,
        host_pressure,
    })
}

/// An estimate's figures: a full read's speed-up, and the slow places'.
#[derive(Debug, PartialEq)]
struct Figures {
    /// Places slow every time, of all.
    slow: usize,
    places: usize,
    /// A full read now / re-sequenced, every place at its fastest reading now and at
    /// least at the reference re-sequenced.
    speedup: f64,
    /// The same for the slow places alone (1.0 without any).
    slow_speedup: f64,
    now: f64,
    reference: f64,
}

impl Figures {
    fn of(places: &[Place], slow: &[bool], reference: f64) -> Figures {
        // Time per byte, summed: a read's time, not a median's, is what the user waits for.
        let times = |only_slow: bool| {
            places.iter().zip(slow).filter(|(_, s)| !only_slow || **s).fold((0.0, 0.0), |(now, after), (p, _)| {
                let best = p.best().max(f64::MIN_POSITIVE);
                (now + 1.0 / best, after + 1.0 / best.max(reference))
            })
        };
        let ((now, after), (slow_now, slow_after)) = (times(false), times(true));
        Figures {
            slow: slow.iter().filter(|s| **s).count(),
            places: places.len(),
            speedup: now / after.max(f64::MIN_POSITIVE),
            slow_speedup: if slow_after > 0.0 { slow_now / slow_after } else { 1.0 },
            now: places.len() as f64 / now.max(f64::MIN_POSITIVE),
            reference,
        }
    }
}

/// The reference and its words: the target's own fastest quarter, or the device around
/// it where that reads faster.
fn reference(places: &[Place], elsewhere: Option<&[Place]>, around: Option<&Target>) -> (f64, String) {
    let own = noise::reference(places)
        .map(|o| (o, "the fastest quarter of the sampled places, each at its slowest reading".to_string()));
    own_or_around(own, around.zip(elsewhere))
}

/// A target's own reference (`None`: every place held zeros), or the second fastest place
/// of the data in use around it where that reads faster: a target slow all over is
/// compared with the drive. `estimate` and `estimate DIR` both choose this way.
pub(crate) fn own_or_around(own: Option<(f64, String)>, around: Option<(&Target, &[Place])>) -> (f64, String) {
    let other = around.and_then(|(dev, places)| Some((dev, noise::best_elsewhere(places)?)));
    match (own, other) {
        (Some((o, words)), Some((dev, e))) if e > o => (
            e,
            format!(
                "data in use elsewhere on {}: the second fastest of its sampled places, at its slowest reading (faster than the target's own reference, {words}: {})",
                dev.describe(),
                human_rate(o)
            ),
        ),
        (Some(own), _) => own,
        (None, Some((dev, e))) => (
            e,
            format!("data in use elsewhere on {} (every place of this target held blocks of zeros)", dev.describe()),
        ),
        (None, None) => (0.0, "none: every place held blocks of zeros".into()),
    }
}

fn regions_of(s: &Sample, places: &[Place], slow: &[bool]) -> Vec<Region> {
    (0..places.len())
        .map(|i| {
            let best = places[i].best();
            Region {
                index: i,
                offset_bytes: s.at[i],
                length_bytes: s.each,
                seconds: s.each as f64 / best.max(f64::MIN_POSITIVE),
                bytes_per_second: best,
                slow: slow[i],
                readings_bytes_per_second: places[i].rates.clone(),
                ..Region::default()
            }
        })
        .collect()
}

/// What decides an estimate's words besides its figures.
struct Call<'a> {
    cache: Option<&'a CacheCheck>,
    virtual_time: bool,
    sureness: &'a Sureness,
    /// The CPU pressure of a host too busy to tell ([`Watch::busy`]).
    busy: Option<f64>,
}

impl Call<'_> {
    /// The estimate in words, from its figures and the reference's words.
    fn advice(&self, f: &Figures, words: &str) -> String {
        // As a verdict's: an effect no larger than one place's readings differ is no effect.
        let needed =
            self.sureness.effect_needed(if self.virtual_time { WORTH_IT } else { MIN_EFFECT }, self.busy.is_some());
        let how_sure = self.sureness.words_with(self.busy);
        let (now, reference) = (human_rate(f.now), human_rate(f.reference));
        let below = THRESHOLD * 100.0;
        if let Some(c) = self.cache.filter(|c| c.cache_suspected) {
            return format!("cannot tell: {}", c.finding);
        }
        // Two places at least: one place slow three times running can be the host's.
        if f.speedup >= needed && f.slow >= 2 {
            return format!(
                "worth it: a full read could be about x{:.2} faster ({now} now, {reference} re-sequenced, the reference being {words}); {} of {} places read below {below:.0} % of it at every reading ({how_sure})",
                f.speedup, f.slow, f.places
            );
        }
        if f.slow_speedup >= needed && f.slow >= 2 {
            return format!(
                "worth it for the slow part: {} of {} places read below {below:.0} % of the reference at every reading and would read about x{:.2} faster re-sequenced; a full read gains x{:.2} ({now} now, {reference} re-sequenced, the reference being {words}); `reseq rewrite --only-slow` rewrites just the slow regions ({how_sure})",
                f.slow, f.places, f.slow_speedup, f.speedup
            );
        }
        if self.sureness.unsure(self.busy.is_some()) {
            return format!("cannot tell: {how_sure}; run it again when the host is quieter");
        }
        format!(
            "looks flat: a full read would gain x{:.2} ({now} now, {reference} re-sequenced, the reference being {words}; under x{needed} is within what a device's reads drift); re-sequencing is unlikely to help much ({how_sure})",
            f.speedup
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sureness(spread: f64) -> Sureness {
        Sureness { readings_per_place: 3, spread, zero_places: 0, words: "w".into() }
    }

    fn figures(rates: &[f64], reference: f64) -> Figures {
        let places: Vec<Place> = rates.iter().map(|&r| Place { rates: vec![r; 3], zeros: false }).collect();
        let slow = noise::slow_every_time(&places, reference, THRESHOLD);
        Figures::of(&places, &slow, reference)
    }

    #[test]
    fn a_full_read_is_predicted_by_its_time_and_the_slow_part_alone() {
        let f = figures(&[100.0, 100.0, 25.0, 25.0], 100.0);
        assert_eq!((f.slow, f.places), (2, 4));
        assert!((f.speedup - 2.5).abs() < 1e-9, "0.1 s per byte-place now, 0.04 re-sequenced: {f:?}");
        assert!((f.slow_speedup - 4.0).abs() < 1e-9, "{f:?}");
        assert!((f.now - 40.0).abs() < 1e-9, "4 places in 0.1 s per byte: {f:?}");
    }

    #[test]
    fn advice_needs_places_slow_every_time_and_a_quiet_enough_host() {
        let quiet = sureness(1.05);
        let call = Call { cache: None, virtual_time: false, sureness: &quiet, busy: None };
        assert!(call.advice(&figures(&[100.0, 40.0, 40.0, 40.0], 100.0), "r").starts_with("worth it:"));
        let part =
            call.advice(&figures(&[100.0; 14].iter().chain(&[30.0, 30.0]).copied().collect::<Vec<_>>(), 100.0), "r");
        assert!(part.starts_with("worth it for the slow part"), "{part}");
        let one = call.advice(&figures(&[100.0; 15].iter().chain(&[30.0]).copied().collect::<Vec<_>>(), 100.0), "r");
        assert!(one.starts_with("looks flat"), "one slow place is not enough: {one}");
        assert!(call.advice(&figures(&[100.0, 80.0, 75.0], 100.0), "r").starts_with("looks flat"));
        let busy = sureness(1.6);
        let call = Call { cache: None, virtual_time: false, sureness: &busy, busy: None };
        assert!(call.advice(&figures(&[100.0, 90.0, 80.0], 100.0), "r").starts_with("cannot tell"));
        assert!(call.advice(&figures(&[100.0, 30.0, 30.0], 100.0), "r").starts_with("worth it"), "x3 above the noise");
        // Seen under load on a loop device: two places x2.13 slower, readings x1.79 apart.
        let loaded = sureness(1.79);
        let call = Call { cache: None, virtual_time: false, sureness: &loaded, busy: None };
        let rates: Vec<f64> = [100.0; 30].iter().chain(&[47.0, 47.0]).copied().collect();
        let f = figures(&rates, 100.0);
        assert!(f.slow_speedup > 2.1 && f.slow == 2, "{f:?}");
        assert!(call.advice(&f, "r").starts_with("cannot tell"), "{}", call.advice(&f, "r"));
        let sim = Call { cache: None, virtual_time: true, sureness: &quiet, busy: None };
        assert!(sim.advice(&figures(&[100.0, 60.0, 60.0, 60.0], 100.0), "r").starts_with("worth it"));
    }

    #[test]
    fn a_busy_cpu_asks_as_much_of_the_slow_part_as_a_noisy_spread() {
        // Seen under bench/load.sh on a loop device: five places slow at every reading,
        // x1.58 faster re-sequenced, readings x1.32 apart, the CPU 43 % busy.
        let spread = sureness(1.32);
        let rates: Vec<f64> = [100.0; 27].iter().chain(&[63.0; 5]).copied().collect();
        let f = figures(&rates, 100.0);
        assert!(f.slow == 5 && f.slow_speedup > 1.55, "{f:?}");
        let quiet = Call { cache: None, virtual_time: false, sureness: &spread, busy: None };
        assert!(quiet.advice(&f, "r").starts_with("worth it for the slow part"), "{}", quiet.advice(&f, "r"));
        let busy = Call { busy: Some(0.43), ..quiet };
        let words = busy.advice(&f, "r");
        assert!(words.starts_with("cannot tell") && words.contains("CPU was busy 43 %"), "{words}");
        // The positive control: a slow part far above the load still decides.
        let f = figures(&[100.0; 27].iter().chain(&[30.0; 5]).copied().collect::<Vec<_>>(), 100.0);
        assert!(busy.advice(&f, "r").starts_with("worth it for the slow part"), "{}", busy.advice(&f, "r"));
    }

    #[test]
    fn a_file_slow_all_over_is_compared_with_the_drive_around_it() {
        let p = |r: f64| Place { rates: vec![r; 3], zeros: false };
        let file: Vec<Place> = (0..8).map(|_| p(100.0)).collect();
        let drive = [p(100.0), p(300.0), p(290.0), Place { rates: vec![900.0; 3], zeros: true }];
        let (r, words) = reference(&file, Some(&drive), Some(&Target::Real(Vec::new())));
        assert_eq!(r, 290.0, "the second fastest non-zero place");
        assert!(words.starts_with("data in use elsewhere"), "{words}");
        let (r, words) = reference(&file, None, None);
        assert_eq!(r, 100.0);
        assert!(words.starts_with("the fastest quarter"), "{words}");
    }
}
