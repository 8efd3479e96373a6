//! Where the guardian lives: outside reseq's cgroup, so that what a service manager aims
//! at reseq's whole unit (systemd's `KillMode=control-group`, `systemctl kill`,
//! `systemctl freeze`, an OOM kill of the unit with `memory.oom.group`, `docker pause`, a
//! container's kill) does not reach the process that must thaw.
//!
//! [`plan`] reads the host and decides, changing nothing (the dry run prints it);
//! [`Placement::apply`] moves the guardian right after it is forked, before the first
//! freeze, and checks in `/proc/PID/cgroup` that it moved. The guardian removes its own
//! group when it leaves ([`leave_own_group`]), after its last thaw.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::host::mounts::MountEntry;

/// The name of a guardian's own group at the root of the v2 hierarchy (PID appended).
const GROUP_PREFIX: &str = "reseq-guardian.";

/// How the guardian leaves reseq's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum How {
    /// systemd is PID 1: a transient scope of its own (`reseq-guardian-PID.scope`),
    /// asked of systemd over D-Bus as `systemd-run --scope` does, so that systemd accounts
    /// for it and stops nothing it should not; a group of its own if systemd says no.
    Scope,
    /// A group of its own at the root of the cgroup v2 hierarchy.
    Group,
    /// It cannot leave (why); `accepted`: `--accept-cgroup-risk` was given.
    Stays { why: String, accepted: bool },
}

/// Where the guardian will live, decided before anything is frozen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) how: How,
    /// reseq's own cgroup v2 group (as `/proc/self/cgroup` names it).
    pub(crate) caller: String,
    /// The cgroup v2 hierarchy's mount point (None: no v2 hierarchy).
    hierarchy: Option<PathBuf>,
    /// The cgroup v1 hierarchies (freezer; cpu, whose real-time budget a new group lacks)
    /// where reseq is in a group other than the root: the guardian goes to their roots.
    v1_roots: Vec<PathBuf>,
}

/// What the host shows about cgroups, read once (see [`Host::read`]).
#[derive(Debug, Clone, Default)]
struct Host {
    /// `/proc/self/cgroup`.
    self_cgroup: String,
    /// The inode of `/proc/self/ns/cgroup`.
    namespace: Option<u64>,
    /// The inode of `/proc/self/ns/pid`.
    pid_namespace: Option<u64>,
    mounts: Vec<MountEntry>,
    /// PID 1 is systemd, and busctl is there to ask it for a scope.
    systemd: bool,
    /// The v2 hierarchy's mount point is writable by us.
    v2_writable: bool,
    /// The v1 hierarchies to leave (see [`Placement`]) are writable by us.
    v1_writable: bool,
}

impl Host {
    fn read() -> Host {
        use std::os::unix::fs::MetadataExt;
        let mounts = crate::host::mounts::read_mounts().unwrap_or_default();
        let writable = |m: Option<&MountEntry>| {
            m.is_some_and(|m| {
                !m.read_only && nix::unistd::access(&m.mount_point, nix::unistd::AccessFlags::W_OK).is_ok()
            })
        };
        let self_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let v1 = v1_to_leave(&mounts, &self_cgroup);
        Host {
            v1_writable: v1.iter().all(|m| writable(Some(m))),
            self_cgroup,
            namespace: std::fs::metadata("/proc/self/ns/cgroup").ok().map(|m| m.ino()),
            pid_namespace: std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()),
            systemd: crate::host::procs::comm(1) == "systemd"
                && Path::new("/run/systemd/system").is_dir()
                && crate::support::tool::find("busctl").is_some(),
            v2_writable: writable(v2_mount(&mounts)),
            mounts,
        }
    }
}

fn v2_mount(mounts: &[MountEntry]) -> Option<&MountEntry> {
    mounts.iter().find(|m| m.fs_type == "cgroup2")
}

/// The v1 controllers whose groups the guardian leaves: a freeze of reseq's group would
/// stop it, and a new cpu group has no real-time budget (`cpu.rt_runtime_us` 0).
const V1_LEFT: [&str; 2] = ["freezer", "cpu"];

