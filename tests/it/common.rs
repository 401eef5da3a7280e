//! Helpers shared by the integration tests' modules (`serve`, `faults_serve`, `grpc`,
//! `serve_triton`, …):
//! a tiny model trained in-process once per binary, and repositories holding it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln::backend::TrainCpu;
use kiln::config;
use kiln::records::RunDir;
use kiln::train::{ProgressMode, TrainJob, train};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The export directory of `configs/tiny.yaml`, trained once per test process under
/// `<target tmp>/trained/<pid>/` (earlier processes' directories there go).
pub fn trained() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trained");
        if let Ok(old) = std::fs::read_dir(&base) {
            for e in old.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let tmp = base.join(std::process::id().to_string());
        std::fs::create_dir_all(&tmp).unwrap();
        let mut text = std::fs::read_to_string(root().join("configs/tiny.yaml")).unwrap();
        text = text.replace(
            "  dir: checkpoints",
            &format!("  dir: {}", tmp.join("out").display()),
        );
        let path = tmp.join("tiny.yaml");
        std::fs::write(&path, &text).unwrap();
        let loaded = config::load(&path).unwrap();
        let run = RunDir::create(&loaded.config.export.dir, &loaded.config.name).unwrap();
        std::fs::write(run.config_file(), &loaded.text).unwrap();
        let job = TrainJob {
            hooks: None,
            config: &loaded,
            run,
            resume: false,
            progress: ProgressMode::Quiet,
            stop_after_epochs: None,
        };
        let trained = train::<TrainCpu>(&job, &Default::default()).expect("training succeeds");
        trained.outcome.export_dir.clone().unwrap()
    })
}

/// Copy the files of `from` into `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A repository holding `tiny/1`: a copy of `trained`.
pub fn repository_of(trained: &Path) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    copy_dir(trained, &repo.path().join("tiny").join("1"));
    repo
}

/// `n` deterministic rows of raw features within one standard deviation of the training
/// means of the checkpoint in `export`.
pub fn rows_around_means(export: &Path, n: usize, seed: u32) -> Vec<f32> {
    let ckpt = kiln::artifact::Checkpoint::load(export).unwrap();
    let f = &ckpt.manifest.features;
    let mut out = Vec::with_capacity(n * f.len());
    for r in 0..n {
        for (j, c) in f.iter().enumerate() {
            let u = (((r as u32 + 1) * 7919 + (j as u32 + 3) * 104_729 + seed * 31) % 1000) as f64
                / 1000.0;
            out.push((c.mean + c.std * (2.0 * u - 1.0)) as f32);
        }
    }
    out
}
