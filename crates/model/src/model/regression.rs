//! `RegressionNet`: an MLP backbone with a mean head and a log-variance head.
//!
//! ```text
//! x ─► Linear ─► act ─► … ─► Linear ─► act ─► h ─┬─► mean_head   ─► μ        (k)
//!                  backbone                       └─► logvar_head ─► log σ²   (k)
//! ```
//!
//! Built from [`RegressionNetConfig`] by `init(device)`; weights are drawn from kiln's seeded
//! generator with PyTorch's `nn.Linear` default (U(−1/√fan_in, 1/√fan_in) for weights and
//! biases), so a run's initial weights depend only on its seed.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

/// Stream label for weight initialisation.
const INIT_STREAM: u64 = 0x494e_4954;

/// Hidden-layer activation.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash, strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Activation {
    /// max(x, 0).
    #[default]
    Relu,
    /// Gaussian error linear unit, the exact (erf) form `x/2 · (1 + erf(x/√2))` (Burn's
    /// `gelu`; `fused` and the GPU kernel compute the same).
    Gelu,
    /// Hyperbolic tangent.
    Tanh,
    /// x · sigmoid(x).
    Silu,
}

impl Activation {
    /// The lowercase name used in configs and manifests.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The architecture: everything needed to rebuild the network's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegressionNetConfig {
    /// Input features.
    pub n_features: usize,
    /// Backbone hidden widths.
    pub hidden: Vec<usize>,
    /// Targets (outputs per head).
    pub n_targets: usize,
    /// Hidden activation.
    pub activation: Activation,
}

impl RegressionNetConfig {
    /// The reference network used by benchmarks: 20 → 48 → 48 → (3 + 3), ReLU, 3,654 parameters.
    pub fn reference() -> Self {
        Self {
            n_features: 20,
            hidden: vec![48, 48],
            n_targets: 3,
            activation: Activation::Relu,
        }
    }

    /// `(fan_in, fan_out)` of every linear layer in order: backbone…, mean head, log-var head.
    pub fn layer_shapes(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        let mut fan_in = self.n_features;
        for &w in &self.hidden {
            v.push((fan_in, w));
            fan_in = w;
        }
        v.push((fan_in, self.n_targets));
        v.push((fan_in, self.n_targets));
        v
    }

    /// Parameter count (weights and biases).
    pub fn num_params(&self) -> usize {
        self.layer_shapes().iter().map(|(i, o)| i * o + o).sum()
    }

    /// FLOPs per row of a forward pass (2 per multiply-add, plus bias adds).
    pub fn flops_per_row(&self) -> usize {
        self.layer_shapes().iter().map(|(i, o)| 2 * i * o).sum()
    }

    /// Build the network on `device` with weights drawn from `seed`.
    ///
    /// # Panics
    /// When a layer has a zero-sized dimension (no features, no targets or a hidden width of 0;
    /// config validation rejects each). Such a layer is a zero-element device tensor, which
    /// CubeCL's CUDA runtime rejects (`UnsupportedStrides`, reported late, at the next read of
    /// anything on the stream): refusing it here makes the mistake fail on every backend, in
    /// the CPU tests too, instead of only on a GPU.
    pub fn init<B: Backend>(&self, seed: u64, device: &B::Device) -> RegressionNet<B> {
        assert!(
            self.layer_shapes().iter().all(|&(i, o)| i > 0 && o > 0),
            "a RegressionNet with a zero-sized layer ({:?}) would create zero-element device \
             tensors (CubeCL's CUDA runtime rejects them: UnsupportedStrides)",
            self.layer_shapes()
        );
        let mut rng = SplitMix64::derive(seed, &[INIT_STREAM]);
        let mut layers: Vec<Linear<B>> = self
            .layer_shapes()
            .into_iter()
            .map(|(i, o)| {
                let bound = 1.0 / (i as f64).sqrt();
                let w: Vec<f32> = (0..i * o)
                    .map(|_| rng.uniform(-bound, bound) as f32)
                    .collect();
                let b: Vec<f32> = (0..o).map(|_| rng.uniform(-bound, bound) as f32).collect();
                linear_from(w, b, i, o, device)
            })
            .collect();
        let logvar_head = layers.pop().expect("two heads");
        let mean_head = layers.pop().expect("two heads");
        RegressionNet {
            backbone: layers,
            mean_head,
            logvar_head,
            activation: self.activation,
        }
    }
}