fn v1_mount<'a>(mounts: &'a [MountEntry], controller: &str) -> Option<&'a MountEntry> {
    mounts.iter().find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == controller))
}

/// The v1 hierarchies of [`V1_LEFT`] where `self_cgroup` names a group other than the root.
fn v1_to_leave<'a>(mounts: &'a [MountEntry], self_cgroup: &str) -> Vec<&'a MountEntry> {
    let mut out: Vec<&MountEntry> = Vec::new();
    for c in V1_LEFT {
        if let (Some(m), Some(g)) = (v1_mount(mounts, c), v1_group(self_cgroup, c))
            && g != "/"
            && !out.iter().any(|o| o.mount_point == m.mount_point)
        {
            out.push(m);
        }
    }
    out
}

/// The group of `/proc/PID/cgroup` text in the v2 hierarchy (`0::PATH`).
fn v2_group(self_cgroup: &str) -> Option<String> {
    self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

/// The group in the v1 hierarchy that has `controller` (`N:cpu,cpuacct:PATH`).
fn v1_group(self_cgroup: &str, controller: &str) -> Option<String> {
    self_cgroup.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers.split(',').any(|c| c == controller).then(|| path.to_string())
    })
}

/// Reads the host and decides where the guardian goes. Changes nothing.
pub(crate) fn plan(accept_risk: bool) -> Placement {
    decide(&Host::read(), accept_risk)
}

/// [`plan`], refused where the guardian cannot leave and the risk was not accepted.
pub(crate) fn plan_or_refuse(accept_risk: bool) -> crate::support::error::Result<Placement> {
    let p = plan(accept_risk);
    match &p.how {
        How::Stays { why, accepted: false } => Err(refusal(why)),
        _ => Ok(p),
    }
}

/// The refusal when the guardian cannot leave reseq's cgroup.
pub(crate) fn refusal(why: &str) -> crate::support::error::Error {
    crate::support::error::Error::refused(
        format!("the freeze guardian cannot leave reseq's cgroup: {why}"),
        format!(
            "run reseq where it can (on the host, or a pod in the host's cgroup namespace: see docs/OPERATIONS.md), or accept the risk with --accept-cgroup-risk. {RISK}"
        ),
    )
}

fn decide(host: &Host, accepted: bool) -> Placement {
    let caller = v2_group(&host.self_cgroup);
    let v2 = v2_mount(&host.mounts);
    let v1 = v1_to_leave(&host.mounts, &host.self_cgroup);
    let stays = |why: String| How::Stays { why, accepted };
    let how = if host.namespace.is_some_and(|ino| ino != crate::sys::process::CGROUP_NS_INIT_INO) {
        stays("reseq runs in a cgroup namespace of its own (a container): the groups above its own are out of its sight and reach".into())
    } else if host.pid_namespace.is_some_and(|ino| ino != crate::sys::process::PID_NS_INIT_INO) {
        stays("reseq runs in a PID namespace of its own (a container): when the namespace's first process dies, the kernel kills every process in it, the guardian too".into())
    } else if v2.is_none() || caller.is_none() {
        stays("this host has no cgroup v2 hierarchy mounted (cgroup v1 only), where a group of the guardian's own can be made".into())
    } else if let Some(m) = v2.filter(|m| m.root != "/") {
        stays(format!(
            "the cgroup v2 hierarchy at {} shows only the group {}, not its root",
            m.mount_point.display(),
            m.root
        ))
    } else if let Some(m) = v1.first().filter(|_| !host.v1_writable) {
        stays(format!(
            "reseq is in a group of the cgroup v1 hierarchy at {}, which is read-only here",
            m.mount_point.display()
        ))
    } else if host.systemd {
        How::Scope
    } else if host.v2_writable {
        How::Group
    } else {
        let m = v2.map_or(PathBuf::new(), |m| m.mount_point.clone());
        stays(format!(
            "the cgroup v2 hierarchy at {} is read-only here (mounted ro, or systemd's ProtectControlGroups=)",
            m.display()
        ))
    };
    Placement {
        how,
        caller: caller.unwrap_or_default(),
        hierarchy: v2.map(|m| m.mount_point.clone()),
        v1_roots: v1.iter().map(|m| m.mount_point.clone()).collect(),
    }
}

