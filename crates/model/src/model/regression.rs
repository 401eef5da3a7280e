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
        self.init_members(seed, 1, device)
    }

    /// Build a packed ensemble of `members` independent networks on `device`, weights drawn
    /// from `seed`. `self` is the packed architecture: every hidden width is `members` times a
    /// member's width (see [`RegressionNet::members`] for the layout). One member is the plain
    /// network of [`Self::init`].
    ///
    /// Each member's layers get `nn.Linear`'s default for the member's own fan-in; the weights
    /// between members are zero (and stay zero: training masks them). The log-variance head is
    /// one dense layer over every member's features.
    ///
    /// # Panics
    /// When `members` is 0 or does not divide every hidden width, when an ensemble has no
    /// hidden layer (config validation refuses each), or on a zero-sized layer (see
    /// [`Self::init`]).
    pub fn init_members<B: Backend>(
        &self,
        seed: u64,
        members: usize,
        device: &B::Device,
    ) -> RegressionNet<B> {
        assert!(
            members >= 1 && self.hidden.iter().all(|w| w % members == 0),
            "{members} members do not divide the hidden widths {:?}",
            self.hidden
        );
        assert!(
            members == 1 || !self.hidden.is_empty(),
            "an ensemble's members are told apart by their hidden layers: it needs one"
        );
        let shapes = self.layer_shapes();
        assert!(
            shapes.iter().all(|&(i, o)| i > 0 && o > 0),
            "a RegressionNet with a zero-sized layer ({shapes:?}) would create zero-element \
             device tensors (CubeCL's CUDA runtime rejects them: UnsupportedStrides)"
        );
        let mut rng = SplitMix64::derive(seed, &[INIT_STREAM]);
        let last = shapes.len() - 1;
        let mut layers: Vec<Linear<B>> = shapes
            .into_iter()
            .enumerate()
            .map(|(l, (i, o))| {
                // The first layer reads the shared input and the log-variance head every
                // member's features (dense, whole fan-in); the mean head is each member's own
                // rows (dense, a member's fan-in); the hidden layers between are
                // block-diagonal, member by member. Weights row-major, then biases: one member
                // draws exactly the plain network's sequence.
                let (fan_in, blocks) = match l {
                    0 => (i, false),
                    l if l == last => (i, false),
                    l if l + 1 == last => (i / members, false),
                    _ => (i / members, true),
                };
                let (bi, bo) = (i / members, o / members);
                let bound = 1.0 / (fan_in as f64).sqrt();
                let mut w = vec![0f32; i * o];
                for (e, v) in w.iter_mut().enumerate() {
                    if !blocks || (e / o) / bi == (e % o) / bo {
                        *v = rng.uniform(-bound, bound) as f32;
                    }
                }
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
            members,
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
    /// Independent members packed side by side (1: one network). Member `m` owns columns
    /// `m·w .. (m+1)·w` of every hidden layer (`w` = the width ÷ `members`): the first layer
    /// reads the whole input, every later hidden layer is block-diagonal (the blocks between
    /// members are zero, and [`Self::forward_members`] masks them so they stay zero), and
    /// member `m`'s mean is its own rows of the mean head plus the shared bias. The ensemble's
    /// mean is the members' mean: [`Self::forward`] gives it, and [`Self::folded`] turns the
    /// network into the plain one every engine serves (the mean head divided by `members`).
    /// The log-variance head is one dense layer over all members' features: it is fitted to
    /// the ensemble mean's residuals, so the served variance is the ensemble's own.
    #[module(skip)]
    pub members: usize,
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
        let mean = self.ensemble_mean(h.clone());
        let log_var = self.head(&self.logvar_head, "RegressionNet/logvar_head", h);
        RegressionOutput { mean, log_var }
    }

    /// The members' own means `[members, batch, k]` beside the ensemble's outputs (the
    /// log-variance only when `log_var`): what a training step of a packed ensemble
    /// computes, so that each member is fitted on its own error. The ensemble mean is the
    /// members' mean.
    pub fn forward_members(&self, x: Tensor<B, 2>, log_var: bool) -> MemberOutput<B> {
        let _net = crate::prof_span!("module", path = "RegressionNet", shape = ?x.dims()).entered();
        let h = self.trunk(x);
        let [rows, width] = h.dims();
        let (m, k) = (self.members, self.mean_head.weight.dims()[1]);
        let members = {
            let _s =
                crate::prof_span!("module", path = "RegressionNet/mean_head", shape = ?h.dims())
                    .entered();
            // [rows, m·w] → [m, rows, w] @ [m, w, k] → [m, rows, k], plus the shared bias.
            let hm = h.clone().reshape([rows, m, width / m]).swap_dims(0, 1);
            let w = self.mean_head.weight.val().reshape([m, width / m, k]);
            let out = hm.matmul(w);
            match &self.mean_head.bias {
                Some(b) => out + b.val().reshape([1, 1, k]),
                None => out,
            }
        };
        let mean = members.clone().mean_dim(0).reshape([rows, k]);
        let log_var = log_var.then(|| self.head(&self.logvar_head, "RegressionNet/logvar_head", h));
        MemberOutput {
            members,
            mean,
            log_var,
        }
    }

    /// The plain network every engine serves: the ensemble's mean head divided by the
    /// member count (the members' mean as one dense layer); a single network as it is.
    pub fn folded(mut self) -> Self {
        if self.members > 1 {
            let scale = 1.0 / self.members as f64;
            let w = &self.mean_head.weight;
            self.mean_head.weight = Param::initialized(w.id, w.val().mul_scalar(scale));
            self.members = 1;
        }
        self
    }

    /// The mean head on the backbone's output: a single network's head, or a packed
    /// ensemble's members' mean (the head's product divided by the member count, plus the
    /// shared bias).
    fn ensemble_mean(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        if self.members <= 1 {
            return self.head(&self.mean_head, "RegressionNet/mean_head", h);
        }
        let _s = crate::prof_span!("module", path = "RegressionNet/mean_head", shape = ?h.dims())
            .entered();
        let z = h
            .matmul(self.mean_head.weight.val())
            .div_scalar(self.members as f64);
        match &self.mean_head.bias {
            Some(b) => z + b.val().unsqueeze_dim(0),
            None => z,
        }
    }

    /// The mean head alone (the backbone, then the mean head): what a training step of a
    /// stage whose loss reads no log-variance computes, leaving the log-variance head's
    /// product out. Its values are [`Self::forward`]'s `mean`, bit for bit.
    pub fn forward_mean(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let _net = crate::prof_span!("module", path = "RegressionNet", shape = ?x.dims()).entered();
        let h = self.trunk(x);
        self.ensemble_mean(h)
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
            h = match self.members {
                m if m > 1 && i > 0 => {
                    layer_forward(&block_diagonal(layer, m), h, Some(self.activation))
                }
                _ => layer_forward(layer, h, Some(self.activation)),
            };
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

/// `layer` with every weight between two of `members` packed members masked to zero, as a
/// product the gradient flows through: the masked weights get no gradient, so the zeros they
/// start with stay (AdamW's decoupled decay keeps a zero at zero).
fn block_diagonal<B: Backend>(layer: &Linear<B>, members: usize) -> Linear<B> {
    let w = &layer.weight;
    let [fan_in, fan_out] = w.dims();
    let (bi, bo) = (fan_in / members, fan_out / members);
    let mask: Vec<f32> = (0..fan_in * fan_out)
        .map(|e| f32::from(u8::from((e / fan_out) / bi == (e % fan_out) / bo)))
        .collect();
    let mask = Tensor::<B, 2>::from_data(TensorData::new(mask, [fan_in, fan_out]), &w.device());
    Linear {
        weight: Param::initialized(w.id, w.val() * mask),
        bias: layer.bias.clone(),
    }
}

/// What a packed ensemble's training step computes ([`RegressionNet::forward_members`]).
#[derive(Debug, Clone)]
pub struct MemberOutput<B: Backend> {
    /// Each member's predicted means, `[members, batch, k]`.
    pub members: Tensor<B, 3>,
    /// The ensemble's mean (the members' mean), `[batch, k]`.
    pub mean: Tensor<B, 2>,
    /// The ensemble's log-variance, `[batch, k]`, when asked for.
    pub log_var: Option<Tensor<B, 2>>,
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

    /// A 3-member ensemble of 5 → [4, 6] → 2 networks, packed.
    fn packed() -> RegressionNetConfig {
        RegressionNetConfig {
            n_features: 5,
            hidden: vec![12, 18],
            n_targets: 2,
            activation: Activation::Relu,
        }
    }

    fn rows(n: usize, f: usize) -> Vec<f32> {
        (0..n * f)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect()
    }

    fn host(t: Tensor<impl Backend, 2>) -> Vec<f32> {
        t.into_data().convert::<f32>().to_vec().unwrap()
    }

    /// One network draws `nn.Linear`'s default in layer order (weights row-major, then
    /// biases) from the seed's stream: the sequence every earlier kiln drew, so a config
    /// without `ensemble` starts from the weights it always did.
    #[test]
    fn one_member_is_the_plain_network_bit_for_bit() {
        let cfg = RegressionNetConfig::reference();
        let d = Default::default();
        let net = cfg.init::<Flex>(7, &d);
        assert_eq!(net.members, 1);
        let mut rng = SplitMix64::derive(7, &[INIT_STREAM]);
        let layers: Vec<&Linear<Flex>> = net
            .backbone
            .iter()
            .chain([&net.mean_head, &net.logvar_head])
            .collect();
        for (l, (i, o)) in layers.iter().zip(cfg.layer_shapes()) {
            let bound = 1.0 / (i as f64).sqrt();
            let w: Vec<f32> = (0..i * o)
                .map(|_| rng.uniform(-bound, bound) as f32)
                .collect();
            let b: Vec<f32> = (0..o).map(|_| rng.uniform(-bound, bound) as f32).collect();
            assert_eq!(host(l.weight.val()), w);
            assert_eq!(
                l.bias
                    .as_ref()
                    .unwrap()
                    .val()
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap(),
                b
            );
        }
    }

    #[test]
    fn a_packed_ensemble_is_its_members_mean_and_folds_into_the_served_network() {
        use burn::backend::Autodiff;
        type A = Autodiff<Flex>;
        let (cfg, d) = (packed(), Default::default());
        let net = cfg.init_members::<A>(11, 3, &d);
        assert_eq!(net.architecture(), cfg);
        // Between-member blocks start at zero; a member's own block does not.
        let w1 = host(net.backbone[1].weight.val());
        let off = |r: usize, c: usize| r / 4 != c / 6;
        assert!((0..12 * 18).all(|e| !off(e / 18, e % 18) || w1[e] == 0.0));
        assert!((0..12 * 18).any(|e| !off(e / 18, e % 18) && w1[e] != 0.0));

        let x = || Tensor::<A, 2>::from_data(TensorData::new(rows(9, 5), [9, 5]), &d);
        let out = net.forward_members(x(), true);
        assert_eq!(out.members.dims(), [3, 9, 2]);
        let mean = host(out.mean.clone());
        let by_members = host(out.members.clone().mean_dim(0).reshape([9, 2]));
        let full = net.forward(x());
        for ((a, b), c) in mean.iter().zip(&by_members).zip(host(full.mean)) {
            assert!((a - b).abs() < 1e-5 && (a - c).abs() < 1e-5, "{a} {b} {c}");
        }
        // The folded network is the plain one the engines serve: same mean and variance.
        let folded = net.clone().folded();
        assert_eq!(folded.members, 1);
        let served = folded.forward(x());
        for (a, b) in mean.iter().zip(host(served.mean)) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert_eq!(host(full.log_var), host(served.log_var));

        // Each member learns from its own error: no gradient reaches a between-member weight,
        // and member 0's means do not move when member 2's block changes.
        let loss = out.members.powi_scalar(2).mean() + out.log_var.unwrap().mean();
        let g = loss.backward();
        let gw = host(net.backbone[1].weight.grad(&g).unwrap().reshape([12, 18]));
        assert!((0..12 * 18).all(|e| !off(e / 18, e % 18) || gw[e] == 0.0));
        assert!(gw.iter().any(|&v| v != 0.0));
        let mut other = net.clone();
        let w = &other.backbone[1].weight;
        let moved: Vec<f32> = w1
            .iter()
            .enumerate()
            .map(|(e, &v)| if e / 18 >= 8 { v + 0.5 } else { v })
            .collect();
        other.backbone[1].weight = Param::initialized(
            w.id,
            Tensor::from_data(TensorData::new(moved, [12, 18]), &d),
        );
        let (a, b) = (
            net.forward_members(x(), false).members,
            other.forward_members(x(), false).members,
        );
        let first = |t: Tensor<A, 3>| t.slice([0..1, 0..9, 0..2]).into_data();
        assert_eq!(first(a.clone()), first(b.clone()));
        assert_ne!(a.into_data(), b.into_data());
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
