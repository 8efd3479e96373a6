//! A thin LV's map: which blocks of a device-mapper `thin` device hold data in its pool
//! (provisioned), and which of those the kernel would copy on write (shared with a
//! snapshot, or older than one since removed).
//!
//! A thin volume reads an unprovisioned block as zeros from no storage at all, and a
//! write there takes a new block from the pool; a write to a shared block breaks the
//! sharing and takes one too. Neither has an order to restore, and a full pool fails
//! every volume in it. So only the blocks the kernel would not copy on write are
//! rewritten: each of them is written where it already is, and the pool does not grow.
//!
//! The map is the pool's own metadata, read through a metadata snapshot (the kernel's
//! way to read a live pool's metadata consistently): `dmsetup message POOL 0
//! reserve_metadata_snap`, `thin_dump -m` of the metadata device, `release_metadata_snap`.
//! It is read at the plan and at the start of a run, and again in any window that finds
//! the pool's transaction id moved (a thin device or snapshot made or removed mid-run,
//! which can make shared what was not), looked at every [`THIN_DATA`] of data. Only
//! LVM's pools: LVM moves the id with each snapshot. A block provisioned after a read is
//! left for the next run; one discarded after it reads as zeros, and writing those zeros
//! back takes a block again, at most what was discarded during the run. Neither loses a
//! byte.

use std::path::PathBuf;

use crate::engine::push_merged;
use crate::host::device::{BlockDeviceInfo, Sysfs};
use crate::host::devnum::parse_dev;
use crate::support::error::{Error, Result};
use crate::support::tool::Tool;

/// A thin volume's map covers at most this much data at a time: a snapshot made mid-window
/// (an unmounted volume's run is one window; on Linux 6.8 and later LVM's suspend nests in
/// reseq's freeze) is seen, and the map read again, within this much writing.
pub(crate) const THIN_DATA: u64 = 256 << 20;

/// A thin device and where its pool's metadata is.
#[derive(Debug)]
pub(crate) struct Thin {
    /// The pool's dm name (LVM's `VG-POOL-tpool`), for `dmsetup message` and `status`.
    pool: String,
    /// The pool's metadata device (`/dev/dm-N`).
    metadata: PathBuf,
    /// The thin device's id in its pool.
    dev_id: u64,
    /// The device's size in bytes: the map ends there.
    size: u64,
    /// In words: "the metadata of the thin pool vmvg-pool-tpool (thin_dump, …)".
    pub(crate) described: String,
}

/// What the pool's metadata says of one thin device at one transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ThinMap {
    /// The pool's transaction id when read.
    pub(crate) transaction: u64,
    /// Device byte ranges holding data the kernel would not copy on write (mapped at or
    /// after the device's last snapshot), ascending, apart.
    pub(crate) own: Vec<(u64, u64)>,
    /// Device byte ranges holding data older than its last snapshot, which a write would
    /// copy to a new block (left out), ascending, apart.
    pub(crate) shared: Vec<(u64, u64)>,
}

