//! The end of a training session: the instruments' outputs, the bottleneck verdict, the final
//! evaluation on every split, the manifest and the atomic export.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use super::distill::{normalised_predictions, side_by_side};
use super::evaluate::{
    EvalReport, evaluate_weighted, predict_split, residual_correlation, residual_variance,
    variance_scales,
};
use super::job::{TrainError, TrainOutcome, Trained, io_err, summarise};
use super::session::Session;
use crate::artifact::{self, CalibrationInfo, DatasetInfo, HostWeights, Manifest};
use crate::config::Calibration;
use crate::data::Subset;
use crate::observe::resources;
use crate::observe::verdict::{self, Verdict};
use crate::records::metrics::ManifestMetrics;

impl<B: AutodiffBackend> Session<'_, '_, B> {
    /// Close the instruments, judge the bottleneck, evaluate and export the checkpoint.
    pub(crate) fn finish(mut self) -> Result<Trained<B>, TrainError> {
        self.close_instruments()?;
        let verdict = self.verdict()?;
        let job = self.job;
        let cfg = &job.config.config;
        let run = &job.run;
        let prep = &self.prep;
        let data = &prep.data;
        let arch = &prep.arch;
        let device = &self.device;
        let nf = arch.n_features;

        let stages = summarise(cfg, &self.progress.history);
        let mut inner = self.model.valid();
        let train_pred = predict_split(&inner, &data.train.x, &self.x_aff, device);
        let const_var = residual_variance(&train_pred, &data.train.y, &prep.y_stats);
        let vpred = predict_split(&inner, &data.validation.x, &self.x_aff, device);
        let corr = residual_correlation(&vpred, &data.validation.y, &prep.y_stats);
        let persistence = prep.persistence_features();
        let eval = |name: &str, pred: &_, split: &Subset| {
            evaluate_weighted(
                name,
                pred,
                split,
                nf,
                &prep.y_stats,
                &persistence,
                &const_var,
                split.weights(),
            )
        };
        let mut weights = HostWeights::from_model(&inner);
        // Recalibration: fit on validation, fold ln s² into the log-variance bias, and judge the
        // network that is exported (so the reports describe exactly what every consumer serves).
        let mut before: Option<EvalReport> = None;
        let mut calibration = None;
        if let Some(Calibration::VarianceScaling) = cfg.calibration {
            let s2 = variance_scales(
                &vpred,
                &data.validation.y,
                &prep.y_stats,
                data.validation.weights(),
            );
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
            let tpred = predict_split(&inner, &data.test.x, &self.x_aff, device);
            before = Some(eval("test", &tpred, &data.test));
            for (b, s) in weights.logvar_head.b.iter_mut().zip(&s2) {
                *b = (*b as f64 + s.ln()) as f32;
            }
            inner = weights.to_model(device);
            calibration = Some(CalibrationInfo {
                method: "variance_scaling".into(),
                fitted_on: "validation".into(),
                std_scale: s2.iter().map(|v| v.sqrt()).collect(),
                applied_in: "logvar_head.bias (+ ln s²)".into(),
            });
        }
        let vpred = predict_split(&inner, &data.validation.x, &self.x_aff, device);
        let vreport = eval("validation", &vpred, &data.validation);
        let tpred = predict_split(&inner, &data.test.x, &self.x_aff, device);
        let report = eval("test", &tpred, &data.test);
        self.reporter.line(&report.table());
        self.reporter.line(&report.uncertainty_table());
        crate::observe::calibration::write_figures(&run.path, "test", &report.calibration_data())
            .map_err(io_err(&run.path))?;
        if let (Some(b), Some(c)) = (&before, &calibration) {
            self.reporter
                .line(&recalibration_table(b, &report, &c.std_scale));
        }
        let teacher = job.teacher.filter(|_| cfg.distill.is_some());
        let teacher_report = match teacher {
            Some(t) => {
                let (m, sd) = t
                    .predict(&data.test.x, data.test.rows())
                    .map_err(TrainError::Distill)?;
                let tp = normalised_predictions(&m, &sd, &prep.y_stats);
                let r = evaluate_weighted(
                    "test",
                    &tp,
                    &data.test,
                    nf,
                    &prep.y_stats,
                    &prep.persistence_features(),
                    &const_var,
                    data.test.weights(),
                );
                self.reporter.line(&format!(
                    "student {} parameters; teacher {}\n{}",
                    arch.num_params(),
                    serde_json::to_string(&t.describe()).expect("teacher info serialises"),
                    side_by_side(&report, &r)
                ));
                Some(r)
            }
            None => None,
        };
        let teacher_info = teacher.map(|t| t.describe());

        // The split as resolved on this data (relative windows name the values they took).
        let split: std::collections::BTreeMap<String, String> = crate::data::split::SPLIT_NAMES
            .iter()
            .zip(&data.split_describe)
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let mut manifest = Manifest::new(artifact::ManifestParts {
            run_id: run.id.clone(),
            architecture: arch.clone(),
            features: prep.x_stats.clone(),
            targets: prep.y_stats.clone(),
            residual_correlation: corr,
            metrics: ManifestMetrics {
                beats_all_baselines: report.beats_all(),
                test: Some(report.clone()),
                validation: Some(vreport),
                stages: stages.clone(),
                bottleneck: Some(verdict.clone()),
                refit: cfg.refit_pass.as_ref().map(|r| r.provenance.clone()),
                test_before_calibration: before.clone(),
                // The registry row keeps the metrics: the teacher goes there too.
                teacher: teacher_info.clone(),
                teacher_test: teacher_report,
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
            config_sha256: self.config_sha.clone(),
            teacher: teacher_info,
        });
        manifest.calibration = calibration;
        manifest.preprocessing = Some(data.preprocessing.clone());
        // The serving tier's drift reference: the training inputs' sketches and the test
        // split's mean predicted std per target.
        manifest.drift = Some(crate::data::drift::DriftReference::fit(
            &data.preprocessing,
            &data.train.x,
            report.targets.iter().map(|t| t.sharpness).collect(),
        ));
        let export_dir = run.export_dir();
        if export_dir.exists() {
            // A previous process finished training and exported, then died before marking the
            // run finished: the export is complete (it is renamed into place atomically).
            std::fs::remove_dir_all(&export_dir).map_err(io_err(&export_dir))?;
        }
        let manifest = artifact::export(&export_dir, manifest, &weights)?;
        if let Some(h) = job.observer {
            h.on_export(run, &export_dir);
        }
        Ok(Trained {
            outcome: TrainOutcome {
                run: run.clone(),
                export_dir: Some(export_dir),
                report: Some(report),
                stages,
                parameter_count: arch.num_params(),
                manifest: Some(manifest),
                wall: self.started.elapsed(),
                verdict: Some(verdict),
            },
            model: Some(inner),
        })
    }

    /// Write the resource trace and judge the bottleneck from this process's epochs.
    fn verdict(&mut self) -> Result<Verdict, TrainError> {
        let cfg = &self.job.config.config;
        let here = self
            .monitor
            .take()
            .expect("the resource monitor runs until the session finishes")
            .stop();
        let trace = self.full_trace(here);
        let cpu_util = (resources::cpu_seconds().unwrap_or(self.cpu_start) - self.cpu_start)
            / (self.wall_start.elapsed().as_secs_f64() * resources::cores() as f64).max(1e-9);
        resources::write_trace(&trace, &self.job.run.path)?;
        let here = self.epochs_here();
        let verdict = verdict::verdict(&verdict::Timings {
            data_wait_s: here.iter().map(|r| r.data_wait_s).sum(),
            compute_s: here.iter().map(|r| r.compute_s).sum(),
            cpu_util,
            workers: self.workers,
            cores: resources::cores(),
            batch_size: cfg.loader.batch_size,
        });
        self.reporter.line(&format!(
            "bottleneck: {} (data wait {:.0}% of step time, compute {:.0}%, CPU {:.0}% of {} cores, peak RSS {:.0} MiB) — {}",
            verdict.bound.label(),
            verdict.data_wait_frac * 100.0,
            verdict.compute_frac * 100.0,
            verdict.cpu_util * 100.0,
            resources::cores(),
            trace.peak_rss_mb(),
            verdict.advice
        ));
        Ok(verdict)
    }
}

/// Test calibration before and after recalibration, per target.
pub(crate) fn recalibration_table(
    before: &EvalReport,
    after: &EvalReport,
    scale: &[f64],
) -> String {
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
