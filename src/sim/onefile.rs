//! One file served through FUSE as `MOUNTDIR/disk`, its size fixed, for a loop device
//! to sit on: `reseq sim serve` serves the emulated SSD with it, and the tests a disk
//! that fails on demand. A [`Backend`] answers the file's reads, writes and discards;
//! this module is the rest of the filesystem.
//!
//! The file is opened with `FOPEN_DIRECT_IO`: no FUSE page cache sits between the loop
//! device and the backend, so every read and write the loop driver issues reaches it.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};

use crate::sys::extents::Fallocate;

/// The served file's name in the mount directory.
pub const DISK_NAME: &str = "disk";

const ROOT: INodeNo = INodeNo::ROOT;
const DISK: INodeNo = INodeNo(2);
const SIDE: INodeNo = INodeNo(3);
const TTL: Duration = Duration::from_secs(1);

/// What stores the served file's bytes. Requests reach it inside the file and not empty.
pub trait Backend: Send + Sync + 'static {
    /// A read-only file beside the disk, by name (see [`Backend::side_file`]).
    const SIDE_FILE: Option<&'static str> = None;

    /// Answers a read of `[offset, end)`, now or later.
    fn read(&self, offset: u64, end: u64, reply: ReplyData);
    /// Answers a write of `data` at `offset`, now or later.
    fn write(&self, offset: u64, data: &[u8], reply: ReplyWrite);
    /// Makes what was written durable (a flush of the loop device).
    fn fsync(&self) -> std::io::Result<()>;
    /// Discards `[offset, end)` (a loop device's discard: fallocate punch-hole or
    /// zero-range). By default the filesystem has no fallocate.
    fn trim(&self, _offset: u64, _end: u64) -> std::io::Result<()> {
        Err(nix::errno::Errno::ENOSYS.into())
    }
    /// Sets the session's limits (request sizes, asynchronous direct I/O).
    fn init(&self, _config: &mut KernelConfig) {}
    /// What [`Backend::SIDE_FILE`] holds now; its size reads as 4 KiB, and direct I/O
    /// reads it to its end anyway.
    fn side_file(&self) -> Vec<u8> {
        Vec::new()
    }
}

/// The filesystem: a root directory holding the disk (and the backend's side file).
pub struct OneFileFs<B> {
    backend: B,
    len: u64,
    uid: u32,
    gid: u32,
}

impl<B: Backend> OneFileFs<B> {
    /// Serves `backend` as `dir/disk`, `len` bytes, in the background; `name` is the
    /// mount's source and subtype. Unmounting `dir` ends the session.
    pub fn mount(backend: B, len: u64, dir: &Path, name: &str) -> std::io::Result<fuser::BackgroundSession> {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(name.into()),
            MountOption::Subtype(name.into()),
            MountOption::DefaultPermissions,
            MountOption::RW,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::NoExec,
        ];
        // Without allow_other the kernel admits only the mounting user's processes (root
        // for a loop device), and the loop driver's I/O, done by kernel workers with root
        // credentials, passes that check too.
        config.acl = SessionACL::Owner;
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        fuser::spawn_mount(OneFileFs { backend, len, uid, gid }, dir, &config)
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            ROOT => (FileType::Directory, 0o755, 0, 2),
            DISK => (FileType::RegularFile, 0o644, self.len, 1),
            SIDE if B::SIDE_FILE.is_some() => (FileType::RegularFile, 0o444, 4096, 1),
            _ => return None,
        };
        let t = SystemTime::UNIX_EPOCH;
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

impl<B: Backend> Filesystem for OneFileFs<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.backend.init(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = match name.to_str() {
            Some(DISK_NAME) => DISK,
            Some(n) if Some(n) == B::SIDE_FILE => SIDE,
            _ => INodeNo(0),
        };
        match self.attr(ino) {
            Some(a) if parent == ROOT => reply.entry(&TTL, &a, Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Mode, owner and time changes are accepted and forgotten; the size is fixed.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.attr(ino) {
            Some(a) if size.is_none_or(|s| s == a.size) => reply.attr(&TTL, &a),
            Some(_) => reply.error(Errno::EPERM),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.attr(ino).is_some_and(|a| a.kind == FileType::RegularFile) {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino == SIDE && B::SIDE_FILE.is_some() {
            let v = self.backend.side_file();
            let from = (offset as usize).min(v.len());
            return reply.data(&v[from..(from + size as usize).min(v.len())]);
        }
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        let end = offset.saturating_add(u64::from(size)).min(self.len);
        if offset >= end {
            return reply.data(&[]);
        }
        self.backend.read(offset, end, reply);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        if offset.saturating_add(data.len() as u64) > self.len {
            return reply.error(Errno::ENOSPC);
        }
        if data.is_empty() {
            return reply.written(0);
        }
        self.backend.write(offset, data, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        let end = offset.saturating_add(length).min(self.len);
        let r = match crate::sys::extents::fallocate_mode(mode) {
            // Allocation: every byte of the file exists already.
            Fallocate::Allocate => Ok(()),
            Fallocate::Discard if offset < end => self.backend.trim(offset, end),
            Fallocate::Discard => Ok(()),
            Fallocate::Other => return reply.error(Errno::EOPNOTSUPP),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.into()),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.backend.fsync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.into()),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries = vec![
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, DISK_NAME),
        ];
        entries.extend(B::SIDE_FILE.map(|name| (SIDE, FileType::RegularFile, name)));
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
