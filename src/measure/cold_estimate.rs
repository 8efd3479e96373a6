//! `reseq estimate DIR`: how much of the files is cold and slow, and how much faster
//! they would read refreshed, from a sample rather than a full read.
//!
//! The files are banded by age as `scan --by-file` bands them. In each band, parts of the
//! large files are sampled evenly by bytes (several in a large file), and the band's
//! small files read as one group, as the scan times them. Every sample is read three
//! times (forward, backward, forward), interleaved with places of the device under the
//! files (see [`crate::measure::noise`]): its fastest reading is what a read gets now,
//! its slowest counts for the reference. A full read's time is predicted band by band,
//! and refreshed (no sample slower than the reference: the youngest files', else the
//! fastest quarter's, or the device's where that is faster). It "looks flat" under the
//! x1.5 a verdict needs, as the region estimate does, unless the cold part alone would
//! read x1.5 faster refreshed: a cold tenth of the data read 5x slower hardly moves a
//! full read, yet is what a refresh is for. Either call takes two samples slow at every
//! reading.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::measure::bench::{EmulatedDrive, HostPressure, Watch};
use crate::measure::noise::{self, Place, ROUNDS, Sureness, median};

use crate::measure::byfile::{
    BANDS, Found, SMALL_FILE_BLOCKS, Timed, check_cache, find, rates_by, references, unreliable,
};
use crate::measure::estimate::{Sample, own_or_around, read_place, sample_around};
use crate::measure::readbench::{CacheCheck, Source, Target, read_span};
use crate::measure::verdict::MIN_EFFECT;
use crate::support::error::Result;
use crate::support::units::{human_bytes, human_rate};

/// One age band of the estimate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct BandEstimate {
    pub(crate) band: String,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    pub(crate) samples: usize,
    pub(crate) sampled_bytes: u64,
    /// Median of its samples (null: none).
    pub(crate) median_bytes_per_second: Option<f64>,
    /// Its median below `threshold` x the reference.
    pub(crate) slow: bool,
    /// Of its bytes, those whose samples read below `threshold` x the reference (by the
    /// samples' share of the band's data): cold data hides in a young band when its files'
    /// times say nothing of their data's age.
    pub(crate) slow_bytes: u64,
    /// Predicted seconds to read the band now, and refreshed.
    pub(crate) seconds_now: f64,
    pub(crate) seconds_refreshed: f64,
    /// Of those, the slow bytes' (for `cold_speedup`).
    #[serde(skip)]
    slow_seconds: (f64, f64),
}

/// `reseq estimate DIR`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct ColdEstimate {
    pub(crate) target: String,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    /// Bytes read for the estimate (each sample twice counts once).
    pub(crate) sample_bytes: u64,
    pub(crate) threshold: f64,
    pub(crate) reference_bytes_per_second: f64,
    pub(crate) reference: String,
    pub(crate) bands: Vec<BandEstimate>,
    /// Bytes reading below `threshold` x the reference (the bands' `slow_bytes`).
    pub(crate) cold_slow_bytes: u64,
    /// A full read, predicted now and refreshed, and their ratio.
    pub(crate) seconds_now: f64,
    pub(crate) seconds_refreshed: f64,
    pub(crate) predicted_speedup: f64,
    /// The slow bytes alone: their read now / refreshed (null: none is slow).
    pub(crate) cold_speedup: Option<f64>,
    /// In words: "worth it", "worth it for the cold part", "looks flat", or "cannot tell"
    /// (a cache, a late drive).
    pub(crate) advice: String,
    pub(crate) cache: Option<CacheCheck>,
    pub(crate) emulated: Option<EmulatedDrive>,
    /// How often each sample was read and how far its readings agree.
    #[serde(default)]
    pub(crate) sureness: Sureness,
    /// How loaded the host was while reading (null: no PSI).
    #[serde(default)]
    pub(crate) host_pressure: Option<HostPressure>,
}

/// A band is cold and slow below this fraction of the reference (`scan`'s default).
pub(crate) const THRESHOLD: f64 = 0.7;

