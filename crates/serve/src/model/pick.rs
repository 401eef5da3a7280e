//! The pick model: B picks of L legs → FP64 `p` (P(all legs hit)), `se` and
//! `independent_p` `[B]`, computed by [`pick_probabilities`]. Its legs carry either their
//! outcome's moments (`mean`, `std`, `line`, `over`, `target`, `group` `[B, L]`) or a row
//! of features each (`features` `[B, L, F]`, `target`, `line`, `over` `[B, L]`) that the
//! checkpoint's network turns into moments. Its `pick.json` is read in
//! [`super::pick_config`].

use std::sync::Arc;

use serde_json::Value;

use super::{
    FEATURES_INPUT, Instance, InstanceError, LoadError, ModelInput, ModelKind, ModelSpec,
    PickModel, TensorSpec, check_batch,
};
use crate::artifact::Checkpoint;
use crate::infer::{EngineKind, build_engine};
use crate::predict::Predictor;
use crate::protocol::{Datatype, InputTensor, OutputData, OutputTensor, ProtocolError};
use crate::records::PickDescription;
use kiln_model::model::mvn::{HaltonMvnCdf, Leg, PickResult, Side, pick_probabilities, pick_query};

/// The float inputs of a pick whose legs carry moments, in input order.
const PICK_FLOAT_INPUTS: [&str; 3] = ["mean", "std", "line"];

impl ModelSpec {
    /// The pick model.
    pub fn pick(pick: Arc<PickModel>) -> Self {
        let outputs = ["p", "se", "independent_p"]
            .iter()
            .map(|n| TensorSpec::new(n, Datatype::Fp64, &[-1]))
            .collect();
        if let Some(net) = &pick.network {
            let f = net.manifest.features.len() as i64;
            let mut features = TensorSpec::new(FEATURES_INPUT, Datatype::Fp32, &[-1, -1, f]);
            features.parameters.insert(
                "feature_names".into(),
                Value::String(net.manifest.feature_names().join(",")),
            );
            let mut target = TensorSpec::new("target", Datatype::I32, &[-1, -1]);
            target
                .parameters
                .insert("target_names".into(), Value::String(pick.targets.join(",")));
            return Self {
                kind: ModelKind::Pick(pick),
                inputs: vec![
                    features,
                    target,
                    TensorSpec::new("line", Datatype::Fp64, &[-1, -1]),
                    TensorSpec::new("over", Datatype::Bool, &[-1, -1]),
                ],
                outputs,
            };
        }
        let mut inputs: Vec<TensorSpec> = PICK_FLOAT_INPUTS
            .iter()
            .map(|n| TensorSpec::new(n, Datatype::Fp64, &[-1, -1]))
            .collect();
        inputs.push(TensorSpec::new("over", Datatype::Bool, &[-1, -1]));
        let mut target = TensorSpec::new("target", Datatype::I32, &[-1, -1]);
        target
            .parameters
            .insert("target_names".into(), Value::String(pick.targets.join(",")));
        inputs.push(target);
        inputs.push(TensorSpec::new("group", Datatype::I32, &[-1, -1]));
        Self {
            kind: ModelKind::Pick(pick),
            inputs,
            outputs,
        }
    }
}

/// The model-configuration fields of a pick model.
pub(super) fn describe(p: &PickModel) -> PickDescription {
    PickDescription {
        targets: p.targets.clone(),
        target_corr: p.corr.target_corr.clone(),
        cross_row_corr: p.corr.cross_row_corr.clone(),
        points: p.estimator.points,
        randomizations: p.estimator.randomizations,
        method: p.estimator.method.name().to_string(),
        max_legs: p.estimator.max_dim,
        legs_from: if p.network.is_some() {
            "features"
        } else {
            "moments"
        }
        .to_string(),
        features: p.network.as_ref().map(|n| n.manifest.features.clone()),
    }
}

/// Check a request's inputs (in model order) against the pick model and decode the picks.
pub(super) fn decode(
    p: &PickModel,
    given: &[&InputTensor],
    max_batch: usize,
) -> Result<ModelInput, ProtocolError> {
    match &p.network {
        Some(net) => decode_rows(p, net, given, max_batch),
        None => decode_moments(p, given, max_batch),
    }
}

/// Refuse picks with no legs, or more than the estimator answers.
fn check_legs(p: &PickModel, l: usize) -> Result<(), ProtocolError> {
    if l == 0 || l > p.estimator.max_dim {
        return Err(ProtocolError(format!(
            "picks have {l} legs; expected 1 to {} legs",
            p.estimator.max_dim
        )));
    }
    Ok(())
}

