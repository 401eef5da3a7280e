//! `Linear` + activation as one Burn autodiff operation on the default training backend.
//!
//! Burn builds a training step of the regression network from many small tensor operations
//! (`linear` = matmul + bias broadcast, then the activation; in the backward pass transposes,
//! matmuls, a bias reduction and the activation's mask), each of which allocates, records a
//! graph node and, on `Flex`, copies through a `Bytes` allocation. At kiln's sizes (batch 128,
//! widths ≤ 64) that overhead is most of the step. [`linear_act`] replaces a layer and its
//! ReLU (or a head, no activation) by **one** node of Burn's autodiff graph whose forward and
//! [`Backward`] work on the layer's host buffers, the products by the `gemm` crate (the
//! kernels Burn's own Flex matmul calls, single-threaded at these sizes as Burn runs them):
//!
//! ```text
//! forward   Z = X·W + b,   Y = relu(Z)             (state: X, W, Y)
//! backward  dZ = dY ⊙ [Y > 0]
//!           dW = Xᵀ·dZ,   db = Σ_rows dZ,   dX = dZ·Wᵀ   (each only if its input is tracked)
//! ```
//!
//! It is used only where it is exact Burn semantics: the backend is `Autodiff<Flex>` (kiln's
//! `TrainCpu`, no checkpointing), tensors are f32, the layer has a bias and the activation is
//! ReLU or none; everything else (NdArray, CUDA, GELU/tanh/SiLU) runs Burn's own `linear`
//! and activation. Gradients are registered through Burn's `Gradients`, so parameter freezing
//! (`require_grad = false`), gradient accumulation into a shared input (both heads read the
//! backbone's output) and `GradientsParams` work unchanged.
//!
//! Everything runs on one thread in an order fixed by the shapes (and the CPU's instruction
//! set, which `gemm` picks at run time), so a step's bits depend only on its inputs: runs
//! repeat bit for bit and resume exactly. A first version with kiln's own register-tiled
//! kernels (`crate::simd`) was half as fast as `gemm` on these shapes (128×48×48: 13.3 µs
//! forward vs 7.4 µs on an AVX2 Zen 3), so the products are left to `gemm`.

use std::any::Any;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::{Flex, FlexTensor};

/// The training backend the fused operation serves.
type Ad = Autodiff<Flex>;

/// Move `t` into `U` when they are the same type (no allocation); otherwise hand it back.
pub fn cast<T: 'static, U: 'static>(t: T) -> Result<U, T> {
    let mut slot = Some(t);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<U>>() {
        Some(u) => Ok(u.take().expect("filled above")),
        None => Err(slot.expect("not taken")),
    }
}

/// `act(layer(x))` with `relu` true for ReLU, false for none: the fused operation on
/// `Autodiff<Flex>` f32, `None` (nothing consumed but `x` handed back) elsewhere.
pub fn linear_act<B: Backend>(
    layer: &Linear<B>,
    x: Tensor<B, 2>,
    relu: bool,
) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
    let Some(bias) = &layer.bias else {
        return Err(x);
    };
    let (w, b) = (layer.weight.val(), bias.val());
    // Every operand f32 (a layer of another precision takes Burn's ops).
    if [x.dtype(), w.dtype(), b.dtype()] != [DType::F32; 3] {
        return Err(x);
    }
    let x: Tensor<Ad, 2> = cast(x)?;
    let w: Tensor<Ad, 2> = cast(w).map_err(|_| ()).expect("B is Ad");
    let b: Tensor<Ad, 1> = cast(b).map_err(|_| ()).expect("B is Ad");
    let y = fused(x, w, b, relu);
    Ok(cast(y).map_err(|_| ()).expect("B is Ad"))
}

/// A contiguous f32 view (copies only a strided tensor).
pub fn host(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(
            t.to_contiguous()
                .as_slice::<f32>()
                .expect("contiguous f32")
                .to_vec(),
        ),
    }
}

fn flex(v: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(v, shape.to_vec()))
}

