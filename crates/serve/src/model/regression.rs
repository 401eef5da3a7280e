//! The regression model: a checkpoint served as FP32 `features` `[B, F]` → FP32 `mean` and
//! `std` `[B, k]` in original units, as `kiln predict` computes them.
//!
//! A checkpoint whose inputs are not plain numbers (categorical columns, imputed columns,
//! missing indicators) takes one input per raw column instead — FP32 `[B]` for a numeric
//! column (NaN = missing), BYTES `[B]` for a categorical one (empty, `NaN`, `NA` or `null` =
//! missing, as in a file) —
//! and applies the checkpoint's preprocessing exactly as `kiln predict` does on a file.

use std::sync::Arc;

use serde_json::Value;

use super::{
    FEATURES_INPUT, Instance, InstanceError, LoadError, ModelInput, ModelKind, ModelSpec,
    TensorSpec, check_batch,
};
use crate::artifact::Checkpoint;
use crate::infer::{EngineKind, build_engine};
use crate::predict::{Prediction, Predictor};
use crate::protocol::{Datatype, InputTensor, OutputData, OutputTensor, ProtocolError};
use crate::records::RegressionDescription;
use kiln_model::preprocess::EncodeCounts;

/// How `mean` and `std` relate to the network's outputs (the `convention` parameter of both
/// outputs in the model metadata; the README's *Output convention*).
pub const OUTPUT_CONVENTION: &str = "original units: mean = mean_norm * target_std + target_mean; \
std = exp(0.5 * logvar) * target_std, where the network predicts mean_norm and logvar for \
targets normalised as (y - target_mean) / target_std with the training split's statistics";

impl ModelSpec {
    /// The regression model of a checkpoint.
    pub fn regression(ckpt: Arc<Checkpoint>) -> Self {
        let f = ckpt.manifest.features.len() as i64;
        let k = ckpt.manifest.targets.len() as i64;
        let pre = ckpt.manifest.input_preprocessing();
        let inputs = if pre.is_plain() {
            let mut input = TensorSpec::new(FEATURES_INPUT, Datatype::Fp32, &[-1, f]);
            input.parameters.insert(
                "feature_names".into(),
                Value::String(ckpt.manifest.feature_names().join(",")),
            );
            vec![input]
        } else {
            pre.inputs
                .iter()
                .map(|c| {
                    let dt = if c.categories.is_some() || c.date.is_some() {
                        Datatype::Bytes
                    } else {
                        Datatype::Fp32
                    };
                    let mut t = TensorSpec::new(&c.name, dt, &[-1]);
                    let missing = if !c.accepts_missing() {
                        "refused"
                    } else if c.categories.is_some() {
                        "an empty string (or NaN, NA, null); goes to the unknown bucket"
                    } else if c.date.is_some() {
                        "an empty string (or NaN, NA, null); imputed"
                    } else {
                        "NaN; imputed"
                    };
                    t.parameters
                        .insert("missing".into(), Value::String(missing.into()));
                    if let Some(cats) = &c.categories {
                        t.parameters
                            .insert("categories".into(), Value::from(cats.len()));
                    }
                    if let Some(d) = &c.date {
                        let parts: Vec<&str> = d.parts.iter().map(|p| p.name()).collect();
                        t.parameters
                            .insert("date_parts".into(), Value::String(parts.join(",")));
                    }
                    t
                })
                .collect()
        };
        let mut mean = TensorSpec::new("mean", Datatype::Fp32, &[-1, k]);
        let mut std = TensorSpec::new("std", Datatype::Fp32, &[-1, k]);
        let targets = Value::String(ckpt.manifest.target_names().join(","));
        mean.parameters
            .insert("target_names".into(), targets.clone());
        std.parameters.insert("target_names".into(), targets);
        for out in [&mut mean, &mut std] {
            let c = Value::String(OUTPUT_CONVENTION.into());
            out.parameters.insert("convention".into(), c);
        }
        Self {
            kind: ModelKind::Regression(ckpt),
            inputs,
            outputs: vec![mean, std],
        }
    }
}

impl ModelSpec {
    /// What the `auto` engine chose for this model's network in this process at `threads`
    /// per call and these `buckets` (`None` for a pick model, or before that selection).
    pub fn auto_choice(
        &self,
        threads: usize,
        buckets: &[usize],
    ) -> Option<crate::infer::AutoChoice> {
        match &self.kind {
            ModelKind::Regression(c) => {
                crate::infer::auto::choice_for(&c.weights, threads, buckets)
            }
            ModelKind::Pick(_) => None,
        }
    }
}

