//! The end of a training session, in two parts:
//!
//! * [`evaluate`]: every number the manifest records, on the final weights in memory and the
//!   data the session already holds — the test and validation tables, the recalibration, the
//!   teacher's table, and the run layer's measurements ([`super::measure::Measure`]: int8
//!   accuracy change, latency, pick evaluation);
//! * [`seal`]: the manifest built from those numbers and the one atomic export, sealed once.
//!
//! Nothing is measured after the export: a checkpoint that exists is complete.

use burn::tensor::backend::{AutodiffBackend, Backend};

use super::distill::{normalised_predictions, side_by_side};
use super::evaluate::{
    EvalReport, SplitPredictions, evaluate_weighted, predict_split, residual_correlation,
    residual_variance, variance_scales,
};
use super::job::{StageSummary, TrainError, TrainJob, TrainOutcome, Trained, io_err};
use super::measure::{Candidate, Measurements};
use super::prepare::Prepared;
use super::progress::Reporter;
use crate::artifact::{self, CalibrationInfo, DatasetInfo, HostWeights, Manifest};
use crate::config::Calibration;
use crate::data::Subset;
use crate::data::dataset::Affine;
use crate::model::RegressionNet;
use crate::observe::verdict::Verdict;
use crate::records::metrics::ManifestMetrics;

/// What the end of a session reads.
pub(crate) struct Ending<'s, 'a, B: AutodiffBackend> {
    pub(crate) job: &'s TrainJob<'a>,
    pub(crate) prep: &'s Prepared,
    pub(crate) x_aff: &'s Affine,
    pub(crate) device: &'s B::Device,
    pub(crate) reporter: &'s Reporter,
}

/// Every number of the final model, ready to be sealed.
pub(crate) struct Evaluation<B: Backend> {
    /// The model exported (recalibrated when the config asks).
    model: RegressionNet<B>,
    /// Its weights, exactly as exported.
    weights: HostWeights,
    stages: Vec<StageSummary>,
    residual_correlation: Vec<Vec<f64>>,
    test: EvalReport,
    validation: EvalReport,
    /// The test table before recalibration, and the recalibration.
    calibration: Option<(EvalReport, CalibrationInfo)>,
    teacher_test: Option<EvalReport>,
    measured: Measurements,
}

/// The tables of one split against the baselines of the training split.
struct Judge<'p> {
    prep: &'p Prepared,
    persistence: Vec<Option<usize>>,
    constant_variance: Vec<f64>,
}

impl Judge<'_> {
    fn eval(&self, name: &str, pred: &SplitPredictions, split: &Subset) -> EvalReport {
        evaluate_weighted(
            name,
            pred,
            split,
            self.prep.arch.n_features,
            &self.prep.y_stats,
            &self.persistence,
            &self.constant_variance,
            split.weights(),
        )
    }
}

/// Evaluate `model` (the final one, without autodiff) on every split; `stages` summarises the
/// run's epochs. See the module docs.
pub(crate) fn evaluate<B: AutodiffBackend>(
    end: &Ending<'_, '_, B>,
    model: RegressionNet<B::InnerBackend>,
    stages: Vec<StageSummary>,
) -> Result<Evaluation<B::InnerBackend>, TrainError> {
    let (prep, data, device) = (end.prep, &end.prep.data, end.device);
    let predict = |m: &RegressionNet<B::InnerBackend>, split: &Subset| {
        predict_split(m, &split.x, end.x_aff, device)
    };
    let train_pred = predict(&model, &data.train);
    let judge = Judge {
        prep,
        persistence: prep.persistence_features(),
        constant_variance: residual_variance(&train_pred, &data.train.y, &prep.y_stats),
    };
    let vpred = predict(&model, &data.validation);
    let corr = residual_correlation(&vpred, &data.validation.y, &prep.y_stats);
    let mut weights = HostWeights::from_model(&model);
    let (model, calibration) = match end.job.config.config.calibration {
        Some(Calibration::VarianceScaling) => {
            let before = judge.eval("test", &predict(&model, &data.test), &data.test);
            let info = recalibrate(prep, &mut weights, &vpred)?;
            (weights.to_model(device), Some((before, info)))
        }
        None => (model, None),
    };
    let validation = judge.eval(
        "validation",
        &predict(&model, &data.validation),
        &data.validation,
    );
    let test = judge.eval("test", &predict(&model, &data.test), &data.test);
    show(end, &test, calibration.as_ref())?;
    let teacher_test = teacher_table(end, &judge, &test)?;
    let measured = match end.job.measure {
        Some(m) => m
            .measure(&Candidate {
                weights: &weights,
                residual_correlation: &corr,
                data: prep,
            })
            .map_err(TrainError::Measure)?,
        None => Measurements::default(),
    };
    Ok(Evaluation {
        model,
        weights,
        stages,
        residual_correlation: corr,
        test,
        validation,
        calibration,
        teacher_test,
        measured,
    })
}