/// Picks whose legs carry a row of features: `features`, `target`, `line`, `over`.
fn decode_rows(
    p: &PickModel,
    net: &Checkpoint,
    given: &[&InputTensor],
    max_batch: usize,
) -> Result<ModelInput, ProtocolError> {
    let f = net.manifest.features.len();
    let (feat, rest) = (given[0], &given[1..]);
    if feat.shape.len() != 3 || feat.shape[2] != f {
        return Err(ProtocolError(format!(
            "input `{}` has shape {:?}; expected [picks, legs, {f}] (a row of the {f} features per leg)",
            feat.name, feat.shape
        )));
    }
    let (b, l) = (feat.shape[0], feat.shape[1]);
    for t in rest {
        if t.shape != [b, l] {
            return Err(ProtocolError(format!(
                "input `{}` has shape {:?}; expected [{b}, {l}] (picks × legs, as `{}`)",
                t.name, t.shape, feat.name
            )));
        }
    }
    check_batch(&feat.name, b, max_batch)?;
    check_legs(p, l)?;
    let target = rest[0].to_i32()?;
    let k = p.corr.targets;
    if let Some(j) = target.iter().position(|&t| t < 0 || t as usize >= k) {
        return Err(ProtocolError(format!(
            "pick {} leg {}: target is {}; expected an index from 0 to {}",
            j / l,
            j % l,
            target[j],
            k - 1
        )));
    }
    Ok(ModelInput::PickRows {
        x: feat.to_f32()?,
        target: target.into_iter().map(|t| t as usize).collect(),
        line: rest[1].to_f64()?,
        over: rest[2].to_bool()?,
        picks: b,
        legs: l,
    })
}

/// Picks whose legs carry moments: `mean`, `std`, `line`, `over`, `target`, `group`.
fn decode_moments(
    p: &PickModel,
    given: &[&InputTensor],
    max_batch: usize,
) -> Result<ModelInput, ProtocolError> {
    let shape = &given[0].shape;
    for t in given {
        if t.shape.len() != 2 || t.shape != *shape {
            return Err(ProtocolError(format!(
                "input `{}` has shape {:?}; expected [picks, legs], the same for every input ({:?} for `{}`)",
                t.name, t.shape, shape, given[0].name
            )));
        }
    }
    let (b, l) = (shape[0], shape[1]);
    check_batch(&given[0].name, b, max_batch)?;
    check_legs(p, l)?;
    let mean = given[0].to_f64()?;
    let std = given[1].to_f64()?;
    let line = given[2].to_f64()?;
    let over = given[3].to_bool()?;
    let target = given[4].to_i32()?;
    let group = given[5].to_i32()?;
    if let Some(j) = target.iter().position(|&t| t < 0) {
        return Err(ProtocolError(format!(
            "pick {} leg {}: target is {}; expected an index from 0 to {}",
            j / l,
            j % l,
            target[j],
            p.corr.targets - 1
        )));
    }
    let mut picks = Vec::with_capacity(b);
    for i in 0..b {
        let legs: Vec<Leg> = (i * l..(i + 1) * l)
            .map(|j| Leg {
                group: group[j].to_string(),
                target: target[j] as usize,
                mean: mean[j],
                std: std[j],
                line: line[j],
                side: if over[j] { Side::Over } else { Side::Under },
            })
            .collect();
        pick_query(&legs, &p.corr).map_err(|e| ProtocolError(format!("pick {i}: {e}")))?;
        picks.push(legs);
    }
    Ok(ModelInput::Pick(picks))
}

/// Build a pick instance: the estimator, and the network's engine (warmed over `buckets`)
/// when legs carry features.
pub(super) fn build(
    p: &Arc<PickModel>,
    engine: EngineKind,
    threads: usize,
    buckets: &[usize],
) -> Result<Box<dyn Instance>, LoadError> {
    let device = Default::default();
    let mvn = p
        .estimator
        .init::<crate::backend::Cpu>(&device)
        .map_err(|e| LoadError::Warmup(e.to_string()))?;
    let predictor = match &p.network {
        None => None,
        Some(c) => {
            let mut e = build_engine(engine, &c.weights, threads)?;
            e.warm_up(buckets)?;
            Some(Predictor::new(e, &c.manifest.features, &c.manifest.targets))
        }
    };
    Ok(Box::new(PickInstance {
        model: p.clone(),
        mvn,
        predictor,
    }))
}

/// Runs pick batches: the network's forward pass (feature legs), then the estimator.
struct PickInstance {
    model: Arc<PickModel>,
    mvn: HaltonMvnCdf<crate::backend::Cpu>,
    predictor: Option<Predictor>,
}

