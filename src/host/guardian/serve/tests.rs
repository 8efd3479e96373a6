//! The guardian's decisions, without fork, root or FIFREEZE: its state machine over
//! scripted filesystems, fed the requests its socket would carry.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum By {
    Nobody,
    Us,
    Other,
}

/// Each filesystem: who froze it, its sentinel (bumped by every freeze, as ext4 and
/// xfs write their superblock), and whether the sentinel can be read.
#[derive(Clone, Copy, Debug)]
struct FakeFs {
    by: By,
    generation: u64,
    readable: bool,
    /// Its FIFREEZE does not return in time (it waits on another freeze).
    stuck: bool,
    /// Its FIFREEZE answers only after 100 ms (a busy host): a shorter wait gives up.
    slow: bool,
}

#[derive(Clone)]
struct Fake(Rc<RefCell<Vec<FakeFs>>>, Vec<String>);

impl Fake {
    fn new(n: usize) -> Fake {
        let fs = FakeFs { by: By::Nobody, generation: 0, readable: true, stuck: false, slow: false };
        Fake(Rc::new(RefCell::new(vec![fs; n])), (0..n).map(|i| format!("/mnt/{i}")).collect())
    }
    fn by(&self) -> Vec<By> {
        self.0.borrow().iter().map(|f| f.by).collect()
    }
    /// Someone thaws filesystem `i` (ours or not).
    fn thawed_by_someone(&self, i: usize) {
        self.0.borrow_mut()[i].by = By::Nobody;
    }
    /// Someone thaws filesystem `i` and freezes it again: their freeze now.
    fn refrozen_by_someone(&self, i: usize) {
        let mut fs = self.0.borrow_mut();
        fs[i].by = By::Other;
        fs[i].generation += 1;
    }
}

impl Filesystems for Fake {
    fn count(&self) -> usize {
        self.1.len()
    }
    fn fifreeze(&mut self, i: usize, limit: Duration) -> Result<(), Errno> {
        let mut fs = self.0.borrow_mut();
        if fs[i].stuck || (fs[i].slow && limit < Duration::from_millis(100)) {
            return Err(Errno::ETIMEDOUT);
        }
        if fs[i].by != By::Nobody {
            return Err(Errno::EBUSY);
        }
        fs[i].by = By::Us;
        fs[i].generation += 1;
        Ok(())
    }
    fn settle(&mut self, _limit: Duration) -> bool {
        !self.0.borrow().iter().any(|f| f.stuck)
    }
    fn fithaw(&mut self, i: usize) {
        let mut fs = self.0.borrow_mut();
        assert_ne!(fs[i].by, By::Other, "the guardian thawed a freeze that is not its own");
        fs[i].by = By::Nobody;
    }
    fn sentinel(&mut self, i: usize, _limit: Duration) -> Option<Vec<u8>> {
        let fs = self.0.borrow()[i];
        fs.readable.then(|| fs.generation.to_le_bytes().to_vec())
    }
    fn name(&self, i: usize) -> &str {
        &self.1[i]
    }
    fn recorded(&self, i: usize, _snapshot: Option<&Vec<u8>>) -> RecordedFs {
        RecordedFs { mount_point: self.1[i].clone().into(), dev: "0:0".into(), sentinel: None }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

fn guardian(n: usize, window: Duration) -> (GuardianState<Fake>, Fake, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new(n);
    let bounds = Bounds { window, grace: Duration::from_millis(250) };
    let g = GuardianState::new(fake.clone(), bounds, dir.path().into(), nix::unistd::getpid(), None);
    (g, fake, dir)
}

fn reply(g: &mut GuardianState<Fake>, r: Request) -> (u8, u32, u64) {
    fields(&g.apply(r).expect("stays").expect("a reply"))
}

fn permit(g: &mut GuardianState<Fake>, offset: u64) -> Permit {
    let (st, why, lost) = reply(g, Request::Permit(Some((offset, 4096, [7; 32]))));
    permit_of(st, why, lost)
}

fn thaw(g: &mut GuardianState<Fake>) -> ThawReport {
    let (st, a, micros) = reply(g, Request::Thaw);
    assert_eq!(st, ST_OK);
    thaw_report_of(a, micros)
}

fn record_exists(dir: &tempfile::TempDir) -> bool {
    crate::host::freeze_record::list(dir.path()).is_ok_and(|l| !l.is_empty())
}

#[test]
fn grants_within_the_deadline_and_thaws_on_request() {
    let (mut g, fake, dir) = guardian(2, HOUR);
    assert_eq!(reply(&mut g, Request::Freeze(HOUR)).0, ST_OK);
    assert_eq!(fake.by(), [By::Us, By::Us]);
    assert!(record_exists(&dir), "the freeze record is written before the freeze");
    assert_eq!(permit(&mut g, 0), Permit::Granted);
    assert_eq!(g.granted.len(), 1);
    assert_eq!(g.apply(Request::Written), Ok(None), "WRITTEN has no reply");
    assert_eq!(g.granted.len(), 0);
    assert_eq!(fake.by(), [By::Us, By::Us], "a write within the deadline does not end the window");
    let t = thaw(&mut g);
    assert!(!t.overran && t.lost.is_none());
    assert_eq!(fake.by(), [By::Nobody, By::Nobody]);
    assert!(!record_exists(&dir), "the record goes with the thaw");
}

#[test]
fn after_the_deadline_an_idle_window_is_denied_and_thawed_at_once() {
    let (mut g, fake, _dir) = guardian(1, Duration::ZERO);
    assert_eq!(reply(&mut g, Request::Freeze(Duration::ZERO)).0, ST_OK);
    assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed);
    assert_eq!(fake.by(), [By::Nobody], "no write outstanding: thawed at the refusal");
    assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed, "and stays refused");
    assert!(thaw(&mut g).overran, "frozen past a zero --max-freeze");
}