/// Estimates the files under `target` from about `sample` bytes in about `samples` reads;
/// `around`: the device under them, for a reference beyond the files.
pub(crate) fn estimate(
    target: &Path,
    around: Option<&Target>,
    block: u64,
    (sample, samples): (u64, usize),
) -> Result<ColdEstimate> {
    let found = find(target)?;
    let cache = check_cache(&found, block, 1)?;
    let whole = Target::Real(vec![Source::open(&found[0].path)?]);
    let watch = Watch::start(&whole);
    let plan = sample_plan(&found, block, sample, samples);
    let a = around.map(|dev| sample_around(dev, block, (sample_each(block, sample, samples), samples))).transpose()?;
    let ((timed, slowest, places), elsewhere) = read_rounds(&found, &plan, block, around.zip(a.as_ref()))?;
    let read_seconds: f64 = timed.iter().map(|t| t.seconds * ROUNDS as f64).sum();
    let emulated = watch.emulated(&whole, read_seconds);
    let ((own, own_words), group_ref) = references(&slowest);
    let (reference, words) = own_or_around(Some((own, own_words)), around.zip(Some(elsewhere.as_slice())));
    let sureness = Sureness::of(&[places, elsewhere].concat());
    let host_pressure = watch.host_pressure(&whole);
    let bands = band_estimates(&found, &timed, (reference, group_ref.map(|g| g.0)), SMALL_FILE_BLOCKS * block);
    let (now, refreshed) = bands.iter().fold((0.0, 0.0), |(a, b), x| (a + x.seconds_now, b + x.seconds_refreshed));
    let speedup = now / refreshed.max(f64::MIN_POSITIVE);
    let cold_slow_bytes = bands.iter().map(|b| b.slow_bytes).sum();
    let cold_speedup = cold_speedup(&bands);
    let bytes = found.iter().map(|f| f.size).sum();
    let cannot = unreliable(cache.as_ref(), emulated.as_ref());
    // As a verdict's: an effect no larger than one sample's readings differ is no effect.
    let busy = watch.busy(host_pressure.as_ref());
    let needed = sureness.effect_needed(MIN_EFFECT, busy.is_some());
    let clear = speedup >= needed || cold_speedup.is_some_and(|c| c >= needed);
    let cannot = cannot.or_else(|| (sureness.unsure(busy.is_some()) && !clear).then(|| sureness.words_with(busy)));
    let limits = (THRESHOLD * reference, group_ref.map(|g| THRESHOLD * g.0).unwrap_or(0.0));
    let slow_samples = timed.iter().filter(|t| t.rate() < if t.group { limits.1 } else { limits.0 }).count();
    let advice = advice(cannot, (speedup, cold_speedup), (cold_slow_bytes, bytes), (now, refreshed), slow_samples);
    log::debug!("{advice}"); // the report says it first
    Ok(ColdEstimate {
        target: target.display().to_string(),
        files: found.len(),
        bytes,
        sample_bytes: timed.iter().map(|t| t.bytes).sum(),
        threshold: THRESHOLD,
        reference_bytes_per_second: reference,
        reference: words,
        bands,
        cold_slow_bytes,
        seconds_now: now,
        seconds_refreshed: refreshed,
        predicted_speedup: speedup,
        cold_speedup,
        advice,
        cache,
        emulated,
        sureness,
        host_pressure,
    })
}

/// One read of the sample: a part of a large file (index, offset, length), or a band's
/// small files (indexes).
enum Part {
    Of(usize, u64, u64),
    Small(Vec<usize>),
}

/// The length of one sample: at least a group of small files.
fn sample_each(block: u64, sample: u64, samples: usize) -> u64 {
    (sample / samples.max(1) as u64).max(SMALL_FILE_BLOCKS * block) / block * block
}

/// What to read: per band, up to `samples / bands` parts of its large files, chosen
/// evenly by bytes, and one group of its small files, each about `sample / samples`.
fn sample_plan(found: &[Found], block: u64, sample: u64, samples: usize) -> Vec<(usize, Part)> {
    let small = SMALL_FILE_BLOCKS * block;
    let bands: Vec<usize> = (0..BANDS.len()).filter(|b| found.iter().any(|f| f.band == *b)).collect();
    let per_band = (samples / bands.len().max(1)).max(1);
    let each = sample_each(block, sample, samples);
    let mut out = Vec::new();
    for &b in &bands {
        // A part of a file with holes may be all hole, which reads fast from nowhere.
        let large: Vec<usize> =
            (0..found.len()).filter(|&i| found[i].band == b && found[i].size >= small && found[i].dense()).collect();
        let total: u64 = large.iter().map(|&i| found[i].size).sum();
        let mut last = None;
        for k in 0..per_band as u64 {
            // The part around the byte at (k + 1/2) / n of the band's large files: parts
            // spread by bytes, several in a large file (a band of one cold file is not one
            // sample), each standing for as many bytes.
            let at = total * (2 * k + 1) / (2 * per_band as u64);
            let mut start = 0;
            let Some(&i) = large.iter().find(|&&i| {
                let here = start + found[i].size > at;
                start += if here { 0 } else { found[i].size };
                here
            }) else {
                break;
            };
            let len = each.min(found[i].size / block * block);
            let off = (at - start).saturating_sub(len / 2).min(found[i].size - len) / block * block;
            if last != Some((i, off)) {
                out.push((b, Part::Of(i, off, len)));
                last = Some((i, off));
            }
        }
        let smalls: Vec<usize> = (0..found.len()).filter(|&i| found[i].band == b && found[i].size < small).collect();
        let (mut bytes, mut group) = (0, Vec::new());
        let step = smalls.len().div_ceil(((each / 4096).max(1)) as usize).max(1);
        for &i in smalls.iter().step_by(step) {
            if bytes >= each {
                break;
            }
            bytes += found[i].size;
            group.push(i);
        }
        if !group.is_empty() {
            out.push((b, Part::Small(group)));
        }
    }
    out
}