impl Placement {
    /// Whether the guardian stays in reseq's group.
    pub(crate) fn stays(&self) -> bool {
        matches!(self.how, How::Stays { .. })
    }

    /// One line for the dry run and the log.
    pub(crate) fn describe(&self) -> String {
        match &self.how {
            How::Scope => format!(
                "the guardian leaves reseq's cgroup ({}) for a systemd scope of its own (reseq-guardian-PID.scope): a kill, freeze or OOM kill of reseq's unit does not reach it",
                self.caller
            ),
            How::Group => format!(
                "the guardian leaves reseq's cgroup ({}) for a group of its own ({}/{GROUP_PREFIX}PID{}): a kill, freeze or OOM kill of reseq's group does not reach it",
                self.caller,
                self.hierarchy.as_deref().unwrap_or(Path::new("")).display(),
                if self.v1_roots.is_empty() {
                    String::new()
                } else {
                    format!(", and the roots of {}", self.v1_names())
                }
            ),
            How::Stays { why, .. } => format!(
                "the guardian stays in reseq's cgroup ({}): {why}. {}",
                if self.caller.is_empty() { "unknown" } else { &self.caller },
                RISK
            ),
        }
    }

    /// Moves the guardian (`pid`) where the plan says, and checks that it is there.
    /// Returns where it went.
    pub(crate) fn apply(&self, pid: i32) -> Result<String, String> {
        let went = match &self.how {
            How::Stays { accepted: true, .. } => return Ok(self.describe()),
            How::Stays { why, .. } => return Err(why.clone()),
            How::Scope => match self.to_own_scope(pid) {
                Ok(went) => went,
                Err(e) => {
                    log::warn!(
                        "systemd gave the guardian no scope of its own ({e}); it gets a group of its own instead"
                    );
                    self.to_own_group(pid)?
                }
            },
            How::Group => self.to_own_group(pid)?,
        };
        for root in &self.v1_roots {
            write_pid(&root.join("cgroup.procs"), pid)
                .map_err(|e| format!("moving the guardian to the root of {}: {e}", root.display()))?;
        }
        Ok(went)
    }

    fn v1_names(&self) -> String {
        self.v1_roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    fn to_own_group(&self, pid: i32) -> Result<String, String> {
        let root = self.hierarchy.as_deref().ok_or("no cgroup v2 hierarchy")?;
        sweep_stale_groups(root);
        let name = format!("{GROUP_PREFIX}{pid}");
        let dir = root.join(&name);
        // A group of this name is a dead guardian's (the PID is ours now): reuse it.
        if let Err(e) = std::fs::create_dir(&dir)
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            return Err(format!("making the guardian's group {}: {e}", dir.display()));
        }
        if let Err(e) = write_pid(&dir.join("cgroup.procs"), pid) {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("moving the guardian into {}: {e}", dir.display()));
        }
        let want = format!("/{name}");
        wait_for_group(pid, |g| g == want, Duration::ZERO)?;
        Ok(format!("{} ({want})", dir.display()))
    }

    fn to_own_scope(&self, pid: i32) -> Result<String, String> {
        let unit = format!("reseq-guardian-{pid}.scope");
        crate::support::tool::Tool::new("busctl")
            .args(["call", "--timeout=5", "org.freedesktop.systemd1", "/org/freedesktop/systemd1"])
            .args(["org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))", &unit, "fail"])
            .args(["3", "PIDs", "au", "1", &pid.to_string()])
            .args(["Description", "s", "reseq freeze guardian: thaws what reseq froze, whatever happens to reseq"])
            .args(["CollectMode", "s", "inactive-or-failed", "0"])
            .run()
            .map_err(|e| e.to_string())?;
        // The scope's start job moves the process; the reply comes when it is queued.
        let suffix = format!("/{unit}");
        let group = wait_for_group(pid, |g| g.ends_with(&suffix), Duration::from_secs(5))?;
        Ok(format!("{unit} ({group})"))
    }
}

