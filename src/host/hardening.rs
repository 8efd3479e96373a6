//! What keeps the guardian on time when the host is not: real-time priority (a thaw
//! must not wait behind busy loops, even at nice -20), memory locked (no page of its
//! code or data read from disk, or reclaimed, on the way to a thaw), and no OOM kill
//! (an OOM kill of reseq's unit, or of the host, must not pick it).
//!
//! The guardian arranges this for itself right after the fork and tells reseq in its
//! first message, so that reseq can say, before the first freeze, what it could not get.

use std::time::Duration;

use nix::errno::Errno;

use crate::sys::{self, process::Scheduling};

/// The guardian's real-time priority: the highest. reseq's writer and verifier run one
/// below it while a window is open, so the guardian preempts them.
pub(crate) fn guardian_priority() -> i32 {
    sys::process::fifo_max_priority()
}

/// What the guardian could arrange for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hardening {
    /// SCHED_FIFO at this priority, or why not.
    pub(crate) realtime: Result<i32, Errno>,
    /// Memory locked (mlockall, and its own code faulted in), or why not.
    pub(crate) locked: Result<(), Errno>,
    /// oom_score_adj -1000 (never chosen by the OOM killer).
    pub(crate) oom_protected: bool,
}

impl Default for Hardening {
    fn default() -> Hardening {
        Hardening { realtime: Err(Errno::UnknownErrno), locked: Err(Errno::UnknownErrno), oom_protected: false }
    }
}

const RT_OK: u32 = 1;
const LOCK_OK: u32 = 2;
const OOM_OK: u32 = 4;

impl Hardening {
    /// In the guardian, before anything is frozen.
    pub(crate) fn get() -> Hardening {
        let priority = guardian_priority();
        let realtime = sys::process::set_scheduling_of(0, Scheduling::Fifo(priority)).map(|()| priority);
        let locked = sys::memory::lock_touched_memory().and_then(|()| lock_own_code());
        let oom_protected = std::fs::write("/proc/self/oom_score_adj", "-1000\n").is_ok();
        Hardening { realtime, locked, oom_protected }
    }

    /// Into a message's fields (flags in `a`; the two errnos in `b`).
    pub(crate) fn encode(&self, mut m: [u8; 16]) -> [u8; 16] {
        let mut flags = (self.realtime.unwrap_or(0) as u32) << 8;
        for (ok, bit) in [(self.realtime.is_ok(), RT_OK), (self.locked.is_ok(), LOCK_OK), (self.oom_protected, OOM_OK)]
        {
            flags |= u32::from(ok) * bit;
        }
        let errno = |r: Result<(), Errno>| r.err().map_or(0, |e| e as i32 as u32);
        let b = (u64::from(errno(self.realtime.map(drop))) << 32) | u64::from(errno(self.locked));
        m[4..8].copy_from_slice(&flags.to_le_bytes());
        m[8..16].copy_from_slice(&b.to_le_bytes());
        m
    }

    pub(crate) fn decode(a: u32, b: u64) -> Hardening {
        let errno = |e: u64| Errno::from_raw(e as i32);
        Hardening {
            realtime: if a & RT_OK != 0 { Ok((a >> 8 & 0xff) as i32) } else { Err(errno(b >> 32)) },
            locked: if a & LOCK_OK != 0 { Ok(()) } else { Err(errno(b & 0xffff_ffff)) },
            oom_protected: a & OOM_OK != 0,
        }
    }

    /// What is missing, in words (None: nothing).
    pub(crate) fn shortfall(&self) -> Option<String> {
        let mut missing = Vec::new();
        if let Err(e) = self.realtime {
            missing.push(format!(
                "real-time priority ({e}: no CAP_SYS_NICE, or RestrictRealtime=): a thaw can come late on a busy CPU"
            ));
        }
        if let Err(e) = self.locked {
            missing.push(format!("locked memory ({e}: no CAP_IPC_LOCK): a thaw can wait for paging"));
        }
        if !self.oom_protected {
            missing.push("OOM protection (no CAP_SYS_RESOURCE; the unit grants it)".to_string());
        }
        (!missing.is_empty()).then(|| format!("the freeze guardian runs without {}", missing.join("; without ")))
    }
}

