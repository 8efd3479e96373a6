//! The FTL model described in docs/FTL-MODEL.md, ported from its Python reference
//! (`ftlsim.py`) operation for operation, so that the same inputs give the
//! same virtual times. Where the reference and the spec differ, the reference wins (it is
//! the oracle): physical read-ahead follows `slot(l) == slot(l-1) + 1` without the spec's
//! `succ_line` hop at line ends.
//!
//! State per 4 KiB of simulated space: `l2p` (4 bytes per LBA), `p2l` (4 bytes per
//! physical slot, 1.07x plus spare lines) and the page write times of retention (4 bytes
//! per 16 KiB page), about 9.6 bytes; the bench checks the 16-byte goal.
//!
//! Retention (reseq's addition; the reference knows none): a sense operation takes
//! tR x a factor that grows with the age of its oldest page, off (1) unless configured.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

pub const SLOT: u64 = 4096;
const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
const UNMAPPED: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReadAhead {
    None,
    Lba,
    Phys,
}

/// Every parameter of the model (docs/FTL-MODEL.md). Times in µs, bandwidths in
/// MB/s, which is bytes per µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Params {
    pub(crate) name: String,
    pub(crate) channels: u64,
    /// Dies per channel.
    pub(crate) ways: u64,
    pub(crate) planes: u64,
    pub(crate) page_bytes: u64,
    /// Pages per block per plane.
    pub(crate) pages_per_block: u64,
    pub(crate) logical_bytes: u64,
    pub(crate) op_ratio: f64,
    /// GC runs when free lines <= this.
    pub(crate) gc_free_lines: u64,
    pub(crate) t_read_us: f64,
    pub(crate) ch_mbps: f64,
    pub(crate) link_mbps: f64,
    pub(crate) fw_us: f64,
    pub(crate) host_gap_us: f64,
    pub(crate) multiplane_read: bool,
    pub(crate) partial_xfer: bool,
    pub(crate) store_and_forward: bool,
    pub(crate) readahead: ReadAhead,
    pub(crate) ra_bytes: u64,
    pub(crate) t_prog_us: f64,
    /// Write command firmware latency.
    pub(crate) fw_w_us: f64,
    /// Write buffer that lets commands complete before programming.
    pub(crate) wbuf_bytes: u64,
    /// Retention (docs/FTL-MODEL.md, "Retention"): a page this many days old or younger
    /// reads at full speed.
    pub(crate) retention_onset_days: f64,
    /// The age at which the read-time factor reaches its cap.
    pub(crate) retention_full_days: f64,
    /// The cap of the factor on the NAND read time of old pages; 1 turns retention off.
    pub(crate) retention_max_factor: f64,
}

impl Default for Params {
    /// The reference's `Params()` and `WriteTiming()` defaults.
    fn default() -> Self {
        Params {
            name: "custom".into(),
            channels: 8,
            ways: 2,
            planes: 2,
            page_bytes: 16 * KIB,
            pages_per_block: 128,
            logical_bytes: 8 * GIB,
            op_ratio: 0.07,
            gc_free_lines: 2,
            t_read_us: 60.0,
            ch_mbps: 800.0,
            link_mbps: 3300.0,
            fw_us: 30.0,
            host_gap_us: 5.0,
            multiplane_read: true,
            partial_xfer: true,
            store_and_forward: false,
            readahead: ReadAhead::None,
            ra_bytes: MIB,
            t_prog_us: 600.0,
            fw_w_us: 10.0,
            wbuf_bytes: 8 * MIB,
            // Off: the reference model knows no retention.
            retention_onset_days: 14.0,
            retention_full_days: 90.0,
            retention_max_factor: 1.0,
        }
    }
}

pub(crate) const PRESETS: [&str; 4] = ["consumer-nvme", "consumer-nvme-mild", "datacenter-sata", "consumer-tlc-aging"];

