//! The simulated SSD's commands as typed values: `reseq simulate`, the steps of
//! `reseq sim …`, and `reseq rewrite sim:STATE`. Also the one place that knows how a
//! target names a simulated SSD (`sim:STATE`).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The state file of a `sim:STATE` target; None for any other target.
pub(crate) fn sim_state(target: &Path) -> Option<PathBuf> {
    let rest = target.as_os_str().as_bytes().strip_prefix(b"sim:")?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(rest)))
}

/// `reseq simulate`: the measurement that started this project, on a model SSD.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SimulateOptions {
    /// A preset of `sim::ftl::PRESETS`.
    pub(crate) preset: String,
    pub(crate) device_size: u64,
    pub(crate) file_size: u64,
    /// Random 4 KiB write stages in MiB, for a 4 GiB file.
    pub(crate) stages: Vec<f64>,
    pub(crate) chunk_size: u64,
    pub(crate) seed: u64,
    pub(crate) set: Vec<Override>,
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
pub(crate) struct Override {
    pub(crate) key: String,
    pub(crate) value: serde_json::Value,
}

/// A range of a simulated device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub(crate) struct SimRange {
    pub(crate) offset: u64,
    /// None: to the end of the device.
    pub(crate) length: Option<u64>,
}

/// `--only-slow`: scan first and rewrite only the regions that read slowly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlowScan {
    pub(crate) regions: usize,
    pub(crate) threshold: f64,
}

/// A rewrite of a range of a simulated SSD with reseq's engine.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SimRewrite {
    pub(crate) state: PathBuf,
    pub(crate) range: SimRange,
    pub(crate) chunk_size: u64,
    pub(crate) verify: bool,
    pub(crate) only_slow: Option<SlowScan>,
}

/// One step of `reseq sim …` on a simulated SSD kept in a state file.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SimStep {
    Create {
        state: PathBuf,
        preset: String,
        device_size: u64,
        set: Vec<Override>,
    },
    Write {
        state: PathBuf,
        range: SimRange,
    },
    Fragment {
        state: PathBuf,
        range: SimRange,
        random_writes: u64,
        seed: u64,
    },
    Read {
        state: PathBuf,
        range: SimRange,
        block_size: u64,
        queue_depth: usize,
    },
    Rewrite(SimRewrite),
    Info {
        state: PathBuf,
    },
    /// Advance the retention age clock by `days` (finite, not negative).
    Age {
        state: PathBuf,
        days: f64,
    },
    Serve {
        state: PathBuf,
        mount_dir: PathBuf,
        time_scale: f64,
    },
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
