//! [`KernelEngine`]: the network as one fused CubeCL kernel launch per call
//! ([`super::kernel`]), on any CubeCL runtime (CUDA for `cuda-f32`/`cuda-bf16`; wgpu/Vulkan —
//! Mesa's lavapipe in CI — in the tests).
//!
//! # What a call does
//! One upload of the input rows, one kernel launch, one read of one output buffer holding both
//! heads (row-interleaved: a row's `k` means then its `k` log-variances). The weights were
//! uploaded once at build, as one packed buffer, and stay resident. Each batch bucket of
//! [`BUCKETS`] has its own output buffer, allocated at build and reused by every call; only the
//! prefix holding the call's rows is read back. The input and the host-side results go through
//! buffers the engine keeps (`staging`, `out`), so the engine's own code allocates nothing per
//! call once the batch size has been seen.
//!
//! # What cubecl 0.10 does not allow (measured against its source, `cubecl-runtime` 0.10.0)
//! * **No write into an existing device buffer**: the client's only uploads are `create*`,
//!   which take a fresh handle from the memory pool (a pool slot, not a device allocation) and
//!   copy the host bytes once more into a `Vec` before the server writes them
//!   (`ComputeClient::do_create` → `Bytes::from_bytes_vec(data.to_vec())`). So each call's
//!   input lives in a pooled handle and passes through one host copy inside cubecl.
//! * **No pinned upload**: for the same reason, `ComputeClient::staging` buffers (CUDA's pinned
//!   pool) are copied back into pageable memory by `create`; reads, on CUDA, do land in pinned
//!   memory (cubecl's read path).
//! * **No CUDA graphs**: cubecl 0.10 has no graph or stream-capture API, and its streams are
//!   not exposed, so a call is one launch on cubecl's stream, not a replayed graph.
//!
//! # Reading back a prefix
//! A handle from `ComputeClient::empty`/`create*` is a window onto a base allocation rounded up
//! to the runtime's memory alignment (`cubecl-runtime` 0.10 `allocator.rs`: `apply` rounds
//! `total_size` up, `offset_handles` sets the window's `offset_end` to the padding), and
//! `Handle::offset_end` *adds* to the offset already set. The call's rows are therefore the
//! window's used size minus the unused rows' bytes ([`read_prefix`]), never the base size
//! (`Handle::size`) minus them, which trims the padding twice: that read 4 of a 1-row bucket's 6
//! values on lavapipe and failed every build with "range end index 6 out of range for slice of
//! length 4".
//!
//! # Fallback
//! The kernel keeps one row's activations in a local array of `2 × width` values, `width` the
//! widest layer (or input); above [`MAX_KERNEL_WIDTH`] the engines fall back to the Burn module
//! ([`super::GpuEngine`]), as they do when `KILN_GPU_ENGINE=burn` is set (benches compare the
//! two that way) and when the kernel cannot be built on the device ([`kernel_or_module`]).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::kernel::{activation_code, network_kernel};
use super::{BUCKETS, GpuDeviation, PROBE_ROWS, bucket_for, max_abs_diff, probe_rows};
use crate::artifact::{HostLinear, HostWeights};
use crate::infer::{Engine, FusedEngine, HeadOutput, InferError, check_shape};
use crate::model::RegressionNetConfig;
use burn::tensor::DType;

/// The widest layer (or input) the kernel takes; wider networks use the Burn module.
pub const MAX_KERNEL_WIDTH: usize = 1024;

/// Threads per cube (one row each).
pub const THREADS_PER_CUBE: u32 = 64;

/// The environment variable that makes the GPU engines use the Burn module instead of the
/// kernel (`burn`); benches set it to compare the two.
pub const ENGINE_ENV: &str = "KILN_GPU_ENGINE";

/// The fused-kernel engine on cubecl's wgpu (Vulkan) runtime, computing in `F` (f32, or f16
/// where the device has it): the CI tests' stand-in for CUDA (lavapipe has no bf16).
#[cfg(feature = "wgpu")]
pub type WgpuKernelEngine<F> = KernelEngine<cubecl::wgpu::WgpuRuntime, F>;

/// A float type the kernel computes in (f32, f16, bf16), with its host conversions.
pub trait KernelFloat: Float + CubeElement + Copy {
    /// Burn's name for it.
    const DTYPE: DType;
    /// From f32 (round to nearest even).
    fn from_f32(v: f32) -> Self;
    /// To f32 (exact).
    fn to_f32(self) -> f32;
}