impl Params {
    /// The presets of docs/FTL-MODEL.md (as the reference's `presets.py` sets them).
    pub fn preset(name: &str) -> Option<Params> {
        let base = Params { name: name.into(), ..Params::default() };
        Some(match name {
            // Toshiba XG5-like: store-and-forward data path, physical read-ahead.
            "consumer-nvme" => Params {
                ways: 3,
                t_read_us: 60.0,
                link_mbps: 2500.0,
                store_and_forward: true,
                readahead: ReadAhead::Phys,
                ..base
            },
            // Samsung PM981-like: cut-through, no read-ahead dependence.
            "consumer-nvme-mild" => Params { ways: 4, t_read_us: 50.0, link_mbps: 3000.0, ..base },
            // Intel S3510-like: SATA link bound, much NAND parallelism.
            "datacenter-sata" => {
                Params { ways: 8, t_read_us: 50.0, ch_mbps: 400.0, link_mbps: 420.0, fw_us: 40.0, ..base }
            }
            // Samsung 840 EVO-like: a SATA TLC drive whose old data reads slowly
            // (docs/FTL-MODEL.md, "Retention": fitted to the published shape).
            "consumer-tlc-aging" => Params {
                ways: 2,
                t_read_us: 90.0,
                ch_mbps: 400.0,
                link_mbps: 540.0,
                fw_us: 40.0,
                retention_onset_days: 14.0,
                retention_full_days: 90.0,
                retention_max_factor: RETENTION_TLC_CAP,
                ..base
            },
            _ => return None,
        })
    }

    /// Whether old pages read slower than fresh ones.
    pub(crate) fn retention_on(&self) -> bool {
        self.retention_max_factor > 1.0
    }

    /// The factor on the NAND read time of a page `age_days` old: 1 up to the onset, then
    /// growing linearly to the cap at `retention_full_days`, the cap after.
    pub(crate) fn retention_factor(&self, age_days: f64) -> f64 {
        if !self.retention_on() || age_days <= self.retention_onset_days {
            return 1.0;
        }
        let span = self.retention_full_days - self.retention_onset_days;
        let share = ((age_days - self.retention_onset_days) / span).min(1.0);
        1.0 + (self.retention_max_factor - 1.0) * share
    }

    /// Refuses retention parameters the factor cannot be computed from.
    pub(crate) fn check_retention(&self) -> Result<(), String> {
        let (on, full, cap) = (self.retention_onset_days, self.retention_full_days, self.retention_max_factor);
        if !(on.is_finite() && on >= 0.0 && full.is_finite() && full > on) {
            return Err(format!(
                "retention_onset_days ({on}) must be 0 or more and retention_full_days ({full}) larger"
            ));
        }
        if !(cap.is_finite() && (1.0..=MAX_RETENTION_FACTOR).contains(&cap)) {
            return Err(format!("retention_max_factor ({cap}) must be from 1 (off) to {MAX_RETENTION_FACTOR}"));
        }
        Ok(())
    }
}

/// The cap of `consumer-tlc-aging`'s read-time factor (docs/FTL-MODEL.md, "Retention").
const RETENTION_TLC_CAP: f64 = 100.0;
/// The largest read-time factor accepted: more is a typo, not a drive.
const MAX_RETENTION_FACTOR: f64 = 10_000.0;
/// The age clock goes no further than this (a century): page write times are whole
/// seconds of it in a u32.
pub(crate) const MAX_AGE_DAYS: f64 = 36_525.0;
const SECONDS_PER_DAY: f64 = 86_400.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum LineState {
    Free,
    Open,
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Host = 0,
    Gc = 1,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FtlStats {
    pub(crate) host_slots: u64,
    pub(crate) gc_slots: u64,
    pub(crate) gc_runs: u64,
}

/// The mapping state and the read-side timelines.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ftl {
    pub(crate) p: Params,
    /// Slots per page, dies, slots per program unit, slots per line.
    s: u64,
    n: u64,
    u: u64,
    spl: u64,
    pub n_lpn: u64,
    pub(crate) n_lines: u64,
    /// LBA -> slot; stored as a raw table in state files, not in the JSON header.
    #[serde(skip)]
    l2p: Vec<u32>,
    /// Slot -> LBA.
    #[serde(skip)]
    p2l: Vec<u32>,
    valid: Vec<u32>,
    state: Vec<LineState>,
    /// Free lines; the next to open is at the back, freed lines go to the front.
    free_lines: VecDeque<u32>,
    /// (line, q) per stream.
    front: [(u64, u64); 2],
    pub(crate) stats: FtlStats,
    /// The retention age clock, days (advanced by `reseq sim age`; absent from old state
    /// files: 0).
    #[serde(default)]
    pub(crate) age_days: f64,
    /// When each NAND page was last programmed, whole seconds of the age clock; stored as
    /// a raw table in state files (0 in old ones: as old as the clock).
    #[serde(skip)]
    written: Vec<u32>,
    #[serde(skip)]
    die_free: Vec<f64>,
    #[serde(skip)]
    ch_free: Vec<f64>,
    #[serde(skip)]
    link_free: f64,
    #[serde(skip)]
    ra_prev_end: Option<u64>,
    #[serde(skip)]
    ra_hi: u64,
    #[serde(skip)]
    ra_buf: HashMap<u64, f64>,
}

