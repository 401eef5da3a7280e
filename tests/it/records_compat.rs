//! What the previous release wrote still loads and reads the same: the checkpoints, the model
//! repository and the run registry of `tests/fixtures/release-0.1.0` (written by 0.1.0 at
//! a7cfede, before the run records were typed; see its README), and `kiln runs …` prints
//! exactly what that release printed for the registry (`golden/`).

use std::path::{Path, PathBuf};

use kiln::artifact::Checkpoint;
use kiln::records::RunState;
use kiln::track::promotion::PromotionDecision;
use kiln::track::registry::Registry;
use kiln::track::report;

use crate::common::{kiln, root};

/// The fixture directory.
fn fixture() -> PathBuf {
    root().join("tests/fixtures/release-0.1.0")
}

/// The two runs of the fixture registry.
const TINY: &str = "tiny-20261204T225404Z-97df";
const REFIT: &str = "tiny-refit-20261204T225406Z-66ec";

/// A copy of the fixture registry in a temporary directory (opening may migrate a registry,
/// and the reaper writes: the fixture itself is never opened).
fn registry_copy(dir: &Path) -> PathBuf {
    let db = dir.join("runs.db");
    std::fs::copy(fixture().join("runs.db"), &db).unwrap();
    db
}

fn golden(name: &str) -> String {
    std::fs::read_to_string(fixture().join("golden").join(name)).unwrap()
}

/// Where two texts first differ, for a readable failure.
fn first_difference(got: &str, want: &str) -> String {
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        if g != w {
            return format!("line {}:\n  got  {g:?}\n  want {w:?}", i + 1);
        }
    }
    format!(
        "{} lines against {} (trailing newline: {} against {})",
        got.lines().count(),
        want.lines().count(),
        got.ends_with('\n'),
        want.ends_with('\n')
    )
}

fn assert_same(what: &str, got: &str, want: &str) {
    assert!(
        got == want,
        "{what} differs from the previous release's output: {}\n--- got:\n{got}",
        first_difference(got, want)
    );
}

/// Every golden file, from the `kiln` binary: the same bytes on stdout (and on stderr for
/// `regressions`, whose summary goes there). No line needs normalising: every value printed
/// is stored in the registry (times are the runs' own, not the time of printing).
#[test]
fn kiln_runs_prints_what_the_previous_release_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let db = registry_copy(tmp.path());
    let db = db.to_str().unwrap();
    let cases: [(&str, &[&str]); 5] = [
        ("runs_list.txt", &["list"]),
        ("runs_show_tiny.txt", &["show", TINY]),
        ("runs_show_tiny_refit.txt", &["show", REFIT]),
        ("runs_compare.txt", &["compare", TINY, REFIT]),
        ("runs_promotions.txt", &["promotions"]),
    ];
    for (file, args) in cases {
        let o = kiln(&[&["runs", "--registry", db][..], args].concat());
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "kiln runs {args:?}: {err}");
        assert_same(&format!("kiln runs {args:?}"), &out, &golden(file));
        assert!(err.is_empty(), "kiln runs {args:?} warned: {err}");
    }
    let o = kiln(&["runs", "--registry", db, "regressions"]);
    assert_eq!(o.status.code(), Some(0), "nothing flagged");
    assert!(o.stdout.is_empty());
    assert_same(
        "kiln runs regressions (stderr)",
        &String::from_utf8_lossy(&o.stderr),
        &golden("runs_regressions.txt"),
    );
}

/// The same texts from `kiln_track::report` directly (what the CLI prints, without it).
#[test]
fn the_report_functions_return_the_previous_releases_text() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::open(&registry_copy(tmp.path())).unwrap();
    let rows = reg.list().unwrap();
    let promotions = reg.promotions(None).unwrap();
    assert_same(
        "list",
        &report::list_table(&rows, &promotions),
        &golden("runs_list.txt"),
    );
    for (id, file) in [
        (TINY, "runs_show_tiny.txt"),
        (REFIT, "runs_show_tiny_refit.txt"),
    ] {
        let r = reg.get(id).unwrap();
        let epochs = reg.epochs(id).unwrap();
        assert_same(id, &report::show_text(&r, &epochs), &golden(file));
    }
    let (a, b) = (reg.get(TINY).unwrap(), reg.get(REFIT).unwrap());
    assert_same(
        "compare",
        &report::compare_text(&a, &b),
        &golden("runs_compare.txt"),
    );
    assert_same(
        "promotions",
        &report::promotions_table(&promotions, Path::new("unused")),
        &golden("runs_promotions.txt"),
    );
    let found = report::find_regressions(
        &rows,
        report::LatencyBatch::One,
        &kiln::track::analysis::RegressionRule::default(),
    );
    assert!(found.findings.is_empty());
    assert_same(
        "regressions",
        &format!("{}\n", found.summary()),
        &golden("runs_regressions.txt"),
    );
}

