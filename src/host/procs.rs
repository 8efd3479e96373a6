//! Other processes, as `/proc` shows them: one parser for `/proc/PID/stat`, used by the
//! freeze records (is a guardian still alive?), the other-writers check and the warning
//! about other freezers.

/// What `/proc/PID/stat` says about a process (proc(5)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `D`, `T` (stopped), `Z` (zombie)...
    pub(crate) state: char,
    /// Field 4.
    pub(crate) ppid: i32,
    /// Field 22, in clock ticks since boot: tells a process from a later one that reused
    /// its PID.
    pub start_ticks: u64,
    /// Fields 14 and 15: CPU time used, in clock ticks.
    pub(crate) cpu_ticks: u64,
    /// Field 41: the scheduling policy (1 SCHED_FIFO, 2 SCHED_RR: real-time).
    pub(crate) policy: u32,
    /// Field 9 (flags) marks a kernel thread.
    pub(crate) kernel_thread: bool,
}

impl Stat {
    /// SCHED_FIFO or SCHED_RR, in a user task.
    pub(crate) fn realtime(&self) -> bool {
        (self.policy == 1 || self.policy == 2) && !self.kernel_thread
    }
}

pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// What `/proc/PID/task/TID/stat` says about one thread: its own policy and CPU time
/// (the process's file gives the policy of its first thread only).
pub(crate) fn thread_stat(pid: i32, tid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

/// The threads of process `pid`.
pub(crate) fn threads(pid: i32) -> Vec<i32> {
    numbered(&format!("/proc/{pid}/task"))
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_ticks: fields.get(22 - 3)?.parse().ok()?,
        cpu_ticks: fields.get(14 - 3)?.parse::<u64>().ok()? + fields.get(15 - 3)?.parse::<u64>().ok()?,
        policy: fields.get(41 - 3).and_then(|p| p.parse().ok()).unwrap_or(0),
        kernel_thread: fields
            .get(9 - 3)
            .and_then(|f| f.parse().ok())
            .is_some_and(crate::sys::process::is_kernel_thread),
    })
}

/// The process `pid` started at `start_ticks` is still there, and not a zombie (which can
/// no longer do anything). Its state, if so.
pub fn alive(pid: i32, start_ticks: u64) -> Option<char> {
    stat(pid).filter(|s| s.start_ticks == start_ticks && s.state != 'Z' && s.state != 'X').map(|s| s.state)
}

pub fn pids() -> Vec<i32> {
    numbered("/proc")
}

fn numbered(dir: &str) -> Vec<i32> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_string_lossy().parse().ok()).collect())
        .unwrap_or_default()
}

/// The executable of process `pid`, as (device, inode): tells another reseq from other
/// programs whatever its name or path.
pub(crate) fn exe_id(pid: i32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some((m.dev(), m.ino()))
}

/// The process name (`comm`).
pub(crate) fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

/// The most of a command line a message shows (a JVM's runs to thousands of characters).
const CMDLINE_SHOWN: usize = 80;

/// The command line, arguments joined by spaces on one line, its middle cut out past
/// [`CMDLINE_SHOWN`] characters (for messages: nothing compares it); the name when it has
/// none (a kernel thread, or a process that cleared it).
pub(crate) fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> =
        raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let line = if args.is_empty() { comm(pid) } else { args.join(" ") };
    // One line: a script given with -c holds newlines.
    let line: Vec<char> = line.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if line.len() <= CMDLINE_SHOWN {
        return line.into_iter().collect();
    }
    // The program and the last arguments, which tell processes apart.
    let (head, tail) = (CMDLINE_SHOWN * 5 / 8, CMDLINE_SHOWN * 3 / 8);
    let (a, b): (String, String) = (line[..head].iter().collect(), line[line.len() - tail..].iter().collect());
    format!("{} … {}", a.trim_end(), b.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert_eq!(s.ppid, nix::unistd::getppid().as_raw());
        // The state itself may change between the two reads (running, sleeping).
        assert!(alive(me, s.start_ticks).is_some());
        assert_eq!(alive(me, s.start_ticks + 1), None, "a reused PID is another process");
        assert!(pids().contains(&me));
        assert!(threads(me).contains(&me), "the first thread's id is the process's");
        assert_eq!(thread_stat(me, me).map(|t| t.start_ticks), Some(s.start_ticks));
        assert!(exe_id(me).is_some() && exe_id(me) == exe_id(me));
        assert!(!cmdline(me).is_empty());
        assert!(cmdline(me).chars().count() <= CMDLINE_SHOWN + 3, "{}", cmdline(me));
    }
}