impl Params {
    /// Slots (4 KiB) per line, the unit GC frees: a block of every plane of every die.
    pub(crate) fn slots_per_line(&self) -> u64 {
        self.channels * self.ways * self.planes * (self.page_bytes / SLOT) * self.pages_per_block
    }

    /// Lines the logical space and its spare area fill, before the GC reserve.
    fn data_lines(&self) -> u64 {
        let phys_needed = ((self.logical_bytes / SLOT) as f64 * (1.0 + self.op_ratio)) as u64;
        phys_needed.div_ceil(self.slots_per_line())
    }

    /// Whether garbage collection can always free a line, even with every logical block
    /// written. When GC runs, the closed lines (all but the free ones it keeps and the two
    /// open ones: `data_lines - 1` of them) hold more slots than there are logical blocks,
    /// so one of them is not full of valid data and moving it frees space.
    pub(crate) fn never_stuck(&self) -> bool {
        self.data_lines().saturating_sub(1) * self.slots_per_line() > self.logical_bytes / SLOT
    }

    /// The smallest device size in whole MiB, from this one up, that GC never gets stuck
    /// on, whatever is written (None: no size does, as with no spare area). Sizes that
    /// work come in one interval per line count, `(m·SPL/(1+OP), m·SPL)` LBAs for `m`
    /// victim lines, so this jumps to the start of the next interval when not in one.
    pub(crate) fn smallest_working_mib(&self) -> Option<u64> {
        if self.op_ratio.is_nan() || self.op_ratio <= 0.0 {
            return None;
        }
        let line = (self.slots_per_line() * SLOT) as f64;
        let mut mib = self.logical_bytes.div_ceil(MIB).max(1);
        for _ in 0..100_000 {
            let p = Params { logical_bytes: mib.checked_mul(MIB)?, ..self.clone() };
            if p.never_stuck() {
                return Some(mib);
            }
            let next = (p.data_lines() as f64 * line / (1.0 + self.op_ratio) / MIB as f64) as u64;
            mib = next.max(mib + 1);
        }
        None
    }

    /// What to change for a drive GC can get stuck on.
    pub(crate) fn size_hint(&self) -> String {
        match self.smallest_working_mib() {
            Some(mib) => format!(
                "the smallest device size from {} MiB up that never gets stuck with these parameters is {mib} MiB (--device-size {mib}M); a larger op_ratio (--set op_ratio=...) helps too",
                self.logical_bytes.div_ceil(MIB)
            ),
            None => "no device size works with these parameters: use a larger op_ratio (--set op_ratio=...)".into(),
        }
    }

    /// Refuses a drive that cannot take a single write: one whose data and spare area fit
    /// in one line starts with no more free lines than GC keeps, so its first write runs
    /// GC with no closed line to free (the reference fails there too). Any other drive
    /// runs; one that fills so far that GC can free nothing stops with [`Stuck`].
    pub(crate) fn check_gc(&self) -> Result<(), String> {
        let spl = self.slots_per_line();
        if spl == 0 {
            return Err("the geometry gives lines of 0 slots".into());
        }
        if self.data_lines() > 1 {
            return Ok(());
        }
        Err(format!(
            "its {} MiB with their spare area (op_ratio {}) fit in one GC line ({} MiB): its first write would run garbage collection with no closed line to free; {}",
            self.logical_bytes >> 20,
            self.op_ratio,
            (spl * SLOT) >> 20,
            self.size_hint()
        ))
    }
}

