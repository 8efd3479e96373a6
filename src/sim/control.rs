//! `reseq sim age`: advances a simulated drive's retention age clock (docs/FTL-MODEL.md,
//! "Retention"), in its state file, or through the `reseq sim serve` that serves it.
//!
//! A served drive's model lives in the server's memory and is saved when the session
//! ends, so a change to the state file would be lost. The server therefore listens on a
//! small control channel: a Unix socket in the abstract namespace, named after the data
//! file's device and inode (`reseq-sim-serve/DEV:INO`), so that any path to the drive
//! finds it and nothing is left on disk when the server dies. Whether a drive is served
//! is told by the lock the server holds on `STATE.data`: locked and no answer on the
//! channel is refused. One request, one JSON line each way: `{"age_days": N}` →
//! `{"age_days": TOTAL}` or `{"error": "..."}`. Only root and the server's own user may
//! age it (the peer's credentials). The server applies the step to its model and saves
//! a copy of it to the state file at once, so the new clock survives even a SIGKILL.

use std::fs::File;
use std::io::{BufRead, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SimState;
use crate::support::error::{Error, Result};

/// How long a client waits for the server's answer (it saves the state file first).
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How often the server's channel thread looks for a stop.
const POLL: Duration = Duration::from_millis(50);

#[derive(Serialize, Deserialize)]
struct Request {
    age_days: f64,
}

#[derive(Serialize, Deserialize)]
struct Answer {
    #[serde(default)]
    age_days: Option<f64>,
    #[serde(default)]
    error: Option<String>,
}

/// What `reseq sim age` did.
#[derive(Debug, Serialize)]
pub(crate) struct Aged {
    pub(crate) state: PathBuf,
    /// The clock after the step, days.
    pub(crate) age_days: f64,
    /// Whether a running `reseq sim serve` took the step.
    pub(crate) served: bool,
    /// Whether the drive's reads depend on age at all (`retention_max_factor` > 1).
    pub(crate) retention_on: bool,
}

/// The channel's name for the drive whose data file is `data`.
fn channel_name(data: &File) -> std::io::Result<SocketAddr> {
    use std::os::unix::fs::MetadataExt;
    let md = data.metadata()?;
    SocketAddr::from_abstract_name(format!("reseq-sim-serve/{}:{}", md.dev(), md.ino()))
}

/// `reseq sim age STATE --days N` (`days` finite, not negative: checked at parse).
pub(crate) fn age(state: &Path, days: f64) -> Result<Aged> {
    let data_path = data_path(state);
    let data = match File::open(&data_path) {
        Ok(f) => f,
        // Never served: no server can be holding it (one starting now reloads it: serve.rs).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return age_file(state, days),
        Err(e) => return Err(Error::io(format!("opening {}", data_path.display()), e)),
    };
    match nix::fcntl::Flock::lock(data, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        // Locked by us until aged and saved (the lock goes with the arm): no server can
        // start in between.
        Ok(_locked) => age_file(state, days),
        Err((data, nix::errno::Errno::EWOULDBLOCK)) => age_served(state, &data, days),
        Err((_, e)) => Err(Error::io(format!("locking {}", data_path.display()), e.into())),
    }
}

fn age_file(state: &Path, days: f64) -> Result<Aged> {
    let mut st = super::load(state)?;
    let age_days = st.ftl.age(days).map_err(Error::Usage)?;
    super::save(&st, state)?;
    Ok(Aged { state: state.to_path_buf(), age_days, served: false, retention_on: st.ftl.p.retention_on() })
}

/// Asks the server holding `data` locked to take the step.
fn age_served(state: &Path, data: &File, days: f64) -> Result<Aged> {
    let refuse = |why: String| {
        Error::refused(
            format!("{} is being served (its data file is locked) and {why}", state.display()),
            "age it while served by this version's `reseq sim serve`, or stop the server and age the state file",
        )
    };
    let addr = channel_name(data).map_err(|e| Error::io("naming the control channel", e))?;
    let stream =
        UnixStream::connect_addr(&addr).map_err(|e| refuse(format!("its server has no control channel ({e})")))?;
    let answer = exchange(&stream, days).map_err(|e| refuse(format!("its server did not answer ({e})")))?;
    match (answer.age_days, answer.error) {
        (_, Some(e)) => Err(Error::Usage(format!("the server of {} refused: {e}", state.display()))),
        (Some(age_days), None) => {
            // The server saved its model with the new clock; its parameters are its own.
            let retention_on = SimState::load(state).map(|s| s.ftl.p.retention_on()).unwrap_or(false);
            Ok(Aged { state: state.to_path_buf(), age_days, served: true, retention_on })
        }
        (None, None) => Err(refuse("its server gave an empty answer".into())),
    }
}

fn exchange(stream: &UnixStream, days: f64) -> std::io::Result<Answer> {
    stream.set_read_timeout(Some(ANSWER_WITHIN))?;
    let mut line = serde_json::to_vec(&Request { age_days: days })?;
    line.push(b'\n');
    (&*stream).write_all(&line)?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer)?;
    Ok(serde_json::from_str(&answer)?)
}

