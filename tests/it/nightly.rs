//! The nightly retraining loop's gate: distinct outcomes (promoted 0, refused 3, nothing to do
//! 4), the data the run saw is the data the gate sees, and a paired, noise-aware rule that
//! candidates differing only by their seed do not flip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::root;

fn kiln_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(dir)
        .env_remove("KILN_LOG")
        .env_remove("MLFLOW_TRACKING_URI")
        .output()
        .expect("run kiln")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The shipped baseball table cut at `last` season, written to `path`.
fn seasons_through(last: i64, path: &Path) {
    let text = std::fs::read_to_string(root().join("datasets/baseball.csv")).unwrap();
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        let season: Option<i64> = line.split(',').nth(1).and_then(|s| s.parse().ok());
        if i == 0 || season.is_some_and(|s| s <= last) {
            out.push_str(line);
            out.push('\n');
        }
    }
    std::fs::write(path, out).unwrap();
}

/// Train `configs/baseball.yaml` on `data` (test split 2017–`test_to`) with `seed`; returns
/// the run directory.
fn train(dir: &Path, data: &Path, test_to: i64, seed: u64, name: &str) -> PathBuf {
    let export = dir.join(name);
    let o = kiln_in(
        &root(),
        &[
            "train",
            "configs/baseball.yaml",
            "-q",
            "--set",
            &format!("seed={seed}"),
            "--set",
            &format!("data.path={}", data.display()),
            "--set",
            &format!("data.split.test.to={test_to}"),
            "--set",
            &format!("export.dir={}", export.display()),
            "--registry",
            &dir.join("runs.db").display().to_string(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    p.parent().unwrap().to_path_buf()
}

fn promote(run: &Path, repo: &Path, db: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "promote".to_string(),
        "--checkpoint".into(),
        run.display().to_string(),
        "--repository".into(),
        repo.display().to_string(),
        "--model".into(),
        "baseball".into(),
        "--latency-ms".into(),
        "40".into(),
        "--registry".into(),
        db.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // From another directory than the one the run was trained in: the manifest's resolved
    // data path is what promote uses.
    kiln_in(Path::new("/"), &args)
}

#[test]
fn outcomes_are_distinct_and_the_gate_sees_the_runs_data() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("night.csv");
    seasons_through(2018, &data);
    let run = train(tmp.path(), &data, 2018, 42, "a");
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));

    let o = promote(&run, &repo, &db, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The same run again: nothing to do (4), said as a note, nothing written.
    let o = promote(&run, &repo, &db, &[]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("note: nothing to do"), "{err}");
    assert!(repo.join("baseball/1").is_dir() && !repo.join("baseball/2").exists());

    // The night's file is overwritten (a season appended): re-promoting the old run would
    // test on other rows than it held out, so it is refused as bad input.
    seasons_through(2019, &data);
    let o = promote(&run, &repo, &db, &["--dry-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("the data file changed since run"),
        "{}",
        text(&o)
    );
    // An explicit --data evaluates on the file given.
    let old = tmp.path().join("old.csv");
    seasons_through(2018, &old);
    let o = promote(
        &run,
        &repo,
        &db,
        &["--dry-run", "--data", old.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));

    let reg = kiln::track::registry::Registry::open(&db).unwrap();
    let rows = reg.promotions(Some("baseball")).unwrap();
    let decisions: Vec<&str> = rows.iter().map(|r| r.decision.as_str()).collect();
    assert_eq!(decisions, ["promoted", "nothing_to_do"]);

    // The record: `kiln runs promotions` lists both decisions; `runs list` says which run
    // serves version 1; `--config` reads the registry that config names.
    let db_s = db.display().to_string();
    let o = kiln_in(&root(), &["runs", "--registry", &db_s, "promotions"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains("promoted") && lines[0].contains("→1"),
        "{out}"
    );
    assert!(lines[1].contains("nothing_to_do"), "{out}");
    let o = kiln_in(&root(), &["runs", "--registry", &db_s, "list", "--json"]);
    let listed: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let id = run.file_name().unwrap().to_str().unwrap();
    let me = listed
        .iter()
        .find(|r| r["id"] == id)
        .expect("the run is listed");
    assert_eq!(me["served"], serde_json::json!(["baseball v1"]));
    assert!(me["test_nll"].as_f64().is_some_and(f64::is_finite));
    let cfg = run.join("config.yaml").display().to_string();
    let o = kiln_in(&root(), &["runs", "--config", &cfg, "list"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&tmp.path().join("a/runs.db").display().to_string()),
        "the config's registry (export.dir/runs.db): {}",
        text(&o)
    );
}

/// Twenty models that differ only by their seed, each compared with the first as if it were
/// tonight's candidate: the paired rule (95 %, rows resampled by player, tolerances 10 % MSE and
/// 0.02 nats) may call at most one of them worse and at most one better — the stated rate of
/// 5 % — although their test MSEs differ by several per cent.
#[test]
fn seed_noise_alone_does_not_flip_the_gate() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("night3.csv");
    seasons_through(2018, &data);
    let (repo, db) = (tmp.path().join("repo"), tmp.path().join("runs.db"));
    let first = train(tmp.path(), &data, 2018, 1, "s1");
    let o = promote(&first, &repo, &db, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (mut worse, mut better, mut spread) = (0, 0, Vec::new());
    for seed in 2..=20u64 {
        let run = train(tmp.path(), &data, 2018, seed, &format!("s{seed}"));
        let o = promote(
            &run,
            &repo,
            &db,
            &[
                "--dry-run",
                "--json",
                "--group",
                "player_id",
                "--max-latency-ratio",
                "1e9",
            ],
        );
        assert!(matches!(o.status.code(), Some(0 | 3)), "{}", text(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let checks = v["decision"]["checks"].as_array().unwrap();
        let quality: Vec<&Value> = checks
            .iter()
            .filter(|c| {
                let n = c["name"].as_str().unwrap();
                n.starts_with("mse ") || n == "nll"
            })
            .collect();
        assert_eq!(quality.len(), 4, "three targets and the NLL");
        for c in &quality {
            let d = c["detail"].as_str().unwrap();
            assert!(d.contains("318 groups"), "blocked by player: {d}");
            if c["passed"] == false {
                assert!(d.contains("worse"), "{d}");
            }
            if d.contains("— better") {
                better += 1;
            }
        }
        if quality.iter().any(|c| c["passed"] == false) {
            worse += 1;
        }
        let mse = quality[0]["candidate"].as_f64().unwrap();
        let inc = quality[0]["incumbent"].as_f64().unwrap();
        spread.push(mse / inc - 1.0);
    }
    let max = spread.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    eprintln!(
        "seed-only candidates: {worse} of 19 refused, {better} checks better; largest hr_rate MSE change {:.1} %",
        max * 100.0
    );
    assert!(max > 0.01, "seeds really differ: {spread:?}");
    assert!(worse <= 1, "{worse} of 19 seed-only candidates refused");
    assert!(better <= 1, "{better} seed-only checks called better");
}

/// `refit: train+validation` on the tiny config: a selection pass, then the exported model
/// trained on train + validation for the selection pass's best epochs, its normalisation fit on
/// those rows, the selection pass's test evaluation kept in the manifest; a run killed during
/// the refit pass resumes to the same weights.
#[test]
fn refit_retrains_on_train_and_validation_with_the_chosen_epochs() {
    use kiln::artifact::Checkpoint;
    let run_once = |dir: &Path, fault: Option<&str>| -> PathBuf {
        let cfg = crate::common::tiny_config(
            dir,
            &dir.join("out"),
            &[("export:\n", "refit: train+validation\nexport:\n")],
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.args(["train", cfg.to_str().unwrap(), "-q"])
            .current_dir(root())
            .env_remove("MLFLOW_TRACKING_URI");
        if let Some(f) = fault {
            cmd.env("KILN_FAULT", f);
        }
        let o = cmd.output().unwrap();
        let runs: Vec<PathBuf> = std::fs::read_dir(dir.join("out/runs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(runs.len(), 1);
        let run = runs[0].clone();
        if fault.is_some() {
            assert!(!o.status.success(), "killed");
            let o = kiln_in(
                &root(),
                &[
                    "train",
                    cfg.to_str().unwrap(),
                    "-q",
                    "--resume",
                    run.to_str().unwrap(),
                ],
            );
            assert!(o.status.success(), "{}", text(&o));
        } else {
            assert!(o.status.success(), "{}", text(&o));
        }
        run
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = run_once(tmp.path(), None);
    let sel = Checkpoint::load(&run.join("selection/export")).unwrap();
    let refit = Checkpoint::load(&run.join("export")).unwrap();
    let m = refit.manifest.metrics.refit.as_ref().unwrap();
    assert_eq!(m.trained_on, "train+validation");
    let chosen: Vec<usize> = sel
        .manifest
        .metrics
        .stages
        .iter()
        .map(|s| s.best_epoch)
        .collect();
    let epochs = m.epochs.clone();
    assert_eq!(epochs, chosen);
    assert_eq!(m.selection_test, sel.manifest.metrics.test);
    // The refit pass ran exactly those epochs.
    let lines = std::fs::read_to_string(run.join("epochs.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), epochs.iter().sum::<usize>());
    // Trained on train (≤ 2014) + validation (2015–2016): its feature normalisation is the
    // mean over those rows, computed here from the CSV.
    let csv = std::fs::read_to_string(root().join("datasets/baseball.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let (si, ai) = (
        header.iter().position(|h| *h == "season").unwrap(),
        header.iter().position(|h| *h == "age").unwrap(),
    );
    let (mut sum, mut n) = (0.0f64, 0usize);
    for line in csv.lines().skip(1) {
        let c: Vec<&str> = line.split(',').collect();
        let season: i64 = c[si].parse().unwrap();
        if (2005..=2016).contains(&season) {
            sum += c[ai].parse::<f64>().unwrap();
            n += 1;
        }
    }
    let age = refit
        .manifest
        .features
        .iter()
        .find(|f| f.name == "age")
        .unwrap();
    assert!(
        (age.mean - sum / n as f64).abs() < 1e-9,
        "{} vs {}",
        age.mean,
        sum / n as f64
    );
    assert_eq!(
        refit.manifest.dataset.rows[0], n,
        "train rows include validation"
    );
    assert_ne!(refit.manifest.weights.sha256, sel.manifest.weights.sha256);

    // Killed in the refit pass (the selection pass logs 5 epochs first), then resumed.
    let tmp2 = tempfile::tempdir().unwrap();
    let run2 = run_once(tmp2.path(), Some("kill@after-epoch-log:6"));
    let again = Checkpoint::load(&run2.join("export")).unwrap();
    assert_eq!(again.manifest.weights.sha256, refit.manifest.weights.sha256);
}

/// The shipped CronJob's script (`deploy/kubernetes/retrain-cronjob.yaml`), with the pod's
/// paths mapped into `image` (its working directory, holding `configs/` and `datasets/` as the
/// image does), `work` (the emptyDir) and `models` (the shared repository).
fn cronjob_script(work: &Path, models: &Path) -> String {
    let text =
        std::fs::read_to_string(root().join("deploy/kubernetes/retrain-cronjob.yaml")).unwrap();
    let v: Value = serde_saphyr::from_str(&text).unwrap();
    let c = &v["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["command"], serde_json::json!(["/bin/sh", "-c"]));
    let script = c["args"][0].as_str().unwrap().to_string();
    assert!(script.contains("/work/checkpoints") && script.contains("/models "));
    script
        .replace("/work/checkpoints", &work.display().to_string())
        .replace("/models ", &format!("{} ", models.display()))
}

/// A night: write the night's table into the image's `datasets/baseball.csv`, run the
/// CronJob's script; returns its exit code.
fn night(image: &Path, script: &str, registry: &Path) -> i32 {
    let bin = Path::new(env!("CARGO_BIN_EXE_kiln")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = Command::new("/bin/sh")
        .args(["-c", script])
        .current_dir(image)
        .env("PATH", path)
        .env("KILN_REGISTRY", registry)
        .env_remove("MLFLOW_TRACKING_URI")
        .env_remove("KILN_LOG")
        .output()
        .unwrap();
    eprintln!("night: exit {:?}\n{}", o.status.code(), text(&o));
    o.status.code().unwrap_or(-1)
}

/// Append a categorical column `tier` to the table at `path`: `low`/`mid`/`high` by the
/// previous season's plate appearances, and from season 2013 on a new category, `star`, for
/// the busiest (a category that appears mid-series: it enters the training window of the
/// night whose test season is 2016, so that night's candidate has one more network input
/// than the served version).
fn with_tier(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let cols: Vec<&str> = header.split(',').collect();
    let (si, pi) = (
        cols.iter().position(|c| *c == "season").unwrap(),
        cols.iter().position(|c| *c == "pa_l1").unwrap(),
    );
    out.push_str(header);
    out.push_str(",tier\n");
    for line in lines {
        let c: Vec<&str> = line.split(',').collect();
        let season: i64 = c[si].parse().unwrap();
        let pa: f64 = c[pi].parse().unwrap_or(0.0);
        let tier = match pa {
            p if season >= 2013 && p >= 650.0 => "star",
            p if p >= 450.0 => "high",
            p if p >= 250.0 => "mid",
            _ => "low",
        };
        out.push_str(line);
        out.push(',');
        out.push_str(tier);
        out.push('\n');
    }
    std::fs::write(path, out).unwrap();
}

/// The baseball table cut at `last`, its targets shuffled among the rows before `clean_from`
/// (a broken upstream job: the training rows' labels no longer belong to their features).
fn corrupted(last: i64, clean_from: i64, path: &Path) {
    seasons_through(last, path);
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let header = lines[0].clone();
    let cols: Vec<usize> = ["hr_rate", "bb_rate", "so_rate"]
        .iter()
        .map(|t| header.iter().position(|h| h == t).unwrap())
        .collect();
    let old: Vec<usize> = (1..lines.len())
        .filter(|&i| lines[i][1].parse::<i64>().unwrap() < clean_from)
        .collect();
    // A fixed rotation by a third of the rows: deterministic, and every label moves.
    let vals: Vec<Vec<String>> = old
        .iter()
        .map(|&i| cols.iter().map(|&c| lines[i][c].clone()).collect())
        .collect();
    let shift = old.len() / 3;
    for (k, &i) in old.iter().enumerate() {
        let from = &vals[(k + shift) % vals.len()];
        for (j, &c) in cols.iter().enumerate() {
            lines[i][c] = from[j].clone();
        }
    }
    let out: String = lines.iter().map(|l| l.join(",") + "\n").collect();
    std::fs::write(path, out).unwrap();
}

/// The drill: six nights of the shipped CronJob's exact script, one unchanged config
/// (`configs/nightly.yaml` with a categorical feature), a `kiln serve` polling the repository.
/// Growing data is promoted; a night without new data is nothing to do (exit 0); a night whose
/// training labels were corrupted is refused (exit 3) and the server stays on the last good
/// version; a corrupt file fails training (exit 2) and is on record; the next good night —
/// whose candidate has a new category's input — is promoted and served; a candidate 3 % worse
/// is refused. Each decision is read back from the registry.
#[test]
fn the_nightly_drill_promotes_growing_data_and_refuses_a_corrupted_night() {
    use kiln::loadgen::client::BlockingClient;
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("image");
    std::fs::create_dir_all(image.join("configs")).unwrap();
    std::fs::create_dir_all(image.join("datasets")).unwrap();
    // The shipped config plus one categorical feature (`tier`, see `with_tier`), unchanged
    // from night to night.
    let config = std::fs::read_to_string(root().join("configs/nightly.yaml")).unwrap();
    assert_eq!(config.matches("    - sb_rate_l2\n").count(), 1);
    let config = config
        .replace("    - sb_rate_l2\n", "    - sb_rate_l2\n    - tier\n")
        .replace(
            "  season_column: season\n",
            "  season_column: season\n  categorical: [tier]\n",
        );
    std::fs::write(image.join("configs/nightly.yaml"), config).unwrap();
    let seasons_through = |last: i64, path: &Path| {
        seasons_through(last, path);
        with_tier(path);
    };
    let (work, models) = (tmp.path().join("work"), tmp.path().join("models"));
    let registry = tmp.path().join("registry.db");
    let script = cronjob_script(&work, &models);
    let data = image.join("datasets/baseball.csv");
    let decisions = || -> Vec<(String, Option<i64>)> {
        kiln::track::registry::Registry::open(&registry)
            .unwrap()
            .promotions(Some("baseball"))
            .unwrap()
            .into_iter()
            .map(|r| (r.decision.to_string(), r.version))
            .collect()
    };

    // Night 1: seasons ≤ 2014 — the first version.
    seasons_through(2014, &data);
    assert_eq!(night(&image, &script, &registry), 0);
    assert_eq!(
        decisions().last().unwrap(),
        &("promoted".to_string(), Some(1))
    );

    // The serving tier polls the repository from now on.
    let mut server = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--port",
            "0",
            "--grpc-port",
            "0",
            "--instances",
            "1",
        ])
        .arg("--repository")
        .arg(&models)
        .args(["--poll-interval-ms", "100"])
        .env_remove("KILN_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = server.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log: Vec<String> = Vec::new();
    let mut addr = None;
    let t0 = Instant::now();
    while addr.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("kiln serve prints its address");
        if let Some(i) = line.find("http://") {
            let rest = &line[i + 7..];
            let end = rest.find([' ', '/']).unwrap_or(rest.len());
            addr = rest[..end].parse::<std::net::SocketAddr>().ok();
        }
        log.push(line);
        assert!(t0.elapsed() < Duration::from_secs(120));
    }
    let mut client = BlockingClient::new(addr.unwrap())
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    // Wait (bounded generously: an ordering, not a latency check) until the server answers
    // with `version`, and its default-level log says that version went live.
    let mut served = |version: u64, log: &mut Vec<String>| {
        let t0 = Instant::now();
        loop {
            while let Ok(l) = rx.try_recv() {
                log.push(l);
            }
            let meta = client
                .get("/v2/models/baseball")
                .ok()
                .filter(|r| r.status == 200)
                .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok());
            let live = log
                .iter()
                .any(|l| l.contains("version live") && l.contains(&format!("version={version}")));
            if meta.is_some_and(|m| m["versions"] == serde_json::json!([version.to_string()]))
                && live
            {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "version {version} never went live: {log:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    served(1, &mut log);

    // Night 2: a new season — promoted (not worse beyond noise) and served.
    seasons_through(2015, &data);
    assert_eq!(night(&image, &script, &registry), 0);
    assert_eq!(
        decisions().last().unwrap(),
        &("promoted".to_string(), Some(2))
    );
    served(2, &mut log);

    // Night 3: no new data — the run reproduces version 2's weights: nothing to do, and the
    // Job succeeds.
    assert_eq!(night(&image, &script, &registry), 0);
    assert_eq!(decisions().last().unwrap().0, "nothing_to_do");

    // Night 4: a new season, but the older rows' labels were scrambled upstream: refused.
    corrupted(2016, 2016, &data);
    with_tier(&data);
    assert_eq!(night(&image, &script, &registry), 3);
    assert_eq!(decisions().last().unwrap(), &("refused".to_string(), None));

    // Night 5: the file arrives corrupt (a row with a text in a numeric column): training
    // refuses it (exit 2), the script stops there — no comparison — and the night is on
    // record as failed, with its exit code and the training error's line.
    seasons_through(2016, &data);
    let mut text = std::fs::read_to_string(&data).unwrap();
    let bad = text.lines().nth(7).unwrap().replacen(",", ",oops", 1);
    text.push_str(&bad);
    text.push('\n');
    std::fs::write(&data, text).unwrap();
    assert_eq!(night(&image, &script, &registry), 2);
    let reg = kiln::track::registry::Registry::open(&registry).unwrap();
    let last = reg.promotions(Some("baseball")).unwrap().pop().unwrap();
    assert_eq!(last.decision, "failed");
    assert_eq!(
        (last.details.step.as_deref(), last.details.exit_code),
        (Some("train"), Some(2))
    );
    assert!(
        last.details
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("baseball.csv")),
        "{:?}",
        last.details.reason
    );
    assert_eq!(last.incumbent_version, Some(2));

    // Night 6: the season, clean. A new category (`tier=star`, from 2013) has entered the
    // training window: the candidate has one more network input than version 2. Compared on
    // raw columns (the new category is version 2's unknown bucket): promoted as version 3,
    // and served.
    seasons_through(2016, &data);
    assert_eq!(night(&image, &script, &registry), 0);
    assert_eq!(
        decisions().last().unwrap(),
        &("promoted".to_string(), Some(3))
    );
    served(3, &mut log);
    let inputs = |v: u64| {
        kiln::artifact::read_manifest(&models.join("baseball").join(v.to_string()))
            .unwrap()
            .feature_names()
    };
    assert!(
        inputs(3).iter().any(|f| f == "tier=star"),
        "{:?}",
        inputs(3)
    );
    assert!(!inputs(2).iter().any(|f| f == "tier=star"));

    // A candidate 3 % worse than version 3 on every row of tonight's window is refused by the
    // default gate (a 2 % margin beyond noise).
    {
        use kiln::track::promote::{Gates, Outcome, decide};
        let v3 = kiln::artifact::Checkpoint::load(&models.join("baseball/3")).unwrap();
        let cfg = kiln::config::load(&image.join("configs/nightly.yaml")).unwrap();
        let mut data_cfg = cfg.config.data.clone();
        data_cfg.path = data.clone();
        let (d, table) = kiln::data::Dataset::load_with_table(&data_cfg).unwrap();
        let x = kiln::track::promote::raw_inputs(
            &v3.manifest.input_preprocessing(),
            &table,
            &d.test.source_rows,
            "version 3",
        )
        .unwrap();
        let mut p = kiln::predict::Predictor::for_checkpoint(
            &v3,
            kiln::infer::build_engine(kiln::records::EngineKind::Fused, &v3.weights, 1).unwrap(),
        );
        let (q, rows) =
            kiln::track::promote::quality_and_rows_on(&mut p, &d.targets, &x, &d.test.y).unwrap();
        let served_m = kiln::track::promote::Measurement {
            quality: q.clone(),
            latency: vec![kiln::track::promote::BatchP50 {
                batch: 1,
                p50_us: 10.0,
                iters: 1,
            }],
            weights_sha256: "v3".into(),
            rows: Some(rows.clone()),
        };
        let mut worse = served_m.clone();
        worse.weights_sha256 = "worse".into();
        for t in &mut worse.quality.targets {
            t.mse *= 1.03;
        }
        let r = worse.rows.as_mut().unwrap();
        r.sq.iter_mut().for_each(|v| *v *= 1.03);
        let gates = Gates::default();
        let dec = decide(&gates, &worse, Some(&served_m));
        assert_eq!(dec.outcome, Outcome::Refused, "{:#?}", dec.checks);
        let failed: Vec<&str> = dec
            .checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.as_str())
            .collect();
        assert!(failed.iter().all(|n| n.starts_with("mse ")), "{failed:?}");
        assert_eq!(failed.len(), 3, "every target 3 % worse: {failed:?}");
    }

    let words: Vec<String> = decisions().into_iter().map(|d| d.0).collect();
    assert_eq!(
        words,
        [
            "promoted",
            "promoted",
            "nothing_to_do",
            "refused",
            "failed",
            "promoted"
        ]
    );
    // `kiln runs promotions`: one line per night, with its exit code; nothing to do is not
    // a failure.
    let o = kiln_in(
        &root(),
        &[
            "runs",
            "--registry",
            registry.to_str().unwrap(),
            "promotions",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(
        lines[2].contains("exit 4") && !lines[2].contains("FAIL"),
        "{out}"
    );
    assert!(lines[3].contains("exit 3"), "{out}");
    assert!(
        lines[4].contains("failed") && lines[4].contains("exit 2 · train failed"),
        "{out}"
    );
    // Each go-live line names the run the version came from.
    let live: Vec<&String> = log.iter().filter(|l| l.contains("version live")).collect();
    assert!(live.iter().all(|l| l.contains("run=nightly-")), "{live:#?}");
    let _ = server.kill();
    let _ = server.wait();
}

/// `kiln serve` prints where it listens on stdout, one machine-readable line per listener
/// (`listening on http://ADDR`, `listening on grpc://ADDR`), and nothing else there.
#[test]
fn serve_prints_its_listening_addresses_on_stdout() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let repo = crate::common::repository_of(crate::common::trained());
    let mut server = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "serve",
            "--port",
            "0",
            "--grpc-port",
            "0",
            "--instances",
            "1",
        ])
        .arg("--repository")
        .arg(repo.path())
        .env_remove("KILN_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        lines.push(line.trim_end().to_string());
    }
    let http = lines[0]
        .strip_prefix("listening on http://")
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("{lines:?}"));
    let grpc = lines[1]
        .strip_prefix("listening on grpc://")
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(http.port() > 0 && grpc.port() > 0 && http.port() != grpc.port());
    // The address works.
    let ok = std::net::TcpStream::connect(http).is_ok();
    let _ = server.kill();
    let _ = server.wait();
    assert!(ok, "nothing listens on {http}");
}

/// The exported checkpoint directory `kiln train` prints is absolute even when the config's
/// export directory is relative, so a script can hand it on from any working directory.
#[test]
fn train_prints_the_export_directory_as_an_absolute_path() {
    let tmp = tempfile::tempdir().unwrap();
    let (from, to) = crate::common::absolute_data();
    let cfg = crate::common::tiny_config(tmp.path(), Path::new("out"), &[(from, &to)]);
    let o = kiln_in(tmp.path(), &["train", cfg.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let printed = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    assert!(printed.is_absolute(), "{}", printed.display());
    assert!(
        printed.starts_with(tmp.path().canonicalize().unwrap()) || printed.starts_with(tmp.path()),
        "{}",
        printed.display()
    );
    assert!(
        printed.join("manifest.json").is_file(),
        "{}",
        printed.display()
    );
}

/// `seed_spread: 3` trains the config under seeds 7, 8 and 9 on the same rows, records each
/// seed's test MSE per target in the manifest, and exports exactly the model a run without
/// the key exports (its own seed's); the other seeds' runs are kept under `<run>/seeds/`.
#[test]
fn seed_spread_records_every_seeds_test_mse_and_exports_the_runs_own_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let (from, to) = crate::common::absolute_data();
    let plain_dir = tmp.path().join("plain");
    let spread_dir = tmp.path().join("spread");
    std::fs::create_dir_all(&plain_dir).unwrap();
    std::fs::create_dir_all(&spread_dir).unwrap();
    let plain = crate::common::tiny_config(&plain_dir, Path::new("out"), &[(from, &to)]);
    let spread = crate::common::tiny_config(
        &spread_dir,
        Path::new("out"),
        &[(from, &to), ("seed: 7\n", "seed: 7\nseed_spread: 3\n")],
    );
    let export = |dir: &Path, cfg: &Path| -> (PathBuf, Value) {
        let o = kiln_in(dir, &["train", cfg.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        let m: Value =
            serde_json::from_slice(&std::fs::read(p.join("manifest.json")).unwrap()).unwrap();
        (p, m)
    };
    let (_, plain_m) = export(&plain_dir, &plain);
    let o = kiln_in(&spread_dir, &["train", spread.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("seed spread over 3 seeds (7, 8, 9): test MSE standard deviation"),
        "{}",
        text(&o)
    );
    let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let m: Value =
        serde_json::from_slice(&std::fs::read(p.join("manifest.json")).unwrap()).unwrap();
    let mse = |m: &Value| -> Vec<f64> {
        m["metrics"]["test"]["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["mse_model"].as_f64().unwrap())
            .collect()
    };
    // The exported model is the run's own seed's, as without the key.
    assert_eq!(mse(&m), mse(&plain_m));
    assert!(plain_m["metrics"].get("seed_spread").is_none());
    let s = &m["metrics"]["seed_spread"];
    assert_eq!(s["seeds"], serde_json::json!([7, 8, 9]));
    assert_eq!(
        s["targets"],
        serde_json::json!(["hr_rate", "bb_rate", "so_rate"])
    );
    let rows: Vec<Vec<f64>> = serde_json::from_value(s["test_mse"].clone()).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0], mse(&m), "the first row is the exported model's");
    assert!(rows.iter().flatten().all(|v| v.is_finite() && *v > 0.0));
    assert_ne!(rows[0], rows[1], "another seed trains another model");
    // Each other seed's run is kept, its own export saying the same test MSE.
    let runs: Vec<String> = serde_json::from_value(s["runs"].clone()).unwrap();
    assert_eq!(runs.len(), 2);
    for (run, row) in runs.iter().zip(&rows[1..]) {
        assert!(run.ends_with("seed-8") || run.ends_with("seed-9"), "{run}");
        let other: Value = serde_json::from_slice(
            &std::fs::read(Path::new(run).join("export/manifest.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(&mse(&other), row);
        assert!(other["metrics"].get("seed_spread").is_none());
    }
    // A count outside 1..=32 is refused, naming the key.
    let o = kiln_in(
        &spread_dir,
        &[
            "config",
            "check",
            spread.to_str().unwrap(),
            "--set",
            "seed_spread=0",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("seed_spread"), "{}", text(&o));
}
