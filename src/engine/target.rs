//! The device abstraction the engine rewrites through.
//!
//! [`BlockTarget`] is all the engine knows of a device: a length, an alignment, and
//! whole-buffer positioned reads and writes plus a flush. The real implementation,
//! [`DirectDevice`], is a block device opened with O_DIRECT; a simulated SSD implements
//! the same trait, so the engine under test is the engine that ships.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub(crate) trait BlockTarget: Send + Sync {
    /// What to call it in messages.
    fn describe(&self) -> String;
    /// Size in bytes.
    fn len_bytes(&self) -> u64;
    /// Required alignment of buffer addresses.
    fn mem_align(&self) -> usize;
    /// Required alignment of offsets and lengths.
    fn offset_align(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Makes completed writes durable (a cache flush on the device).
    fn flush(&self) -> std::io::Result<()>;
    /// Where `len` bytes at `offset` lie on the underlying device (file mode maps file
    /// offsets), for rescue copies.
    fn device_offset(&self, offset: u64, _len: u64) -> Option<u64> {
        Some(offset)
    }
}

/// A block device opened `O_RDWR | O_DIRECT`.
pub(crate) struct DirectDevice {
    file: File,
    path: PathBuf,
    len: u64,
    mem_align: usize,
    offset_align: u64,
}

/// How to open the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpenMode {
    /// O_EXCL: the device is not mounted, and stays unmountable while we hold it.
    Exclusive,
    /// Shared: the device is mounted; the freeze is what keeps it still.
    SharedWithMounts,
}

impl DirectDevice {
    pub(crate) fn open(
        path: &Path,
        mode: OpenMode,
        len: u64,
        mem_align: usize,
        offset_align: u64,
    ) -> std::io::Result<DirectDevice> {
        crate::support::hooks::open_error(mode == OpenMode::SharedWithMounts)?;
        let file = crate::sys::open_direct_rw(path, mode == OpenMode::Exclusive)?;
        Ok(DirectDevice { file, path: path.to_path_buf(), len, mem_align, offset_align })
    }
}

impl BlockTarget for DirectDevice {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    fn len_bytes(&self) -> u64 {
        self.len
    }
    fn mem_align(&self) -> usize {
        self.mem_align
    }
    fn offset_align(&self) -> u64 {
        self.offset_align
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        crate::support::hooks::io_fault(crate::support::hooks::IoOp::Read, offset, buf.len() as u64)?;
        self.file.read_exact_at(buf, offset)?;
        crate::support::hooks::corrupt_read(offset, buf);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        crate::support::hooks::io_fault(crate::support::hooks::IoOp::Write, offset, buf.len() as u64)?;
        self.file.write_all_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}
