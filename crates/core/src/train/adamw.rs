//! The stage optimizer: Burn's AdamW, with its update done on the host on the default CPU
//! backend.
//!
//! Burn's `AdamW::step` is a dozen tensor operations per parameter (moments, bias
//! correction, square root, decay, update), each allocating, and Burn's `OptimizerAdaptor`
//! around it moves every parameter's state in and out of a hash map of boxed records on every
//! step; on `Flex` at kiln's parameter counts (3,654 in the reference network) that is tens of
//! microseconds per step of pure overhead. Two layers remove it:
//!
//! * [`KilnAdamW`] performs the *same* f32 operations in the same order, element by element,
//!   in one loop — so its results are bit-identical to Burn's (tested below) — as a Burn
//!   `SimpleOptimizer` whose state is Burn's `AdamWState`.
//! * [`StageAdamW`] is the stage's `Optimizer`. On `Autodiff<Flex>` it keeps the moments of
//!   every f32 parameter in two flat host buffers (one range per parameter, in the module's
//!   visiting order) and updates the parameter's own buffer in place with that loop: no
//!   tensor, record or hash-map entry is made per step. Anything else (another backend, a
//!   parameter of another precision, an AMSGrad state) takes `KilnAdamW` through Burn's
//!   records, exactly as `OptimizerAdaptor` would. Its record *is* `OptimizerAdaptor`'s, so
//!   optimizer snapshots (`optim.bin`) written before and after read back unchanged, and
//!   Burn's own AdamW resumes from them.

use std::any::TypeId;
use std::marker::PhantomData;

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::record::AdaptorRecord;
use burn::optim::{
    AdamW, AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate, MultiGradientsParams,
    Optimizer, SimpleOptimizer,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::{Flex, FlexTensor};
use hashbrown::HashMap;
use kiln_base::simd::Kernel;

use crate::config::StageConfig;
use crate::model::fused_linear::{cast, host};

/// AdamW (decoupled weight decay, no AMSGrad) with a host fast path on `Flex`.
#[derive(Clone)]
pub struct KilnAdamW {
    burn: AdamW,
    /// The vector path of the host update (the same bits on every path).
    kernel: Kernel,
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
            kernel: Kernel::best(),
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
) -> StageAdamW<M, B> {
    StageAdamW::new(KilnAdamW::new(stage))
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
        let (mut m, mut v, mut w) = (m, v, owned(param));
        self.update_host(
            lr,
            time,
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
            w.storage_mut::<f32>(),
            g,
        );
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: wrap(m),
            moment_2: wrap(v),
            max_moment_2: None,
        };
        (wrap(w), AdamWState { momentum })
    }
}

impl KilnAdamW {
    /// Burn's AdamW update of one f32 parameter `ws` with gradient `g` at step `time` (1 for
    /// the first), its moments `ms` and `vs` updated in place.
    fn update_host(
        &self,
        lr: LearningRate,
        time: usize,
        ms: &mut [f32],
        vs: &mut [f32],
        ws: &mut [f32],
        g: &[f32],
    ) {
        let (b1, b2) = (self.beta_1, self.beta_2);
        let t = time as i32;
        let decay_rate = lr * self.weight_decay as f64;
        let k = Consts {
            b1,
            b2,
            f1: 1.0f32 - b1,
            f2: 1.0f32 - b2,
            c1: 1f32 - b1.powi(t),
            c2: 1f32 - b2.powi(t),
            eps: self.epsilon,
            keep: (1.0 - decay_rate) as f32,
            lr: lr as f32,
        };
        // One loop per case, each branch-free so that it vectorises (IEEE division and
        // square root give the same bits in vector lanes as in scalar code).
        match (time == 1, decay_rate == 0.0) {
            (true, true) => update_on::<true, false>(self.kernel, ms, vs, ws, g, &k),
            (true, false) => update_on::<true, true>(self.kernel, ms, vs, ws, g, &k),
            (false, true) => update_on::<false, false>(self.kernel, ms, vs, ws, g, &k),
            (false, false) => update_on::<false, true>(self.kernel, ms, vs, ws, g, &k),
        }
    }
}