impl PickInstance {
    /// Legs of feature-row picks: one forward pass for every leg of the batch.
    fn legs_from_rows(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<Leg>>, InstanceError> {
        let Some(pred) = self.predictor.as_mut() else {
            return Err(InstanceError::WrongInput(
                "feature rows reached a pick model without a network",
            ));
        };
        let f = pred.n_features();
        let k = pred.n_targets();
        let mut x = Vec::new();
        let mut n = 0;
        for i in inputs {
            if let ModelInput::PickRows {
                x: xi, picks, legs, ..
            } = i
            {
                x.extend_from_slice(xi);
                n += picks * legs;
            }
        }
        let out = pred.predict(&x, n)?;
        let mut all = Vec::new();
        let mut row = 0;
        for i in inputs {
            if let ModelInput::PickRows {
                x: xi,
                target,
                line,
                over,
                picks,
                legs,
            } = i
            {
                for p in 0..*picks {
                    let legs: Vec<Leg> = (0..*legs)
                        .map(|j| {
                            let li = p * legs + j;
                            let r = &xi[li * f..(li + 1) * f];
                            // Legs on the same row of features share a group.
                            let g = (0..j)
                                .find(|&m| xi[(p * legs + m) * f..(p * legs + m + 1) * f] == *r)
                                .unwrap_or(j);
                            let o = (row + li) * k + target[li];
                            Leg {
                                group: g.to_string(),
                                target: target[li],
                                mean: out.mean[o] as f64,
                                std: out.std[o] as f64,
                                line: line[li],
                                side: if over[li] { Side::Over } else { Side::Under },
                            }
                        })
                        .collect();
                    all.push(legs);
                }
                row += picks * legs;
            }
        }
        Ok(all)
    }
}

impl Instance for PickInstance {
    fn warm_up(&mut self, rows: usize) -> Result<(), InstanceError> {
        let k = self.model.corr.targets;
        let input = match &self.model.network {
            Some(net) => {
                let row: Vec<f32> = net
                    .manifest
                    .features
                    .iter()
                    .map(|c| c.mean as f32)
                    .collect();
                ModelInput::PickRows {
                    x: row.repeat(2 * rows),
                    target: (0..2 * rows).map(|j| j % k).collect(),
                    line: vec![0.0; 2 * rows],
                    over: vec![true; 2 * rows],
                    picks: rows,
                    legs: 2,
                }
            }
            None => {
                let legs: Vec<Leg> = (0..2)
                    .map(|t| Leg {
                        group: "0".into(),
                        target: t % k,
                        mean: 0.0,
                        std: 1.0,
                        line: 0.0,
                        side: Side::Over,
                    })
                    .collect();
                ModelInput::Pick(vec![legs; rows])
            }
        };
        let out = self.execute(&[&input])?;
        let finite = out[0].iter().all(|t| match &t.data {
            OutputData::F64(v) => v.iter().all(|x| x.is_finite()),
            OutputData::F32(v) => v.iter().all(|x| x.is_finite()),
        });
        if !finite {
            return Err(InstanceError::NonFinite(
                "non-finite warm-up probability".into(),
            ));
        }
        Ok(())
    }

    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, InstanceError> {
        let from_rows = if inputs
            .iter()
            .any(|i| matches!(i, ModelInput::PickRows { .. }))
        {
            self.legs_from_rows(inputs)?
        } else {
            Vec::new()
        };
        let mut from_rows = from_rows.iter();
        let mut picks: Vec<&[Leg]> = Vec::new();
        for i in inputs {
            match i {
                ModelInput::Pick(p) => picks.extend(p.iter().map(|l| l.as_slice())),
                ModelInput::PickRows { picks: n, .. } => {
                    picks.extend(from_rows.by_ref().take(*n).map(|l| l.as_slice()))
                }
                ModelInput::Regression { .. } => {
                    return Err(InstanceError::WrongInput(
                        "a regression input reached a pick model",
                    ));
                }
            }
        }
        let results = pick_probabilities(&self.mvn, &picks, &self.model.corr)?;
        let mut it = results.into_iter();
        Ok(inputs
            .iter()
            .map(|i| {
                let r: Vec<_> = it.by_ref().take(i.rows()).collect();
                let col = |f: fn(&PickResult) -> f64| OutputData::F64(r.iter().map(f).collect());
                vec![
                    OutputTensor {
                        name: "p".into(),
                        shape: vec![r.len()],
                        data: col(|x| x.p),
                    },
                    OutputTensor {
                        name: "se".into(),
                        shape: vec![r.len()],
                        data: col(|x| x.se),
                    },
                    OutputTensor {
                        name: "independent_p".into(),
                        shape: vec![r.len()],
                        data: col(|x| x.independent_p),
                    },
                ]
            })
            .collect())
    }
}