/// The fixture registry opens (on a copy) and its rows read back typed: status, metrics,
/// latency, environment, and the promotions' decisions and details.
#[test]
fn the_previous_releases_registry_reads_back_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::open(&registry_copy(tmp.path())).unwrap();
    let rows = reg.list().unwrap();
    assert_eq!(
        rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [TINY, REFIT]
    );
    for r in &rows {
        assert_eq!(r.status, RunState::Finished);
        let m = r.final_metrics.as_ref().expect("final metrics");
        let test = m.test.as_ref().expect("a test table");
        assert_eq!(test.rows, 820);
        assert_eq!(
            test.targets
                .iter()
                .map(|t| t.target.as_str())
                .collect::<Vec<_>>(),
            ["hr_rate", "bb_rate", "so_rate"]
        );
        assert!(
            test.targets
                .iter()
                .all(|t| t.nll_model < 0.0 && t.mse_model > 0.0)
        );
        assert_eq!(m.validation.as_ref().unwrap().rows, 564);
        assert_eq!(
            m.stages.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["mean", "variance"]
        );
        assert!(m.bottleneck.is_some() && m.int8_test_delta.is_some());
        assert!(m.pick_evaluation.is_some());
        assert!(m.other.is_empty(), "every key known: {:?}", m.other.keys());
        let l = r.latency.as_ref().expect("latency");
        assert_eq!(
            (l.engine.as_str(), l.cpu.as_deref()),
            ("auto", Some("avx2"))
        );
        assert_eq!(l.p50(1), r.latency_b1_p50_us);
        assert_eq!(l.p50(128), r.latency_b128_p50_us);
        let env = r.environment.as_ref().expect("environment");
        assert_eq!(
            (env.kiln.as_str(), env.burn.as_str(), env.cores),
            ("0.1.0", "0.21.0", 2)
        );
        assert_eq!(
            (
                env.device.as_str(),
                env.backend.as_str(),
                env.precision.as_str()
            ),
            ("cpu", "flex", "f32")
        );
        assert!(env.other.is_empty());
    }
    // The refit run records its selection pass; the calibrated one its table before.
    let (tiny, refit) = (&rows[0], &rows[1]);
    assert!(
        tiny.final_metrics
            .as_ref()
            .unwrap()
            .test_before_calibration
            .is_some()
    );
    let prov = refit
        .final_metrics
        .as_ref()
        .unwrap()
        .refit
        .as_ref()
        .unwrap();
    assert_eq!(prov.trained_on, "train+validation");
    assert!(!prov.selection_stages.is_empty() && prov.selection_test.is_some());

    let promotions = reg.promotions(None).unwrap();
    assert_eq!(
        promotions
            .iter()
            .map(|p| (p.decision, p.incumbent_version, p.version))
            .collect::<Vec<_>>(),
        [
            (PromotionDecision::Promoted, None, Some(1)),
            (PromotionDecision::Promoted, Some(1), Some(2)),
            (PromotionDecision::Promoted, Some(2), Some(3)),
        ]
    );
    for p in &promotions {
        let d = &p.details;
        assert_eq!(d.engine, "auto");
        // The release's gates as it recorded them (its default MSE margin was 10 %; today's
        // default is 2 %, which must not rewrite what an old row says).
        assert_eq!(
            d.gates,
            kiln::track::promote::Gates {
                max_mse_increase: 0.10,
                ..kiln::track::promote::Gates::default()
            }
        );
        assert!(d.checks.iter().all(|c| c.passed), "{:?}", d.checks);
        let cand = d.candidate.as_ref().expect("the candidate's numbers");
        assert_eq!(cand.quality.rows, 820);
        assert_eq!(cand.quality.targets.len(), 3);
        assert_eq!(
            cand.latency.iter().map(|b| b.batch).collect::<Vec<_>>(),
            [1, 128]
        );
        assert!(d.pid.is_some() && d.pid_start.is_some());
        assert!(d.other.is_empty(), "every key known: {:?}", d.other.keys());
    }
    assert!(promotions[0].details.incumbent.is_none());
    assert!(promotions[1].details.incumbent.is_some());
    assert_eq!(promotions[1].details.checks.len(), 3 + 3 + 1 + 6 + 2);
}