/// Garbage collection can free nothing: the reference model loops for ever (or fails)
/// here; the Rust model stops and says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck(pub(crate) String);

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stuck {}

impl From<Stuck> for std::io::Error {
    fn from(s: Stuck) -> std::io::Error {
        std::io::Error::other(s)
    }
}

impl Ftl {
    pub fn new(p: Params) -> Ftl {
        let s = p.page_bytes / SLOT;
        let n = p.channels * p.ways;
        let u = p.planes * s;
        let spl = n * u * p.pages_per_block;
        let n_lpn = p.logical_bytes / SLOT;
        let n_lines = p.data_lines() + p.gc_free_lines + 1;
        let n_slots = n_lines * spl;
        assert!(n_slots < u64::from(UNMAPPED), "simulated device too large for 32-bit slots");
        let mut f = Ftl {
            s,
            n,
            u,
            spl,
            n_lpn,
            n_lines,
            l2p: vec![UNMAPPED; n_lpn as usize],
            p2l: vec![UNMAPPED; n_slots as usize],
            valid: vec![0; n_lines as usize],
            state: vec![LineState::Free; n_lines as usize],
            free_lines: (0..n_lines as u32).rev().collect(),
            front: [(0, 0); 2],
            stats: FtlStats::default(),
            age_days: 0.0,
            written: vec![0; (n_slots / s) as usize],
            die_free: Vec::new(),
            ch_free: Vec::new(),
            link_free: 0.0,
            ra_prev_end: None,
            ra_hi: 0,
            ra_buf: HashMap::new(),
            p,
        };
        f.reset_clock();
        f.open_line(Stream::Host);
        f.open_line(Stream::Gc);
        f
    }

    /// Bytes of model state (the mapping tables, page write times and per-line counters).
    pub fn state_bytes(&self) -> u64 {
        let tables = self.l2p.len() + self.p2l.len() + self.written.len();
        (tables * 4 + self.valid.len() * 4 + self.state.len() + self.free_lines.len() * 4) as u64
    }

    /// The tables (for state files): mapping, reverse mapping, page write times.
    pub(crate) fn tables(&self) -> [&[u32]; 3] {
        [&self.l2p, &self.p2l, &self.written]
    }

    /// Restores the tables after loading the rest; checks they fit the geometry. No page
    /// write times (an old state file): every page as old as the age clock's start.
    pub(crate) fn set_tables(&mut self, l2p: Vec<u32>, p2l: Vec<u32>, written: Option<Vec<u32>>) -> Result<(), String> {
        let pages = self.n_lines * self.spl / self.s;
        let written = written.unwrap_or_else(|| vec![0; pages as usize]);
        if l2p.len() as u64 != self.n_lpn
            || p2l.len() as u64 != self.n_lines * self.spl
            || written.len() as u64 != pages
        {
            return Err("the mapping tables do not fit the device geometry".into());
        }
        if !(self.age_days.is_finite() && (0.0..=MAX_AGE_DAYS).contains(&self.age_days)) {
            return Err(format!("the age clock ({} days) is outside 0..{MAX_AGE_DAYS}", self.age_days));
        }
        self.l2p = l2p;
        self.p2l = p2l;
        self.written = written;
        self.reset_clock();
        Ok(())
    }

    /// Advances the retention age clock by `days` (checked by the caller: finite, not
    /// negative); refuses to go past [`MAX_AGE_DAYS`].
    pub(crate) fn age(&mut self, days: f64) -> Result<f64, String> {
        let to = self.age_days + days;
        if !(days >= 0.0 && to <= MAX_AGE_DAYS) {
            return Err(format!(
                "aging by {days} days would take the clock from {} to {to} days, past its limit of {MAX_AGE_DAYS} (a century)",
                self.age_days
            ));
        }
        self.age_days = to;
        Ok(to)
    }

    /// The age clock as a page write time.
    fn stamp_now(&self) -> u32 {
        (self.age_days * SECONDS_PER_DAY).round() as u32
    }

