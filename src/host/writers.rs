//! Other writers of the target: processes that hold it (or a partition of it, or the
//! disk it is part of, or another name of the same bytes) open for writing or mapped
//! writable, loop devices backed by it or by the same file, and filesystems mounted from
//! another name of its bytes.
//!
//! Why: a freeze stops the filesystem's writes, and O_EXCL stops other exclusive
//! openers, but neither stops a process that opened the block device itself: a VM on a
//! raw partition, a database on a raw device, `dd`, or a loop device stacked on the
//! target with a filesystem mounted from it (which shows in no `holders/`). Nor do they
//! stop a write that reaches the same bytes under another name ([`crate::host::aliases`]:
//! a second loop over the target's backing file, a process writing that file). Their
//! writes race reseq's rewrite of the same bytes, and one of them loses. Nothing in the
//! kernel excludes them, so reseq looks (`/proc/*/fd`, `/proc/*/fdinfo`, `/proc/*/maps`,
//! loop devices' status, mountinfo, sysfs) and refuses when it finds one: before the
//! first write, and again before each window.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::host::aliases::{self, FileId, Reach};
use crate::host::device::Sysfs;
use crate::host::{mounts, procs};
use crate::support::error::{Error, Result};

/// A process or device that may write the target behind reseq's back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Writer {
    /// None for a loop device (the kernel writes, for whoever uses it).
    pub(crate) pid: Option<i32>,
    /// The process's command line, or the loop device's name.
    pub(crate) what: String,
    /// How it holds the target: "fd 5 (O_RDWR) on /dev/loop6", "loop7 is backed by it"...
    pub(crate) how: String,
    /// What to do about it, when not "stop the process".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fix: Option<String>,
    /// What it reaches ("dev 7:3", "file 254:0:1234", "hidden io_uring"): with `pid`, what
    /// tells one finding from another across looks (an fd number or a command line may
    /// change from one look to the next; the process and what it writes do not).
    #[serde(skip)]
    pub(crate) reaches: String,
    /// It holds a backing file: never taken for a passing probe.
    #[serde(skip)]
    pub(crate) backing: bool,
}

/// One way a process holds the target: the phrase, what it reaches, whether a backing file.
struct Hold {
    how: String,
    reaches: String,
    backing: bool,
}

/// What [`reaches`] needs of a file's stat: the block device it is, if one, and the file.
struct Ident {
    block: Option<(u32, u32)>,
    file: FileId,
}

impl Ident {
    fn of(md: &std::fs::Metadata) -> Ident {
        let block = md.file_type().is_block_device().then(|| crate::host::devnum::dev_num(md.rdev()));
        Ident { block, file: FileId::of(md) }
    }

    fn of_stat(st: &nix::sys::stat::FileStat) -> Ident {
        let block =
            (st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFBLK).then(|| crate::host::devnum::dev_num(st.st_rdev));
        Ident { block, file: FileId { dev: crate::host::devnum::dev_num(st.st_dev), ino: st.st_ino } }
    }
}

/// The access mode of an open file from its fdinfo ("flags: 0100002", octal).
fn opened_for_writing(fdinfo: &str) -> bool {
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .unwrap_or(0);
    flags & 0o3 != 0 // O_WRONLY or O_RDWR
}

/// The files registered with an io_uring instance (`UserFiles:` in its fdinfo, one
/// "  N: /path" line each, fs/io_uring/fdinfo.c). They stay usable after their fds are
/// closed, and the kernel does not say how each was opened.
fn io_uring_files(fdinfo: &str) -> Vec<String> {
    let mut lines = fdinfo.lines().skip_while(|l| !l.starts_with("UserFiles:")).skip(1);
    let mut names = Vec::new();
    while let Some((n, name)) = lines.next().and_then(|l| l.split_once(':')) {
        if n.trim().parse::<u32>().is_err() {
            break;
        }
        names.push(name.trim().to_string());
    }
    names
}

/// Every process other than reseq and its guardians holding one of the devices or files
/// of `r` for writing.
fn processes(r: &Reach, out: &mut Vec<Writer>) {
    let me = std::process::id() as i32;
    let devs = r.devices();
    for pid in procs::pids().into_iter().filter(|&p| p != me) {
        let how = holds_for_writing(pid, r, &devs);
        // Our guardians are forked from us, so they hold copies of our fds.
        if !how.is_empty() && procs::stat(pid).is_none_or(|s| s.ppid != me) {
            let what = procs::cmdline(pid);
            out.extend(how.into_iter().map(|h| Writer {
                pid: Some(pid),
                what: what.clone(),
                how: h.how,
                fix: None,
                reaches: h.reaches,
                backing: h.backing,
            }));
        }
    }
}

