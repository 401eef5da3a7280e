//! Prediction in original units: the manifest's normalisation (and any target transform,
//! [`crate::stats::TargetTransform`]) around an inference engine.

use crate::artifact::Checkpoint;
use crate::infer::{Engine, HeadOutput, InferError};
use crate::stats::{Affine, ColumnStats};

/// Predictions in original units, row-major `rows × k`. For a transformed target these are
/// the predictive distribution's mean and standard deviation in original units
/// ([`crate::stats::TargetTransform::moments`]); its intervals are not `mean ± z·std` but
/// [`Predictor::quantiles_into`].
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Predicted means.
    pub mean: Vec<f32>,
    /// Predicted standard deviations.
    pub std: Vec<f32>,
}

/// An engine plus the checkpoint's normalisation.
pub struct Predictor {
    engine: Box<dyn Engine>,
    x_norm: Affine,
    targets: Vec<ColumnStats>,
    scratch_x: Vec<f32>,
    scratch_out: HeadOutput,
}

impl Predictor {
    /// Wrap an engine with the normalisation of `features` and `targets`.
    pub fn new(engine: Box<dyn Engine>, features: &[ColumnStats], targets: &[ColumnStats]) -> Self {
        Self {
            engine,
            x_norm: Affine::new(features),
            targets: targets.to_vec(),
            scratch_x: Vec::new(),
            scratch_out: HeadOutput::default(),
        }
    }

    /// For a loaded checkpoint.
    pub fn for_checkpoint(ckpt: &Checkpoint, engine: Box<dyn Engine>) -> Self {
        Self::new(engine, &ckpt.manifest.features, &ckpt.manifest.targets)
    }

    /// Features per row.
    pub fn n_features(&self) -> usize {
        self.x_norm.scale.len()
    }

    /// Targets per row.
    pub fn n_targets(&self) -> usize {
        self.targets.len()
    }

    /// The targets' normalisation and transforms.
    pub fn targets(&self) -> &[ColumnStats] {
        &self.targets
    }

    /// The engine's name.
    pub fn engine_name(&self) -> String {
        self.engine.name()
    }

    /// Predict `rows` raw feature rows (`rows × n_features`, original units).
    pub fn predict(&mut self, x_raw: &[f32], rows: usize) -> Result<Prediction, InferError> {
        let mut p = Prediction {
            mean: Vec::new(),
            std: Vec::new(),
        };
        self.predict_into(x_raw, rows, &mut p)?;
        Ok(p)
    }

    /// Like [`Predictor::predict`], reusing `out`'s buffers.
    pub fn predict_into(
        &mut self,
        x_raw: &[f32],
        rows: usize,
        out: &mut Prediction,
    ) -> Result<(), InferError> {
        crate::infer::check_shape(x_raw, rows, self.n_features())?;
        {
            let _s = crate::prof_span!("normalize").entered();
            self.scratch_x.clear();
            self.scratch_x.extend_from_slice(x_raw);
            self.x_norm.apply(&mut self.scratch_x);
        }
        {
            let _s = crate::prof_span!("engine_forward").entered();
            self.engine
                .forward(&self.scratch_x, rows, &mut self.scratch_out)?;
        }
        let _s = crate::prof_span!("denormalize").entered();
        out.mean.clear();
        out.std.clear();
        for (t, mu, sd) in self.modelled() {
            let (mean, std) = t.transform.moments(mu, sd);
            out.mean.push(mean as f32);
            out.std.push(std as f32);
        }
        Ok(())
    }

    /// Every output of the last forward pass in the space the network models (the target's
    /// transformed space): its target, μ and σ, row-major.
    fn modelled(&self) -> impl Iterator<Item = (&ColumnStats, f64, f64)> + '_ {
        let k = self.targets.len();
        self.scratch_out
            .mean
            .iter()
            .zip(&self.scratch_out.log_var)
            .enumerate()
            .map(move |(i, (&m, &lv))| {
                let t = &self.targets[i % k];
                (
                    t,
                    m as f64 * t.std + t.mean,
                    (0.5 * lv as f64).exp() * t.std,
                )
            })
    }

    /// Whether any target is modelled through a transform (its intervals are then
    /// asymmetric: see [`Predictor::quantiles_into`]).
    pub fn has_transform(&self) -> bool {
        self.targets.iter().any(|t| !t.transform.is_none())
    }

    /// The `p` quantile in original units of every output of the last
    /// [`Predictor::predict_into`] (row-major `rows × k`, into `out`): `μ + σ·Φ⁻¹(p)` mapped
    /// through the target's inverse transform, so a transformed target's interval respects
    /// its support.
    pub fn quantiles_into(&self, p: f64, out: &mut Vec<f32>) {
        out.clear();
        out.extend(
            self.modelled()
                .map(|(t, mu, sd)| t.transform.quantile(mu, sd, p) as f32),
        );
    }
}