/// The model-configuration fields of a regression model.
pub(super) fn describe(c: &Checkpoint) -> RegressionDescription {
    let m = &c.manifest;
    RegressionDescription {
        features: m.features.clone(),
        preprocessing: m.preprocessing.as_ref().map(|p| p.inputs.clone()),
        targets: m.targets.clone(),
        architecture: m.architecture.clone(),
        weights_sha256: m.weights.sha256.clone(),
        run_id: m.run_id.clone(),
    }
}

/// Decode one input per raw column through the checkpoint's preprocessing (`given` in the
/// order of the preprocessing's inputs).
pub(super) fn decode_columns(
    pre: &kiln_model::preprocess::Preprocessing,
    given: &[&InputTensor],
    max_batch: usize,
    mut counts: Option<&mut EncodeCounts>,
) -> Result<ModelInput, ProtocolError> {
    use kiln_model::preprocess::RawValue;
    let rows = match given.first() {
        Some(t) if matches!(t.shape.as_slice(), [_] | [_, 1]) => t.shape[0],
        Some(t) => {
            return Err(ProtocolError(format!(
                "input `{}` has shape {:?}; expected [-1] (one value per row) or [-1, 1]",
                t.name, t.shape
            )));
        }
        None => return Err(ProtocolError("request has no inputs".into())),
    };
    check_batch(&given[0].name, rows, max_batch)?;
    enum Column<'a> {
        Numbers(Vec<f32>),
        Text(&'a [String]),
    }
    let mut columns = Vec::with_capacity(given.len());
    for (t, col) in given.iter().zip(&pre.inputs) {
        if !matches!(t.shape.as_slice(), [r] | [r, 1] if *r == rows) {
            return Err(ProtocolError(format!(
                "input `{}` has shape {:?}; expected [{rows}] like input `{}` (one value per row)",
                t.name, t.shape, given[0].name
            )));
        }
        columns.push(if col.categories.is_some() || col.date.is_some() {
            if t.datatype != Datatype::Bytes {
                return Err(ProtocolError(format!(
                    "input `{}` has datatype {}; expected BYTES (a {} column: send its values as strings)",
                    t.name,
                    t.datatype,
                    if col.date.is_some() { "date" } else { "categorical" }
                )));
            }
            Column::Text(t.to_strings()?)
        } else {
            Column::Numbers(t.to_f32_with_nan()?)
        });
    }
    let mut x = Vec::with_capacity(rows * pre.n_features());
    let mut values = Vec::with_capacity(columns.len());
    for r in 0..rows {
        values.clear();
        values.extend(columns.iter().map(|c| match c {
            Column::Numbers(v) if v[r].is_nan() => RawValue::Missing,
            Column::Numbers(v) => RawValue::Number(v[r] as f64),
            // The missing spellings of a file (empty, NaN, NA, null), as `kiln predict` reads.
            Column::Text(s) => RawValue::cell(&s[r]),
        }));
        let locate = |column: &str, message: String| {
            ProtocolError(format!("input `{column}` row {r}: {message}"))
        };
        pre.push_values(&values, &mut x, &locate, counts.as_deref_mut())?;
    }
    Ok(ModelInput::Regression { x, rows })
}

/// Check the `features` input against the checkpoint and decode its rows; a NaN cell of a
/// column with a serving fallback (the training median) gets it, counted in `counts`.
pub(super) fn decode(
    c: &Checkpoint,
    t: &InputTensor,
    max_batch: usize,
    counts: Option<&mut EncodeCounts>,
) -> Result<ModelInput, ProtocolError> {
    let f = c.manifest.features.len();
    if t.datatype != Datatype::Fp32 {
        return Err(ProtocolError(format!(
            "input `{}` has datatype {}; expected FP32",
            t.name, t.datatype
        )));
    }
    if t.shape.len() != 2 || t.shape[1] != f {
        return Err(ProtocolError(format!(
            "input `{}` has shape {:?}; expected [-1, {f}] (rows × the {f} features {})",
            t.name,
            t.shape,
            c.manifest.feature_names().join(", ")
        )));
    }
    check_batch(&t.name, t.shape[0], max_batch)?;
    let fallback: Vec<Option<f64>> = match &c.manifest.preprocessing {
        Some(p) if p.inputs.len() == f => p.inputs.iter().map(|c| c.missing_value()).collect(),
        _ => Vec::new(),
    };
    if fallback.iter().all(Option::is_none) {
        return Ok(ModelInput::Regression {
            x: t.to_f32()?,
            rows: t.shape[0],
        });
    }
    let mut x = t.to_f32_with_nan()?;
    let mut missing = vec![0usize; f];
    for (i, v) in x.iter_mut().enumerate() {
        if v.is_nan() {
            match fallback[i % f] {
                Some(m) => {
                    *v = m as f32;
                    missing[i % f] += 1;
                }
                // The refusal, worded as for any non-finite value.
                None => return Err(t.to_f32().expect_err("a NaN is refused")),
            }
        }
    }
    if let Some(n) = counts
        && missing.iter().any(|&m| m > 0)
    {
        n.imputed = missing;
    }
    Ok(ModelInput::Regression {
        x,
        rows: t.shape[0],
    })
}