/// What an open file or mapping with this identity is to the target: one of its devices,
/// an alias of them, one of its backing files (the phrase, and the identity it reaches);
/// None if nothing.
fn reaches(r: &Reach, devs: &[(u32, u32)], id: Ident) -> Option<(String, Hold)> {
    if let Some(dev) = id.block {
        let what = match r.alias(dev) {
            Some(a) => format!(", which holds the same bytes (it {})", a.why),
            None => String::new(),
        };
        let hold = Hold { how: String::new(), reaches: format!("dev {}:{}", dev.0, dev.1), backing: false };
        return devs.contains(&dev).then_some((what, hold));
    }
    let id = id.file;
    r.file(id).map(|f| {
        let reaches = format!("file {}:{}:{}", id.dev.0, id.dev.1, id.ino);
        (format!(": {}", f.describe()), Hold { how: String::new(), reaches, backing: true })
    })
}

/// `hold` with its phrase.
fn hold(how: String, (_, h): (String, Hold)) -> Hold {
    Hold { how, ..h }
}

/// The tasks of `pid` whose file tables differ, each table once: the leader's, and a
/// thread's that called `unshare(CLONE_FILES)`; a zombie leader (its main thread called
/// `pthread_exit`) has none, and its threads show the table. Each with the thread id
/// to name in a message (None for the leader). Every task where kcmp cannot tell.
fn file_tables(pid: i32) -> Vec<(PathBuf, Option<i32>)> {
    let task = PathBuf::from(format!("/proc/{pid}/task"));
    let mut tids: Vec<i32> = std::fs::read_dir(&task)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    tids.sort_by_key(|&t| (t != pid, t));
    let mut seen: Vec<i32> = Vec::new();
    for tid in tids {
        if !seen.iter().any(|&s| crate::sys::process::same_file_table(s, tid) == Some(true)) {
            seen.push(tid);
        }
    }
    seen.into_iter().map(|t| (task.join(t.to_string()), (t != pid).then_some(t))).collect()
}

/// How process `pid` holds the target for writing: open fds and io_uring registered
/// files in each of its file tables, and shared writable mappings; each way once. An
/// io_uring mapped with no fd of it in any table is a writer that cannot be ruled out:
/// its registered files stay usable and no fdinfo lists them.
fn holds_for_writing(pid: i32, r: &Reach, devs: &[(u32, u32)]) -> Vec<Hold> {
    let mut how = Vec::new();
    let (mut ring_fds, mut ring_mapped) = (false, false);
    for (dir, tid) in file_tables(pid) {
        // A thread named: its own table, or the live table of a zombie leader.
        let of = tid.map(|t| format!(" of thread {t}")).unwrap_or_default();
        let (holds, rings) = table_holds(&dir, &of, r, devs);
        how.extend(holds);
        ring_fds |= rings;
        let maps = std::fs::read_to_string(dir.join("maps")).unwrap_or_default();
        ring_mapped |= maps.lines().any(|l| l.ends_with("anon_inode:[io_uring]"));
        how.extend(maps_hold(&dir, &maps, r, devs));
    }
    if ring_mapped && !ring_fds {
        how.push(Hold {
            how: "has an io_uring mapped whose fd it closed (a registered ring fd): the files registered with it cannot be listed, and any of them may be the target or its backing file".into(),
            reaches: "hidden io_uring".into(),
            backing: true,
        });
    }
    let mut seen = std::collections::HashSet::new();
    how.retain(|h| seen.insert(h.how.clone()));
    how
}