    /// The age, days, of the data in `page` (a NAND page: slot / S).
    fn page_age_days(&self, page: u64) -> f64 {
        (self.age_days - f64::from(self.written[page as usize]) / SECONDS_PER_DAY).max(0.0)
    }

    /// Bytes of mapped data per age, for `sim info`: (age in whole days, bytes), oldest first.
    pub(crate) fn data_ages(&self) -> Vec<(u64, u64)> {
        let mut by_day = std::collections::BTreeMap::<u64, u64>::new();
        for &g in self.l2p.iter().filter(|&&g| g != UNMAPPED) {
            *by_day.entry(self.page_age_days(u64::from(g) / self.s) as u64).or_default() += SLOT;
        }
        by_day.into_iter().rev().collect()
    }

    // ---------- allocation ----------
    fn open_line(&mut self, stream: Stream) {
        let b = self.free_lines.pop_back().expect("a free line to open");
        self.state[b as usize] = LineState::Open;
        self.front[stream as usize] = (u64::from(b), 0);
    }

    fn alloc(&mut self, stream: Stream) -> u64 {
        let (line, q) = self.front[stream as usize];
        let g = line * self.spl + q;
        self.front[stream as usize].1 = q + 1;
        if q + 1 == self.spl {
            self.state[line as usize] = LineState::Closed;
            assert!(!self.free_lines.is_empty(), "out of free lines");
            self.open_line(stream);
        }
        g
    }

    /// Forgets the slot `lpn` was written to, if any.
    fn unmap(&mut self, lpn: u64) {
        let old = self.l2p[lpn as usize];
        if old != UNMAPPED {
            self.p2l[old as usize] = UNMAPPED;
            self.valid[(u64::from(old) / self.spl) as usize] -= 1;
            self.l2p[lpn as usize] = UNMAPPED;
        }
    }

    fn place(&mut self, lpn: u64, stream: Stream) {
        self.unmap(lpn);
        let g = self.alloc(stream);
        self.l2p[lpn as usize] = g as u32;
        self.p2l[g as usize] = lpn as u32;
        // A host write and a GC move alike program the page anew: its age starts again.
        self.written[(g / self.s) as usize] = self.stamp_now();
        self.valid[(g / self.spl) as usize] += 1;
    }

    /// Host writes in arrival order. Returns how many LBAs were written; on [`Stuck`],
    /// the ones before it stay written.
    pub(crate) fn write_lpns(&mut self, lpns: impl IntoIterator<Item = u64>) -> Result<u64, Stuck> {
        let mut count = 0;
        for lpn in lpns {
            if self.free_lines.len() as u64 <= self.p.gc_free_lines {
                self.gc()?;
            }
            self.place(lpn, Stream::Host);
            count += 1;
        }
        self.stats.host_slots += count;
        Ok(count)
    }

    pub(crate) fn trim(&mut self, lpns: impl IntoIterator<Item = u64>) {
        for lpn in lpns {
            self.unmap(lpn);
        }
    }

