//! `reseq scan`: the range in regions, each timed, the slow ones read again; and the
//! regions `--only-slow` chooses from it.

use serde::{Deserialize, Serialize};

use crate::measure::bench::{HostPressure, Watch};
use crate::measure::noise;
use crate::measure::readbench::{ReadParams, Target, read_span};
use crate::support::error::Result;

/// One region of a scan.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Region {
    pub(crate) index: usize,
    pub(crate) offset_bytes: u64,
    pub(crate) length_bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) bytes_per_second: f64,
    /// Slower than `threshold` x the reference (the fastest regions).
    pub(crate) slow: bool,
    /// Where the region lies on the device, when only in-use ranges are measured (its
    /// offset is then in the in-use bytes laid end to end): `[offset, length]` pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) device_ranges: Vec<[u64; 2]>,
    /// Each reading's throughput, in the order read, when read more than once (`slow`
    /// then means slow at every one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) readings_bytes_per_second: Vec<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct ScanResult {
    pub(crate) target: String,
    pub(crate) virtual_time: bool,
    pub(crate) params: ReadParams,
    /// Median throughput of the fastest quarter of the regions (at least one).
    pub(crate) reference_bytes_per_second: f64,
    /// A region is slow below this fraction of the reference.
    pub(crate) threshold: f64,
    pub(crate) regions: Vec<Region>,
    pub(crate) slow_regions: usize,
    /// How often each region was read and how far its readings agree.
    #[serde(default)]
    pub(crate) sureness: noise::Sureness,
    /// How loaded the host was while reading (null: no PSI, or a simulated SSD).
    #[serde(default)]
    pub(crate) host_pressure: Option<HostPressure>,
}

/// Region boundaries: `n` regions covering `[offset, offset + length)` exactly, each a
/// multiple of `align` except possibly the last.
pub(crate) fn region_bounds(offset: u64, length: u64, n: usize, align: u64) -> Vec<(u64, u64)> {
    let n = n.max(1) as u64;
    let size = (length.div_ceil(n)).div_ceil(align).max(1) * align;
    let mut out = Vec::new();
    let mut at = offset;
    let end = offset + length;
    while at < end {
        let len = size.min(end - at);
        out.push((at, len));
        at += len;
    }
    out
}

/// Reads the range region by region, then twice more (backward, forward) the regions the
/// readings so far cannot settle: those slow against the reference, and the reference's
/// own (the fastest quarter). A region is slow only if slow at every reading; the
/// reference counts its regions at their slowest (see [`crate::measure::noise`]).
/// `rounds`: [`noise::ROUNDS`] to choose regions by; 1 for a `--bench` map, which is drawn,
/// not acted on (its slow regions are marked only under a verdict that stands).
pub(crate) fn scan(
    target: &Target,
    params: &ReadParams,
    (regions, rounds): (usize, usize),
    threshold: f64,
) -> Result<ScanResult> {
    let watch = Watch::start(target);
    let bounds = region_bounds(params.offset_bytes, params.length_bytes, regions, target.offset_align());
    let (block, qd) = (params.block_size_bytes, params.queue_depth);
    let places = noise::read_rounds(
        bounds.len(),
        rounds,
        |i| read_span(target, block, qd, bounds[i].0, bounds[i].1).map(|t| (t.rate(), t.zeros)),
        |p| unsettled(p, threshold),
    )?;
    let reference = noise::reference(&places).unwrap_or(0.0);
    let slow = noise::slow_every_time(&places, reference, threshold);
    let sureness = noise::Sureness::of(&places);
    if sureness.noisy() {
        log::warn!("the slow regions cannot be told from noise: {}", sureness.words);
    }
    Ok(ScanResult {
        target: target.describe(),
        virtual_time: target.is_virtual(),
        params: params.clone(),
        reference_bytes_per_second: reference,
        threshold,
        regions: (0..bounds.len()).map(|i| scanned_region(target, i, bounds[i], &places[i], slow[i])).collect(),
        slow_regions: slow.iter().filter(|x| **x).count(),
        sureness,
        host_pressure: watch.host_pressure(target),
    })
}

