//! Which device a journal, a rescue copy or a report is about.
//!
//! Here, below the host layer, because the journal and the rescue files record it;
//! `host::device` reads it from sysfs.

/// Identity recorded in the journal; a resume refuses if any of it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct DeviceIdentity {
    /// Kernel name (`loop0`, `nvme0n1p2`).
    pub(crate) name: String,
    /// "major:minor".
    pub(crate) dev: String,
    pub(crate) size_bytes: u64,
    /// Serial number of the disk, where the driver exposes one.
    pub(crate) serial: Option<String>,
    /// World-wide name / NVMe wwid, where exposed.
    pub(crate) wwn: Option<String>,
    pub(crate) model: Option<String>,
    /// For partitions: the start sector on the parent disk (same number, different
    /// partition table = different data).
    pub(crate) partition_start_sectors: Option<u64>,
    /// For loop devices: the backing file (loop numbers are reused).
    pub(crate) loop_backing_file: Option<String>,
}

impl DeviceIdentity {
    /// What differs from `was`, field by field, as a person reads it:
    /// "size 2.0 GiB -> 3.0 GiB, serial S1 -> S2".
    pub(crate) fn changes_since(&self, was: &DeviceIdentity) -> String {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "none".into());
        let num = |o: Option<u64>| o.map_or_else(|| "none".into(), |n| n.to_string());
        let fields = [
            ("name", was.name.clone(), self.name.clone()),
            ("major:minor", was.dev.clone(), self.dev.clone()),
            (
                "size",
                crate::support::units::human_bytes(was.size_bytes),
                crate::support::units::human_bytes(self.size_bytes),
            ),
            ("serial", opt(&was.serial), opt(&self.serial)),
            ("WWN", opt(&was.wwn), opt(&self.wwn)),
            ("model", opt(&was.model), opt(&self.model)),
            ("partition start sector", num(was.partition_start_sectors), num(self.partition_start_sectors)),
            ("loop backing file", opt(&was.loop_backing_file), opt(&self.loop_backing_file)),
        ];
        let mut out: Vec<String> =
            fields.iter().filter(|(_, a, b)| a != b).map(|(n, a, b)| format!("{n} {a} -> {b}")).collect();
        if out.is_empty() && was.size_bytes != self.size_bytes {
            out.push(format!("size {} -> {} bytes", was.size_bytes, self.size_bytes));
        }
        out.join(", ")
    }

    /// The same device, perhaps under another name and number (loop and NVMe numbers
    /// can change between boots): the same size and partition start, and the same
    /// backing file, serial, WWN and model where any is known. A device with none of
    /// those is only itself under the same name and major:minor.
    pub(crate) fn same_device(&self, other: &DeviceIdentity) -> bool {
        if self.size_bytes != other.size_bytes || self.partition_start_sectors != other.partition_start_sectors {
            return false;
        }
        let stable =
            |d: &DeviceIdentity| (d.loop_backing_file.clone(), d.serial.clone(), d.wwn.clone(), d.model.clone());
        if self.loop_backing_file.is_some() || self.serial.is_some() || self.wwn.is_some() {
            stable(self) == stable(other)
        } else {
            self.name == other.name && self.dev == other.dev
        }
    }
}
