//! The stage optimizer: Burn's AdamW, with its update done in one host pass per parameter
//! tensor on the default CPU backend.
//!
//! Burn's `AdamW::step` is a dozen tensor operations per parameter (moments, bias
//! correction, square root, decay, update), each allocating; on `Flex` at kiln's parameter
//! counts (3,654 in the reference network) that is tens of microseconds per step of pure
//! overhead. [`KilnAdamW`] performs the *same* f32 operations in the same order, element by
//! element, in one loop — so its results are bit-identical to Burn's (tested below) — and
//! stores its state in Burn's `AdamWState`, so optimizer snapshots (`optim.bin`) written
//! before and after read back unchanged. On any other backend it is Burn's AdamW.

use std::any::TypeId;

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::{Flex, FlexTensor};

use crate::config::StageConfig;
use crate::model::fused_linear::cast;

/// AdamW (decoupled weight decay, no AMSGrad) with a host fast path on `Flex`.
#[derive(Clone)]
pub struct KilnAdamW {
    burn: AdamW,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
}

impl KilnAdamW {
    /// The optimizer with the stage's hyper-parameters.
    pub fn new(stage: &StageConfig) -> Self {
        let o = &stage.optimizer;
        Self {
            burn: super::stage::adamw(stage).build(),
            beta_1: o.beta1 as f32,
            beta_2: o.beta2 as f32,
            epsilon: o.eps as f32,
            weight_decay: o.weight_decay as f32,
        }
    }
}

/// The stage's fresh optimizer over module `M`.
pub fn stage_optimizer<B: AutodiffBackend, M: AutodiffModule<B>>(
    stage: &StageConfig,
) -> OptimizerAdaptor<KilnAdamW, M, B> {
    OptimizerAdaptor::from(KilnAdamW::new(stage))
}

/// The tensor's buffer in a canonical layout, unshared (copied only when something else
/// still holds it), ready to update in place.
fn owned<const D: usize>(t: Tensor<Flex, D>) -> FlexTensor {
    let p: FlexTensor = t.into_primitive().tensor();
    // A clone of `p` when its layout is already canonical; `p` is dropped here.
    p.to_contiguous()
}

fn wrap<const D: usize>(p: FlexTensor) -> Tensor<Flex, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

impl KilnAdamW {
    /// One step on host buffers: Burn's `AdamW::step` operation for operation.
    fn host_step<const D: usize>(
        &self,
        lr: LearningRate,
        param: Tensor<Flex, D>,
        grad: Tensor<Flex, D>,
        state: Option<AdamWState<Flex, D>>,
    ) -> (Tensor<Flex, D>, AdamWState<Flex, D>) {
        let dims = param.dims();
        assert_eq!(param.shape().num_elements(), grad.shape().num_elements());
        let (b1, b2) = (self.beta_1, self.beta_2);
        let (f1, f2) = (1.0f32 - b1, 1.0f32 - b2);
        let g = owned(grad);
        let g = g.as_slice::<f32>().expect("contiguous f32");
        let (m, v, time) = match state {
            Some(s) => (
                owned(s.momentum.moment_1),
                owned(s.momentum.moment_2),
                s.momentum.time + 1,
            ),
            None => (
                FlexTensor::from_data(TensorData::new(vec![0.0f32; g.len()], dims)),
                FlexTensor::from_data(TensorData::new(vec![0.0f32; g.len()], dims)),
                1,
            ),
        };
        let first = time == 1;
        let t = time as i32;
        let (c1, c2) = (1f32 - b1.powi(t), 1f32 - b2.powi(t));
        let decay_rate = lr * self.weight_decay as f64;
        let keep = (1.0 - decay_rate) as f32;
        let lr32 = lr as f32;
        let (mut m, mut v, mut w) = (m, v, owned(param));
        let k = Consts {
            b1,
            b2,
            f1,
            f2,
            c1,
            c2,
            eps: self.epsilon,
            keep,
            lr: lr32,
        };
        let (ms, vs, ws) = (
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
            w.storage_mut::<f32>(),
        );
        // One loop per case, each branch-free so that it vectorises (IEEE division and
        // square root give the same bits in vector lanes as in scalar code).
        match (first, decay_rate == 0.0) {
            (true, true) => update::<true, false>(ms, vs, ws, g, &k),
            (true, false) => update::<true, true>(ms, vs, ws, g, &k),
            (false, true) => update::<false, false>(ms, vs, ws, g, &k),
            (false, false) => update::<false, true>(ms, vs, ws, g, &k),
        }
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: wrap(m),
            moment_2: wrap(v),
            max_moment_2: None,
        };
        (wrap(w), AdamWState { momentum })
    }
}