/// Build a regression instance; the engine warms up over `buckets` first.
pub(super) fn build(
    c: &Checkpoint,
    engine: EngineKind,
    threads: usize,
    buckets: &[usize],
) -> Result<Box<dyn Instance>, LoadError> {
    let mut e = build_engine(engine, &c.weights, threads)?;
    e.warm_up(buckets)?;
    if engine == EngineKind::Int8
        && let Some(note) = crate::infer::auto::int8_notice_once(&c.weights, threads, buckets)?
    {
        tracing::warn!("{note}");
    }
    let pad = engine.is_cuda();
    Ok(Box::new(RegressionInstance {
        predictor: Predictor::new(e, &c.manifest.features, &c.manifest.targets),
        placeholder: c.manifest.features.iter().map(|s| s.mean as f32).collect(),
        k: c.manifest.targets.len(),
        pad_to_bucket: pad,
        x: Vec::new(),
        out: Prediction {
            mean: Vec::new(),
            std: Vec::new(),
        },
        engine_time: None,
    }))
}

/// Runs regression batches through one engine.
struct RegressionInstance {
    predictor: Predictor,
    placeholder: Vec<f32>,
    k: usize,
    /// Shape-specialised engines (CUDA) see only warmed bucket sizes.
    pad_to_bucket: bool,
    x: Vec<f32>,
    out: Prediction,
    /// The engine's time on the last batch.
    engine_time: Option<std::time::Duration>,
}

impl Instance for RegressionInstance {
    fn inline_ok(&self) -> bool {
        // Device engines stay on the thread that built them.
        !self.pad_to_bucket
    }

    fn engine_time(&self) -> Option<std::time::Duration> {
        self.engine_time
    }

    fn warm_up(&mut self, rows: usize) -> Result<(), InstanceError> {
        let x: Vec<f32> = self
            .placeholder
            .iter()
            .copied()
            .cycle()
            .take(rows * self.placeholder.len())
            .collect();
        self.predictor.predict_into(&x, rows, &mut self.out)?;
        let bad = self
            .out
            .mean
            .iter()
            .chain(&self.out.std)
            .filter(|v| !v.is_finite())
            .count();
        if bad > 0 {
            return Err(InstanceError::NonFinite(format!(
                "{bad} non-finite outputs for {rows} rows at the training means"
            )));
        }
        Ok(())
    }

    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, InstanceError> {
        self.x.clear();
        let mut rows = 0;
        for i in inputs {
            match i {
                ModelInput::Regression { x, rows: r } => {
                    self.x.extend_from_slice(x);
                    rows += r;
                }
                ModelInput::Pick(_) | ModelInput::PickRows { .. } => {
                    return Err(InstanceError::WrongInput(
                        "a pick input reached a regression model",
                    ));
                }
            }
        }
        if self.pad_to_bucket {
            let b = rows.next_power_of_two();
            for _ in rows..b {
                self.x.extend_from_slice(&self.placeholder);
            }
            rows = b;
        }
        let t0 = std::time::Instant::now();
        self.predictor.predict_into(&self.x, rows, &mut self.out)?;
        self.engine_time = Some(t0.elapsed());
        let k = self.k;
        let mut start = 0;
        Ok(inputs
            .iter()
            .map(|i| {
                let r = i.rows();
                let span = start * k..(start + r) * k;
                start += r;
                vec![
                    OutputTensor {
                        name: "mean".into(),
                        shape: vec![r, k],
                        data: OutputData::F32(self.out.mean[span.clone()].to_vec()),
                    },
                    OutputTensor {
                        name: "std".into(),
                        shape: vec![r, k],
                        data: OutputData::F32(self.out.std[span].to_vec()),
                    },
                ]
            })
            .collect())
    }
}