/// The parts at their fastest readings (what a read gets now), at their slowest (for
/// the reference), and their readings.
type Readings = (Vec<Timed>, Vec<Timed>, Vec<Place>);

/// Each part read [`ROUNDS`] times, alternating forward and backward, interleaved with the
/// places `around` them: the parts' readings, and the places'.
fn read_rounds(
    found: &[Found],
    plan: &[(usize, Part)],
    block: u64,
    around: Option<(&Target, &Sample)>,
) -> Result<(Readings, Vec<Place>)> {
    let mut bytes = vec![0u64; plan.len()];
    let m = around.map_or(0, |a| a.1.at.len());
    let (places, elsewhere) = noise::read_interleaved(
        (plan.len(), m),
        |i| {
            let (n, seconds, zeros) = match &plan[i].1 {
                Part::Of(f, off, len) => {
                    let r = read_span(&Target::Real(vec![Source::open(&found[*f].path)?]), block, 1, *off, *len)?;
                    (r.bytes, r.seconds, r.zeros)
                }
                Part::Small(files) => {
                    let (n, seconds, _) = crate::measure::byfile::time_files(found, files, block, 1)?;
                    (n, seconds, false)
                }
            };
            bytes[i] = n;
            Ok((n as f64 / seconds.max(f64::MIN_POSITIVE), zeros))
        },
        |j| {
            let (dev, s) = around.expect("places around only with a device");
            read_place(dev, block, s, j)
        },
    )?;
    let timed = |rate: &dyn Fn(&Place) -> f64| -> Vec<Timed> {
        plan.iter()
            .zip(&places)
            .enumerate()
            .map(|(i, ((band, part), p))| {
                let (files, group) = match part {
                    Part::Of(f, ..) => (vec![*f], false),
                    Part::Small(files) => (files.clone(), true),
                };
                let seconds = bytes[i] as f64 / rate(p).max(f64::MIN_POSITIVE);
                Timed { files, band: *band, bytes: bytes[i], seconds, cpu_some: None, group }
            })
            .collect()
    };
    Ok(((timed(&Place::best), timed(&Place::worst), places), elsewhere))
}

/// A band's large files read now and refreshed, per byte of their data, and of that the
/// slow samples' part: samples fall evenly by bytes, so each stands for as many (a file
/// smaller than their stride, for its neighbours too); refreshed at least at the
/// reference.
struct PerByte {
    now: f64,
    refreshed: f64,
    slow_share: f64,
    slow: (f64, f64),
}

fn per_byte(timed: &[Timed], band: usize, reference: f64) -> Option<PerByte> {
    let alone: Vec<&Timed> = timed.iter().filter(|t| t.band == band && !t.group).collect();
    let samples: Vec<(f64, f64)> = alone.iter().map(|t| (t.rate().max(f64::MIN_POSITIVE), 1.0)).collect();
    let weight: f64 = samples.iter().map(|s| s.1).sum();
    if weight <= 0.0 {
        return None;
    }
    let mut p = PerByte { now: 0.0, refreshed: 0.0, slow_share: 0.0, slow: (0.0, 0.0) };
    for (r, w) in samples {
        let (now, refreshed) = (w / weight / r, w / weight / r.max(reference));
        (p.now, p.refreshed) = (p.now + now, p.refreshed + refreshed);
        if r < THRESHOLD * reference {
            p.slow_share += w / weight;
            p.slow = (p.slow.0 + now, p.slow.1 + refreshed);
        }
    }
    Some(p)
}

