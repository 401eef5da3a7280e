//! The `cuda-bf16` and `cuda-f32` engines (cargo feature `cuda`): the network as **one fused
//! CubeCL kernel launch per call** ([`KernelEngine`] on cubecl's CUDA runtime, computing in
//! bf16 / f32 with f32 accumulation), or — for networks wider than the kernel takes
//! ([`kernel_refuses`]) or with `KILN_GPU_ENGINE=burn` — [`GpuEngine`], the Burn module on
//! Burn's CUDA backend, with explicit dtypes (bf16 really is bf16; see [`super::gpu`] for the
//! per-device default-dtype trap that made it silently f32). [`cuda_engine_for`] chooses.
//!
//! On a machine without a GPU or driver, building fails with [`InferError::Unavailable`]
//! naming what is missing (Burn 0.21's CUDA device panics there; [`cuda_probe`] catches it).
//!
//! f32 matrix products: cubek's matmul on CUDA selects its tile kernels by the element types
//! the kernel is launched with (f32 in, f32 accumulate for `cuda-f32`); kiln does not ask for
//! TF32. Whether a selected tile kernel uses TF32 tensor cores for f32 inputs is not measured
//! yet (no GPU this session); the deviation from `fused` printed at load is the evidence.
//!
//! [`cuda_probe`]: crate::backend::cuda_probe

use burn::tensor::DType;

pub use super::gpu::engine::{
    KernelEngine, KernelFloat, burn_module_requested, kernel_or_module, kernel_refuses,
};
pub use super::gpu::{BUCKETS, GpuEngine, bucket_for};
use super::{Engine, InferError};
use crate::artifact::HostWeights;

/// The fused-kernel engine on cubecl's CUDA runtime, computing in `F`.
pub type CudaKernelEngine<F> = KernelEngine<cubecl::cuda::CudaRuntime, F>;

/// The engine `label` computing in `F` (`f32` or `bf16`): the fused kernel, or the Burn module
/// `B` (same dtype) when the kernel refuses the network, cannot be built on this device, or
/// `KILN_GPU_ENGINE=burn` asks for it ([`kernel_or_module`]; the load note says which ran).
pub fn cuda_engine_for<B, F>(
    weights: &HostWeights,
    label: &str,
) -> Result<Box<dyn Engine>, InferError>
where
    B: burn::tensor::backend::Backend<Device = burn::backend::cuda::CudaDevice>,
    F: KernelFloat,
{
    let device = crate::backend::cuda_probe().map_err(|reason| InferError::Unavailable {
        engine: label.to_string(),
        reason: reason.to_string(),
    })?;
    kernel_or_module::<cubecl::cuda::CudaRuntime, B, F>(weights, label, &device)
}

/// Probe the GPU, then build the fused-kernel engine named `label` computing in `F`.
pub fn cuda_kernel_engine<F: KernelFloat>(
    weights: &HostWeights,
    label: &str,
) -> Result<CudaKernelEngine<F>, InferError> {
    let device = crate::backend::cuda_probe().map_err(|reason| InferError::Unavailable {
        engine: label.to_string(),
        reason: reason.to_string(),
    })?;
    KernelEngine::on_device(weights, label, &device)
}

/// The CUDA engines.
pub type CudaEngine<B> = GpuEngine<B>;

/// Probe the GPU, then build the Burn-module engine named `label` on backend `B` computing in
/// `dtype`.
pub fn cuda_engine<B>(
    weights: &HostWeights,
    label: &str,
    dtype: DType,
) -> Result<GpuEngine<B>, InferError>
where
    B: burn::tensor::backend::Backend<Device = burn::backend::cuda::CudaDevice>,
{
    let device = crate::backend::cuda_probe().map_err(|reason| InferError::Unavailable {
        engine: label.to_string(),
        reason: reason.to_string(),
    })?;
    GpuEngine::<B>::on_device(weights, label, device, dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::{Engine, HeadOutput};

    /// Without a usable GPU the engine is an `Unavailable` error naming it, not a panic;
    /// with one, a request of any size comes back with one row per input row.
    #[test]
    fn the_engine_is_an_error_without_a_gpu_and_pads_to_buckets_with_one() {
        let w = crate::infer::reference_weights(4);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cuda_engine::<crate::backend::CudaF32>(&w, "cuda-f32", DType::F32)
        }))
        .expect("building the CUDA engine does not panic");
        match (crate::backend::cuda_probe(), built) {
            (Err(why), Err(InferError::Unavailable { engine, reason })) => {
                assert_eq!(engine, "cuda-f32");
                assert_eq!(reason, why.to_string());
            }
            (Ok(_), Ok(mut e)) => {
                assert_eq!(e.dtype(), DType::F32);
                for rows in [1, 2, 9, 1025] {
                    let x = vec![0.5f32; rows * w.arch.n_features];
                    let mut out = HeadOutput::default();
                    e.forward(&x, rows, &mut out).unwrap();
                    assert_eq!(out.mean.len(), rows * w.arch.n_targets);
                    assert_eq!(out.log_var.len(), rows * w.arch.n_targets);
                }
            }
            (probe, built) => panic!(
                "the probe ({:?}) and the engine ({:?}) disagree",
                probe.err(),
                built.err()
            ),
        }
    }

    /// The fused-kernel engines too: an `Unavailable` error naming the missing GPU without
    /// one; with one, both heads for every row and the dtype asked for.
    #[test]
    fn the_kernel_engines_are_an_error_without_a_gpu_and_answer_with_one() {
        let w = crate::infer::reference_weights(4);
        for kind in [
            crate::records::EngineKind::CudaF32,
            crate::records::EngineKind::CudaBf16,
        ] {
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::infer::build_engine(kind, &w, 0)
            }))
            .expect("building the CUDA engine does not panic");
            match (crate::backend::cuda_probe(), built) {
                (Err(why), Err(InferError::Unavailable { engine, reason })) => {
                    assert_eq!(engine, kind.name());
                    assert_eq!(reason, why.to_string());
                }
                (Ok(_), Ok(mut e)) => {
                    assert!(e.load_note().unwrap().contains("one fused CubeCL kernel"));
                    for rows in [1, 9, 1025] {
                        let x = vec![0.5f32; rows * w.arch.n_features];
                        let mut out = HeadOutput::default();
                        e.forward(&x, rows, &mut out).unwrap();
                        assert_eq!(out.mean.len(), rows * w.arch.n_targets);
                        assert_eq!(out.log_var.len(), rows * w.arch.n_targets);
                    }
                }
                (probe, built) => panic!(
                    "the probe ({:?}) and the engine ({:?}) disagree",
                    probe.err(),
                    built.err().map(|e| e.to_string())
                ),
            }
        }
    }
}
