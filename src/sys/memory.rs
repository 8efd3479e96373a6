//! Memory: transfer buffers aligned for direct I/O (whole huge pages where they can be had),
//! and locking memory so a freeze window never waits on a page fault.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use nix::errno::Errno;
use nix::libc;

const PAGE: usize = 4096;

/// A buffer whose address is aligned for O_DIRECT.
///
/// We never fall back to buffered I/O when an aligned transfer is refused (unlike
/// uutils `dd`): the buffer is aligned from the start, and an `EINVAL` is an error.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Where an [`AlignedBuf`]'s memory comes from.
enum Backing {
    Heap(Layout),
    /// An anonymous mapping of exactly the buffer's length (whole huge pages).
    Mapped,
}

/// A transparent huge page on x86-64 and arm64 with 4 KiB base pages. Elsewhere (64 KiB
/// base pages) such buffers are still correct, only without huge pages.
const HUGE_PAGE: usize = 2 << 20;

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); nothing is shared.
unsafe impl Send for AlignedBuf {}
// SAFETY: &AlignedBuf only gives &[u8]; no interior mutability.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two), and at least to
    /// a page: a buffer that is only sector-aligned straddles one more page than its
    /// length needs, so a 1 MiB direct read needs 257 segments, one more than many
    /// queues take, and the block layer splits it.
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        assert!(len > 0, "empty aligned buffer");
        let layout = Layout::from_size_align(len, align.max(PAGE)).expect("alignment is a power of two");
        // SAFETY: layout has a non-zero size (asserted above).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, backing: Backing::Heap(layout) }
    }

    /// A zeroed buffer for the rewrite's own transfers: from 2 MiB on, on transparent
    /// huge pages where the kernel has them (`madvise`, the default policy, gives them
    /// only to memory that asks). A direct transfer takes one segment per physically
    /// contiguous run of its buffer: on 4 KiB pages a request holds at most
    /// `max_segments` pages (254 on a virtio disk: 1 MiB), on huge pages up to
    /// `max_sectors_kb` (4 MiB there), and 64 MiB reads and writes in place on that disk
    /// took 0.4-0.6 s a GiB against 0.8-1.5 s. Every page is touched here, so the
    /// faults (and any compaction they wait for) happen now, never inside a window:
    /// make these before a window starts. Without huge pages these are the faults
    /// [`AlignedBuf::new`] takes, made earlier. Only whole huge pages: another length
    /// would map more than the plan's memory figure counts.
    pub(crate) fn for_transfers(len: usize, align: usize) -> AlignedBuf {
        if len == 0 || !len.is_multiple_of(HUGE_PAGE) || !align.is_power_of_two() || align > HUGE_PAGE {
            return AlignedBuf::new(len, align);
        }
        match map_huge(len) {
            Some(ptr) => AlignedBuf { ptr, len, backing: Backing::Mapped },
            None => AlignedBuf::new(len, align),
        }
    }
}