/// A `Linear` from host weights stored `[fan_in, fan_out]` row-major (Burn's layout).
pub fn linear_from<B: Backend>(
    w: Vec<f32>,
    b: Vec<f32>,
    fan_in: usize,
    fan_out: usize,
    device: &B::Device,
) -> Linear<B> {
    Linear {
        weight: Param::from_tensor(Tensor::from_data(
            TensorData::new(w, [fan_in, fan_out]),
            device,
        )),
        bias: Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(b, [fan_out]),
            device,
        ))),
    }
}

/// The two heads' outputs for a batch.
#[derive(Debug, Clone)]
pub struct RegressionOutput<B: Backend> {
    /// Predicted means (normalised target units), `[batch, k]`.
    pub mean: Tensor<B, 2>,
    /// Predicted log-variances (normalised target units), `[batch, k]`.
    pub log_var: Tensor<B, 2>,
}

/// The compact regression network.
#[derive(Module, Debug)]
pub struct RegressionNet<B: Backend> {
    /// Hidden layers.
    pub backbone: Vec<Linear<B>>,
    /// Mean head.
    pub mean_head: Linear<B>,
    /// Log-variance head.
    pub logvar_head: Linear<B>,
    /// Hidden activation (not a parameter).
    #[module(skip)]
    pub activation: Activation,
}

impl<B: Backend> RegressionNet<B> {
    /// The one forward pass: both heads on normalised features `[batch, n_features]`.
    ///
    /// Each module runs inside a profiler span named by its path (`RegressionNet/backbone/0`,
    /// …, `RegressionNet/mean_head`, `RegressionNet/logvar_head`); while the profiler
    /// records, the device is synchronised at the end of each, so the spans time finished
    /// work on asynchronous backends too.
    pub fn forward(&self, x: Tensor<B, 2>) -> RegressionOutput<B> {
        let _net = crate::prof_span!("module", path = "RegressionNet", shape = ?x.dims()).entered();
        let h = self.trunk(x);
        let mean = self.head(&self.mean_head, "RegressionNet/mean_head", h.clone());
        let log_var = self.head(&self.logvar_head, "RegressionNet/logvar_head", h);
        RegressionOutput { mean, log_var }
    }

    /// The mean head alone (the backbone, then the mean head): what a training step of a
    /// stage whose loss reads no log-variance computes, leaving the log-variance head's
    /// product out. Its values are [`Self::forward`]'s `mean`, bit for bit.
    pub fn forward_mean(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let _net = crate::prof_span!("module", path = "RegressionNet", shape = ?x.dims()).entered();
        let h = self.trunk(x);
        self.head(&self.mean_head, "RegressionNet/mean_head", h)
    }

    /// The backbone's hidden layers.
    fn trunk(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let device = x.device();
        let mut h = x;
        for (i, layer) in self.backbone.iter().enumerate() {
            // Underscored: a `no-spans` build compiles the span, its only reader, out.
            let _path = LAYER_PATHS
                .get(i)
                .copied()
                .unwrap_or("RegressionNet/backbone/n");
            let _s = crate::prof_span!("module", path = _path, shape = ?h.dims()).entered();
            h = layer_forward(layer, h, Some(self.activation));
            crate::observe::profiler::sync::<B>(&device);
        }
        h
    }

    /// One head (no activation) on the backbone's output, in its profiler span.
    fn head(&self, layer: &Linear<B>, _path: &'static str, h: Tensor<B, 2>) -> Tensor<B, 2> {
        let device = h.device();
        let _s = crate::prof_span!("module", path = _path, shape = ?h.dims()).entered();
        let out = layer_forward(layer, h, None);
        crate::observe::profiler::sync::<B>(&device);
        out
    }

    /// The architecture of this network.
    pub fn architecture(&self) -> RegressionNetConfig {
        let [n_features, _] = self
            .backbone
            .first()
            .map(|l| l.weight.dims())
            .unwrap_or_else(|| self.mean_head.weight.dims());
        RegressionNetConfig {
            n_features,
            hidden: self.backbone.iter().map(|l| l.weight.dims()[1]).collect(),
            n_targets: self.mean_head.weight.dims()[1],
            activation: self.activation,
        }
    }
}