impl KernelFloat for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl KernelFloat for burn::tensor::f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(v: f32) -> Self {
        burn::tensor::f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        burn::tensor::f16::to_f32(self)
    }
}

impl KernelFloat for burn::tensor::bf16 {
    const DTYPE: DType = DType::BF16;
    fn from_f32(v: f32) -> Self {
        burn::tensor::bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        burn::tensor::bf16::to_f32(self)
    }
}

/// The widest layer or input of `arch` (what the kernel's local buffer must hold).
pub fn kernel_width(arch: &RegressionNetConfig) -> usize {
    arch.hidden
        .iter()
        .copied()
        .chain([arch.n_features])
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Whether the kernel can run `arch` (else the engines use the Burn module), and why not.
pub fn kernel_refuses(arch: &RegressionNetConfig) -> Option<String> {
    let w = kernel_width(arch);
    if w > MAX_KERNEL_WIDTH {
        return Some(format!(
            "its widest layer has {w} units, above the fused kernel's {MAX_KERNEL_WIDTH}"
        ));
    }
    if arch.n_features == 0 || arch.n_targets == 0 {
        return Some("it has no features or no targets".to_string());
    }
    None
}

/// Whether `KILN_GPU_ENGINE=burn` asks for the Burn module.
pub fn burn_module_requested() -> bool {
    std::env::var(ENGINE_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("burn"))
}

/// The engine `label` on `device` computing in `F`: the fused kernel ([`KernelEngine`] on
/// runtime `R`), or the Burn module on backend `B` (same device, dtype `F::DTYPE`) when
/// `KILN_GPU_ENGINE=burn` asks for it, when the kernel refuses the network
/// ([`kernel_refuses`]) or when building the kernel fails ([`InferError::Unavailable`]: the
/// runtime could not compile or run it). The load note says which runs and why.
pub fn kernel_or_module<R, B, F>(
    weights: &HostWeights,
    label: &str,
    device: &R::Device,
) -> Result<Box<dyn Engine>, InferError>
where
    R: Runtime,
    B: burn::tensor::backend::Backend<Device = R::Device>,
    F: KernelFloat,
{
    kernel_or_module_with::<B>(weights, label, device, F::DTYPE, || {
        KernelEngine::<R, F>::on_device(weights, label, device).map(|k| Box::new(k) as _)
    })
}

/// [`kernel_or_module`] on cubecl's wgpu runtime, with Burn's wgpu backend as the fallback (the
/// CI tests' stand-in for `cuda_engine_for`).
#[cfg(feature = "wgpu")]
pub fn wgpu_kernel_or_module<F: KernelFloat>(
    weights: &HostWeights,
    label: &str,
    device: &cubecl::wgpu::WgpuDevice,
) -> Result<Box<dyn Engine>, InferError> {
    kernel_or_module::<cubecl::wgpu::WgpuRuntime, crate::backend::WgpuF32, F>(
        weights, label, device,
    )
}

/// [`kernel_or_module`] with the kernel's builder given: the Burn module on `B` in `dtype`
/// unless `KILN_GPU_ENGINE=burn` or [`kernel_refuses`] rule the kernel out, then `kernel()`,
/// and the Burn module again when that is [`InferError::Unavailable`] (other errors are the
/// caller's: bad weights fail the Burn module too).
pub fn kernel_or_module_with<B>(
    weights: &HostWeights,
    label: &str,
    device: &B::Device,
    dtype: DType,
    kernel: impl FnOnce() -> Result<Box<dyn Engine>, InferError>,
) -> Result<Box<dyn Engine>, InferError>
where
    B: burn::tensor::backend::Backend,
{
    let module = |why: String| -> Result<Box<dyn Engine>, InferError> {
        let engine = super::GpuEngine::<B>::on_device(weights, label, device.clone(), dtype)?;
        Ok(Box::new(engine.with_fallback_reason(why)))
    };
    if burn_module_requested() {
        return module(format!("{ENGINE_ENV}=burn asks for it"));
    }
    if let Some(why) = kernel_refuses(&weights.arch) {
        return module(why);
    }
    match kernel() {
        Ok(engine) => Ok(engine),
        Err(InferError::Unavailable { reason, .. }) => {
            tracing::warn!(
                target: "kiln::infer::gpu",
                "{label}: the fused kernel could not be built ({reason}); using the Burn module"
            );
            module(format!("the fused kernel could not be built: {reason}"))
        }
        Err(e) => Err(e),
    }
}

/// The packed parameters (each backbone layer's weights then bias; then the two heads as one
/// `2k`-column layer) and the widths `[n_features, hidden…, 2k]`.
pub fn pack_weights(weights: &HostWeights) -> (Vec<f32>, Vec<u32>) {
    let mut params = Vec::new();
    let mut dims = vec![weights.arch.n_features as u32];
    for l in &weights.backbone {
        params.extend_from_slice(&l.w);
        params.extend_from_slice(&l.b);
        dims.push(l.fan_out as u32);
    }
    let (m, v): (&HostLinear, &HostLinear) = (&weights.mean_head, &weights.logvar_head);
    let k = m.fan_out;
    for i in 0..m.fan_in {
        params.extend_from_slice(&m.w[i * k..(i + 1) * k]);
        params.extend_from_slice(&v.w[i * k..(i + 1) * k]);
    }
    params.extend_from_slice(&m.b);
    params.extend_from_slice(&v.b);
    dims.push(2 * k as u32);
    (params, dims)
}

/// The largest deviation from `fused` a kernel computing in `dtype` may show at build, per unit
/// of output scale (`1 + max |output|`): f32 accumulates in f32 like `fused` (measured ≤ 3e-7
/// relative), half precision rounds every weight and activation (measured 5e-4).
pub fn deviation_limit(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-3,
        _ => 5e-2,
    }
}