/// `len` bytes (whole huge pages) of anonymous memory at a huge page's address, advised
/// to be huge pages and not to be copied into a forked child, every page touched. None
/// if the kernel refuses the mapping.
fn map_huge(len: usize) -> Option<NonNull<u8>> {
    use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap_anonymous, munmap};
    let over = len.checked_add(HUGE_PAGE)?;
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks aliases
    // nothing; `over` is non-zero.
    let raw = unsafe { mmap_anonymous(None, std::num::NonZeroUsize::new(over)?, prot, MapFlags::MAP_PRIVATE) }.ok()?;
    let base = raw.as_ptr() as usize;
    let start = base.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - base, base + over - (start + len));
    // SAFETY: [base, base + over) is the mapping just made: the head before `start` and
    // the tail after `start + len` are parts of it no one else has seen.
    // A failure there leaves those bytes mapped, unused: wasted, not wrong.
    unsafe {
        if head > 0 {
            let _ = munmap(raw, head);
        }
        if let Some(after) = NonNull::new((start + len) as *mut libc::c_void).filter(|_| tail > 0) {
            let _ = munmap(after, tail);
        }
    }
    let ptr = NonNull::new(start as *mut u8)?;
    // SAFETY: [start, start + len) is mapped and ours. Without THP in the kernel the
    // advice fails (EINVAL) and the pages are small: still correct.
    let _ = unsafe { madvise(ptr.cast(), len, MmapAdvise::MADV_HUGEPAGE) };
    // A child forked while these exist (the guardian is forked before them) never uses
    // them: shared copy-on-write, the parent's next read into one would copy it, page by
    // page, inside a window.
    // SAFETY: as above; only this process's own use of the range follows.
    let _ = unsafe { madvise(ptr.cast(), len, MmapAdvise::MADV_DONTFORK) };
    for page in (0..len).step_by(PAGE) {
        // SAFETY: inside the mapping; writing the zero it holds faults the page in.
        unsafe { std::ptr::write_volatile(ptr.as_ptr().add(page), 0) };
    }
    Some(ptr)
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of at least len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `new` with exactly this layout, freed once.
            Backing::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: mapped in `map_huge` with exactly this length, unmapped once.
            Backing::Mapped => {
                let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len) };
            }
        }
    }
}

/// mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT): every page the process has touched
/// stays in memory, and so does every page it touches later, without faulting in the
/// rest of a copied address space (a forked guardian would otherwise duplicate reseq's
/// untouched heap). EPERM/ENOMEM without CAP_IPC_LOCK beyond RLIMIT_MEMLOCK.
pub(crate) fn lock_touched_memory() -> nix::Result<()> {
    // SAFETY: mlockall(2) takes flags and touches no memory of ours.
    let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    Errno::result(rc).map(drop)
}

/// mlock(2) of `len` bytes at `addr`, faulting them in: for the executable's own code,
/// so that a deadline path never waits for a page of it to be read from disk.
pub(crate) fn lock_range(addr: usize, len: usize) -> nix::Result<()> {
    // SAFETY: mlock(2) only changes the residency of the pages of [addr, addr+len); an
    // unmapped range gives ENOMEM, it reads and writes no memory of ours.
    let rc = unsafe { libc::mlock(addr as *const libc::c_void, len) };
    Errno::result(rc).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transfer buffer of whole huge pages is mapped at a huge page's address, zeroed
    /// and writable to its last byte, and unmapped when dropped (the address range is
    /// free again); another length, or a larger alignment, comes from the heap.
    #[test]
    fn transfer_buffers_are_whole_huge_pages_or_from_the_heap() {
        for len in [HUGE_PAGE, 3 * HUGE_PAGE, 32 * HUGE_PAGE] {
            let mut b = AlignedBuf::for_transfers(len, 4096);
            assert!(matches!(b.backing, Backing::Mapped), "{len}");
            assert_eq!((b.len(), b.as_ptr() as usize % HUGE_PAGE), (len, 0));
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            b[0] = 9;
            assert_eq!((b[0], b[len - 1]), (9, 7));
        }
        // Dropped, each is unmapped: 2 GiB made and dropped leave the resident set as it
        // was (less than 1 GiB of growth, whatever the tests beside this one allocate).
        let rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
            line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
        };
        let before = rss();
        for _ in 0..32 {
            drop(AlignedBuf::for_transfers(32 * HUGE_PAGE, 4096));
        }
        assert!(rss() < before + (1 << 30), "{} bytes resident after, {before} before", rss());
        for (len, align) in [(HUGE_PAGE + 4096, 4096), (4096, 4096), (4 * HUGE_PAGE, 2 * HUGE_PAGE)] {
            let b = AlignedBuf::for_transfers(len, align);
            assert!(matches!(b.backing, Backing::Heap(_)), "{len} aligned to {align}");
            assert_eq!((b.len(), b.as_ptr() as usize % align), (len, 0));
        }
    }
}