/// Span names of the first backbone layers (static strings keep disabled spans free).
const LAYER_PATHS: [&str; 8] = [
    "RegressionNet/backbone/0",
    "RegressionNet/backbone/1",
    "RegressionNet/backbone/2",
    "RegressionNet/backbone/3",
    "RegressionNet/backbone/4",
    "RegressionNet/backbone/5",
    "RegressionNet/backbone/6",
    "RegressionNet/backbone/7",
];

/// `act(layer(x))`: one fused autodiff operation on the default training backend for ReLU or
/// no activation ([`super::fused_linear`]), Burn's `linear` and activation otherwise.
fn layer_forward<B: Backend>(
    layer: &Linear<B>,
    x: Tensor<B, 2>,
    act: Option<Activation>,
) -> Tensor<B, 2> {
    let x = match act {
        None | Some(Activation::Relu) => {
            match super::fused_linear::linear_act(layer, x, act.is_some()) {
                Ok(y) => return y,
                Err(x) => x,
            }
        }
        Some(_) => x,
    };
    let z = layer.forward(x);
    match act {
        Some(a) => apply_activation(z, a),
        None => z,
    }
}

/// Apply a hidden activation.
pub fn apply_activation<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    a: Activation,
) -> Tensor<B, D> {
    match a {
        Activation::Relu => activation::relu(x),
        Activation::Gelu => activation::gelu(x),
        Activation::Tanh => activation::tanh(x),
        Activation::Silu => activation::silu(x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// The 0-feature "stand-in" network the training session once built killed every CUDA run
    /// (zero-element tensors → `UnsupportedStrides`); building one now fails on any backend.
    #[test]
    #[should_panic(expected = "zero-element device tensors")]
    fn a_network_with_a_zero_sized_layer_is_refused() {
        let arch = RegressionNetConfig {
            n_features: 0,
            hidden: Vec::new(),
            n_targets: 0,
            activation: Default::default(),
        };
        let _ = arch.init::<Flex>(0, &Default::default());
    }

    #[test]
    fn reference_network_has_3654_parameters() {
        let cfg = RegressionNetConfig::reference();
        assert_eq!(cfg.num_params(), 3654);
        assert_eq!(cfg.flops_per_row(), 7104);
        let net = cfg.init::<Flex>(1, &Default::default());
        assert_eq!(net.num_params(), 3654);
        assert_eq!(net.architecture(), cfg);
        let out = net.forward(Tensor::zeros([5, 20], &Default::default()));
        assert_eq!(out.mean.dims(), [5, 3]);
        assert_eq!(out.log_var.dims(), [5, 3]);
    }

    #[test]
    fn init_is_a_function_of_the_seed() {
        let cfg = RegressionNetConfig::reference();
        let d = Default::default();
        let a = cfg.init::<Flex>(7, &d).mean_head.weight.val().into_data();
        let b = cfg.init::<Flex>(7, &d).mean_head.weight.val().into_data();
        let c = cfg.init::<Flex>(8, &d).mean_head.weight.val().into_data();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn the_mean_only_pass_is_the_full_pass_mean_bit_for_bit() {
        use burn::backend::Autodiff;
        let cfg = RegressionNetConfig::reference();
        let d = Default::default();
        let x: Vec<f32> = (0..7 * 20)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let net = cfg.init::<Autodiff<Flex>>(3, &d);
        let xt = || Tensor::<Autodiff<Flex>, 2>::from_data(TensorData::new(x.clone(), [7, 20]), &d);
        let full = net.forward(xt()).mean.into_data();
        let mean = net.forward_mean(xt());
        assert_eq!(mean.clone().into_data(), full);
        // Its gradient reaches the backbone and the mean head, never the log-variance head.
        let g = mean.sum().backward();
        let gp = burn::optim::GradientsParams::from_grads(g, &net);
        assert!(gp.get::<Flex, 2>(net.mean_head.weight.id).is_some());
        assert!(gp.get::<Flex, 2>(net.backbone[0].weight.id).is_some());
        assert!(gp.get::<Flex, 2>(net.logvar_head.weight.id).is_none());
    }
}