/// The network as one fused CubeCL kernel launch per call on runtime `R`, computing in `F`.
pub struct KernelEngine<R: Runtime, F: KernelFloat> {
    client: ComputeClient<R>,
    arch: RegressionNetConfig,
    label: String,
    width: usize,
    act: u32,
    params: Handle,
    params_len: usize,
    dims: Handle,
    dims_len: usize,
    /// One output buffer per bucket of [`BUCKETS`], `bucket × 2k` values each.
    outputs: Vec<Handle>,
    staging: Vec<F>,
    deviation: Option<GpuDeviation>,
}

impl<R: Runtime, F: KernelFloat> KernelEngine<R, F> {
    /// Upload `weights` to `device` once, allocate every bucket's output buffer, run one row
    /// (compiling the kernel) and measure the deviation from `fused`. Errors: the
    /// shape is not one the kernel takes ([`kernel_refuses`]) or the runtime panicked
    /// ([`InferError::Unavailable`]).
    pub fn on_device(
        weights: &HostWeights,
        label: &str,
        device: &R::Device,
    ) -> Result<Self, InferError> {
        let unavailable = |reason: String| InferError::Unavailable {
            engine: label.to_string(),
            reason,
        };
        if let Some(why) = kernel_refuses(&weights.arch) {
            return Err(unavailable(why));
        }
        let build = || -> Result<Self, InferError> {
            let client = R::client(device);
            let (params, dims) = pack_weights(weights);
            let params_f: Vec<F> = params.iter().map(|&v| F::from_f32(v)).collect();
            let k2 = 2 * weights.arch.n_targets;
            let elem = std::mem::size_of::<F>();
            let outputs = BUCKETS
                .iter()
                .map(|&b| client.empty(padded(b * k2) * elem))
                .collect();
            let mut engine = Self {
                params: client.create_from_slice(F::as_bytes(&padded_vec(params_f))),
                params_len: params.len(),
                dims: client.create_from_slice(u32::as_bytes(&dims)),
                dims_len: dims.len(),
                client,
                arch: weights.arch.clone(),
                label: label.to_string(),
                width: kernel_width(&weights.arch),
                act: activation_code(weights.arch.activation),
                outputs,
                staging: Vec::new(),
                deviation: None,
            };
            // One launch compiles the kernel: every batch size runs the same compiled kernel
            // (the widths and the row count are read at run time; only the cube count changes),
            // so unlike the Burn module there is nothing to warm per bucket.
            let mut out = HeadOutput::default();
            let x = vec![0.0f32; engine.arch.n_features];
            engine.forward(&x, 1, &mut out)?;
            let (deviation, scale) = engine.measure_deviation(weights)?;
            engine.deviation = Some(deviation);
            // A kernel that answers wrongly is not served: the chooser falls back to the Burn
            // module ([`kernel_or_module`]). On lavapipe, networks of more than 65,536 packed
            // parameters came back with outputs the launch never wrote, with no error.
            let limit = deviation_limit(F::DTYPE) * (1.0 + scale);
            let (m, v) = (deviation.max_abs_diff_mean, deviation.max_abs_diff_log_var);
            let worst = if m.is_nan() || v.is_nan() {
                f32::NAN
            } else {
                m.max(v)
            };
            // NaN is past any limit.
            if worst.is_nan() || worst > limit {
                return Err(unavailable(format!(
                    "its answers on {} seeded rows differ from fused by up to {worst:.3e} (limit {limit:.3e} in {:?})",
                    deviation.rows,
                    F::DTYPE
                )));
            }
            if let Some(note) = engine.load_note() {
                tracing::info!(target: "kiln::infer::gpu", "{note}");
            }
            Ok(engine)
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)).unwrap_or_else(|p| {
            Err(unavailable(format!(
                "the GPU runtime panicked: {}",
                crate::backend::panic_text(&*p)
            )))
        })
    }

    /// The float dtype the kernel computes in (its buffers' element type).
    pub fn dtype(&self) -> DType {
        F::DTYPE
    }

    /// The deviation from `fused` measured at build.
    pub fn deviation(&self) -> Option<GpuDeviation> {
        self.deviation
    }

    /// The deviation from `fused` on [`PROBE_ROWS`] seeded rows, and the largest |output| of
    /// `fused` there (the scale the deviation is judged against).
    fn measure_deviation(
        &mut self,
        weights: &HostWeights,
    ) -> Result<(GpuDeviation, f32), InferError> {
        let rows = PROBE_ROWS;
        let x = probe_rows(rows, weights.arch.n_features);
        let mut fused = FusedEngine::new(weights, 1)?;
        let (mut a, mut b) = (HeadOutput::default(), HeadOutput::default());
        fused.forward(&x, rows, &mut a)?;
        self.forward(&x, rows, &mut b)?;
        let scale = a
            .mean
            .iter()
            .chain(&a.log_var)
            .fold(0.0f32, |m, v| m.max(v.abs()));
        Ok((
            GpuDeviation {
                rows,
                max_abs_diff_mean: max_abs_diff(&a.mean, &b.mean),
                max_abs_diff_log_var: max_abs_diff(&a.log_var, &b.log_var),
            },
            scale,
        ))
    }

    /// One launch for `rows` (≤ the largest bucket) rows of `x`; appends both heads.
    fn run_chunk(
        &mut self,
        x: &[f32],
        rows: usize,
        out: &mut HeadOutput,
    ) -> Result<(), InferError> {
        let nf = self.arch.n_features;
        let k = self.arch.n_targets;
        let bucket = bucket_for(rows);
        let slot = BUCKETS.iter().position(|&b| b == bucket).unwrap_or(0);
        self.staging.clear();
        self.staging.extend(x.iter().map(|&v| F::from_f32(v)));
        // Uploads are whole 4-byte words (wgpu's copy alignment); the kernel reads
        // `x.len() / n_features` rows, so the padding is never a row.
        let n = rows * nf;
        self.staging.resize(padded(n), F::from_f32(0.0));
        let input = self.client.create_from_slice(F::as_bytes(&self.staging));
        let output = self.outputs[slot].clone();
        let elem = std::mem::size_of::<F>();
        let used = padded(rows * 2 * k) * elem;
        // SAFETY: every buffer is passed with its true length in elements; the kernel indexes
        // `x` below `rows × n_features` (its length is `n`, not the padded upload), `params`
        // and `dims` within the layout `pack_weights` made, and `out` below `rows × 2k`.
        unsafe {
            network_kernel::launch::<F, R>(
                &self.client,
                CubeCount::Static((rows as u32).div_ceil(THREADS_PER_CUBE), 1, 1),
                CubeDim::new_1d(THREADS_PER_CUBE),
                ArrayArg::from_raw_parts(input, n),
                ArrayArg::from_raw_parts(self.params.clone(), self.params_len),
                ArrayArg::from_raw_parts(self.dims.clone(), self.dims_len),
                ArrayArg::from_raw_parts(output.clone(), bucket * 2 * k),
                self.width,
                self.act,
            );
        }
        let bytes = self
            .client
            .read_one(read_prefix(output, used))
            .map_err(|e| InferError::Unavailable {
                engine: self.label.clone(),
                reason: format!("reading the kernel's output failed: {e}"),
            })?;
        let vals = F::from_bytes(&bytes);
        for r in 0..rows {
            let row = &vals[r * 2 * k..(r + 1) * 2 * k];
            out.mean
                .extend(row[..k].iter().map(|&v| KernelFloat::to_f32(v)));
            out.log_var
                .extend(row[k..].iter().map(|&v| KernelFloat::to_f32(v)));
        }
        Ok(())
    }
}