impl Thin {
    /// The thin target under `dev` (itself a dm `thin` device, one table line, no
    /// external origin), or None when it is not a thin device. Err: a thin device whose
    /// map cannot be read (in words).
    pub(crate) fn of(dev: &BlockDeviceInfo, sysfs: &Sysfs) -> std::result::Result<Option<Thin>, String> {
        let Some((name, None)) = sysfs.name_of(dev.dev_num) else { return Ok(None) };
        let Some(dm) = sysfs.read(&name, "dm/name") else { return Ok(None) };
        // Without dmsetup nothing says it is thin: `checks::no_copy_on_write` then goes
        // by LVM's names, and refuses what sits on a pool.
        let Ok(table) = dmsetup(&["table", "--", &dm]).map_err(|e| log::debug!("dmsetup table {dm}: {e}")) else {
            return Ok(None);
        };
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        if !lines.iter().any(|l| l.get(2) == Some(&"thin")) {
            return Ok(None);
        }
        let [line] = lines.as_slice() else {
            return Err(format!("{dm} has {} targets, not one thin target: no map", lines.len()));
        };
        // "start length thin POOL_DEV DEV_ID [EXTERNAL_ORIGIN]"
        if let Some(origin) = line.get(5) {
            return Err(format!(
                "{dm} has an external origin ({origin}): its unprovisioned blocks read from there, not as zeros"
            ));
        }
        let parse = || -> Option<((u32, u32), u64)> { Some((parse_dev(line.get(3)?)?, line.get(4)?.parse().ok()?)) };
        let Some((pool_dev, dev_id)) = parse() else { return Err(format!("{dm}: unexpected table: {table}")) };
        let pool_name = sysfs.name_of(pool_dev).map(|(n, _)| n).ok_or(format!("{dm}: its pool is not in sysfs"))?;
        let pool = sysfs.read(&pool_name, "dm/name").ok_or(format!("{dm}: its pool {pool_name} is not a dm device"))?;
        // LVM moves the pool's transaction id with every thin device or snapshot it makes
        // or removes, which is how a run sees a snapshot made mid-run; `dmsetup message
        // create_snap` by hand (or another manager) need not.
        if !sysfs.read(&pool_name, "dm/uuid").is_some_and(|u| u.starts_with("LVM-")) {
            return Err(format!(
                "the thin pool {pool} is not LVM's: a snapshot made in it mid-run might not move its transaction id, and would go unseen"
            ));
        }
        let ptable = dmsetup(&["table", "--", &pool]).map_err(|e| format!("dmsetup table {pool}: {e}"))?;
        // "start length thin-pool METADATA_DEV DATA_DEV BLOCK_SECTORS LOW_WATER ..."
        let p: Vec<&str> = ptable.split_whitespace().collect();
        let meta = (p.get(2) == Some(&"thin-pool")).then(|| p.get(3).and_then(|d| parse_dev(d))).flatten();
        let Some(meta) = meta else { return Err(format!("{pool}: unexpected table: {ptable}")) };
        let meta_name = sysfs.name_of(meta).map(|(n, _)| n).ok_or(format!("{pool}: its metadata is not in sysfs"))?;
        if crate::support::tool::find("thin_dump").is_none() {
            return Err("thin_dump is not installed (Debian: thin-provisioning-tools)".into());
        }
        let described = format!("the metadata of the thin pool {pool} (thin_dump, read again when the pool changes)");
        let size = dev.identity.size_bytes;
        Ok(Some(Thin { pool, metadata: PathBuf::from("/dev").join(meta_name), dev_id, size, described }))
    }

    /// The pool's transaction id now (`dmsetup status`): it moves when a thin device or
    /// snapshot is made or removed.
    pub(crate) fn transaction(&self) -> Result<u64> {
        // --noflush: a thin pool's status otherwise commits its metadata, in every window.
        let status =
            dmsetup(&["status", "--noflush", "--", &self.pool]).map_err(|e| self.error("reading the status of", e))?;
        // "start length thin-pool TRANSACTION USED_META/TOTAL USED_DATA/TOTAL HELD_ROOT ..."
        status.split_whitespace().nth(3).and_then(|t| t.parse().ok()).ok_or_else(|| {
            Error::refused(format!("the status of the thin pool {} says no transaction id: {status}", self.pool), HINT)
        })
    }

    /// Reads the map through a metadata snapshot, released before this returns.
    pub(crate) fn map(&self) -> Result<ThinMap> {
        let message = |what: &str| dmsetup(&["message", "--", &self.pool, "0", what]);
        message("reserve_metadata_snap").map_err(|e| {
            Error::refused(
                format!("the thin pool {}'s metadata snapshot cannot be taken: {e}", self.pool),
                "another tool (a backup, thin_ls) may hold it: once it is done, or if nothing does, run `dmsetup message POOL 0 release_metadata_snap` and reseq again",
            )
        })?;
        // This device's mappings alone: the kernel's own rule for sharing needs no other's.
        let dev_id = self.dev_id.to_string();
        let dump = Tool::new("thin_dump").args(["-m", "--dev-id", &dev_id]).arg(&self.metadata).run();
        let released = message("release_metadata_snap");
        let xml = dump.map_err(|e| self.error("reading", e))?;
        released.map_err(|e| self.error("releasing the metadata snapshot of", e))?;
        parse(&xml, self.dev_id, self.size).map_err(|why| {
            Error::refused(format!("the metadata of the thin pool {} cannot be read: {why}", self.pool), HINT)
        })
    }

    fn error(&self, doing: &str, e: impl std::fmt::Display) -> Error {
        Error::refused(format!("{doing} the thin pool {}: {e}", self.pool), HINT)
    }
}

const HINT: &str = "check the pool (lvs -a, dmsetup status), then run reseq again";

fn dmsetup(args: &[&str]) -> std::result::Result<String, crate::support::tool::ToolError> {
    Tool::new("dmsetup").args(args).run()
}

