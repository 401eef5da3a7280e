//! Files that others read are written atomically: a uniquely named temporary sibling (from
//! `tempfile`, so two threads or processes writing the same path never share a temp file),
//! fsync, rename, fsync of the directory. A reader sees the old file or the new one, never a
//! partial one; a failed write leaves no temporary file behind. The file gets the mode an
//! ordinary `File::create` would give it (0666 less the umask), not the temp file's private
//! 0600, so a checkpoint or model version written by one user is readable by the server's.

use std::io::Write;
use std::path::Path;

/// Attach the path to an I/O error so the message says which file failed.
fn at(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The directory a path lives in (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Write `bytes` to `path` atomically (temp sibling, fsync, rename, fsync the directory).
/// Errors name the path.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = parent_of(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            at(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"),
            )
        })?;
    let prefix = format!(".{name}.tmp-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Applied at creation, so the umask still narrows it, as for `File::create`.
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir).map_err(|e| at(path, e))?;
    tmp.write_all(bytes).map_err(|e| at(tmp.path(), e))?;
    tmp.as_file().sync_all().map_err(|e| at(tmp.path(), e))?;
    tmp.persist(path).map_err(|e| at(path, e.error))?;
    sync_dir(dir)
}

/// Write `bytes` to `path` (not atomically) and fsync it. Errors name the path.
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| at(path, e))?;
    f.write_all(bytes).map_err(|e| at(path, e))?;
    f.sync_all().map_err(|e| at(path, e))
}

/// fsync a directory so a rename inside it is durable. Errors name the directory.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| at(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temp files left: {names:?}");
    }

    #[test]
    fn concurrent_writers_of_one_path_never_collide() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("same.txt");
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(p, &[t; 64]).unwrap();
                    }
                });
            }
        });
        let got = std::fs::read(&p).unwrap();
        assert_eq!(got.len(), 64);
        assert!(got.iter().all(|&b| b == got[0]), "a torn file: {got:?}");
    }

    #[cfg(unix)]
    #[test]
    fn atomic_files_get_the_mode_of_an_ordinary_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("atomic"), d.path().join("plain"));
        write_atomic(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&a), mode(&b));
    }

    #[test]
    fn errors_name_the_path() {
        let e = write_atomic(Path::new("/nonexistent-dir-kiln/x.json"), b"x").unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir-kiln"), "{e}");
    }
}