/// The first `bytes` bytes of `handle`'s used range (all of it when shorter): trims the
/// window's used size, not the base allocation's (see "Reading back a prefix" above).
fn read_prefix(handle: Handle, bytes: usize) -> Handle {
    let in_use = handle.size_in_used();
    let trim = in_use.saturating_sub(bytes as u64);
    handle.offset_end(trim)
}

/// `n` rounded up to whole 4-byte words of any kernel float (a multiple of 2 elements).
fn padded(n: usize) -> usize {
    n.div_ceil(2) * 2
}

fn padded_vec<F: KernelFloat>(mut v: Vec<F>) -> Vec<F> {
    v.resize(padded(v.len()), F::from_f32(0.0));
    v
}

impl<R: Runtime, F: KernelFloat> Engine for KernelEngine<R, F> {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn arch(&self) -> &RegressionNetConfig {
        &self.arch
    }

    fn forward(&mut self, x: &[f32], rows: usize, out: &mut HeadOutput) -> Result<(), InferError> {
        let nf = self.arch.n_features;
        check_shape(x, rows, nf)?;
        out.mean.clear();
        out.log_var.clear();
        let max = BUCKETS[BUCKETS.len() - 1];
        let mut r = 0;
        while r < rows {
            let n = max.min(rows - r);
            self.run_chunk(&x[r * nf..(r + n) * nf], n, out)?;
            r += n;
        }
        Ok(())
    }