/// The data file of a state file: `STATE.data`, beside the file a symlink names, so that
/// every spelling of one drive finds the same data file and the same server's lock.
pub(crate) fn data_path(state: &Path) -> PathBuf {
    let state = state.canonicalize().unwrap_or_else(|_| state.to_path_buf());
    let mut s = state.into_os_string();
    s.push(".data");
    PathBuf::from(s)
}

/// The server's side: a thread answering age requests for the served model.
pub(crate) struct Channel {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Channel {
    /// Listens for the drive whose locked data file is `data`. None (and a warning) if the
    /// channel cannot be opened: the drive is served, but cannot be aged while it is.
    pub(crate) fn open(data: &File, state: Arc<Mutex<SimState>>, state_path: &Path) -> Option<Channel> {
        let listener = channel_name(data)
            .and_then(|a| UnixListener::bind_addr(&a))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .inspect_err(|e| log::warn!("no control channel ({e}): `reseq sim age` cannot reach this served drive"))
            .ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, path) = (stop.clone(), state_path.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("serve-control".into())
            .spawn(move || listen(listener, &s, &state, &path))
            .inspect_err(|e| log::warn!("no control channel ({e})"))
            .ok()?;
        Some(Channel { stop, thread: Some(thread) })
    }

    /// Stops answering; after this no request changes the model.
    pub(crate) fn close(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn listen(listener: UnixListener, stop: &AtomicBool, state: &Mutex<SimState>, path: &Path) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = answer(&stream, state, path) {
                    log::warn!("control channel: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(e) => {
                log::warn!("control channel: {e}");
                std::thread::sleep(POLL);
            }
        }
    }
}

/// Reads one request, applies it, saves the model, answers.
fn answer(stream: &UnixStream, state: &Mutex<SimState>, path: &Path) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    std::io::Read::take(std::io::BufReader::new(stream), 4096).read_line(&mut line)?;
    let result = allowed(stream).and_then(|()| {
        let req: Request = serde_json::from_str(&line).map_err(|e| format!("bad request: {e}"))?;
        if !(req.age_days.is_finite() && req.age_days >= 0.0) {
            return Err(format!("--days must be finite and not negative, not {}", req.age_days));
        }
        let copy = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            st.ftl.age(req.age_days)?;
            st.clone()
        };
        copy.save(path).map_err(|e| format!("saving {}: {e}", path.display()))?;
        Ok(copy.ftl.age_days)
    });
    let reply = Answer { age_days: result.as_ref().ok().copied(), error: result.err() };
    let mut out = serde_json::to_vec(&reply)?;
    out.push(b'\n');
    (&*stream).write_all(&out)
}

/// Root and the server's own user may age the drive; nobody else.
fn allowed(stream: &UnixStream) -> std::result::Result<(), String> {
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("the caller's credentials: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if cred.uid() == 0 || cred.uid() == me {
        Ok(())
    } else {
        Err(format!("user {} may not age a drive served by user {me}", cred.uid()))
    }
}