    /// Bytes of the LBAs that hold data.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.l2p.iter().filter(|&&g| g != UNMAPPED).count() as u64 * SLOT
    }

    fn gc(&mut self) -> Result<(), Stuck> {
        while self.free_lines.len() as u64 <= self.p.gc_free_lines {
            // Greedy: the closed line with the fewest valid slots, lowest id on ties.
            let victim = (0..self.n_lines as usize)
                .filter(|&b| self.state[b] == LineState::Closed)
                .min_by_key(|&b| (self.valid[b], b))
                .ok_or_else(|| self.stuck("there is no closed line to free", self.p.size_hint()))?;
            self.check_progress(victim)?;
            let base = victim as u64 * self.spl;
            let mut moved = 0;
            for g in base..base + self.spl {
                let lpn = self.p2l[g as usize];
                if lpn != UNMAPPED {
                    self.place(u64::from(lpn), Stream::Gc);
                    moved += 1;
                }
            }
            assert_eq!(self.valid[victim], 0);
            self.state[victim] = LineState::Free;
            self.free_lines.push_front(victim as u32);
            self.stats.gc_slots += moved;
            self.stats.gc_runs += 1;
        }
        Ok(())
    }

    /// Fails where the reference would loop for ever or fail: a victim full of valid
    /// data (then every closed line is: moving one closes one GC line and frees one, for
    /// ever), or a move that must open a line with none free (`gc_free_lines` 0).
    fn check_progress(&self, victim: usize) -> Result<(), Stuck> {
        let valid = u64::from(self.valid[victim]);
        if valid == self.spl {
            return Err(self.stuck("every closed line is full of valid data", self.p.size_hint()));
        }
        if self.free_lines.is_empty() && self.front[Stream::Gc as usize].1 + valid >= self.spl {
            let hint = "keep gc_free_lines at 1 or more (--set gc_free_lines=1)".to_string();
            return Err(self.stuck("moving the emptiest line needs a free line and none is left", hint));
        }
        Ok(())
    }

    fn stuck(&self, why: &str, hint: String) -> Stuck {
        let mapped = self.mapped_bytes();
        Stuck(format!(
            "the simulated drive is stuck: garbage collection can free nothing ({why}; {} MiB of the {} MiB drive are written, and its spare area, op_ratio {}, is too small for that with {} MiB lines); {hint}",
            mapped >> 20,
            self.p.logical_bytes >> 20,
            self.p.op_ratio,
            (self.spl * SLOT) >> 20,
        ))
    }

    fn die_of(&self, g: u64) -> u64 {
        ((g % self.spl) / self.u) % self.n
    }

    fn key_div(&self) -> u64 {
        if self.p.multiplane_read { self.u } else { self.s }
    }

    // ---------- read timing ----------

    /// Groups LBAs into NAND sense operations in first-touch order.
    fn nand_ops(&self, lpns: &[u64]) -> Vec<NandOp> {
        let key_div = self.key_div();
        let mut index: HashMap<u64, usize> = HashMap::new();
        // (key, die, need, pages touched) per op, in first-touch order
        let mut ops: Vec<(u64, u64, u64, Vec<u64>)> = Vec::new();
        let mut last: Option<(u64, usize)> = None;
        for &lpn in lpns {
            let g = self.l2p[lpn as usize];
            if g == UNMAPPED {
                continue;
            }
            let g = u64::from(g);
            let k = g / key_div;
            let i = match last {
                Some((lk, li)) if lk == k => li,
                _ => *index.entry(k).or_insert_with(|| {
                    ops.push((k, self.die_of(g), 0, Vec::new()));
                    ops.len() - 1
                }),
            };
            last = Some((k, i));
            let op = &mut ops[i];
            op.2 += SLOT;
            let page = g / self.s;
            if !op.3.contains(&page) {
                op.3.push(page);
            }
        }
        ops.into_iter()
            .map(|(k, d, need, pages)| {
                let chb = if self.p.partial_xfer { need } else { pages.len() as u64 * self.p.page_bytes };
                (k, d, chb, need, self.read_factor(&pages))
            })
            .collect()
    }

    /// The factor on tR of one sense operation: its oldest page's (the operation ends
    /// when its last page is read; retries are for the worst one).
    fn read_factor(&self, pages: &[u64]) -> f64 {
        if !self.p.retention_on() {
            return 1.0;
        }
        let oldest = pages.iter().map(|&pg| self.page_age_days(pg)).fold(0.0, f64::max);
        self.p.retention_factor(oldest)
    }

    /// Reserves die and channel time for `ops` issued at `t0`; returns the ready times
    /// of the needed data, as (time, bytes).
    fn schedule_nand(&mut self, ops: &[NandOp], t0: f64, out: &mut Vec<(f64, u64)>) {
        for &(_, d, chb, need, factor) in ops {
            let c = (d % self.p.channels) as usize;
            let d = d as usize;
            let s = t0.max(self.die_free[d]);
            // With retention off the factor is 1: the reference's sum, bit for bit.
            let e = s + if factor == 1.0 { self.p.t_read_us } else { self.p.t_read_us * factor };
            let xs = e.max(self.ch_free[c]);
            let xe = xs + chb as f64 / self.p.ch_mbps;
            self.ch_free[c] = xe;
            self.die_free[d] = xe;
            if self.p.store_and_forward {
                out.push((xe, need));
            } else {
                let k = need / SLOT;
                let step = (xe - xs) / k as f64;
                for i in 1..=k {
                    out.push((xs + i as f64 * step, SLOT));
                }
            }
        }
    }

    fn link(&mut self, ready: &mut [(f64, u64)], t0: f64, total_bytes: u64) -> f64 {
        let mut lt = self.link_free.max(t0);
        if self.p.store_and_forward {
            let last = ready.iter().map(|r| r.0).reduce(f64::max);
            lt = lt.max(last.unwrap_or(t0)) + total_bytes as f64 / self.p.link_mbps;
        } else {
            ready.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(r, nb) in ready.iter() {
                lt = lt.max(r) + nb as f64 / self.p.link_mbps;
            }
        }
        self.link_free = lt;
        lt
    }

    /// One host read command of `n` LBAs arriving at `t_arrive`; returns its completion.
    pub(crate) fn read(&mut self, lpn0: u64, n: u64, t_arrive: f64) -> f64 {
        let t0 = t_arrive + self.p.fw_us;
        let b = lpn0 + n;
        let mut ready: Vec<(f64, u64)> = Vec::new();
        let mut demand: Vec<u64> = (lpn0..b).collect();
        if self.p.readahead != ReadAhead::None {
            if self.ra_prev_end != Some(lpn0) {
                self.ra_buf.clear();
                self.ra_hi = b;
            }
            if !self.ra_buf.is_empty() {
                demand.clear();
                for l in lpn0..b {
                    match self.ra_buf.remove(&l) {
                        Some(r) => ready.push((r.max(t0), SLOT)),
                        None => demand.push(l),
                    }
                }
            }
        }
        let ops = self.nand_ops(&demand);
        self.schedule_nand(&ops, t0, &mut ready);
        let have: u64 = ready.iter().map(|r| r.1).sum();
        let unmapped = (n * SLOT).saturating_sub(have);
        if unmapped > 0 {
            ready.push((t0, unmapped));
        }
        let done = self.link(&mut ready, t0, n * SLOT);
        if self.p.readahead != ReadAhead::None {
            self.ra_prev_end = Some(b);
            self.prefetch(b, t0);
        }
        done
    }

    /// Read-ahead after a command ending at LBA `b` (docs/FTL-MODEL.md, Reads).
    fn prefetch(&mut self, b: u64, t0: f64) {
        let w = self.p.ra_bytes / SLOT;
        self.ra_buf.retain(|&l, _| l >= b);
        let start = b.max(self.ra_hi);
        let end = (b + w).min(self.n_lpn);
        if start >= end {
            return;
        }
        let mut pf = Vec::new();
        let mut anchor: i64 = if start > 0 { l2p_signed(self.l2p[start as usize - 1]) } else { -2 };
        for l in start..end {
            let g = l2p_signed(self.l2p[l as usize]);
            if g < 0 {
                break;
            }
            if self.p.readahead == ReadAhead::Phys && g != anchor + 1 {
                break;
            }
            pf.push(l);
            anchor = g;
        }
        self.ra_hi = start + pf.len() as u64;
        if pf.is_empty() {
            return;
        }
        let mut ready_at: HashMap<u64, f64> = HashMap::new();
        let mut out = Vec::new();
        for op in &self.nand_ops(&pf) {
            out.clear();
            self.schedule_nand(std::slice::from_ref(op), t0, &mut out);
            ready_at.insert(op.0, out.iter().map(|x| x.0).fold(f64::NEG_INFINITY, f64::max));
        }
        let key_div = self.key_div();
        for &l in &pf {
            let k = u64::from(self.l2p[l as usize]) / key_div;
            self.ra_buf.insert(l, ready_at[&k]);
        }
    }

    /// Forgets all in-flight read state (before each measured read).
    pub(crate) fn reset_clock(&mut self) {
        self.die_free = vec![0.0; self.n as usize];
        self.ch_free = vec![0.0; self.p.channels as usize];
        self.link_free = 0.0;
        self.ra_prev_end = None;
        self.ra_hi = 0;
        self.ra_buf.clear();
    }
}