/// What a freeze held by a guardian that cannot leave depends on.
const RISK: &str = "A kill or freeze of reseq's whole unit or container mid-window would also reach the guardian, and the filesystem would stay frozen until `reseq thaw` runs (the shipped systemd unit's ExecStopPost= runs it; nothing does under cron or a container runtime)";

fn write_pid(procs: &Path, pid: i32) -> std::io::Result<()> {
    std::fs::write(procs, format!("{pid}\n"))
}

/// The v2 group of process `pid`.
fn group_of(pid: i32) -> Option<String> {
    v2_group(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

/// Waits up to `limit` for `pid`'s v2 group to satisfy `ok`; returns it.
fn wait_for_group(pid: i32, ok: impl Fn(&str) -> bool, limit: Duration) -> Result<String, String> {
    let give_up = Instant::now() + limit;
    loop {
        let group = group_of(pid).unwrap_or_default();
        if ok(&group) {
            return Ok(group);
        }
        if Instant::now() >= give_up {
            return Err(format!("the guardian is in {group:?}, not in a group of its own"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes the empty groups of guardians that are gone (killed before they could remove
/// theirs). A group named for a live guardian is never touched: it may be another run's,
/// just made and not yet entered.
fn sweep_stale_groups(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(GROUP_PREFIX).and_then(|p| p.parse::<i32>().ok()) else { continue };
        let populated = std::fs::read_to_string(e.path().join("cgroup.events"))
            .map_or(true, |t| t.lines().any(|l| l == "populated 1"));
        let live = crate::host::procs::stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X');
        let guardian = live && crate::host::procs::comm(pid) == "freeze-guardian";
        if !populated && !guardian {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// In the guardian, after it killed reseq: a reseq frozen by a cgroup v1 freezer does not
/// die of SIGKILL until its group is thawed (a v2 freeze lets fatal signals through), and
/// the guardian waits for reseq's death before it thaws. Moving reseq to the freezer's
/// root thaws reseq alone (not the rest of its group), so the kill lands. Whether it
/// was moved.
pub(crate) fn release_from_v1_freeze(pid: i32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return false };
    let Some(group) = v1_group(&text, "freezer").filter(|g| g != "/") else { return false };
    let mounts = crate::host::mounts::read_mounts().unwrap_or_default();
    let Some(m) = v1_mount(&mounts, "freezer") else { return false };
    let state = std::fs::read_to_string(m.mount_point.join(group.trim_start_matches('/')).join("freezer.state"));
    state.is_ok_and(|s| s.trim() != "THAWED") && write_pid(&m.mount_point.join("cgroup.procs"), pid).is_ok()
}

/// In the guardian, after its last thaw: back to the hierarchy's root, and its own group
/// removed (a group cannot be removed while a process is in it). A systemd scope goes by
/// itself once empty.
pub(crate) fn leave_own_group() {
    let pid = std::process::id() as i32;
    let Some(group) = group_of(pid) else { return };
    if group != format!("/{GROUP_PREFIX}{pid}") {
        return;
    }
    let mounts = crate::host::mounts::read_mounts().unwrap_or_default();
    let Some(root) = v2_mount(&mounts).map(|m| m.mount_point.clone()) else { return };
    if write_pid(&root.join("cgroup.procs"), pid).is_ok() {
        let _ = std::fs::remove_dir(root.join(&group[1..]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(point: &str, fs: &str, root: &str, opts: &str, ro: bool) -> MountEntry {
        let line = format!("30 1 0:30 {root} {point} {} shared:1 - {fs} {fs} {opts}", if ro { "ro" } else { "rw" });
        crate::host::mounts::parse_mountinfo(&line).remove(0)
    }

    fn host(cgroup: &str, mounts: Vec<MountEntry>) -> Host {
        Host {
            self_cgroup: cgroup.into(),
            namespace: Some(crate::sys::process::CGROUP_NS_INIT_INO),
            pid_namespace: Some(crate::sys::process::PID_NS_INIT_INO),
            mounts,
            systemd: false,
            v2_writable: true,
            v1_writable: true,
        }
    }

    fn unified() -> MountEntry {
        mount("/sys/fs/cgroup", "cgroup2", "/", "rw,nsdelegate", false)
    }

    #[test]
    fn a_plain_v2_host_gives_the_guardian_a_group_of_its_own() {
        let p = decide(&host("0::/jobs/reseq\n", vec![unified()]), false);
        assert_eq!((p.how.clone(), p.caller.as_str()), (How::Group, "/jobs/reseq"));
        assert!(p.describe().contains("/sys/fs/cgroup/reseq-guardian.PID"), "{}", p.describe());
    }

    #[test]
    fn under_systemd_a_scope_is_asked_for() {
        let mut h = host("0::/system.slice/reseq@pg.service\n", vec![unified()]);
        h.systemd = true;
        h.v2_writable = false;
        assert_eq!(decide(&h, false).how, How::Scope, "systemd moves it: a read-only cgroupfs does not matter");
    }

    #[test]
    fn where_it_cannot_leave_it_stays_and_says_why() {
        let cases = [
            (Some(0xF000_0000), vec![unified()], true, "cgroup namespace"),
            (None, vec![mount("/sys/fs/cgroup/freezer", "cgroup", "/", "rw,freezer", false)], true, "cgroup v1 only"),
            (None, vec![mount("/sys/fs/cgroup", "cgroup2", "/kubepods/pod1", "rw", false)], true, "not its root"),
            (None, vec![unified()], false, "read-only"),
        ];
        for (ns, mounts, writable, why) in cases {
            let mut h = host("0::/jobs/reseq\n", mounts);
            h.namespace = ns.or(h.namespace);
            h.v2_writable = writable;
            let p = decide(&h, false);
            assert!(matches!(&p.how, How::Stays { why: w, accepted: false } if w.contains(why)), "{why}: {:?}", p.how);
            assert!(p.describe().contains("reseq thaw"), "the dry run says what then ends a stuck freeze");
            assert!(matches!(decide(&h, true).how, How::Stays { accepted: true, .. }));
        }
    }

    #[test]
    fn v1_freezer_and_cpu_groups_are_left_too() {
        let freezer = mount("/sys/fs/cgroup/freezer", "cgroup", "/", "rw,freezer", false);
        let cpu = mount("/sys/fs/cgroup/cpu,cpuacct", "cgroup", "/", "rw,cpu,cpuacct", false);
        let mounts = vec![unified(), freezer.clone(), cpu.clone()];
        let p = decide(&host("6:freezer:/pod1\n3:cpu,cpuacct:/pod1\n0::/\n", mounts.clone()), false);
        let want: Vec<PathBuf> = vec!["/sys/fs/cgroup/freezer".into(), "/sys/fs/cgroup/cpu,cpuacct".into()];
        assert_eq!((p.how.clone(), p.v1_roots.clone()), (How::Group, want));
        let at_root = decide(&host("6:freezer:/\n3:cpu,cpuacct:/\n0::/\n", mounts), false);
        assert!(at_root.v1_roots.is_empty(), "nothing to leave at the roots");
    }

    #[test]
    fn a_pid_namespace_of_its_own_keeps_the_guardian_in_reach() {
        let mut h = host("0::/\n", vec![unified()]);
        h.pid_namespace = Some(0xF000_0001);
        assert!(matches!(decide(&h, false).how, How::Stays { why, .. } if why.contains("PID namespace")));
    }

    #[test]
    fn groups_are_read_from_proc_self_cgroup() {
        let text = "12:freezer:/a\n4:memory:/m\n3:cpu,cpuacct:/c\n1:name=systemd:/s\n0::/x/y\n";
        assert_eq!(v2_group(text), Some("/x/y".into()));
        assert_eq!((v1_group(text, "freezer"), v1_group(text, "cpu")), (Some("/a".into()), Some("/c".into())));
    }
}
