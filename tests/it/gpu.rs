//! The GPU path's command-line edges that run on any machine (issue 44). The GPU path itself
//! without a GPU — training, resume, evaluation and the GPU engine on Burn's wgpu backend — is
//! `crates/core/tests/wgpu.rs` (`--features wgpu`, lavapipe in CI).

use std::time::Instant;

use crate::common::{repository_of, trained};

/// `kiln bench serve` on a model whose only version is rejected at load (here a truncated
/// weights file; on a machine without a GPU also `--engine cuda-bf16`) exits 2 at once with
/// the reason, instead of waiting for a readiness that cannot come.
#[test]
fn bench_serve_exits_2_at_once_when_the_version_is_rejected() {
    let repo = repository_of(trained());
    let weights = repo
        .path()
        .join("tiny/1")
        .join(kiln::artifact::WEIGHTS_FILE);
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let mut cases = vec![("fused", repo)];
    if kiln::backend::cuda_probe().is_err() {
        cases.push(("cuda-bf16", repository_of(trained())));
    }
    for (engine, repo) in cases {
        let t0 = Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["bench", "serve", "--repository"])
            .arg(repo.path())
            .args(["--model", "tiny", "--engine", engine, "--requests", "4"])
            .args(["--rounds", "1", "--json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{engine}: {stderr}");
        let kind: kiln::records::EngineKind = engine.parse().unwrap();
        if kind.is_built() {
            assert!(stderr.contains("version rejected"), "{engine}: {stderr}");
            assert!(stderr.contains("model tiny"), "{engine}: {stderr}");
        } else {
            // A build without the engine refuses the name before any server starts.
            assert!(
                stderr.contains(&format!("unknown engine `{engine}`")),
                "{engine}: {stderr}"
            );
        }
        // Far below the 120 s readiness wait it used to sit through.
        assert!(t0.elapsed().as_secs() < 60, "{engine}: {:?}", t0.elapsed());
    }
}
