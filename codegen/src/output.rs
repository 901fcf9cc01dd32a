//! Writing generated files: only when their content changed, so an unchanged
//! contract costs no rebuild of the crate that includes them. Used by
//! [`crate::Builder`], the `rfidl generate` CLI and the registry's lock file
//! and cache; it depends on nothing else in this crate.

use std::path::Path;

/// Writes `contents` to `path` unless the file already holds exactly that.
/// Returns whether it wrote.
pub fn write_if_changed(path: &Path, contents: &str) -> std::io::Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == contents.as_bytes()) {
        return Ok(false);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents)?;
    Ok(true)
}
