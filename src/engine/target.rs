//! The device abstraction the engine rewrites through, and measuring reads through.
//!
//! [`ReadTarget`] is what a measurement needs of a device: an alignment and positioned
//! reads. [`BlockTarget`] adds what the engine needs to rewrite: writes and a flush. The
//! real implementations are a block device or file opened with O_DIRECT: read-only,
//! [`DirectReader`], or read-write, [`DirectDevice`]; a simulated SSD implements the same
//! traits, so the engine under test is the engine that ships.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::support::hooks::{self, IoOp};

pub(crate) trait ReadTarget: Send + Sync {
    /// Required alignment of buffer addresses.
    fn mem_align(&self) -> usize;
    /// Required alignment of offsets and lengths.
    fn offset_align(&self) -> u64;
    /// One positioned read into `buf`: the bytes read, fewer than asked only at the end
    /// of a file.
    fn read_some_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_some_at(&mut buf[done..], offset + done as u64) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
            }
        }
        Ok(())
    }
}

pub(crate) trait BlockTarget: ReadTarget {
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Makes completed writes durable (a cache flush on the device).
    fn flush(&self) -> std::io::Result<()>;
    /// Writes back what the page cache holds dirty of `len` bytes at `offset` (another
    /// program's buffered writes to the device), so that the kernel's counters show them
    /// before reseq writes there. Nothing where no page cache stands between.
    fn write_back(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
        Ok(())
    }
    /// Where `len` bytes at `offset` lie on the underlying device (file mode maps file
    /// offsets), for rescue copies.
    fn device_offset(&self, offset: u64, _len: u64) -> Option<u64> {
        Some(offset)
    }
}

/// A block device or file opened with O_DIRECT; `WRITABLE` only as [`DirectDevice`]: only
/// that one is a [`BlockTarget`].
pub(crate) struct Direct<const WRITABLE: bool> {
    file: File,
    mem_align: usize,
    offset_align: u64,
}

/// A block device or file opened `O_RDONLY | O_DIRECT`: nothing can write through it.
pub(crate) type DirectReader = Direct<false>;

/// A block device opened `O_RDWR | O_DIRECT`.
pub(crate) type DirectDevice = Direct<true>;

impl DirectReader {
    /// Opens `path` for direct reads, aligned to 512 bytes until [`Self::aligned`] says
    /// otherwise (the alignment is asked of the open file).
    pub(crate) fn open(path: &Path) -> std::io::Result<DirectReader> {
        Ok(Direct { file: crate::sys::block::open_direct_read(path)?.into(), mem_align: 512, offset_align: 512 })
    }

    pub(crate) fn aligned(self, mem_align: usize, offset_align: u64) -> DirectReader {
        Direct { mem_align, offset_align, ..self }
    }
}

impl<const WRITABLE: bool> AsFd for Direct<WRITABLE> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl<const WRITABLE: bool> ReadTarget for Direct<WRITABLE> {
    fn mem_align(&self) -> usize {
        self.mem_align
    }
    fn offset_align(&self) -> u64 {
        self.offset_align
    }
    fn read_some_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        hooks::io_fault(IoOp::Read, offset, buf.len() as u64)?;
        let n = self.file.read_at(buf, offset)?;
        hooks::corrupt_read(offset, &mut buf[..n]);
        Ok(n)
    }
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
        mem_align: usize,
        offset_align: u64,
    ) -> std::io::Result<DirectDevice> {
        hooks::open_error(mode == OpenMode::SharedWithMounts)?;
        let file = crate::sys::block::open_direct_rw(path, mode == OpenMode::Exclusive)?;
        Ok(Direct { file, mem_align, offset_align })
    }
}

impl BlockTarget for DirectDevice {
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        hooks::io_fault(IoOp::Write, offset, buf.len() as u64)?;
        self.file.write_all_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
    fn write_back(&self, offset: u64, len: u64) -> std::io::Result<()> {
        crate::sys::block::write_back_range(self.file.as_fd(), offset, len)
    }
}