/// [`update`] compiled for the vector path `kernel`: the loop is the same IEEE operations
/// (no contraction into fused multiply-adds), so every path gives the same bits; wider
/// vectors only divide and take square roots more lanes at a time.
fn update_on<const FIRST: bool, const DECAY: bool>(
    kernel: Kernel,
    ms: &mut [f32],
    vs: &mut [f32],
    ws: &mut [f32],
    g: &[f32],
    k: &Consts,
) {
    match kernel {
        // SAFETY: the token proves the CPU has the instruction set the function is built for.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512(_) => unsafe { update_avx512::<FIRST, DECAY>(ms, vs, ws, g, k) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2(_) => unsafe { update_avx2::<FIRST, DECAY>(ms, vs, ws, g, k) },
        Kernel::Portable(_) => update::<FIRST, DECAY>(ms, vs, ws, g, k),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn update_avx512<const FIRST: bool, const DECAY: bool>(
    ms: &mut [f32],
    vs: &mut [f32],
    ws: &mut [f32],
    g: &[f32],
    k: &Consts,
) {
    update::<FIRST, DECAY>(ms, vs, ws, g, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn update_avx2<const FIRST: bool, const DECAY: bool>(
    ms: &mut [f32],
    vs: &mut [f32],
    ws: &mut [f32],
    g: &[f32],
    k: &Consts,
) {
    update::<FIRST, DECAY>(ms, vs, ws, g, k)
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

/// The flat path's backend.
type Ad = Autodiff<Flex>;

/// One parameter's range of the flat moment buffers.
#[derive(Clone)]
struct Slot {
    id: ParamId,
    start: usize,
    len: usize,
    /// Steps taken so far (Burn's `AdaptiveMomentumState::time`).
    time: usize,
    shape: Vec<usize>,
    /// Its state as Burn's record ([`slot_record`] for the parameter's rank).
    record: SlotRecord,
}

/// Builds a slot's record from the moment buffers.
type SlotRecord = fn(&Slot, &[f32], &[f32]) -> AdaptorRecord<KilnAdamW, Ad>;

/// A slot's moments as the record Burn's `OptimizerAdaptor` keeps for a rank-`D` parameter.
fn slot_record<const D: usize>(slot: &Slot, m: &[f32], v: &[f32]) -> AdaptorRecord<KilnAdamW, Ad> {
    let tensor = |x: &[f32]| {
        let data = TensorData::new(
            x[slot.start..slot.start + slot.len].to_vec(),
            slot.shape.clone(),
        );
        Tensor::<Flex, D>::from_data(data, &Default::default())
    };
    AdaptorRecord::from_state::<D>(AdamWState {
        momentum: AdaptiveMomentumState {
            time: slot.time,
            moment_1: tensor(m),
            moment_2: tensor(v),
            max_moment_2: None,
        },
    })
}

/// The stage's AdamW over module `M` (see the module docs): flat host state for the f32
/// parameters on `Autodiff<Flex>`, Burn's records for everything else; its record is
/// `OptimizerAdaptor<KilnAdamW, M, B>`'s.
pub struct StageAdamW<M, B: AutodiffBackend> {
    optim: KilnAdamW,
    /// First and second moments of the flat parameters, one range per slot.
    m: Vec<f32>,
    v: Vec<f32>,
    /// The flat parameters in the order the module visits them.
    slots: Vec<Slot>,
    /// States of the other parameters, and loaded states not yet moved into a slot (a
    /// parameter's rank is known only when the module visits it).
    records: HashMap<ParamId, AdaptorRecord<KilnAdamW, B>>,
    _module: PhantomData<fn() -> M>,
}

impl<M, B: AutodiffBackend> Clone for StageAdamW<M, B> {
    fn clone(&self) -> Self {
        Self {
            optim: self.optim.clone(),
            m: self.m.clone(),
            v: self.v.clone(),
            slots: self.slots.clone(),
            records: self.records.clone(),
            _module: PhantomData,
        }
    }
}

impl<M, B: AutodiffBackend> StageAdamW<M, B> {
    fn new(optim: KilnAdamW) -> Self {
        Self {
            optim,
            m: Vec::new(),
            v: Vec::new(),
            slots: Vec::new(),
            records: HashMap::new(),
            _module: PhantomData,
        }
    }

    /// The slot of parameter `id`, looked for first at `hint` (the visiting order repeats
    /// every step), else anywhere.
    fn find(&self, id: ParamId, hint: usize) -> Option<usize> {
        if self.slots.get(hint).is_some_and(|s| s.id == id) {
            return Some(hint);
        }
        self.slots.iter().position(|s| s.id == id)
    }

    /// A new slot for a rank-`D` parameter of `shape`, its moments zero or, when the loaded
    /// record holds a plain f32 state for it, that state's.
    fn add_slot<const D: usize>(&mut self, id: ParamId, shape: Vec<usize>) -> Option<usize> {
        let len: usize = shape.iter().product();
        let (time, m, v) = match self.records.remove(&id) {
            None => (0, vec![0.0; len], vec![0.0; len]),
            Some(record) => {
                let record: AdaptorRecord<KilnAdamW, Ad> =
                    cast(record).map_err(|_| ()).expect("B is Ad");
                let state: AdamWState<Flex, D> = record.into_state::<D>();
                let s = state.momentum;
                let plain = s.max_moment_2.is_none()
                    && [s.moment_1.dtype(), s.moment_2.dtype()] == [DType::F32; 2]
                    && s.moment_1.dims().to_vec() == shape
                    && s.moment_2.dims().to_vec() == shape;
                if !plain {
                    // Not a state this path keeps: back to the records, Burn's step.
                    let back =
                        AdaptorRecord::<KilnAdamW, Ad>::from_state::<D>(AdamWState { momentum: s });
                    self.records
                        .insert(id, cast(back).map_err(|_| ()).expect("B is Ad"));
                    return None;
                }
                let host = |t: Tensor<Flex, D>| t.into_data().to_vec::<f32>().expect("f32");
                (s.time, host(s.moment_1), host(s.moment_2))
            }
        };
        let start = self.m.len();
        self.m.extend_from_slice(&m);
        self.v.extend_from_slice(&v);
        self.slots.push(Slot {
            id,
            start,
            len,
            time,
            shape,
            record: slot_record::<D>,
        });
        Some(self.slots.len() - 1)
    }

    /// The slot of an f32 parameter of `shape` on `Autodiff<Flex>`, made on its first step;
    /// `None` when its state is not one the flat path keeps (Burn's records take it).
    fn flat_slot<const D: usize>(
        &mut self,
        id: ParamId,
        shape: Vec<usize>,
        hint: usize,
    ) -> Option<usize> {
        match self.find(id, hint) {
            Some(i) => (self.slots[i].shape == shape).then_some(i),
            None => self.add_slot::<D>(id, shape),
        }
    }

    /// One step of the parameter in `slot` in the flat buffers.
    fn flat_update<const D: usize>(
        &mut self,
        lr: LearningRate,
        slot: usize,
        tensor: Tensor<Ad, D>,
        grad: Tensor<Flex, D>,
    ) -> Tensor<Ad, D> {
        // The parameter keeps its autodiff leaf (node and reference count): only its buffer
        // changes. Burn's adaptor makes a new leaf per parameter and step (`from_inner`, then
        // `require_grad`, which registers a root step with the graph), as if the parameter
        // were new; a leaf that outlives a backward pass is what gradient accumulation uses
        // too. The buffer is the module's alone here (the optimizer owns the module), so the
        // update is in place.
        let s = &mut self.slots[slot];
        let mut leaf = tensor.into_primitive().tensor();
        if leaf.primitive.as_slice::<f32>().map(<[f32]>::len) != Some(s.len) {
            leaf.primitive = leaf.primitive.to_contiguous();
        }
        let g: FlexTensor = grad.into_primitive().tensor();
        let g = host(&g);
        s.time += 1;
        let range = s.start..s.start + s.len;
        self.optim.update_host(
            lr,
            s.time,
            &mut self.m[range.clone()],
            &mut self.v[range],
            leaf.primitive.storage_mut::<f32>(),
            &g,
        );
        Tensor::from_primitive(TensorPrimitive::Float(leaf))
    }
}

/// Visits the module's parameters for one step.
struct StepMapper<'a, M, B: AutodiffBackend> {
    optim: &'a mut StageAdamW<M, B>,
    grads: GradientsParams,
    lr: LearningRate,
    /// Parameters with a flat step so far this step: where the next one's slot should be.
    next_slot: usize,
}

impl<M, B: AutodiffBackend> ModuleMapper<B> for StepMapper<'_, M, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let flat = TypeId::of::<B>() == TypeId::of::<Ad>()
            && [tensor.dtype(), grad.dtype()] == [DType::F32; 2];
        let slot = if flat {
            self.optim
                .flat_slot::<D>(id, tensor.dims().to_vec(), self.next_slot)
        } else {
            None
        };
        if let Some(slot) = slot {
            let same = "B is Ad";
            let t: Tensor<Ad, D> = cast(tensor).map_err(|_| ()).expect(same);
            let g: Tensor<Flex, D> = cast(grad).map_err(|_| ()).expect(same);
            let t = self.optim.flat_update(self.lr, slot, t, g);
            self.next_slot = slot + 1;
            return Param::from_mapped_value(id, cast(t).map_err(|_| ()).expect(same), mapper);
        }
        // Burn's `OptimizerAdaptor`, parameter by parameter (one device: kiln's).
        let require_grad = tensor.is_require_grad();
        let state = self.optim.records.remove(&id).map(|r| r.into_state::<D>());
        let (inner, state) = self.optim.optim.step(self.lr, tensor.inner(), grad, state);
        if let Some(state) = state {
            self.optim
                .records
                .insert(id, AdaptorRecord::from_state::<D>(state));
        }
        let mut tensor = Tensor::from_inner(inner);
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Moves every parameter's (accumulated) gradient from a multi-device set into one set.
struct Gather<'a, B> {
    multi: MultiGradientsParams,
    single: &'a mut GradientsParams,
    _b: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some((g, _)) = self.multi.remove::<B::InnerBackend, D>(param.id) {
            self.single.register(param.id, g);
        }
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Optimizer<M, B> for StageAdamW<M, B> {
    type Record = HashMap<ParamId, AdaptorRecord<KilnAdamW, B>>;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        module.map(&mut StepMapper {
            optim: self,
            grads,
            lr,
            next_slot: 0,
        })
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        // Each parameter's gradients summed as Burn's `MultiGradientsParams::remove` sums
        // them, then one step.
        let mut single = GradientsParams::new();
        module.visit(&mut Gather::<B> {
            multi: grads,
            single: &mut single,
            _b: PhantomData,
        });
        self.step(lr, module, single)
    }

    fn to_record(&self) -> Self::Record {
        let mut out = self.records.clone();
        for s in &self.slots {
            let r = (s.record)(s, &self.m, &self.v);
            out.insert(
                s.id,
                cast(r).map_err(|_| ()).expect("slots exist only on Ad"),
            );
        }
        out
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        self.m.clear();
        self.v.clear();
        self.slots.clear();
        self.records = record;
        self
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
    use kiln_base::simd::Isa;

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
    fn every_vector_path_updates_to_the_same_bits() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let mut draw = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next_u64() as f32 / u64::MAX as f32 - 0.5) * scale)
                .collect()
        };
        // A length with a remainder after every vector width.
        let n = 16 * 61 + 13;
        let (m0, v0, w0, g) = (draw(n, 1e-2), draw(n, 1e-4), draw(n, 2.0), draw(n, 1.0));
        let v0: Vec<f32> = v0.iter().map(|v| v.abs()).collect();
        let st = stage(0.01);
        let run = |isa: Isa, time: usize, lr: f64| {
            let mut opt = KilnAdamW::new(&st);
            opt.kernel = Kernel::new(isa).expect("available");
            let (mut m, mut v, mut w) = (m0.clone(), v0.clone(), w0.clone());
            opt.update_host(lr, time, &mut m, &mut v, &mut w, &g);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            (bits(&m), bits(&v), bits(&w))
        };
        for (time, lr) in [(1, 1e-3), (1, 0.0), (7, 3e-3), (7, 0.0)] {
            let want = run(Isa::Portable, time, lr);
            for isa in Isa::available() {
                assert!(
                    run(isa, time, lr) == want,
                    "{} time {time} lr {lr}",
                    isa.name()
                );
            }
        }
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
            // And ours resumes from Burn's: the loaded states move into the flat buffers at
            // the next step, and two more steps stay bit-identical.
            let bytes = Recorder::<Ad>::record(&rec, resumed.to_record(), ()).unwrap();
            let mut ours_again = stage_optimizer::<Ad, Linear<Ad>>(&st)
                .load_record(Recorder::<Ad>::load(&rec, bytes, &d).unwrap());
            let (mut a, mut b) = (a, b);
            for _ in 0..2 {
                let x = Tensor::<Ad, 2>::random([4, 7], Distribution::Default, &d);
                let ga = GradientsParams::from_grads(a.forward(x.clone()).sum().backward(), &a);
                let gb = GradientsParams::from_grads(b.forward(x).sum().backward(), &b);
                a = ours_again.step(2e-3, a, ga);
                b = resumed.step(2e-3, b, gb);
                assert_eq!(bits(a.weight.val()), bits(b.weight.val()), "wd {wd}");
                assert_eq!(
                    bits(a.bias.as_ref().unwrap().val()),
                    bits(b.bias.as_ref().unwrap().val()),
                    "wd {wd}"
                );
            }
            assert_eq!(
                ours_again.slots.len(),
                2,
                "both parameters on the flat path"
            );
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
