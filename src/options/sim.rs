//! The simulated SSD's commands as typed values: `reseq simulate`, the steps of
//! `reseq sim …`, and `reseq rewrite sim:STATE`. Also the one place that knows how a
//! target names a simulated SSD (`sim:STATE`).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The state file of a `sim:STATE` target; None for any other target.
pub fn sim_state(target: &Path) -> Option<PathBuf> {
    let rest = target.as_os_str().as_bytes().strip_prefix(b"sim:")?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(rest)))
}

/// `reseq simulate`: the measurement that started this project, on a model SSD.
#[derive(Clone, Debug, PartialEq)]
pub struct SimulateOptions {
    /// A preset of `sim::ftl::PRESETS`.
    pub preset: String,
    pub device_size: u64,
    pub file_size: u64,
    /// Random 4 KiB write stages in MiB, for a 4 GiB file.
    pub stages: Vec<f64>,
    pub chunk_size: u64,
    pub seed: u64,
    pub set: Vec<Override>,
}

impl Default for SimulateOptions {
    fn default() -> SimulateOptions {
        SimulateOptions {
            preset: "consumer-nvme".into(),
            device_size: 8 << 30,
            file_size: 4 << 30,
            stages: vec![50.0, 200.0, 800.0, 4000.0],
            chunk_size: 4 << 20,
            seed: 1,
            set: Vec::new(),
        }
    }
}

/// One `--set KEY=VALUE` of a model parameter, its value already typed (a `*_bytes`
/// key's size in bytes; a number or word otherwise).
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: serde_json::Value,
}

/// A range of a simulated device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct SimRange {
    pub offset: u64,
    /// None: to the end of the device.
    pub length: Option<u64>,
}

/// `--only-slow`: scan first and rewrite only the regions that read slowly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowScan {
    pub regions: usize,
    pub threshold: f64,
}

/// A rewrite of a range of a simulated SSD with reseq's engine.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRewrite {
    pub state: PathBuf,
    pub range: SimRange,
    pub chunk_size: u64,
    pub verify: bool,
    pub only_slow: Option<SlowScan>,
}

/// One step of `reseq sim …` on a simulated SSD kept in a state file.
#[derive(Clone, Debug, PartialEq)]
pub enum SimStep {
    Create { state: PathBuf, preset: String, device_size: u64, set: Vec<Override> },
    Write { state: PathBuf, range: SimRange },
    Fragment { state: PathBuf, range: SimRange, random_writes: u64, seed: u64 },
    Read { state: PathBuf, range: SimRange, block_size: u64, queue_depth: usize },
    Rewrite(SimRewrite),
    Info { state: PathBuf },
    Serve { state: PathBuf, mount_dir: PathBuf, time_scale: f64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sim_prefix_names_a_simulated_ssd() {
        assert_eq!(sim_state(Path::new("sim:/tmp/x.state")), Some(PathBuf::from("/tmp/x.state")));
        assert_eq!(sim_state(Path::new("sim:rel")), Some(PathBuf::from("rel")));
        assert_eq!(sim_state(Path::new("/dev/sim:x")), None);
        assert_eq!(sim_state(Path::new("/dev/nvme0n1")), None);
        // Not UTF-8 after the prefix: still the path it names.
        let raw = std::ffi::OsStr::from_bytes(b"sim:/tmp/\xff");
        assert_eq!(sim_state(Path::new(raw)), Some(PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xff"))));
    }
}