/// The value of attribute `name` in an XML element's text.
fn attr<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}=\""))? + name.len() + 3;
    line[at..].split('"').next()
}

fn num(line: &str, name: &str) -> Option<u64> {
    attr(line, name)?.parse().ok()
}

/// One mapping: (origin block, data block, length, time).
type Mapping = (u64, u64, u64, u64);

/// The map of device `dev_id` (at most `size` bytes) in `thin_dump`'s XML.
///
/// Shared is what the kernel calls shared: a block is copied on write when its mapping is
/// older than the device's last snapshot (`time < snap_time`: dm-thin-metadata.c,
/// `__snapshotted_since`), whether or not the snapshot is still there. So a block written
/// before a backup's snapshot that was since removed is still left out: a write there
/// would take a new block and move the data. thin-provisioning-tools 1.x puts mappings
/// several devices share in `<def name>` elements that a device takes with `<ref name>`;
/// 0.9 lists them in the device.
fn parse(xml: &str, dev_id: u64, size: u64) -> std::result::Result<ThinMap, String> {
    let mut r = Reading::default();
    for line in xml.lines().map(str::trim) {
        r.line(line, dev_id)?;
    }
    let (Some(transaction), Some(block)) = (r.transaction, r.block) else { return Err("no superblock".into()) };
    let Some(snap_time) = r.snap_time else { return Err(format!("no thin device {dev_id} in it")) };
    let (own, shared): (Vec<Mapping>, Vec<Mapping>) = r.mine.into_iter().partition(|m| m.3 >= snap_time);
    let origins = |m: Vec<Mapping>| m.into_iter().map(|(o, _, l, _)| (o, l)).collect();
    Ok(ThinMap {
        transaction,
        own: in_bytes(origins(own), block, size),
        shared: in_bytes(origins(shared), block, size),
    })
}

/// Where a mapping being read goes: a def, this device, another device.
#[derive(Default)]
enum In {
    #[default]
    Nothing,
    Def(String),
    Ours,
    Other,
}

/// What [`parse`] has read so far.
#[derive(Default)]
struct Reading {
    transaction: Option<u64>,
    /// Bytes per data block.
    block: Option<u64>,
    /// This device's last snapshot's time.
    snap_time: Option<u64>,
    defs: std::collections::HashMap<String, Vec<Mapping>>,
    at: In,
    mine: Vec<Mapping>,
}

impl Reading {
    fn line(&mut self, line: &str, dev_id: u64) -> std::result::Result<(), String> {
        let mapping = if line.starts_with("<superblock ") {
            self.transaction = num(line, "transaction");
            self.block = num(line, "data_block_size").map(|s| s * 512);
            return Ok(());
        } else if line.starts_with("<def ") {
            let name = attr(line, "name").ok_or(format!("a def without a name: {line}"))?;
            self.at = In::Def(name.to_string());
            return Ok(());
        } else if line.starts_with("<device ") {
            self.at = if num(line, "dev_id") == Some(dev_id) {
                self.snap_time = Some(num(line, "snap_time").ok_or(format!("no snap_time: {line}"))?);
                In::Ours
            } else {
                In::Other
            };
            return Ok(());
        } else if line.starts_with("</def>") || line.starts_with("</device>") {
            self.at = In::Nothing;
            return Ok(());
        } else if line.starts_with("<ref ") {
            if let In::Ours = self.at {
                let name = attr(line, "name").unwrap_or_default();
                self.mine.extend(self.defs.get(name).ok_or(format!("a ref to no def: {line}"))?);
            }
            return Ok(());
        } else if line.starts_with("<range_mapping ") {
            (num(line, "origin_begin"), num(line, "data_begin"), num(line, "length"), num(line, "time"))
        } else if line.starts_with("<single_mapping ") {
            (num(line, "origin_block"), num(line, "data_block"), Some(1), num(line, "time"))
        } else {
            return Ok(());
        };
        let (Some(o), Some(d), Some(l), Some(t)) = mapping else { return Err(format!("a mapping unread: {line}")) };
        match &self.at {
            In::Def(name) => self.defs.entry(name.clone()).or_default().push((o, d, l, t)),
            In::Ours => self.mine.push((o, d, l, t)),
            In::Other => {}
            In::Nothing => return Err(format!("a mapping outside any device: {line}")),
        }
        Ok(())
    }
}