/// The fds of one file table (`dir` is a task's directory) that hold the target for
/// writing, and its io_uring instances' registered files that reach it; whether it holds
/// an io_uring fd at all.
fn table_holds(dir: &Path, of: &str, r: &Reach, devs: &[(u32, u32)]) -> (Vec<Hold>, bool) {
    let mut how = Vec::new();
    let mut rings = false;
    // A task whose fds are not ours to read refuses every link as it refused the stat:
    // once one is refused, the others with no stat are not tried.
    let mut refused = false;
    let fds = dir.join("fd");
    for fd in crate::sys::process::open_files(&fds).files {
        let name = &fd.name;
        let read_link = || std::fs::read_link(fds.join(name)).map(|l| l.display().to_string());
        let link = || read_link().unwrap_or_default();
        let info = || std::fs::read_to_string(dir.join("fdinfo").join(name)).unwrap_or_default();
        // Its link read only where its stat cannot tell: an io_uring is an anonymous inode.
        let anonymous = match fd.may_be_anonymous() && !(refused && fd.stat.is_none()) {
            false => String::new(),
            true => read_link().unwrap_or_else(|e| {
                refused |= fd.stat.is_none() && e.kind() == std::io::ErrorKind::PermissionDenied;
                String::new()
            }),
        };
        if anonymous == "anon_inode:[io_uring]" {
            rings = true;
            how.extend(io_uring_files(&info()).into_iter().filter_map(|f| {
                let found = std::fs::metadata(&f).ok().and_then(|m| reaches(r, devs, Ident::of(&m)))?;
                let phrase =
                    format!("has {f} registered with an io_uring (fd {name}{of}), usable for writing{}", found.0);
                Some(hold(phrase, found))
            }));
            continue;
        }
        let Some(found) = fd.stat.and_then(|st| reaches(r, devs, Ident::of_stat(&st))) else { continue };
        if opened_for_writing(&info()) {
            let phrase = format!("has {} open for writing (fd {name}{of}){}", link(), found.0);
            how.push(hold(phrase, found));
        }
    }
    (how, rings)
}

/// The first shared writable mapping of the target in a task's address space (`maps`,
/// read from its directory `dir`).
fn maps_hold(dir: &Path, maps: &str, r: &Reach, devs: &[(u32, u32)]) -> Option<Hold> {
    for line in maps.lines() {
        // address perms offset dev inode path; perms "rwxs" or "rwxp": most lines are
        // passed over at their perms, unsplit (a busy host's maps run to 100,000 lines).
        let Some((addr, rest)) = line.split_once(' ') else { continue };
        if !rest.get(..4).is_some_and(|p| p.as_bytes()[1] == b'w' && p.as_bytes()[3] == b's') {
            continue;
        }
        let Some(path) = rest.split_whitespace().nth(4).filter(|p| p.starts_with('/')) else { continue };
        // map_files/ names the mapped file itself (a path may be stale); the path is the
        // fallback where it cannot be read.
        let md = std::fs::metadata(dir.join("map_files").join(addr)).or_else(|_| std::fs::metadata(path));
        if let Some(found) = md.ok().and_then(|m| reaches(r, devs, Ident::of(&m))) {
            return Some(hold(format!("maps {path} writable{}", found.0), found));
        }
    }
    None
}

/// Why `/proc` may not show every process of the host, if it may not: reseq in a PID
/// namespace other than the initial one sees none of the processes outside it, and a
/// `/proc` mounted for another namespace shows that namespace's.
fn unseen_processes() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
    if ns.is_some_and(|ino| ino != crate::sys::process::PID_NS_INIT_INO) {
        return Some("it runs in a PID namespace of its own, and processes outside it are not in its /proc".into());
    }
    let me = std::fs::read_link("/proc/self").ok().and_then(|l| l.to_string_lossy().parse::<u32>().ok());
    (me != Some(std::process::id())).then(|| {
        "/proc is not this PID namespace's (/proc/self is not reseq): its processes are not the ones that run here"
            .into()
    })
}

/// Everything that may write `devs` besides reseq: processes writing them, an alias of
/// them or a backing file of theirs; loop devices over any of those; filesystems mounted
/// from an alias (see [`crate::host::aliases`]).
pub(crate) fn find(devs: &[(u32, u32)]) -> Vec<Writer> {
    let sysfs = Sysfs::default();
    let r = aliases::reach(devs, &sysfs);
    let mut out = Vec::new();
    processes(&r, &mut out);
    let mounts = mounts::read_mounts().unwrap_or_default();
    out.extend(aliases::in_use(&r, &mounts, &sysfs).into_iter().map(|u| Writer {
        pid: None,
        reaches: format!("alias {}", u.what),
        backing: false,
        what: u.what,
        how: u.how,
        fix: Some(u.fix),
    }));
    out
}

/// What is still there after a few looks 100 ms apart: tools that probe devices (a
/// `losetup --find` scanning for a free loop device, blkid) hold one for a moment, a
/// writer to fear holds it on. A finding lasts when the same process reaches the same
/// device or file again, by whatever fd or command line (a writer that reopens for each
/// write moves); one that holds a backing file for writing is never let go (no probe
/// opens an image for writing), nor a hidden io_uring.
pub(crate) fn find_lasting(devs: &[(u32, u32)]) -> Vec<Writer> {
    let mut found = find(devs);
    for _ in 0..3 {
        if found.iter().all(|w| w.backing) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let again = find(devs);
        found.retain(|w| w.backing || again.iter().any(|a| a.pid == w.pid && a.reaches == w.reaches));
    }
    found
}