/// Each band's predicted read, now and refreshed: its large files by their samples (see
/// [`PerByte`]), its small files (under `small` bytes) at their group's rate; a band
/// without a sample of one kind at its other kind's, or at all samples' median.
fn band_estimates(found: &[Found], timed: &[Timed], refs: (f64, Option<f64>), small: u64) -> Vec<BandEstimate> {
    let (groups, all) = (rates_by(timed, Some(true)), rates_by(timed, None));
    let fallback = median(&all.concat()).max(f64::MIN_POSITIVE);
    let (ref_l, ref_s) = (refs.0, refs.1.unwrap_or(refs.0));
    let alone = rates_by(timed, Some(false));
    BANDS
        .iter()
        .enumerate()
        .map(|(b, (name, _))| {
            let in_band: Vec<&Found> = found.iter().filter(|f| f.band == b).collect();
            // Time goes by the data read; a band's bytes are its files' sizes.
            let sum = |large: bool, of: fn(&&Found) -> u64| -> u64 {
                in_band.iter().filter(|f| (f.size >= small) == large).map(of).sum()
            };
            let (small_bytes, large_bytes) = (sum(false, |f| f.size), sum(true, |f| f.size));
            let (small_data, large_data) = (sum(false, |f| f.data) as f64, sum(true, |f| f.data) as f64);
            let r_small = groups[b].first().copied();
            let r_any = (!alone[b].is_empty()).then(|| median(&alone[b])).or(r_small).unwrap_or(fallback);
            let rs = r_small.unwrap_or(r_any);
            let large = per_byte(timed, b, ref_l).unwrap_or_else(|| {
                let (now, refreshed) = (1.0 / r_any, 1.0 / r_any.max(ref_l));
                PerByte { now, refreshed, slow_share: 0.0, slow: (0.0, 0.0) }
            });
            let small_slow = r_small.is_some_and(|r| r < THRESHOLD * ref_s);
            let (small_now, small_refreshed) = (small_data / rs, small_data / rs.max(ref_s));
            let slow_seconds = (
                large_data * large.slow.0 + if small_slow { small_now } else { 0.0 },
                large_data * large.slow.1 + if small_slow { small_refreshed } else { 0.0 },
            );
            let sampled = timed.iter().filter(|t| t.band == b);
            BandEstimate {
                band: (*name).into(),
                files: in_band.len(),
                bytes: small_bytes + large_bytes,
                samples: sampled.clone().count(),
                sampled_bytes: sampled.map(|t| t.bytes).sum(),
                median_bytes_per_second: (!all[b].is_empty()).then(|| median(&all[b])),
                slow: (!alone[b].is_empty() && median(&alone[b]) < THRESHOLD * ref_l) || small_slow,
                slow_bytes: (large_bytes as f64 * large.slow_share) as u64 + if small_slow { small_bytes } else { 0 },
                seconds_now: large_data * large.now + small_now,
                seconds_refreshed: large_data * large.refreshed + small_refreshed,
                slow_seconds,
            }
        })
        .collect()
}

/// The slow bytes' read now / refreshed, when some are slow.
fn cold_speedup(bands: &[BandEstimate]) -> Option<f64> {
    let (now, refreshed) = bands.iter().fold((0.0, 0.0), |(a, b), x| (a + x.slow_seconds.0, b + x.slow_seconds.1));
    (refreshed > 0.0).then(|| now / refreshed)
}

