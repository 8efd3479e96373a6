//! A thin LV's map: which blocks of a device-mapper `thin` device hold data in its pool
//! (provisioned), and which of those it shares with another thin device (a snapshot).
//!
//! A thin volume reads an unprovisioned block as zeros from no storage at all, and a
//! write there takes a new block from the pool; a write to a shared block breaks the
//! sharing and takes one too. Neither has an order to restore, and a full pool fails
//! every volume in it. So only the blocks the volume alone holds are rewritten: each of
//! them is written where it already is, and the pool does not grow.
//!
//! The map is the pool's own metadata, read through a metadata snapshot (the kernel's
//! way to read a live pool's metadata consistently): `dmsetup message POOL 0
//! reserve_metadata_snap`, `thin_dump -m` of the metadata device, `release_metadata_snap`.
//! It is read at the plan and at the start of a run, and again in any window that finds
//! the pool's transaction id moved (a thin device or snapshot made or removed mid-run,
//! which can make shared what was not). A block provisioned after a read is left for the
//! next run; one discarded after it reads as zeros, and writing those zeros back takes a
//! block again, at most what was discarded during the run. Neither loses a byte.

use std::path::PathBuf;

use crate::host::device::{BlockDeviceInfo, Sysfs, parse_dev};
use crate::support::error::{Error, Result};
use crate::support::tool::Tool;

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
    /// Device byte ranges the device alone holds data in, ascending, apart.
    pub(crate) own: Vec<(u64, u64)>,
    /// Device byte ranges it holds data in that another thin device shares (left out),
    /// ascending, apart.
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
        let status = dmsetup(&["status", "--", &self.pool]).map_err(|e| self.error("reading the status of", e))?;
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
        let dump = Tool::new("thin_dump").arg("-m").arg(&self.metadata).run();
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
fn attr(line: &str, name: &str) -> Option<u64> {
    let at = line.find(&format!(" {name}=\""))? + name.len() + 3;
    line[at..].split('"').next()?.parse().ok()
}

/// The map of device `dev_id` (at most `size` bytes) in `thin_dump`'s XML: its mappings,
/// less the data blocks any other device maps too.
fn parse(xml: &str, dev_id: u64, size: u64) -> std::result::Result<ThinMap, String> {
    let (mut transaction, mut block) = (None, None);
    let (mut device, mut found) = (None, false);
    // (data block, length, origin block) of this device; (data block, length) of the others.
    let mut mine: Vec<(u64, u64, u64)> = Vec::new();
    let mut others: Vec<(u64, u64)> = Vec::new();
    for line in xml.lines().map(str::trim) {
        let mapping = if line.starts_with("<superblock ") {
            transaction = attr(line, "transaction");
            block = attr(line, "data_block_size").map(|s| s * 512);
            continue;
        } else if line.starts_with("<device ") {
            device = attr(line, "dev_id");
            found |= device == Some(dev_id);
            continue;
        } else if line.starts_with("<range_mapping ") {
            (attr(line, "origin_begin"), attr(line, "data_begin"), attr(line, "length"))
        } else if line.starts_with("<single_mapping ") {
            (attr(line, "origin_block"), attr(line, "data_block"), Some(1))
        } else {
            continue;
        };
        let (Some(origin), Some(data), Some(len)) = mapping else { return Err(format!("a mapping unread: {line}")) };
        match device {
            Some(d) if d == dev_id => mine.push((data, len, origin)),
            Some(_) => others.push((data, len)),
            None => return Err(format!("a mapping outside any device: {line}")),
        }
    }
    let (Some(transaction), Some(block)) = (transaction, block) else { return Err("no superblock".into()) };
    if !found {
        return Err(format!("no thin device {dev_id} in it"));
    }
    others.sort_unstable();
    // Others' data blocks, merged: (start, end).
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for (d, l) in others {
        match taken.last_mut() {
            Some(last) if last.1 >= d => last.1 = last.1.max(d + l),
            _ => taken.push((d, d + l)),
        }
    }
    let (mut own, mut shared) = (Vec::new(), Vec::new());
    for (d, l, o) in mine {
        // The pieces of [d, d + l) no other device maps, and those it does.
        let mut at = d;
        let first = taken.partition_point(|t| t.1 <= d);
        for &(ts, te) in taken[first..].iter().take_while(|t| t.0 < d + l) {
            if ts > at {
                own.push((o + at - d, ts - at));
            }
            let (a, b) = (ts.max(d), te.min(d + l));
            shared.push((o + a - d, b - a));
            at = at.max(te);
        }
        if at < d + l {
            own.push((o + at - d, d + l - at));
        }
    }
    Ok(ThinMap { transaction, own: in_bytes(own, block, size), shared: in_bytes(shared, block, size) })
}

/// Ranges of blocks of `block` bytes as byte ranges below `size`, ascending, merged.
fn in_bytes(mut blocks: Vec<(u64, u64)>, block: u64, size: u64) -> Vec<(u64, u64)> {
    blocks.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in blocks {
        let (a, b) = ((o * block).min(size), ((o + l) * block).min(size));
        match out.last_mut() {
            Some(last) if last.0 + last.1 >= a => last.1 = last.1.max(b - last.0),
            _ if b > a => out.push((a, b - a)),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"<superblock uuid="" time="1" transaction="7" flags="0" version="2" data_block_size="128" nr_data_blocks="4096">
  <device dev_id="1" mapped_blocks="30" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="16" time="0"/>
    <single_mapping origin_block="20" data_block="100" time="0"/>
    <range_mapping origin_begin="30" data_begin="40" length="10" time="1"/>
  </device>
  <device dev_id="2" mapped_blocks="4" transaction="1" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="4" length="4" time="0"/>
    <single_mapping origin_block="9" data_block="45" time="1"/>
  </device>
</superblock>"#;

    #[test]
    fn a_devices_own_blocks_less_what_others_share() {
        let b = 64 << 10; // 128 sectors
        let m = parse(DUMP, 1, 1 << 40).unwrap();
        assert_eq!(m.transaction, 7);
        // Blocks 0-3 and 8-15 (data 0-3, 8-15: 4-7 shared with device 2), 20, 30-34 and
        // 36-39 (data 40-44, 46-49: 45 shared).
        assert_eq!(m.own, vec![(0, 4 * b), (8 * b, 8 * b), (20 * b, b), (30 * b, 5 * b), (36 * b, 4 * b)]);
        assert_eq!(m.shared, vec![(4 * b, 4 * b), (35 * b, b)]);
        let m2 = parse(DUMP, 2, 1 << 40).unwrap();
        assert_eq!(m2.own, vec![], "all of device 2 is shared with device 1");
        assert_eq!(m2.shared, vec![(0, 4 * b), (9 * b, b)]);
    }

    #[test]
    fn the_map_ends_at_the_device_and_refuses_what_it_cannot_read() {
        let b = 64 << 10;
        let m = parse(DUMP, 1, 10 * b + 4096).unwrap();
        assert_eq!(m.own, vec![(0, 4 * b), (8 * b, 2 * b + 4096)]);
        assert!(parse(DUMP, 3, 1 << 40).unwrap_err().contains("no thin device 3"));
        assert!(parse("<device dev_id=\"1\">", 1, 1 << 40).is_err());
        let bad = DUMP.replace("length=\"10\"", "length=\"x\"");
        assert!(parse(&bad, 1, 1 << 40).unwrap_err().contains("a mapping unread"));
    }
}