#[test]
fn a_deadline_passing_mid_write_waits_for_written_then_thaws() {
    let (mut g, fake, _dir) = guardian(1, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    assert_eq!(permit(&mut g, 0), Permit::Granted);
    g.deadline = Instant::now().checked_sub(Duration::from_millis(1));
    assert_eq!(permit(&mut g, 4096), Permit::DeadlinePassed);
    assert_eq!(fake.by(), [By::Us], "never thawed under an outstanding write");
    assert_eq!(g.granted.len(), 1, "a refused write is not waited for");
    g.apply(Request::Written).unwrap();
    assert_eq!(fake.by(), [By::Nobody], "thawed as soon as the write was over");
    assert!(g.timeout().is_none(), "nothing left to wake up for");
}

#[test]
fn written_settles_the_oldest_grant_first() {
    let (mut g, _fake, _dir) = guardian(1, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    assert_eq!(permit(&mut g, 0), Permit::Granted);
    assert_eq!(permit(&mut g, 4096), Permit::Granted);
    assert_eq!(g.granted.len(), 2);
    g.apply(Request::Written).unwrap();
    assert_eq!(g.granted.iter().flatten().map(|c| c.0).collect::<Vec<_>>(), [4096]);
    thaw(&mut g);
    assert_eq!(g.granted.len(), 0, "a thaw ends the window's accounting");
}

#[test]
fn a_freeze_thawed_by_someone_else_is_denied_and_the_window_ends() {
    let (mut g, fake, _dir) = guardian(2, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    fake.thawed_by_someone(1);
    assert_eq!(permit(&mut g, 0), Permit::FreezeLost { index: 1, foreign: false });
    assert_eq!(fake.by(), [By::Nobody, By::Nobody], "the probe's fresh freeze is ours, and thawed");
    assert_eq!(thaw(&mut g).lost, Some((1, false)));
}

fn held(g: &mut GuardianState<Fake>) -> (u8, u32, u64) {
    reply(g, Request::Held)
}

/// HELD grants nothing, and tells a freeze held since the window began from one the
/// guardian thawed at the deadline, and from one lost to another program.
#[test]
fn held_says_whether_the_freeze_was_kept_and_grants_nothing() {
    let (mut g, fake, _dir) = guardian(1, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    assert_eq!(held(&mut g), (ST_OK, 0, 1));
    assert_eq!(g.granted.len(), 0, "nothing granted");
    assert_eq!(fake.by(), [By::Us]);
    thaw(&mut g);
    assert_eq!(held(&mut g), (ST_OK, 0, 0), "thawed: the filesystem may have written since");

    let (mut g, fake, _dir) = guardian(1, Duration::ZERO);
    reply(&mut g, Request::Freeze(Duration::ZERO));
    assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed);
    assert_eq!(fake.by(), [By::Nobody]);
    assert_eq!(held(&mut g), (ST_OK, 0, 0), "thawed at the deadline");

    let (mut g, fake, _dir) = guardian(2, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    fake.refrozen_by_someone(1);
    let (st, why, v) = held(&mut g);
    assert_eq!(permit_of(st, why, v), Permit::FreezeLost { index: 1, foreign: true });
    assert_eq!(fake.by(), [By::Nobody, By::Other], "ours thawed, theirs kept");
    assert_eq!(thaw(&mut g).lost, Some((1, true)));
}

#[test]
fn a_foreign_freeze_is_told_by_its_sentinel_and_left_alone() {
    let (mut g, fake, _dir) = guardian(2, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    fake.refrozen_by_someone(0);
    assert_eq!(permit(&mut g, 0), Permit::FreezeLost { index: 0, foreign: true });
    assert_eq!(fake.by(), [By::Other, By::Nobody], "ours thawed, theirs kept");
    assert_eq!(permit(&mut g, 0), Permit::FreezeLost { index: 0, foreign: true }, "and stays refused");
    assert_eq!(thaw(&mut g).lost, Some((0, true)));
    assert_eq!(fake.by(), [By::Other, By::Nobody]);
}

#[test]
fn an_unreadable_sentinel_proves_nothing_the_freeze_stays_ours() {
    let (mut g, fake, _dir) = guardian(1, HOUR);
    reply(&mut g, Request::Freeze(HOUR));
    fake.0.borrow_mut()[0].readable = false;
    assert_eq!(permit(&mut g, 0), Permit::Granted);
    g.apply(Request::Written).unwrap();
    assert_eq!(thaw(&mut g).lost, None);
    assert_eq!(fake.by(), [By::Nobody], "thawed: it was ours");
}

#[test]
fn a_failed_freeze_is_undone_and_names_the_filesystem() {
    let (mut g, fake, dir) = guardian(3, HOUR);
    fake.refrozen_by_someone(1);
    let (st, index, errno) = reply(&mut g, Request::Freeze(HOUR));
    assert_eq!((st, index, errno), (ST_ERR, 1, Errno::EBUSY as i32 as u64));
    assert_eq!(fake.by(), [By::Nobody, By::Other, By::Nobody], "the first freeze undone, theirs kept");
    assert!(!record_exists(&dir));
    assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed, "nothing granted outside a window");
}

#[test]
fn a_freeze_that_does_not_return_thaws_the_others_and_keeps_the_record() {
    let (mut g, fake, dir) = guardian(3, HOUR);
    fake.0.borrow_mut()[1].stuck = true;
    let (st, index, errno) = reply(&mut g, Request::Freeze(HOUR));
    assert_eq!((st, index, errno), (ST_ERR, 1, Errno::ETIMEDOUT as i32 as u64));
    assert_eq!(fake.by(), [By::Nobody, By::Nobody, By::Nobody], "the first freeze undone at once");
    assert!(record_exists(&dir), "the late freeze may still come: its record stays");
    fake.0.borrow_mut()[1].stuck = false;
    g.linger();
    assert!(!record_exists(&dir), "gone once the late freeze returned");
}

#[test]
fn a_probe_answered_late_after_the_deadline_still_thaws() {
    // Past the deadline the time left to the bound is nothing: a probe given only
    // that gave up on the EBUSY of our own freeze, took it for lost, and never thawed.
    let (mut g, fake, _dir) = guardian(1, Duration::from_millis(10));
    reply(&mut g, Request::Freeze(Duration::from_millis(10)));
    fake.0.borrow_mut()[0].slow = true;
    // Past the deadline and half the grace (125 ms): a stalled writer's kill point.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed);
    assert_eq!(fake.by(), [By::Nobody], "thawed");
}

#[test]
fn the_freeze_limit_leaves_time_to_thaw_within_the_bound() {
    let (mut g, _fake, _dir) = guardian(2, Duration::from_millis(500));
    assert_eq!(g.freeze_limit(), FIRST_FREEZE_LIMIT, "outside a window");
    reply(&mut g, Request::Freeze(Duration::from_millis(500)));
    let limit = g.freeze_limit();
    let bound = Duration::from_millis(500) + g.bounds.kill_after();
    assert!(limit <= bound && limit > bound - Duration::from_millis(200), "{limit:?}");
}

#[test]
fn no_freeze_without_its_record() {
    let (mut g, fake, dir) = guardian(1, HOUR);
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    g.run_dir = file.join("run");
    let (st, index, _) = reply(&mut g, Request::Freeze(HOUR));
    assert_eq!((st, index), (ST_ERR, RECORD_FAILED));
    assert_eq!(fake.by(), [By::Nobody]);
}

#[test]
fn exit_and_unknown_messages_thaw_and_leave() {
    for (request, code) in [(Request::Exit, 0), (Request::Unknown, exit::UNKNOWN_REQUEST)] {
        let (mut g, fake, _dir) = guardian(1, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        assert_eq!(g.apply(request), Err(code));
        assert_eq!(fake.by(), [By::Nobody]);
    }
}

#[test]
fn requests_decode_with_what_follows_them() {
    let hash = [9u8; 32];
    let mut bytes = hash.to_vec();
    let r = read_request(&mut bytes.as_slice(), msg(OP_PERMIT, 4096, 1 << 20));
    assert!(matches!(r, Some(Request::Permit(Some((1048576, 4096, h)))) if h == hash));
    assert!(matches!(read_request(&mut [0u8; 0].as_slice(), msg(OP_PERMIT, 0, 0)), Some(Request::Permit(None))));
    assert!(read_request(&mut [0u8; 5].as_slice(), msg(OP_PERMIT, 4096, 0)).is_none(), "a cut-short hash");
    bytes = b"/state/j".to_vec();
    let r = read_request(&mut bytes.as_slice(), msg(OP_JOURNAL, 8, 0));
    assert!(matches!(r, Some(Request::Journal(p)) if p == Path::new("/state/j")));
    assert!(
        matches!(read_request(&mut [0u8; 0].as_slice(), msg(OP_FREEZE, 0, 1500)), Some(Request::Freeze(d)) if d == Duration::from_millis(1500))
    );
    assert!(matches!(read_request(&mut [0u8; 0].as_slice(), msg(99, 0, 0)), Some(Request::Unknown)));
}

#[test]
fn replies_decode_to_what_reseq_acts_on() {
    assert_eq!(fields(&msg(OP_THAW, u32::MAX, u64::MAX)), (OP_THAW, u32::MAX, u64::MAX));
    let (st, why, lost) = fields(&freeze_lost_reply((3, true)));
    assert_eq!(permit_of(st, why, lost), Permit::FreezeLost { index: 3, foreign: true });
    assert_eq!(permit_of(ST_DENIED, DENY_DEADLINE, 0), Permit::DeadlinePassed);
    let t = thaw_report_of(THAW_OVERRAN | THAW_LOST | (2 << 8), 1_500_000);
    assert!(t.overran);
    assert_eq!(t.lost, Some((2, false)));
    assert_eq!(t.frozen, Duration::from_millis(1500));
}