/// The step's scalars: betas, their complements, bias corrections, epsilon, the decay
/// factor and the learning rate, all f32 as Burn computes them.
struct Consts {
    b1: f32,
    b2: f32,
    f1: f32,
    f2: f32,
    c1: f32,
    c2: f32,
    eps: f32,
    keep: f32,
    lr: f32,
}

/// Burn's AdamW update, element by element: moments (initialised on the `FIRST` step),
/// bias-corrected step, decoupled decay (when `DECAY`), parameter update.
#[inline(always)]
fn update<const FIRST: bool, const DECAY: bool>(
    ms: &mut [f32],
    vs: &mut [f32],
    ws: &mut [f32],
    g: &[f32],
    k: &Consts,
) {
    let n = g.len();
    let (ms, vs, ws) = (&mut ms[..n], &mut vs[..n], &mut ws[..n]);
    for i in 0..n {
        let g = g[i];
        let (m, v) = if FIRST {
            (g * k.f1, (g * g) * k.f2)
        } else {
            (ms[i] * k.b1 + g * k.f1, vs[i] * k.b2 + (g * g) * k.f2)
        };
        ms[i] = m;
        vs[i] = v;
        let delta = (m / k.c1) / ((v / k.c2).sqrt() + k.eps);
        let decayed = if DECAY { ws[i] * k.keep } else { ws[i] };
        ws[i] = decayed - delta * k.lr;
    }
}

