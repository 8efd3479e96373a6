//! Files replaced whole: a crash or a reader sees the old file or the new one, never half.

use std::fs::File;
use std::path::Path;

/// Replaces `path` with what `write` puts in a uniquely named temporary file beside it
/// (mode `mode`), fsynced, renamed over `path`, then the directory fsynced so that the
/// rename is durable. Two writers sharing a directory never share a temporary file.
pub(crate) fn replace(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(".reseq-").suffix(".tmp").tempfile_in(dir)?;
    // Set, not asked of `create`: the umask does not narrow it.
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    write(tmp.as_file_mut())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}
