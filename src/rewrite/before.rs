//! The benchmark before a `--bench` run, kept beside its journal (or file record): a
//! resumed run compares with it, since the data it measured is partly rewritten by then
//! and a new "before" would measure the run's own work.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::measure::bench::BenchResult;

use crate::measure::readbench::Ranges;
use crate::measure::scan::ScanResult;
use crate::options::bench::BenchOptions;
use crate::support::error::{Error, Result};

/// What the benchmark before measured, and on which bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Before {
    pub(crate) bench: BenchResult,
    pub(crate) scan: ScanResult,
    /// The device's ranges in use then (device mode on mounted filesystems).
    pub(crate) in_use: Option<Ranges>,
}

/// Where a run's benchmark before is kept: beside its journal or record.
pub(crate) fn path_of(record: &Path) -> PathBuf {
    let mut name = record.file_name().unwrap_or_default().to_os_string();
    name.push(".before.json");
    record.with_file_name(name)
}

impl Before {
    /// Written whole, as journals are: a crash leaves the old one or the new one.
    pub(crate) fn save(&self, record: &Path) -> Result<()> {
        let path = path_of(record);
        let text = serde_json::to_string(self).map_err(|e| Error::io("encoding the benchmark before", e.into()))?;
        crate::engine::journal::replace_atomically(&path, &text)
            .map_err(|e| Error::io(format!("saving the benchmark before to {}", path.display()), e))
    }

    /// Forgets a run's benchmark before: the run wrote nothing, so there is nothing to
    /// resume and compare with.
    pub(crate) fn discard(record: &Path) {
        let _ = std::fs::remove_file(path_of(record));
    }

    /// The interrupted run's, if it was kept (None, said in the log, if not).
    pub(crate) fn load(record: &Path) -> Option<Before> {
        let path = path_of(record);
        let found = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Before>(&b).ok());
        match &found {
            Some(_) => {
                log::info!("comparing with the benchmark taken before the interrupted run started ({})", path.display())
            }
            None => log::warn!(
                "the interrupted run's benchmark before is not in the state directory ({}): this run measures after, with no verdict",
                path.display()
            ),
        }
        found
    }
}

/// The benchmark options that read as the benchmark before did: the after-benchmark of
/// a resumed run reads the same way, whatever the resuming command says.
pub(crate) fn same_reads(bench: &BenchResult, scan: &ScanResult, given: &BenchOptions) -> BenchOptions {
    let p = &bench.params;
    BenchOptions {
        block_size: p.block_size_bytes,
        queue_depth: p.queue_depth,
        passes: bench.passes.len().max(1),
        regions: scan.regions.len().max(1),
        ..given.clone()
    }
}
