//! The regular files under a directory, on its filesystem only: what file mode rewrites
//! and what `bench DIR` reads. One walker, so the two never disagree on which files a
//! directory holds.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::support::error::{Error, Result};

/// Appends the regular files under `dir` whose filesystem is `dev` (the directory's own:
/// other mounts below it are left out), skipping what `excluded` says (a skipped directory
/// is not entered). Symbolic links are not followed.
pub(crate) fn regular_files(
    dir: &Path,
    dev: u64,
    excluded: &dyn Fn(&Path) -> bool,
    out: &mut Vec<PathBuf>,
) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        let md = entry.metadata().map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        if md.dev() != dev || excluded(&path) {
            continue;
        }
        if md.is_dir() {
            regular_files(&path, dev, excluded, out)?;
        } else if md.is_file() {
            out.push(path);
        }
    }
    Ok(())
}