/// Recalibration: fit one variance scale per target on the validation predictions `vpred`
/// and fold `ln s²` into the log-variance bias of `weights`, so that the reports describe
/// exactly what every consumer serves.
fn recalibrate(
    prep: &Prepared,
    weights: &mut HostWeights,
    vpred: &SplitPredictions,
) -> Result<CalibrationInfo, TrainError> {
    let v = &prep.data.validation;
    let s2 = variance_scales(vpred, &v.y, &prep.y_stats, v.weights());
    if let Some((j, v)) = s2
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v > 0.0))
    {
        return Err(TrainError::Calibration(format!(
            "variance_scaling: the validation split gives target {} a variance scale of {v} (expected a finite positive number; is the validation split empty?)",
            prep.y_stats[j].name
        )));
    }
    for (b, s) in weights.logvar_head.b.iter_mut().zip(&s2) {
        *b = (*b as f64 + s.ln()) as f32;
    }
    Ok(CalibrationInfo {
        method: "variance_scaling".into(),
        fitted_on: "validation".into(),
        std_scale: s2.iter().map(|v| v.sqrt()).collect(),
        applied_in: "logvar_head.bias (+ ln s²)".into(),
    })
}

/// Print the test tables (and the recalibration's effect) and write the test figures.
fn show<B: AutodiffBackend>(
    end: &Ending<'_, '_, B>,
    test: &EvalReport,
    calibration: Option<&(EvalReport, CalibrationInfo)>,
) -> Result<(), TrainError> {
    let run = &end.job.run;
    end.reporter.line(&test.table());
    end.reporter.line(&test.uncertainty_table());
    crate::observe::calibration::write_figures(&run.path, "test", &test.calibration_data())
        .map_err(io_err(&run.path))?;
    if let Some((before, c)) = calibration {
        end.reporter
            .line(&recalibration_table(before, test, &c.std_scale));
    }
    Ok(())
}

/// The teacher's test table beside the student's (a distillation run only).
fn teacher_table<B: AutodiffBackend>(
    end: &Ending<'_, '_, B>,
    judge: &Judge<'_>,
    student: &EvalReport,
) -> Result<Option<EvalReport>, TrainError> {
    let Some(t) = end
        .job
        .teacher
        .filter(|_| end.job.config.config.distill.is_some())
    else {
        return Ok(None);
    };
    let test = &end.prep.data.test;
    let (m, sd) = t
        .predict(&test.x, test.rows())
        .map_err(TrainError::Distill)?;
    let r = judge.eval(
        "test",
        &normalised_predictions(&m, &sd, &end.prep.y_stats),
        test,
    );
    end.reporter.line(&format!(
        "student {} parameters; teacher {}\n{}",
        end.prep.arch.num_params(),
        serde_json::to_string(&t.describe()).expect("teacher info serialises"),
        side_by_side(student, &r)
    ));
    Ok(Some(r))
}

/// Build the manifest of `evaluation` and export it with its weights in one atomic, sealed
/// write; tell the observers.
pub(crate) fn seal<B: AutodiffBackend>(
    end: &Ending<'_, '_, B>,
    evaluation: Evaluation<B::InnerBackend>,
    verdict: Verdict,
    config_sha256: &str,
) -> Result<Trained<B>, TrainError> {
    let run = &end.job.run;
    let manifest = manifest(end, &evaluation, verdict.clone(), config_sha256);
    let export_dir = run.export_dir();
    if export_dir.exists() {
        // A previous process finished training and exported, then died before marking the
        // run finished: the export is complete (it is renamed into place atomically).
        std::fs::remove_dir_all(&export_dir).map_err(io_err(&export_dir))?;
    }
    let manifest = artifact::export(&export_dir, manifest, &evaluation.weights)?;
    if let Some(h) = end.job.observer {
        h.on_export(run, &export_dir);
    }
    let Evaluation {
        model,
        test,
        stages,
        ..
    } = evaluation;
    Ok(Trained {
        outcome: TrainOutcome {
            run: run.clone(),
            export_dir: Some(export_dir),
            report: Some(test),
            stages,
            parameter_count: end.prep.arch.num_params(),
            manifest: Some(manifest),
            wall: std::time::Duration::ZERO,
            verdict: Some(verdict),
        },
        model: Some(model),
    })
}