/// The estimate in words.
/// `slow_samples`: samples slow at every reading; a call on one alone could be the
/// host's (a busy spell can slow one sample three times running), so it takes two.
fn advice(
    cannot: Option<String>,
    (speedup, cold_speedup): (f64, Option<f64>),
    (cold, bytes): (u64, u64),
    (now, refreshed): (f64, f64),
    slow_samples: usize,
) -> String {
    if let Some(why) = cannot {
        return format!("cannot tell: {why}");
    }
    let enough = slow_samples >= 2;
    let share = cold as f64 * 100.0 / bytes.max(1) as f64;
    let (cold_words, all_words) = (human_bytes(cold), human_bytes(bytes));
    if speedup >= MIN_EFFECT && enough {
        return format!(
            "worth it: {cold_words} of {all_words} ({share:.0} %) is cold and slow; a full read takes about {now:.1} s now and {refreshed:.1} s refreshed (x{speedup:.2}, {} -> {}); `reseq rewrite DIR --only-slow` refreshes the slow files",
            human_rate(bytes as f64 / now.max(f64::MIN_POSITIVE)),
            human_rate(bytes as f64 / refreshed.max(f64::MIN_POSITIVE))
        );
    }
    match cold_speedup {
        Some(c) if c >= MIN_EFFECT && enough => format!(
            "worth it for the cold part: {cold_words} of {all_words} ({share:.0} %) is cold and would read x{c:.2} faster refreshed; a full read gains only x{speedup:.2} ({now:.1} s now, {refreshed:.1} s refreshed); `reseq rewrite DIR --only-slow` refreshes just those files"
        ),
        _ => format!(
            "looks flat: a full read would be only x{speedup:.2} faster refreshed ({now:.1} s now, {refreshed:.1} s refreshed; under x{MIN_EFFECT} is within what a device's reads drift{}); {cold_words} of {all_words} ({share:.0} %) is in age bands that read slowly",
            if slow_samples == 1 { ", and one sample slow at every reading is no slow part: it takes two" } else { "" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band(slow: bool, now: f64, refreshed: f64) -> BandEstimate {
        BandEstimate {
            band: "b".into(),
            files: 1,
            bytes: 1 << 30,
            samples: 1,
            sampled_bytes: 1 << 20,
            median_bytes_per_second: Some(1e8),
            slow,
            slow_bytes: if slow { 1 << 30 } else { 0 },
            seconds_now: now,
            seconds_refreshed: refreshed,
            slow_seconds: if slow { (now, refreshed) } else { (0.0, 0.0) },
        }
    }

    #[test]
    fn a_cold_part_that_reads_much_slower_is_worth_it_though_a_full_read_is_flat() {
        // Nine fresh bands' worth of time and one cold band read 4x slower.
        let bands = [band(false, 9.0, 9.0), band(true, 4.0, 1.0)];
        let cold = cold_speedup(&bands);
        assert_eq!(cold, Some(4.0));
        let words = advice(None, (13.0 / 10.0, cold), (1, 10), (13.0, 10.0), 2);
        assert!(words.starts_with("worth it for the cold part"), "{words}");
        assert!(words.contains("x4.00"), "{words}");
        // No slow band, or one that gains under x1.5: flat.
        assert!(advice(None, (1.0, cold_speedup(&bands[..1])), (0, 10), (9.0, 9.0), 0).starts_with("looks flat"));
        assert!(advice(None, (1.1, Some(1.3)), (1, 10), (1.1, 1.0), 2).starts_with("looks flat"));
        let one = advice(None, (2.0, Some(4.0)), (5, 10), (2.0, 1.0), 1);
        assert!(one.starts_with("looks flat") && one.contains("x2.00"), "one slow sample, its figure kept: {one}");
        // A full read that gains x1.5 is worth it outright; a cache makes it unknowable.
        assert!(advice(None, (2.0, Some(4.0)), (5, 10), (2.0, 1.0), 2).starts_with("worth it:"));
        assert!(advice(Some("a cache".into()), (2.0, Some(4.0)), (5, 10), (2.0, 1.0), 2).starts_with("cannot tell"));
    }

    #[test]
    fn cold_data_in_a_young_band_is_found_by_its_samples() {
        // Eight young files of equal data, four read 13x slower: their times say nothing
        // of their data's age (a drive aged, or files restored with new times).
        let found: Vec<Found> = (0..8)
            .map(|i| Found {
                path: format!("f{i}").into(),
                size: 24 << 20,
                data: 24 << 20,
                extents: 1,
                age_seconds: 60.0,
                band: 0,
            })
            .collect();
        let rates = [38e6, 494e6, 38e6, 494e6, 38e6, 494e6, 38e6, 494e6];
        let timed: Vec<Timed> = rates
            .iter()
            .enumerate()
            .map(|(i, r)| Timed {
                files: vec![i],
                band: 0,
                bytes: 8 << 20,
                seconds: (8 << 20) as f64 / r,
                cpu_some: None,
                group: false,
            })
            .collect();
        let reference = (38e6 + 494e6) / 2.0; // the youngest band's median, as the scan's
        let bands = band_estimates(&found, &timed, (reference, None), 4 << 20);
        assert_eq!(bands[0].slow_bytes, 96 << 20, "half the bytes read slowly: {:?}", bands[0]);
        let whole = bands[0].seconds_now / bands[0].seconds_refreshed;
        assert!(whole > 3.0, "a full read x{whole}");
        let cold = cold_speedup(&bands).unwrap();
        assert!((cold - reference / 38e6).abs() < 1e-6, "the cold half x{cold}");
    }
}
