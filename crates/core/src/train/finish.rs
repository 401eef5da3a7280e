//! The end of a training session: the instruments' outputs, the bottleneck verdict, the final
//! evaluation on every split, the manifest and the atomic export.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use super::distill::{normalised_predictions, side_by_side};
use super::evaluate::{evaluate, predict_split, residual_correlation, residual_variance};
use super::job::{TrainError, TrainOutcome, Trained, io_err, summarise};
use super::session::Session;
use crate::artifact::{self, DatasetInfo, HostWeights, Manifest};
use crate::observe::resources;
use crate::observe::verdict::{self, Verdict};

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
        let inner = self.model.valid();
        let train_pred = predict_split(&inner, &data.train.x, &self.x_aff, device);
        let const_var = residual_variance(&train_pred, &data.train.y, &prep.y_stats);
        let vpred = predict_split(&inner, &data.validation.x, &self.x_aff, device);
        let corr = residual_correlation(&vpred, &data.validation.y, &prep.y_stats);
        let tpred = predict_split(&inner, &data.test.x, &self.x_aff, device);
        let report = evaluate(
            "test",
            &tpred,
            &data.test,
            nf,
            &prep.y_stats,
            &prep.persistence_features(),
            &const_var,
        );
        self.reporter.line(&report.table());
        let teacher = job.teacher.filter(|_| cfg.distill.is_some());
        let teacher_report = match teacher {
            Some(t) => {
                let (m, sd) = t
                    .predict(&data.test.x, data.test.rows())
                    .map_err(TrainError::Distill)?;
                let tp = normalised_predictions(&m, &sd, &prep.y_stats);
                let r = evaluate(
                    "test",
                    &tp,
                    &data.test,
                    nf,
                    &prep.y_stats,
                    &prep.persistence_features(),
                    &const_var,
                );
                self.reporter.line(&format!(
                    "student {} parameters; teacher {}\n{}",
                    arch.num_params(),
                    t.describe(),
                    side_by_side(&report, &r)
                ));
                Some(r)
            }
            None => None,
        };
        let teacher_info = teacher.map(|t| t.describe());

        let weights = HostWeights::from_model(&inner);
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
            metrics: {
                let mut m = serde_json::json!({
                    "test": report,
                    "stages": stages,
                    "beats_all_baselines": report.beats_all(),
                    "bottleneck": verdict,
                });
                // The registry row keeps the metrics: the teacher goes there too.
                if let (Some(info), Some(obj)) = (&teacher_info, m.as_object_mut()) {
                    obj.insert("teacher".into(), info.clone());
                    obj.insert(
                        "teacher_test".into(),
                        serde_json::to_value(&teacher_report).expect("report serialises"),
                    );
                }
                m
            },
            dataset: DatasetInfo {
                path: cfg.data.path.display().to_string(),
                sha256: data.sha256.clone(),
                rows: [data.train.rows(), data.validation.rows(), data.test.rows()],
                split,
            },
            config_sha256: self.config_sha.clone(),
            teacher: teacher_info,
        });
        manifest.preprocessing = Some(data.preprocessing.clone());
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
        let trace = self
            .monitor
            .take()
            .expect("the resource monitor runs until the session finishes")
            .stop();
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