/// Reading a row typed and writing it back loses nothing: every JSON column of the fixture
/// registry equals, as JSON, its typed record serialised again.
#[test]
fn typed_records_round_trip_the_previous_releases_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let db = registry_copy(tmp.path());
    let raw = rusqlite::Connection::open(&db).unwrap();
    let reg = Registry::open(&db).unwrap();
    let parse = |text: String| -> serde_json::Value { serde_json::from_str(&text).unwrap() };
    for r in reg.list().unwrap() {
        let (env, metrics, latency): (String, String, String) = raw
            .query_row(
                "SELECT environment, final_metrics, latency FROM runs WHERE id = ?1",
                [&r.id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .unwrap();
        assert_eq!(serde_json::to_value(&r.environment).unwrap(), parse(env));
        assert_eq!(
            serde_json::to_value(&r.final_metrics).unwrap(),
            parse(metrics),
            "{}",
            r.id
        );
        assert_eq!(serde_json::to_value(&r.latency).unwrap(), parse(latency));
    }
    for p in reg.promotions(None).unwrap() {
        let details: String = raw
            .query_row(
                "SELECT details FROM promotions WHERE id = ?1",
                [p.id],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(p.details.to_json_text(), details, "byte for byte");
    }
}

/// The previous release's checkpoints load, their seals verify, and their typed metrics are
/// populated: the test table, the stages, the calibration, and the refit's provenance.
#[test]
fn the_previous_releases_checkpoints_load_typed() {
    let tiny = Checkpoint::load(&fixture().join("checkpoints/tiny")).unwrap();
    let m = &tiny.manifest.metrics;
    let test = m.test.as_ref().expect("a test table");
    assert_eq!((test.split.as_str(), test.rows), ("test", 820));
    assert_eq!(test.targets.len(), 3);
    assert!(
        test.targets
            .iter()
            .all(|t| t.coverage_curve.len() > 1 && !t.pit_histogram.is_empty())
    );
    assert_eq!(
        m.stages
            .iter()
            .map(|s| (s.name.as_str(), s.epochs))
            .collect::<Vec<_>>(),
        [("mean", 3), ("variance", 2)]
    );
    assert!(m.stages.iter().all(|s| s.step_us.forward > 0.0));
    // Fitted by `calibration: variance_scaling`: the factors, and the table before them.
    let cal = tiny.manifest.calibration.as_ref().expect("calibration");
    assert_eq!(
        (cal.method.as_str(), cal.fitted_on.as_str()),
        ("variance_scaling", "validation")
    );
    assert_eq!(cal.std_scale.len(), 3);
    assert!(m.test_before_calibration.is_some());
    assert!(m.refit.is_none() && m.teacher.is_none() && tiny.manifest.teacher.is_none());
    let lat = tiny.manifest.latency.as_ref().expect("latency");
    assert!(lat.p50(1).is_some() && lat.p50(128).is_some());
    assert!(m.int8_test_delta.as_ref().is_some_and(|d| d.rows == 820));
    assert!(m.other.is_empty(), "every key known: {:?}", m.other.keys());

    let refit = Checkpoint::load(&fixture().join("checkpoints/tiny-refit")).unwrap();
    let m = &refit.manifest.metrics;
    let prov = m.refit.as_ref().expect("refit provenance");
    assert_eq!(prov.trained_on, "train+validation");
    assert_eq!(prov.epochs, [2, 2]);
    assert!(!prov.selection_run.is_empty());
    assert_eq!(prov.selection_stages.len(), 2);
    assert_eq!(prov.selection_test.as_ref().map(|t| t.rows), Some(820));
    assert!(m.test.is_some() && !m.stages.is_empty());
    assert!(refit.manifest.calibration.is_none());
    assert!(m.other.is_empty(), "every key known: {:?}", m.other.keys());
}

/// The model repository the previous release's promotions wrote: every version loads, and
/// the one a server would serve is the newest.
#[test]
fn the_previous_releases_repository_loads() {
    let model_dir = fixture().join("repository/tiny");
    let versions = kiln::track::promote::versions(&model_dir).unwrap();
    assert_eq!(
        versions.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    for (v, dir) in &versions {
        let c = Checkpoint::load(dir).unwrap_or_else(|e| panic!("version {v}: {e}"));
        assert!(c.manifest.metrics.test.is_some(), "version {v}");
    }
    let (served, _) = kiln::track::promote::served_version(&model_dir)
        .unwrap()
        .expect("a served version");
    assert_eq!(served, 3);
}

/// `kiln runs promotions --json` prints each decision as the previous release did: the row's
/// fields in order, its details with their keys in alphabetical order, as stored.
#[test]
fn promotions_json_keeps_the_previous_releases_layout() {
    /// The previous release's row: the details as the JSON the registry stores.
    #[derive(serde::Serialize)]
    struct Stored {
        id: i64,
        at: String,
        repository: String,
        model: String,
        candidate: String,
        run_id: Option<String>,
        incumbent_version: Option<i64>,
        version: Option<i64>,
        decision: String,
        details: serde_json::Value,
    }
    let tmp = tempfile::tempdir().unwrap();
    let db = registry_copy(tmp.path());
    let raw = rusqlite::Connection::open(&db).unwrap();
    let mut stmt = raw
        .prepare(
            "SELECT id, at, repository, model, candidate, run_id, incumbent_version, version,
                    decision, details FROM promotions ORDER BY id",
        )
        .unwrap();
    let want: Vec<String> = stmt
        .query_map([], |r| {
            Ok(Stored {
                id: r.get(0)?,
                at: r.get(1)?,
                repository: r.get(2)?,
                model: r.get(3)?,
                candidate: r.get(4)?,
                run_id: r.get(5)?,
                incumbent_version: r.get(6)?,
                version: r.get(7)?,
                decision: r.get(8)?,
                details: serde_json::from_str(&r.get::<_, String>(9)?).unwrap(),
            })
        })
        .unwrap()
        .map(|s| serde_json::to_string(&s.unwrap()).unwrap())
        .collect();
    let reg = Registry::open(&db).unwrap();
    assert_eq!(
        report::promotions_json(&reg.promotions(None).unwrap()),
        want
    );
}
