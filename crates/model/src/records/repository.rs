//! The model repository's layout, the one rule the promoter (which writes it) and the server
//! (which reads it) share: `<repository>/<model>/<version>/`, where a version is a directory
//! named by a number and names starting with `.` are ignored (an atomic install builds its
//! version in a hidden temporary directory, then renames it into place).

use std::path::{Path, PathBuf};

/// The visible subdirectories of `dir` as `(name, path)`, in no particular order: the models
/// of a repository, or the entries of a model directory.
pub fn subdirs(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if e.path().is_dir() {
            out.push((name, e.path()));
        }
    }
    Ok(out)
}

/// The version directories of a model directory, ascending (other entries ignored).
pub fn version_dirs(model_dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = subdirs(model_dir)?
        .into_iter()
        .filter_map(|(n, p)| n.parse::<u64>().ok().map(|v| (v, p)))
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_are_numeric_visible_directories_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["10", "2", ".3", "x", "1"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        std::fs::write(tmp.path().join("4"), b"a file").unwrap();
        let v: Vec<u64> = super::version_dirs(tmp.path())
            .unwrap()
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        assert_eq!(v, [1, 2, 10]);
        assert!(super::version_dirs(&tmp.path().join("missing")).is_err());
    }
}