/// One NAND sense operation: key (page or multi-plane page), die, channel bytes, needed
/// bytes, factor on tR.
type NandOp = (u64, u64, u64, u64, f64);

fn l2p_signed(g: u32) -> i64 {
    if g == UNMAPPED { -1 } else { i64::from(g) }
}

/// Seconds of virtual time to read `[lpn0, lpn0 + n_lpn)` sequentially with commands of
/// `req_bytes` at queue depth `qd` (the reference's `seq_read_time`).
pub(crate) fn seq_read_time(ftl: &mut Ftl, lpn0: u64, n_lpn: u64, req_bytes: u64, qd: usize) -> f64 {
    ftl.reset_clock();
    let per = req_bytes / SLOT;
    let gap = ftl.p.host_gap_us;
    let end = lpn0 + n_lpn;
    let mut t = 0.0;
    let mut l = lpn0;
    if qd <= 1 {
        while l < end {
            let k = per.min(end - l);
            let done = ftl.read(l, k, t);
            t = done + gap;
            l += k;
        }
        return (t - gap) / 1e6;
    }
    // Each completion issues the next command; all start at time 0.
    let mut inflight: Vec<f64> = Vec::new();
    let mut last: f64 = 0.0;
    while l < end || !inflight.is_empty() {
        while l < end && inflight.len() < qd {
            let k = per.min(end - l);
            let done = ftl.read(l, k, t);
            inflight.push(done);
            l += k;
        }
        let first = (0..inflight.len()).min_by(|&a, &b| inflight[a].total_cmp(&inflight[b]));
        let d = inflight.swap_remove(first.expect("a command in flight"));
        last = last.max(d);
        t = d + gap;
    }
    last / 1e6
}

