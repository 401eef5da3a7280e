//! One pass per run: a training run reads its data file once — `kiln train` (whose input check
//! reads it before the run starts) and a refit run (two training passes) included — and
//! measures everything its manifest records (evaluation, int8 accuracy change, latency, pick
//! evaluation) before its one export, so the checkpoint the observers are told about is final.
//!
//! The reads are counted for real: the data file is a named pipe that a thread here serves, so
//! every open of it by the run is one served read (a second one would be served a file without
//! the config's columns, failing the run).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kiln::artifact::{Checkpoint, Manifest, manifest_digest};
use kiln::records::RunDir;
use kiln::run::{RunObserver, RunOptions, TrainingRun};

use crate::common::only_run;
use crate::common::{kiln, root};

/// `O_NONBLOCK` (Linux): opening a pipe's read end without waiting for a writer.
const O_NONBLOCK: i32 = 0o4000;

/// A named pipe standing in for a data file: the first reader gets `content`, any later one
/// a CSV without the config's columns. Each reader gets a pipe of its own: as soon as one has
/// opened the pipe, the path is given a new one, so that what is served next never reaches
/// a reader still reading.
struct DataPipe {
    path: PathBuf,
    served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

impl DataPipe {
    fn serve(path: &Path, content: Vec<u8>) -> Self {
        mkfifo(path);
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (path, served, stop) = (path.to_path_buf(), served.clone(), stop.clone());
            std::thread::spawn(move || {
                loop {
                    // Blocks until a reader opens the pipe.
                    let Ok(mut w) = OpenOptions::new().write(true).open(&path) else {
                        return;
                    };
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    std::fs::remove_file(&path).unwrap();
                    mkfifo(&path);
                    let bytes: &[u8] = match served.fetch_add(1, Ordering::SeqCst) {
                        0 => &content,
                        _ => b"a second read,of the data file\n1,2\n",
                    };
                    // A reader that stops reading early only ends this read.
                    let _ = w.write_all(bytes);
                }
            })
        };
        Self {
            path: path.to_path_buf(),
            served,
            stop,
            thread: Some(thread),
        }
    }

    /// Stop serving; the number of reads served.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        // Release the server from waiting for a reader.
        let _reader = OpenOptions::new()
            .read(true)
            .custom_flags(O_NONBLOCK)
            .open(&self.path)
            .unwrap();
        self.thread.take().unwrap().join().unwrap();
        self.served.load(Ordering::SeqCst)
    }
}

/// `configs/tiny.yaml` in `dir` reading `data` (plus `subst`).
fn tiny_on(dir: &Path, data: &Path, subst: &[(&str, &str)]) -> PathBuf {
    let path = format!("path: {}", data.display());
    let mut all = vec![("path: datasets/baseball.csv", path.as_str())];
    all.extend_from_slice(subst);
    crate::common::tiny_config(dir, &dir.join("out"), &all)
}

fn baseball_csv() -> Vec<u8> {
    std::fs::read(root().join("datasets/baseball.csv")).unwrap()
}

/// The measurements a fresh export's manifest must already hold.
fn assert_measured(m: &Manifest) {
    let latency = m.latency.as_ref().expect("latency in the manifest");
    let batches: Vec<usize> = latency.batches.iter().map(|b| b.batch).collect();
    assert_eq!(batches, [1, 128]);
    let int8 = m.metrics.int8_test_delta.as_ref().expect("int8 delta");
    assert_eq!(int8.targets.len(), 3);
    let picks = m.metrics.pick_evaluation.as_ref().expect("pick evaluation");
    assert_eq!(picks.rows, m.dataset.rows[2], "every test row priced");
    assert!(!picks.kinds.is_empty());
}

#[test]
fn kiln_train_reads_its_data_file_once() {
    // The command's input check reads the file before the run exists; the run trains on
    // what it read (and measures int8, latency and picks on it).
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("baseball.csv");
    let pipe = DataPipe::serve(&fifo, baseball_csv());
    let cfg = tiny_on(tmp.path(), &fifo, &[]);
    let o = kiln(&["train", cfg.to_str().unwrap(), "-q"]);
    let reads = pipe.finish();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(reads, 1, "kiln train reads its data file once");
    let ckpt = Checkpoint::load(&only_run(&tmp.path().join("out")).join("export")).unwrap();
    assert_measured(&ckpt.manifest);
}

#[test]
fn a_refit_run_reads_its_data_file_once_for_both_passes() {
    // Through the library without a dataset given: the run reads the file itself, once, for
    // the selection pass and the refit pass.
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("baseball.csv");
    let pipe = DataPipe::serve(&fifo, baseball_csv());
    let cfg = tiny_on(
        tmp.path(),
        &fifo,
        &[("export:\n", "refit: train+validation\nexport:\n")],
    );
    let loaded = kiln::config::load(&cfg).unwrap();
    let summary = TrainingRun::new(loaded, RunOptions::default())
        .and_then(TrainingRun::execute)
        .map_err(|e| e.to_string());
    let reads = pipe.finish();
    let summary = summary.unwrap();
    assert_eq!(reads, 1, "one read for both passes");
    let run = summary.outcome.run.path;
    let refit = Checkpoint::load(&run.join("export")).unwrap();
    assert!(refit.manifest.metrics.refit.is_some());
    assert_measured(&refit.manifest);
    assert!(Checkpoint::load(&run.join("selection/export")).is_ok());
}

/// The manifest file's bytes and the loaded checkpoint.
type Seen = (Vec<u8>, Checkpoint);

/// Records the manifest as the observers see it when they are told of the export.
#[derive(Clone, Default)]
struct AtExport(Arc<Mutex<Option<Seen>>>);

impl RunObserver for AtExport {
    fn on_export(&self, _run: &RunDir, dir: &Path) {
        let bytes = std::fs::read(dir.join("manifest.json")).unwrap();
        let ckpt = Checkpoint::load(dir).expect("the export loads: sealed, weights verified");
        *self.0.lock().unwrap() = Some((bytes, ckpt));
    }
}

#[test]
fn a_fresh_export_is_measured_before_its_one_seal() {
    let tmp = tempfile::tempdir().unwrap();
    let (from, to) = crate::common::absolute_data();
    let cfg = crate::common::tiny_config(tmp.path(), &tmp.path().join("out"), &[(from, &to)]);
    let mut run =
        TrainingRun::new(kiln::config::load(&cfg).unwrap(), RunOptions::default()).unwrap();
    let seen = AtExport::default();
    run.observe(Box::new(seen.clone()));
    let summary = run.execute().unwrap();
    let (bytes, at_export) = seen.0.lock().unwrap().take().expect("on_export was called");
    // Complete when it appeared: every measurement is in it, and its seal covers them.
    assert_measured(&at_export.manifest);
    let raw: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        at_export.manifest.manifest_sha256.as_deref(),
        Some(manifest_digest(&raw).as_str())
    );
    // Final: nothing rewrote it afterwards, and the run reports what it holds.
    let export = summary.outcome.export_dir.clone().unwrap();
    assert_eq!(std::fs::read(export.join("manifest.json")).unwrap(), bytes);
    // (As serialised: a loaded drift reference is bound to the layout only when used.)
    let json = |m: &Manifest| serde_json::to_value(m).unwrap();
    assert_eq!(
        summary.outcome.manifest.as_ref().map(json),
        Some(json(&at_export.manifest))
    );
    assert_eq!(
        summary.latency.as_ref(),
        at_export.manifest.latency.as_ref()
    );
    let names: Vec<String> = std::fs::read_dir(&export)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "manifest and weights only: {names:?}");
}