fn fused(x: Tensor<Ad, 2>, w: Tensor<Ad, 2>, b: Tensor<Ad, 1>, relu: bool) -> Tensor<Ad, 2> {
    let x = x.into_primitive().tensor();
    let w = w.into_primitive().tensor();
    let b = b.into_primitive().tensor();
    let [m, k] = [
        x.primitive.layout().shape()[0],
        x.primitive.layout().shape()[1],
    ];
    let n = w.primitive.layout().shape()[1];
    let y = {
        let (xs, ws, bs) = (host(&x.primitive), host(&w.primitive), host(&b.primitive));
        flex(forward(&xs, &ws, &bs, [m, k, n], relu), &[m, n])
    };
    let out = match FusedLinear
        .prepare::<NoCheckpointing>([x.node.clone(), w.node.clone(), b.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            FusedState {
                x: x.primitive,
                w: w.primitive,
                y: y.clone(),
                relu,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// What the backward pass needs.
#[derive(Debug, Clone)]
struct FusedState {
    x: FlexTensor,
    w: FlexTensor,
    y: FlexTensor,
    relu: bool,
}

#[derive(Debug)]
struct FusedLinear;

impl Backward<Flex, 3> for FusedLinear {
    type State = FusedState;

    fn backward(self, ops: Ops<FusedState, 3>, grads: &mut Gradients, _c: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let s = ops.state;
        let (xs, ws, ys, dys) = (host(&s.x), host(&s.w), host(&s.y), host(&dy));
        let (m, k) = (s.x.layout().shape()[0], s.x.layout().shape()[1]);
        let n = s.w.layout().shape()[1];
        let g = backward(
            &xs,
            &ws,
            &ys,
            &dys,
            [m, k, n],
            s.relu,
            [node_x.is_some(), node_w.is_some(), node_b.is_some()],
        );
        if let (Some(node), Some(dx)) = (node_x, g.dx) {
            grads.register::<Flex>(node.id, flex(dx, &[m, k]));
        }
        if let (Some(node), Some(dw)) = (node_w, g.dw) {
            grads.register::<Flex>(node.id, flex(dw, &[k, n]));
        }
        if let (Some(node), Some(db)) = (node_b, g.db) {
            grads.register::<Flex>(node.id, flex(db, &[n]));
        }
    }
}

/// A strided view of a matrix operand: element `(i, j)` at `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// A row-major matrix with `cols` columns.
    fn row_major(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns (its strides swapped).
    fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }

    fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || self.data.len() > (rows - 1) * self.rs + (cols - 1) * self.cs
    }
}

/// `out = a·b` (`out` `m × n` row-major, `a` `m × k`, `b` `k × n`), single-threaded with the
/// `gemm` crate (the kernels Burn's Flex matmul runs): its reduction order depends only on
/// the shapes and this CPU, so repeated runs are bit-identical.
fn matmul(m: usize, n: usize, k: usize, a: View, b: View) -> Vec<f32> {
    assert!(a.covers(m, k) && b.covers(k, n), "operand too short");
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    // SAFETY: `covers` bounds every element of both operands, `out` is `m × n` row-major.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    out
}

/// `y = act(x·w + b)` for `x` `m × k`, `w` `k × n`, `b` `n`.
fn forward(x: &[f32], w: &[f32], b: &[f32], [m, k, n]: [usize; 3], relu: bool) -> Vec<f32> {
    let xv = View::row_major(x, k);
    let wv = View::row_major(w, n);
    let mut y = matmul(m, n, k, xv, wv);
    for row in y.chunks_exact_mut(n.max(1)) {
        for (v, b) in row.iter_mut().zip(b) {
            let z = *v + b;
            *v = if relu { z.max(0.0) } else { z };
        }
    }
    y
}

/// The gradients the backward pass produced (`None` where not asked for).
struct Grads {
    dx: Option<Vec<f32>>,
    dw: Option<Vec<f32>>,
    db: Option<Vec<f32>>,
}

/// Gradients of `y = act(x·w + b)` given `dy`; `want` = `[dx, dw, db]`.
#[allow(clippy::too_many_arguments)]
fn backward(
    x: &[f32],
    w: &[f32],
    y: &[f32],
    dy: &[f32],
    [m, k, n]: [usize; 3],
    relu: bool,
    want: [bool; 3],
) -> Grads {
    let dz: std::borrow::Cow<'_, [f32]> = if relu {
        dy[..m * n]
            .iter()
            .zip(&y[..m * n])
            .map(|(g, o)| if *o > 0.0 { *g } else { 0.0 })
            .collect::<Vec<f32>>()
            .into()
    } else {
        dy[..m * n].into()
    };
    let dzv = View::row_major(&dz, n);
    // dW = Xᵀ·dZ: Xᵀ is X with its strides swapped.
    let dw = want[1].then(|| {
        let xt = View::transposed(x, k);
        matmul(k, n, m, xt, dzv)
    });
    let db = want[2].then(|| {
        let mut s = vec![0.0f32; n];
        for r in dz.chunks_exact(n.max(1)) {
            for (a, v) in s.iter_mut().zip(r) {
                *a += v;
            }
        }
        s
    });
    // dX = dZ·Wᵀ.
    let dx = want[0].then(|| {
        let wt = View::transposed(w, n);
        matmul(m, k, n, dzv, wt)
    });
    Grads { dx, dw, db }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::tensor::Distribution;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut r = crate::rng::SplitMix64::new(seed);
        (0..n).map(|_| r.uniform(-1.0, 1.0) as f32).collect()
    }

    /// f64 reference of the forward and all three gradients.
    #[allow(clippy::type_complexity)]
    fn reference(
        x: &[f32],
        w: &[f32],
        b: &[f32],
        dy: &[f32],
        [m, k, n]: [usize; 3],
        relu: bool,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut y = vec![0.0; m * n];
        let mut dz = vec![0.0; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut z = b[c] as f64;
                for p in 0..k {
                    z += x[r * k + p] as f64 * w[p * n + c] as f64;
                }
                y[r * n + c] = if relu { z.max(0.0) } else { z };
                dz[r * n + c] = if !relu || z > 0.0 {
                    dy[r * n + c] as f64
                } else {
                    0.0
                };
            }
        }
        let mut dw = vec![0.0; k * n];
        let mut dx = vec![0.0; m * k];
        let mut db = vec![0.0; n];
        for r in 0..m {
            for c in 0..n {
                db[c] += dz[r * n + c];
                for p in 0..k {
                    dw[p * n + c] += x[r * k + p] as f64 * dz[r * n + c];
                    dx[r * k + p] += dz[r * n + c] * w[p * n + c] as f64;
                }
            }
        }
        (y, dx, dw, db)
    }

    fn close(a: &[f32], b: &[f64], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (*x as f64 - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    #[test]
    fn forward_and_gradients_match_an_f64_reference_on_awkward_shapes() {
        // Shapes off every tile size, a one-wide layer, a one-row batch.
        {
            for &[m, k, n] in &[
                [128, 20, 48],
                [7, 48, 3],
                [5, 3, 17],
                [1, 1, 1],
                [9, 33, 50],
            ] {
                for relu in [true, false] {
                    let (x, w, b, dy) =
                        (data(m * k, 1), data(k * n, 2), data(n, 3), data(m * n, 4));
                    let (ry, rdx, rdw, rdb) = reference(&x, &w, &b, &dy, [m, k, n], relu);
                    let y = forward(&x, &w, &b, [m, k, n], relu);
                    let what = format!("{m}×{k}×{n} relu={relu}");
                    close(&y, &ry, &format!("y {what}"));
                    let g = backward(&x, &w, &y, &dy, [m, k, n], relu, [true; 3]);
                    close(g.dx.as_ref().unwrap(), &rdx, &format!("dx {what}"));
                    close(g.dw.as_ref().unwrap(), &rdw, &format!("dw {what}"));
                    close(g.db.as_ref().unwrap(), &rdb, &format!("db {what}"));
                    // Bit-identical when repeated (a run's bits depend only on its inputs).
                    let again = backward(&x, &w, &y, &dy, [m, k, n], relu, [true; 3]);
                    assert_eq!(forward(&x, &w, &b, [m, k, n], relu), y, "{what}");
                    assert_eq!((again.dx, again.dw, again.db), (g.dx, g.dw, g.db), "{what}");
                }
            }
        }
    }

    #[test]
    fn the_fused_op_gives_burns_gradients_and_respects_frozen_inputs() {
        let d = Default::default();
        let lin = |seed: u64, i: usize, o: usize| Linear::<Ad> {
            weight: Param::from_tensor(Tensor::random([i, o], Distribution::Default, &d))
                .set_require_grad(seed != 0),
            bias: Some(Param::from_tensor(Tensor::random(
                [o],
                Distribution::Default,
                &d,
            ))),
        };
        let (l1, l2) = (lin(1, 6, 10), lin(0, 10, 3));
        let x = Tensor::<Ad, 2>::random([9, 6], Distribution::Default, &d);
        let target = Tensor::<Ad, 2>::random([9, 3], Distribution::Default, &d);
        let loss_of = |fused: bool| {
            let h = if fused {
                linear_act(&l1, x.clone(), true).unwrap()
            } else {
                burn::tensor::activation::relu(l1.forward(x.clone()))
            };
            let o = if fused {
                linear_act(&l2, h, false).unwrap()
            } else {
                l2.forward(h)
            };
            let loss = (o - target.clone()).powi_scalar(2).mean();
            let v: f32 = loss.clone().into_scalar();
            (v, loss.backward())
        };
        let (va, ga) = loss_of(true);
        let (vb, gb) = loss_of(false);
        assert!((va - vb).abs() <= 1e-6 * vb.abs().max(1.0), "{va} vs {vb}");
        let get2 = |g: &Gradients, p: &Param<Tensor<Ad, 2>>| {
            p.val()
                .grad(g)
                .map(|t| t.into_data().to_vec::<f32>().unwrap())
        };
        let get1 = |g: &Gradients, p: &Param<Tensor<Ad, 1>>| {
            p.val()
                .grad(g)
                .map(|t| t.into_data().to_vec::<f32>().unwrap())
        };
        let pairs = [
            (get2(&ga, &l1.weight), get2(&gb, &l1.weight)),
            (
                get1(&ga, l1.bias.as_ref().unwrap()),
                get1(&gb, l1.bias.as_ref().unwrap()),
            ),
            (
                get1(&ga, l2.bias.as_ref().unwrap()),
                get1(&gb, l2.bias.as_ref().unwrap()),
            ),
        ];
        for (a, b) in pairs {
            let (a, b) = (a.expect("fused grad"), b.expect("burn grad"));
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
        // The frozen weight gets no gradient from either path.
        assert!(get2(&ga, &l2.weight).is_none());
        assert!(get2(&gb, &l2.weight).is_none());
    }

    #[test]
    fn other_backends_fall_back() {
        let d = Default::default();
        let lin = Linear::<Flex> {
            weight: Param::from_tensor(Tensor::zeros([2, 2], &d)),
            bias: None,
        };
        assert!(linear_act(&lin, Tensor::zeros([1, 2], &d), true).is_err());
        // A layer of another precision on the fused op's own backend takes Burn's ops.
        let f64_layer = Linear::<Ad> {
            weight: Param::from_tensor(Tensor::<Ad, 2>::zeros([2, 2], &d).cast(DType::F64)),
            bias: Some(Param::from_tensor(Tensor::<Ad, 1>::zeros([2], &d))),
        };
        assert!(linear_act(&f64_layer, Tensor::<Ad, 2>::zeros([1, 2], &d), true).is_err());
    }
}