/// What the guardian will get, for the dry run (nothing is changed: real-time priority
/// is tried on a thread that ends at once; the rest is read off the capabilities).
pub(crate) fn expected() -> String {
    let priority = guardian_priority();
    let rt = std::thread::spawn(move || sys::process::set_scheduling_of(0, Scheduling::Fifo(priority)))
        .join()
        .unwrap_or(Err(Errno::UnknownErrno));
    let caps = crate::host::privileges::effective_caps().unwrap_or(0);
    let has = |cap: u32| caps & (1 << cap) != 0;
    let h = Hardening {
        realtime: rt.map(|()| priority),
        locked: if has(sys::process::CAP_IPC_LOCK) { Ok(()) } else { Err(Errno::EPERM) },
        oom_protected: has(sys::process::CAP_SYS_RESOURCE),
    };
    match h.shortfall() {
        None => format!(
            "the guardian runs SCHED_FIFO {priority} with its memory locked and out of the OOM killer's reach; reseq's writer and verifier run SCHED_FIFO {} while frozen",
            priority - 1
        ),
        Some(s) => s,
    }
}

/// Threads at real-time priority that keep a CPU busy (over half of one, sampled over
/// `sample`), by process: they starve the kernel threads a freeze and a thaw wait for
/// (RCU, the journal, a loop device's workers), whatever reseq's priority. Measured: two
/// SCHED_FIFO 50 busy loops held freezes 12-15 s against a 1 s bound. Each thread is
/// sampled, not the process's first one alone (a busy thread beside an idle main thread
/// counts). Not counted: reseq's own threads and those of other reseq runs (the same
/// executable), which run real-time only inside their own windows, each ended by its
/// guardian: a second run on another device is not refused for the first's windows.
pub(crate) fn realtime_hogs(sample: Duration) -> Vec<(i32, String)> {
    use crate::host::procs;
    let me = std::process::id() as i32;
    let own = procs::exe_id(me);
    let rt_threads = || -> Vec<((i32, i32), u64)> {
        let mut found = Vec::new();
        for pid in procs::pids().into_iter().filter(|&p| p != me) {
            let rt: Vec<_> = procs::threads(pid)
                .into_iter()
                .filter_map(|tid| {
                    procs::thread_stat(pid, tid).filter(|t| t.realtime()).map(|t| ((pid, tid), t.cpu_ticks))
                })
                .collect();
            // The executable is looked at only where a thread is real-time.
            if !rt.is_empty() && (own.is_none() || procs::exe_id(pid) != own) {
                found.extend(rt);
            }
        }
        found
    };
    let before = rt_threads();
    if before.is_empty() {
        return Vec::new();
    }
    std::thread::sleep(sample);
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let busy = |t0: u64, t1: u64| t1.saturating_sub(t0) as f64 / ticks > sample.as_secs_f64() / 2.0;
    let mut hogs: Vec<i32> = before
        .into_iter()
        .filter(|&((pid, tid), t0)| procs::thread_stat(pid, tid).is_some_and(|t| t.realtime() && busy(t0, t.cpu_ticks)))
        .map(|((pid, _), _)| pid)
        .collect();
    hogs.dedup();
    hogs.into_iter().map(|p| (p, procs::cmdline(p))).collect()
}

/// Faults in and locks the executable's code, so that no deadline path waits for a page
/// of it to be read (the binary may even be on the filesystem being frozen).
fn lock_own_code() -> Result<(), Errno> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|_| Errno::ENOENT)?;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| Errno::EIO)?;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || std::path::Path::new(f[5]) != exe {
            continue;
        }
        let Some((lo, hi)) = f[0].split_once('-') else { continue };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else { continue };
        sys::memory::lock_range(lo, hi - lo)?;
    }
    Ok(())
}

/// How long reseq waits for the guardian's first message.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardening_survives_the_socket() {
        let all = Hardening { realtime: Ok(99), locked: Ok(()), oom_protected: true };
        let none = Hardening { realtime: Err(Errno::EPERM), locked: Err(Errno::ENOMEM), oom_protected: false };
        for h in [all, none] {
            let m = h.encode([0; 16]);
            let a = u32::from_le_bytes(m[4..8].try_into().unwrap());
            let b = u64::from_le_bytes(m[8..16].try_into().unwrap());
            assert_eq!(Hardening::decode(a, b), h);
        }
        assert_eq!(all.shortfall(), None);
        let text = none.shortfall().unwrap();
        assert!(text.contains("real-time priority (EPERM") && text.contains("locked memory (ENOMEM"), "{text}");
    }
}