impl<B: Backend> SimpleOptimizer<B> for KilnAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        if TypeId::of::<B>() == TypeId::of::<Flex>() {
            let same = "B is Flex";
            let p: Tensor<Flex, D> = cast(tensor).map_err(|_| ()).expect(same);
            let g: Tensor<Flex, D> = cast(grad).map_err(|_| ()).expect(same);
            let s: Option<AdamWState<Flex, D>> = cast(state).map_err(|_| ()).expect(same);
            // A state with AMSGrad's running maximum never comes from kiln, nor a parameter
            // of another precision; leave those to Burn.
            let plain = [p.dtype(), g.dtype()] == [DType::F32; 2]
                && s.as_ref().is_none_or(|s| {
                    s.momentum.max_moment_2.is_none()
                        && [s.momentum.moment_1.dtype(), s.momentum.moment_2.dtype()]
                            == [DType::F32; 2]
                });
            if plain {
                let (p, s) = self.host_step(lr, p, g, s);
                return (
                    cast(p).map_err(|_| ()).expect(same),
                    Some(cast(s).map_err(|_| ()).expect(same)),
                );
            }
            let (p, s) = SimpleOptimizer::<Flex>::step(&self.burn, lr, p, g, s);
            return (
                cast(p).map_err(|_| ()).expect(same),
                cast(s).map_err(|_| ()).expect(same),
            );
        }
        self.burn.step(lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <AdamW as SimpleOptimizer<B>>::to_device(state, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OptimizerConfig, StageConfig};
    use burn::backend::Autodiff;
    use burn::module::Param;
    use burn::nn::Linear;
    use burn::optim::{GradientsParams, Optimizer};
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    use burn::tensor::Distribution;

    type Ad = Autodiff<Flex>;

    fn stage(weight_decay: f64) -> StageConfig {
        crate::train::stage::test_stage(OptimizerConfig {
            lr: 3e-3,
            beta1: 0.85,
            beta2: 0.995,
            eps: 1e-7,
            weight_decay,
        })
    }

    fn bits<const D: usize>(t: Tensor<Ad, D>) -> Vec<u32> {
        t.into_data()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    #[test]
    fn bit_identical_to_burns_adamw_over_several_steps() {
        for wd in [0.0, 0.01] {
            let st = stage(wd);
            let d = Default::default();
            let lin = Linear::<Ad> {
                weight: Param::from_tensor(Tensor::random([7, 5], Distribution::Default, &d)),
                bias: Some(Param::from_tensor(Tensor::random(
                    [5],
                    Distribution::Default,
                    &d,
                ))),
            };
            let (mut a, mut b) = (lin.clone(), lin);
            let mut ours = stage_optimizer::<Ad, Linear<Ad>>(&st);
            let mut burns = super::super::stage::adamw(&st).init::<Ad, Linear<Ad>>();
            for step in 0..6 {
                let x = Tensor::<Ad, 2>::random([4, 7], Distribution::Default, &d);
                let lr = 3e-3 * (1.0 + step as f64) / 3.0;
                let ga = GradientsParams::from_grads(
                    a.forward(x.clone()).powi_scalar(2).mean().backward(),
                    &a,
                );
                let gb =
                    GradientsParams::from_grads(b.forward(x).powi_scalar(2).mean().backward(), &b);
                a = ours.step(lr, a, ga);
                b = burns.step(lr, b, gb);
                assert_eq!(
                    bits(a.weight.val()),
                    bits(b.weight.val()),
                    "wd {wd} step {step}"
                );
                assert_eq!(
                    bits(a.bias.as_ref().unwrap().val()),
                    bits(b.bias.as_ref().unwrap().val()),
                    "wd {wd} step {step}"
                );
            }
            // The snapshots have the same form: Burn's optimizer resumes from ours.
            let mut resumed = super::super::stage::adamw(&st).init::<Ad, Linear<Ad>>();
            let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
            let bytes = Recorder::<Ad>::record(&rec, ours.to_record(), ()).unwrap();
            resumed = resumed.load_record(Recorder::<Ad>::load(&rec, bytes, &d).unwrap());
            let x = Tensor::<Ad, 2>::random([4, 7], Distribution::Default, &d);
            let ga = GradientsParams::from_grads(a.forward(x.clone()).sum().backward(), &a);
            let gb = GradientsParams::from_grads(b.forward(x).sum().backward(), &b);
            let a = ours.step(1e-3, a, ga);
            let b = resumed.step(1e-3, b, gb);
            assert_eq!(bits(a.weight.val()), bits(b.weight.val()));
        }
    }

    #[test]
    fn a_parameter_of_another_precision_takes_burns_step() {
        let st = stage(0.01);
        let d = Default::default();
        let lin = Linear::<Ad> {
            weight: Param::from_tensor(
                Tensor::<Ad, 2>::random([3, 2], Distribution::Default, &d).cast(DType::F64),
            ),
            bias: None,
        };
        let (mut a, mut b) = (lin.clone(), lin);
        let mut ours = stage_optimizer::<Ad, Linear<Ad>>(&st);
        let mut burns = super::super::stage::adamw(&st).init::<Ad, Linear<Ad>>();
        for _ in 0..3 {
            let grads = |l: &Linear<Ad>| {
                let w = l.weight.val();
                GradientsParams::from_grads(w.clone().powi_scalar(2).sum().backward(), l)
            };
            let (ga, gb) = (grads(&a), grads(&b));
            a = ours.step(1e-2, a, ga);
            b = burns.step(1e-2, b, gb);
            let (wa, wb) = (a.weight.val(), b.weight.val());
            assert_eq!(wa.dtype(), DType::F64);
            assert_eq!(
                wa.into_data().to_vec::<f64>().unwrap(),
                wb.into_data().to_vec::<f64>().unwrap()
            );
        }
    }
}