/// The processes whose open files and mappings the kernel will not show reseq: ptrace
/// read access refused. Without CAP_SYS_PTRACE reseq may not read a process of another
/// user, one of root's with capabilities it lacks, nor a non-dumpable one (sshd, anything
/// after a setuid exec); with it, a security module's policy may still refuse, or reseq
/// runs in a user namespace of its own. Every scan passes their fd tables over, so a
/// writer among them is not refused. Zombies hold no files and are left out.
fn uninspected() -> Vec<i32> {
    let me = std::process::id() as i32;
    // The same check guards the link of a task's `cwd` as its fds' (`open_files`).
    let denied = |p: i32| {
        std::fs::read_link(format!("/proc/{p}/cwd")).is_err_and(|e| e.raw_os_error() == Some(nix::libc::EACCES))
    };
    // A stat that cannot be read is no reason to leave a process out, unless it is gone.
    let left_out = |p: i32| match procs::stat(p) {
        Some(s) => s.kernel_thread || s.ppid == me || (s.state == 'Z' && procs::threads(p).len() <= 1),
        None => !std::path::Path::new(&format!("/proc/{p}")).exists(),
    };
    procs::pids().into_iter().filter(|&p| p != me && denied(p) && !left_out(p)).collect()
}

/// PIDs, the first few with their names: "PID 1 (systemd), PID 412 (postgres) and 9 more".
fn some_pids(pids: &[i32]) -> String {
    // A name is whatever its process set (PR_SET_NAME): no control character gets out.
    let name = |p: i32| procs::comm(p).chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
    let shown: Vec<String> = pids.iter().take(3).map(|&p| format!("PID {p} ({})", name(p))).collect();
    match pids.len() {
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

/// `hidepid=` of the /proc reseq reads, where it hides the processes reseq may not
/// inspect (2 or `invisible`, 4 or `ptraceable`): those are then not even listed.
fn proc_hides_pids() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some("/proc") && l.contains(" - proc "))?;
    let opts = line.rsplit(' ').next()?;
    opts.split(',')
        .find(|o| matches!(*o, "hidepid=2" | "hidepid=invisible" | "hidepid=4" | "hidepid=ptraceable"))
        .map(String::from)
}

/// Whether reseq may look into every process of the host: refused, unless `force`, where
/// it lacks CAP_SYS_PTRACE and some processes are closed to it (see [`uninspected`]) or
/// /proc hides them (`hidepid=`): a restricted unit or container, mended by granting the
/// capability; with `force`, a warning. Where reseq has it and is still refused, nothing
/// it can be given mends that: the dry run's plan names them ([`describe_uninspected`]).
pub(crate) fn refuse_uninspected(force: bool) -> Result<Option<String>> {
    let ptrace = 1u64 << crate::sys::process::CAP_SYS_PTRACE;
    if crate::host::privileges::effective_caps().is_none_or(|c| c & ptrace != 0) {
        return Ok(None);
    }
    let pids = uninspected();
    let hidden = proc_hides_pids();
    if pids.is_empty() && hidden.is_none() {
        return Ok(None);
    }
    log::debug!("the kernel does not let reseq see the open files of PIDs {pids:?}");
    let mut parts = Vec::new();
    if !pids.is_empty() {
        let n = if pids.len() == 1 { "1 process".to_string() } else { format!("{} processes", pids.len()) };
        parts.push(format!("the kernel does not show it the open files and mappings of {n} ({})", some_pids(&pids)));
    }
    if let Some(h) = hidden {
        parts.push(format!("/proc is mounted {h}, so it does not even list those it may not inspect"));
    }
    let what = format!(
        "reseq lacks CAP_SYS_PTRACE: {}. A writer among them is not refused, and only the device's written-sectors counters and the watch on a loop device's backing file catch its writes, after them (exit 9)",
        parts.join("; ")
    );
    match force {
        true => Ok(Some(format!("{what}. Grant it CAP_SYS_PTRACE, as the shipped unit does"))),
        false => Err(Error::refused(
            what,
            "grant reseq CAP_SYS_PTRACE (the shipped unit does; in a container, add it to the capabilities), or pass --force to go on without looking into them",
        )),
    }
}

