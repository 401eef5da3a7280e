//! Facts about this host and process that the run registry, the MLflow mirror and the run
//! records all stamp on what they write: host name, a process's start time (to tell a live
//! process from a reused pid), the git commit of the working directory, and SHA-256 digests.

use sha2::{Digest, Sha256};

/// This machine's host name (`localhost` where `/proc` does not say).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Start time of a process in clock ticks since boot (field 22 of `/proc/PID/stat`).
pub fn process_start(pid: u32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start` (clock ticks since boot; `None`: any
/// start) is still running — a reused pid with another start time is not it.
pub fn process_alive(pid: i64, start: Option<i64>) -> bool {
    if pid <= 0 {
        return false;
    }
    match process_start(pid as u32) {
        None => false,
        Some(s) => start.is_none_or(|st| st == s),
    }
}

/// The git commit of the working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitCommit {
    /// `git rev-parse HEAD`.
    pub commit: String,
    /// Whether tracked files differ from it.
    pub dirty: bool,
}

impl GitCommit {
    /// The commit with `-dirty` appended when the tree is dirty (the registry's spelling).
    pub fn describe(&self) -> String {
        if self.dirty {
            format!("{}-dirty", self.commit)
        } else {
            self.commit.clone()
        }
    }
}

/// The git commit of the working directory, when inside a repository and git is installed.
pub fn git_commit() -> Option<GitCommit> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_string();
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    Some(GitCommit { commit, dirty })
}

/// SHA-256 of bytes as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// SHA-256 of a file as lowercase hex.
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    Ok(sha256_hex(&std::fs::read(path)?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_abc_is_the_fips_vector() {
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_is_not() {
        let pid = std::process::id();
        let start = super::process_start(pid);
        assert!(super::process_alive(pid as i64, start));
        if let Some(s) = start {
            assert!(!super::process_alive(pid as i64, Some(s + 1)));
        }
        assert!(!super::process_alive(0, None));
    }

    #[test]
    fn a_dirty_commit_is_described_with_a_suffix() {
        let c = super::GitCommit {
            commit: "abc".into(),
            dirty: true,
        };
        assert_eq!(c.describe(), "abc-dirty");
    }
}