/// The places a scan reads again: slow against the reference so far, or in its quarter.
fn unsettled(p: &[noise::Place], threshold: f64) -> Vec<bool> {
    let reference = noise::reference(p).unwrap_or(0.0);
    let mut worst: Vec<f64> = p.iter().filter(|x| !x.zeros).map(noise::Place::worst).collect();
    worst.sort_by(|a, b| b.total_cmp(a));
    let quarter = worst.get(worst.len().div_ceil(4).saturating_sub(1)).copied().unwrap_or(f64::INFINITY);
    p.iter().map(|x| x.best() < threshold * reference || (!x.zeros && x.worst() >= quarter)).collect()
}

/// Region `index` of a scan, at its fastest reading.
fn scanned_region(target: &Target, index: usize, (off, len): (u64, u64), p: &noise::Place, slow: bool) -> Region {
    let device_ranges = match target {
        Target::Real(s) if s.len() == 1 && s[0].in_use.is_some() => {
            s[0].device_ranges(off, len).into_iter().map(|(o, l)| [o, l]).collect()
        }
        _ => Vec::new(),
    };
    let best = p.best();
    Region {
        index,
        offset_bytes: off,
        length_bytes: len,
        seconds: len as f64 / best.max(f64::MIN_POSITIVE),
        bytes_per_second: best,
        slow,
        device_ranges,
        readings_bytes_per_second: if p.rates.len() > 1 { p.rates.clone() } else { Vec::new() },
    }
}

/// What selective re-sequencing chose to rewrite, and what it left alone.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Selection {
    /// Where the slow regions came from: `scan in this run` or the saved scan's path.
    pub(crate) source: String,
    pub(crate) threshold: f64,
    pub(crate) reference_bytes_per_second: f64,
    /// The regions chosen (slow), in offset order.
    pub(crate) chosen: Vec<Region>,
    pub(crate) bytes_chosen: u64,
    pub(crate) regions_left_alone: usize,
    /// Bytes left alone because they read at least `threshold` x the reference.
    pub(crate) bytes_left_alone: u64,
    /// How sure: how often each region was read and how far its readings agree.
    #[serde(default)]
    pub(crate) how_sure: String,
}

impl Selection {
    pub(crate) fn from_scan(scan: &ScanResult, source: String) -> Selection {
        let chosen: Vec<Region> = scan.regions.iter().filter(|r| r.slow).cloned().collect();
        let bytes_chosen = chosen.iter().map(|r| r.length_bytes).sum();
        let total: u64 = scan.regions.iter().map(|r| r.length_bytes).sum();
        Selection {
            source,
            threshold: scan.threshold,
            reference_bytes_per_second: scan.reference_bytes_per_second,
            regions_left_alone: scan.regions.len() - chosen.len(),
            bytes_left_alone: total - bytes_chosen,
            bytes_chosen,
            chosen,
            how_sure: format!("a region is chosen only if slow at every reading; {}", scan.sureness.words),
        }
    }

    /// The chosen ranges of the device, merged where adjacent.
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for r in &self.chosen {
            let on_device = if r.device_ranges.is_empty() {
                vec![(r.offset_bytes, r.length_bytes)]
            } else {
                r.device_ranges.iter().map(|&[o, l]| (o, l)).collect()
            };
            for (o, l) in on_device {
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == o => last.1 += l,
                    _ => out.push((o, l)),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_cover_the_range_exactly() {
        for (off, len, n, al) in [(0, 1000 * 4096, 7, 4096), (4096, 12345 * 512, 16, 512), (0, 4096, 10, 4096)] {
            let b = region_bounds(off, len, n, al);
            assert_eq!(b[0].0, off);
            for w in b.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0, "gap or overlap");
                assert_eq!(w[0].1 % al, 0);
            }
            let last = b.last().unwrap();
            assert_eq!(last.0 + last.1, off + len);
            assert!(b.len() <= n);
        }
    }

    #[test]
    fn a_scan_reads_again_what_is_slow_and_what_sets_the_reference() {
        let place = |r: f64| noise::Place { rates: vec![r], zeros: false };
        let mut places: Vec<noise::Place> =
            (0..20).map(|i| place(if i == 7 { 40.0 } else { 100.0 + i as f64 })).collect();
        places[3].zeros = true;
        let again = unsettled(&places, 0.75);
        let which: Vec<usize> = (0..20).filter(|&i| again[i]).collect();
        // Region 7 (slow), and the fastest quarter of the others (15..20); never zeros.
        assert_eq!(which, [7, 15, 16, 17, 18, 19]);
    }
}