/// The manifest of `ev` (its weights entry and seal are the export's).
fn manifest<B: AutodiffBackend>(
    end: &Ending<'_, '_, B>,
    ev: &Evaluation<B::InnerBackend>,
    verdict: Verdict,
    config_sha256: &str,
) -> Manifest {
    let (cfg, prep, data) = (&end.job.config.config, end.prep, &end.prep.data);
    // The split as resolved on this data (relative windows name the values they took).
    let split = crate::data::split::SPLIT_NAMES
        .iter()
        .zip(&data.split_describe)
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let teacher = end
        .job
        .teacher
        .filter(|_| cfg.distill.is_some())
        .map(|t| t.describe());
    let (before, calibration) = ev.calibration.clone().unzip();
    let mut manifest = Manifest::new(artifact::ManifestParts {
        run_id: end.job.run.id.clone(),
        architecture: prep.arch.clone(),
        features: prep.x_stats.clone(),
        targets: prep.y_stats.clone(),
        residual_correlation: ev.residual_correlation.clone(),
        metrics: ManifestMetrics {
            beats_all_baselines: ev.test.beats_all(),
            test: Some(ev.test.clone()),
            validation: Some(ev.validation.clone()),
            stages: ev.stages.clone(),
            bottleneck: Some(verdict),
            refit: cfg.refit_pass.as_ref().map(|r| r.provenance.clone()),
            test_before_calibration: before,
            // The registry row keeps the metrics: the teacher goes there too.
            teacher: teacher.clone(),
            teacher_test: ev.teacher_test.clone(),
            int8_test_delta: ev.measured.int8_test_delta.clone(),
            pick_evaluation: ev.measured.pick_evaluation.clone(),
            seed_spread: cfg.seed_spread_pass.as_ref().map(|p| {
                let own: Vec<f64> = ev.test.targets.iter().map(|t| t.mse_model).collect();
                let mut spread = crate::records::metrics::SeedSpread {
                    seeds: vec![cfg.seed],
                    targets: ev.test.targets.iter().map(|t| t.target.clone()).collect(),
                    test_mse: vec![own],
                    runs: Vec::new(),
                };
                for (seed, run, mse) in &p.others {
                    spread.seeds.push(*seed);
                    spread.test_mse.push(mse.clone());
                    spread.runs.push(run.clone());
                }
                spread
            }),
            numeric_bins: cfg.numeric_bins_pass.clone(),
            ..ManifestMetrics::default()
        },
        dataset: DatasetInfo {
            // Resolved once (relative paths are relative to the working directory of
            // `kiln train`), so that `kiln promote` finds the same file from anywhere.
            path: std::path::absolute(&cfg.data.path)
                .unwrap_or_else(|_| cfg.data.path.clone())
                .display()
                .to_string(),
            sha256: data.sha256.clone(),
            rows: [data.train.rows(), data.validation.rows(), data.test.rows()],
            split,
        },
        config_sha256: config_sha256.to_string(),
        teacher,
    });
    manifest.calibration = calibration;
    manifest.preprocessing = Some(data.preprocessing.clone());
    // The serving tier's drift reference: the training inputs' sketches and the test
    // split's mean predicted std per target.
    manifest.drift = Some(crate::data::drift::DriftReference::fit(
        &data.preprocessing,
        &data.train.x,
        ev.test.targets.iter().map(|t| t.sharpness).collect(),
    ));
    manifest.latency = ev.measured.latency.clone();
    manifest
}

/// Test calibration before and after recalibration, per target.
fn recalibration_table(before: &EvalReport, after: &EvalReport, scale: &[f64]) -> String {
    let mut s = format!(
        "recalibration (variance_scaling, fitted on validation), {} split\n{:<12} {:>8} {:>17} {:>17} {:>19} {:>19}\n",
        after.split, "target", "std ×", "cal.err", "cov90", "nll", "crps"
    );
    for ((b, a), k) in before.targets.iter().zip(&after.targets).zip(scale) {
        s.push_str(&format!(
            "{:<12} {:>8.4} {:>17} {:>17} {:>19} {:>19}\n",
            a.target,
            k,
            format!("{:.3} → {:.3}", b.calibration_error, a.calibration_error),
            format!("{:.3} → {:.3}", b.coverage_90, a.coverage_90),
            format!("{:.4} → {:.4}", b.nll_model, a.nll_model),
            format!("{:.3e} → {:.3e}", b.crps_model, a.crps_model),
        ));
    }
    s
}
