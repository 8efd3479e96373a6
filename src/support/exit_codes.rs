//! The exit codes of `reseq`, one per outcome a script must tell apart.
//!
//! They are part of the interface (cron jobs, systemd units and the Ansible role branch
//! on them): never renumber one. The list is repeated in README.md and the man page.

/// An exit status of the `reseq` process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExitCode {
    /// Everything asked for was done and verified.
    #[default]
    Success,
    /// An unexpected internal failure (a bug).
    Internal,
    /// The command line or a value in it is invalid.
    Usage,
    /// reseq refused to act because acting would not be safe; nothing was written.
    Refused,
    /// An I/O error stopped the run. A failed write's original bytes are in a rescue copy;
    /// the message says whether a read-back found them intact.
    IoError,
    /// A chunk read back differently from what was written; the run stopped there.
    ChecksumMismatch,
    /// SIGINT/SIGTERM stopped the run after a chunk; resume with `--resume`. Also a
    /// FITRIM after a finished rewrite stopped between slices, and a stopped
    /// `bench --trim-impact` (nothing to resume then).
    Interrupted,
    /// `--max-overruns` freeze windows overran their deadline (the guardian thawed each),
    /// or one window outlasted its hard bound; the report's `outcome.cause` says which.
    WindowOverrun,
    /// Another program thawed (or thawed and re-froze) reseq's freeze during a window;
    /// reseq stopped writing at once and never thawed a freeze that was not its own.
    FreezeLost,
    /// Another writer wrote the device during a window (its written-sectors counter grew
    /// by more than reseq wrote, or the fanotify watch of its loop backing file reported a
    /// write); writing stopped; the message names every range reseq wrote since its last
    /// clean look, which may have overwritten that writer's newer bytes.
    ForeignWrite,
}

impl ExitCode {
    /// Every code, in numeric order (for docs and tests).
    pub const ALL: [ExitCode; 10] = [
        ExitCode::Success,
        ExitCode::Internal,
        ExitCode::Usage,
        ExitCode::Refused,
        ExitCode::IoError,
        ExitCode::ChecksumMismatch,
        ExitCode::Interrupted,
        ExitCode::WindowOverrun,
        ExitCode::FreezeLost,
        ExitCode::ForeignWrite,
    ];

    pub fn code(self) -> i32 {
        match self {
            ExitCode::Success => 0,
            ExitCode::Internal => 1,
            ExitCode::Usage => 2,
            ExitCode::Refused => 3,
            ExitCode::IoError => 4,
            ExitCode::ChecksumMismatch => 5,
            ExitCode::Interrupted => 6,
            ExitCode::WindowOverrun => 7,
            ExitCode::FreezeLost => 8,
            ExitCode::ForeignWrite => 9,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            ExitCode::Success => "success: everything was rewritten and verified",
            ExitCode::Internal => "internal error (a bug); stopped and thawed",
            ExitCode::Usage => "invalid command line or value",
            ExitCode::Refused => "refused as unsafe; nothing was written",
            ExitCode::IoError => "I/O error; stopped, thawed; bytes checked intact or kept in a rescue copy",
            ExitCode::ChecksumMismatch => {
                "checksum mismatch on read-back; stopped there; original bytes in a rescue copy"
            }
            ExitCode::Interrupted => "interrupted by a signal; thawed, resumable with --resume",
            ExitCode::WindowOverrun => {
                "windows overran too often, broke the bound or could not freeze; thawed; resumable"
            }
            ExitCode::FreezeLost => "another program thawed the freeze; writing stopped; its freeze left alone",
            ExitCode::ForeignWrite => {
                "a foreign write to the device or its backing file; stopped, ranges at risk named"
            }
        }
    }
}

/// `outcome.cause` of exit 7: `--max-overruns` windows overran their deadline.
pub const CAUSE_OVERRUNS: &str = "window_overruns";
/// `outcome.cause` of exit 7: a window outlasted its hard bound (--max-freeze + grace).
pub const CAUSE_BOUND_BROKEN: &str = "bound_broken";
/// `outcome.cause` of exit 7: a filesystem's FIFREEZE did not return within the bound
/// (its sync waited on another frozen filesystem); the others were thawed at the bound.
pub const CAUSE_FREEZE_STUCK: &str = "freeze_stuck";

impl ExitCode {
    /// What stopped the run, by its cause where the code has several (exit 7).
    pub fn describe_cause(self, cause: Option<&str>) -> &'static str {
        match (self, cause) {
            (ExitCode::WindowOverrun, Some(CAUSE_OVERRUNS)) => {
                "too many freeze windows overran their deadline (--max-overruns); the guardian thawed each; every chunk written was verified; resumable"
            }
            (ExitCode::WindowOverrun, Some(CAUSE_BOUND_BROKEN)) => {
                "a freeze window outlasted its hard bound (--max-freeze plus grace): the thaw came late; every chunk written was verified; resumable"
            }
            (ExitCode::WindowOverrun, Some(CAUSE_FREEZE_STUCK)) => {
                "a filesystem's freeze did not finish within the bound (it waited on another frozen filesystem); the others were thawed at the bound; nothing written in that window; resumable"
            }
            _ => self.describe(),
        }
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(code: ExitCode) -> Self {
        std::process::ExitCode::from(code.code() as u8)
    }
}