/// Host writes with a virtual clock and the optional background noise writer
/// (the reference's `Writer`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Writer {
    b_prog: f64,
    prog_clock: f64,
    /// The virtual time of the next host command.
    pub(crate) t: f64,
    noise_iv: f64,
    /// When the next noise write arrives (None: no noise writer).
    next_noise: Option<f64>,
    noise_lo: u64,
    noise_hi: u64,
    rng: super::pyrandom::PyRandom,
    pub(crate) noise_count: u64,
}

impl Writer {
    /// `noise_interval_us` 0 turns the noise writer off; its writes go to random LBAs
    /// in `[noise_lo, noise_hi)`.
    pub fn new(ftl: &Ftl, noise_interval_us: f64, noise_lo: u64, noise_hi: u64, seed: u64) -> Writer {
        Writer {
            b_prog: (ftl.n * ftl.u * SLOT) as f64 / ftl.p.t_prog_us,
            prog_clock: 0.0,
            t: 0.0,
            noise_iv: noise_interval_us,
            next_noise: (noise_interval_us > 0.0).then_some(noise_interval_us),
            noise_lo,
            noise_hi,
            rng: super::pyrandom::PyRandom::new(seed),
            noise_count: 0,
        }
    }

    fn cmd(&mut self, ftl: &mut Ftl, lpns: impl Iterator<Item = u64>, t_arr: f64) -> Result<f64, Stuck> {
        let nbytes = (ftl.write_lpns(lpns)? * SLOT) as f64;
        self.prog_clock = self.prog_clock.max(t_arr) + nbytes / self.b_prog;
        let accept = t_arr + ftl.p.fw_w_us + nbytes / ftl.p.link_mbps;
        Ok(accept.max(self.prog_clock - ftl.p.wbuf_bytes as f64 / self.b_prog))
    }

    /// One host write command at QD1; returns its completion and advances the clock.
    pub(crate) fn write(&mut self, ftl: &mut Ftl, lpns: impl Iterator<Item = u64>) -> Result<f64, Stuck> {
        while let Some(at) = self.next_noise.filter(|&at| at <= self.t) {
            let l = self.rng.randrange(self.noise_lo, self.noise_hi);
            self.cmd(ftl, std::iter::once(l), at)?;
            self.noise_count += 1;
            self.next_noise = Some(at + self.noise_iv);
        }
        let t = self.t;
        let done = self.cmd(ftl, lpns, t)?;
        self.t = done + ftl.p.host_gap_us;
        Ok(done)
    }
}