/// Ranges of blocks of `block` bytes as byte ranges below `size`, ascending, merged.
fn in_bytes(mut blocks: Vec<(u64, u64)>, block: u64, size: u64) -> Vec<(u64, u64)> {
    blocks.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in blocks {
        let (a, b) = ((o * block).min(size), ((o + l) * block).min(size));
        if b > a {
            push_merged(&mut out, (a, b - a));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// thin-provisioning-tools 0.9: device 1 snapshotted at time 1 (device 2), then
    /// written at time 1 (origin 30-39); device 2 written at time 1 too (origin 9).
    const DUMP: &str = r#"<superblock uuid="" time="1" transaction="7" flags="0" version="2" data_block_size="128" nr_data_blocks="4096">
  <device dev_id="1" mapped_blocks="27" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="16" time="0"/>
    <single_mapping origin_block="20" data_block="100" time="0"/>
    <range_mapping origin_begin="30" data_begin="40" length="10" time="1"/>
  </device>
  <device dev_id="2" mapped_blocks="18" transaction="1" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="16" time="0"/>
    <single_mapping origin_block="9" data_block="200" time="1"/>
    <single_mapping origin_block="20" data_block="100" time="0"/>
  </device>
</superblock>"#;

    #[test]
    fn own_blocks_are_those_written_since_the_last_snapshot() {
        let b = 64 << 10; // 128 sectors
        let m = parse(DUMP, 1, 1 << 40).unwrap();
        assert_eq!(m.transaction, 7);
        assert_eq!(m.own, vec![(30 * b, 10 * b)], "written after the snapshot");
        assert_eq!(m.shared, vec![(0, 16 * b), (20 * b, b)], "older than the snapshot: the kernel copies them");
        let m2 = parse(DUMP, 2, 1 << 40).unwrap();
        assert_eq!(m2.own, vec![(9 * b, b)]);
        assert_eq!(m2.shared, vec![(0, 16 * b), (20 * b, b)]);
    }

    /// A snapshot removed since: its device is gone, its time stays in the volume's
    /// snap_time, and the blocks older than it are still copied on write.
    #[test]
    fn a_removed_snapshot_still_makes_older_blocks_shared() {
        let b = 64 << 10;
        let only = DUMP[..DUMP.find("  <device dev_id=\"2\"").unwrap()].to_string() + "</superblock>";
        let m = parse(&only, 1, 1 << 40).unwrap();
        assert_eq!(m.own, vec![(30 * b, 10 * b)]);
        assert_eq!(m.shared, vec![(0, 16 * b), (20 * b, b)]);
    }

    /// thin-provisioning-tools 1.x: shared leaves in defs, taken by refs.
    #[test]
    fn reads_defs_and_refs() {
        let b = 64 << 10;
        let xml = r#"<superblock uuid="" time="2" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="4096">
  <def name="5">
    <range_mapping origin_begin="0" data_begin="0" length="8" time="0"/>
  </def>
  <device dev_id="1" mapped_blocks="10" transaction="0" creation_time="0" snap_time="1">
    <ref name="5"/>
    <range_mapping origin_begin="8" data_begin="50" length="2" time="2"/>
  </device>
  <device dev_id="2" mapped_blocks="8" transaction="1" creation_time="1" snap_time="1">
    <ref name="5"/>
  </device>
</superblock>"#;
        let m = parse(xml, 1, 1 << 40).unwrap();
        assert_eq!((m.own, m.shared), (vec![(8 * b, 2 * b)], vec![(0, 8 * b)]));
        assert!(
            parse(&xml.replace("<ref name=\"5\"/>\n    <range", "<ref name=\"6\"/>\n    <range"), 1, 1 << 40)
                .unwrap_err()
                .contains("a ref to no def")
        );
    }

    #[test]
    fn the_map_ends_at_the_device_and_refuses_what_it_cannot_read() {
        let b = 64 << 10;
        let m = parse(DUMP, 1, 32 * b + 4096).unwrap();
        assert_eq!(m.own, vec![(30 * b, 2 * b + 4096)]);
        assert!(parse(DUMP, 3, 1 << 40).unwrap_err().contains("no thin device 3"));
        assert!(parse("<device dev_id=\"1\" snap_time=\"0\">", 1, 1 << 40).is_err());
        let bad = DUMP.replace("length=\"10\"", "length=\"x\"");
        assert!(parse(&bad, 1, 1 << 40).unwrap_err().contains("a mapping unread"));
    }
}