/// For the "Not seen" list of the dry run's "other writers" line: the processes whose
/// open files the kernel does not show reseq, if any.
pub(crate) fn describe_uninspected() -> String {
    let pids = uninspected();
    match pids.is_empty() {
        true => String::new(),
        false => format!("the open files of {}, which the kernel does not show reseq; ", some_pids(&pids)),
    }
}

/// Refuses when anything else may write `devs`; `target` names them in the message.
pub(crate) fn refuse_other_writers(target: &Path, devs: &[(u32, u32)]) -> Result<()> {
    if let Some(why) = unseen_processes() {
        return Err(Error::refused(
            format!("reseq cannot see every process that may write {}: {why}", target.display()),
            "run reseq in the host's PID namespace with the host's /proc (a container: hostPID: true; or nsenter --target 1 --pid --mount)",
        ));
    }
    let found = find_lasting(devs);
    let Some(first) = found.first() else { return Ok(()) };
    // Another reseq (its state directory may differ, so its lock may not be seen).
    if let Some(pid) = found.iter().filter_map(|w| w.pid).find(|&p| procs::comm(p) == "reseq") {
        return Err(Error::refused(
            format!("another reseq (PID {pid}) is working on {}", target.display()),
            "wait for it to finish, or stop it (it thaws and can be resumed); two runs on one device would freeze and write over each other",
        ));
    }
    let list: Vec<String> = found
        .iter()
        .map(|w| match w.pid {
            Some(pid) => format!("PID {pid} ({}) {}", w.what, w.how),
            None => format!("{} {}", w.what, w.how),
        })
        .collect();
    Err(Error::refused(
        format!(
            "another writer of {}: {}. Its writes bypass any freeze and would race the rewrite of the same bytes; one of them would be lost",
            target.display(),
            list.join("; ")
        ),
        match first.pid {
            Some(pid) => {
                format!("stop PID {pid} (and any other listed) or let it close the device, then run reseq again")
            }
            None => first.fix.clone().unwrap_or_else(|| format!("stop what uses {}, then run reseq again", first.what)),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_access_mode_and_io_uring_files_from_fdinfo() {
        assert!(opened_for_writing("pos:\t0\nflags:\t0100002\nmnt_id:\t24\n"));
        assert!(!opened_for_writing("pos:\t0\nflags:\t0100000\n"));
        let info =
            "pos:\t0\nflags:\t02\nSqMask:\t0x3\nUserFiles:\t2\n    0: /dev/loop6\n    1: /tmp/a b\nUserBufs:\t0\n";
        assert_eq!(io_uring_files(info), vec!["/dev/loop6".to_string(), "/tmp/a b".to_string()]);
        assert!(io_uring_files("pos:\t0\nUserFiles:\t0\nUserBufs:\t0\n").is_empty());
    }

    /// A task the kernel does not let us inspect is not stat'ed fd by fd: a thread of ours
    /// turned nobody (its own credentials: the raw syscall changes one thread's) looks at
    /// a child of root's, and is denied it whole; as root it sees its fds.
    #[test]
    fn a_task_we_may_not_inspect_is_denied_whole() {
        use crate::sys::process::open_files;
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let fds = PathBuf::from(format!("/proc/{0}/task/{0}/fd", child.id()));
        let as_root = open_files(&fds);
        let as_nobody = std::thread::scope(|s| {
            s.spawn(|| {
                crate::sys::process::thread_become(65534).unwrap();
                open_files(&fds)
            })
            .join()
            .unwrap()
        });
        child.kill().ok();
        child.wait().ok();
        // A thread's change of user made the process non-dumpable (its memory is shared):
        // dumpable again, as before, for the tests after this one.
        nix::sys::prctl::set_dumpable(true).unwrap();
        assert!(!as_root.denied && as_root.files.len() >= 3, "root sees sleep's stdin, stdout, stderr");
        assert!(as_nobody.denied && as_nobody.files.is_empty(), "nobody is denied root's process whole");
    }

    /// A thread that unshares its file table shows as a table of its own; the others
    /// (sharing the leader's) do not.
    #[test]
    fn a_thread_with_its_own_file_table_is_scanned() {
        let me = std::process::id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FILES).unwrap();
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let tables = file_tables(me);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(tables.first().map(|t| t.1), Some(None), "the leader's table first: {tables:?}");
        assert!(tables.iter().any(|t| t.1 == Some(tid)), "thread {tid}'s own table: {tables:?}");
        assert!(tables.len() <= 3, "threads sharing the leader's table are left out: {tables:?}");
    }
}