    fn warm_up(&mut self, _batch_sizes: &[usize]) -> Result<(), InferError> {
        // Compiled (one kernel for every batch size) and every bucket's buffer made at build.
        Ok(())
    }

    fn load_note(&self) -> Option<String> {
        let d = self.deviation?;
        Some(format!(
            "{}: one fused CubeCL kernel per call (one thread per row), computes in {:?} (f32 accumulation) on the device; max |Δ| from fused on {} seeded rows: mean {:.3e}, log_var {:.3e}",
            self.label,
            self.dtype(),
            d.rows,
            d.max_abs_diff_mean,
            d.max_abs_diff_log_var
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_puts_both_heads_in_one_layer() {
        let w = crate::infer::reference_weights(3);
        let (params, dims) = pack_weights(&w);
        let k = w.arch.n_targets;
        assert_eq!(dims.first().copied(), Some(w.arch.n_features as u32));
        assert_eq!(dims.last().copied(), Some(2 * k as u32));
        assert_eq!(dims.len(), w.arch.hidden.len() + 2);
        let expect: usize = dims.windows(2).map(|p| (p[0] * p[1] + p[1]) as usize).sum();
        assert_eq!(params.len(), expect);
        // The head layer's first row: the mean head's then the log-variance head's.
        let head_off = params.len() - (dims[dims.len() - 2] as usize + 1) * 2 * k;
        assert_eq!(&params[head_off..head_off + k], &w.mean_head.w[..k]);
        assert_eq!(
            &params[head_off + k..head_off + 2 * k],
            &w.logvar_head.w[..k]
        );
        assert_eq!(&params[params.len() - k..], &w.logvar_head.b[..]);
    }

    /// `ComputeClient::empty(24)` under a 32-byte alignment is a 24-byte window (offset_end 8)
    /// of a 32-byte base: a prefix trims from the window, so 24 bytes stay 24, not 16.
    #[test]
    fn the_read_back_prefix_trims_the_window_not_the_base_allocation() {
        let window = Handle::new(cubecl::stream_id::StreamId::current(), 32).offset_end(8);
        assert_eq!(window.size(), 32);
        assert_eq!(window.size_in_used(), 24);
        assert_eq!(read_prefix(window.clone(), 24).size_in_used(), 24);
        assert_eq!(read_prefix(window.clone(), 16).size_in_used(), 16);
        assert_eq!(read_prefix(window, 40).size_in_used(), 24);
    }

    #[test]
    fn wide_networks_are_left_to_the_burn_module() {
        let mut arch = crate::infer::reference_weights(3).arch;
        assert_eq!(kernel_refuses(&arch), None);
        arch.hidden = vec![MAX_KERNEL_WIDTH + 1];
        assert!(kernel_refuses(&arch).unwrap().contains("1025 units"));
        assert_eq!(padded(7), 8);
        assert_eq!(padded(8), 8);
    }
}
