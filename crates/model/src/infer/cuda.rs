//! The `cuda-bf16` and `cuda-f32` engines (cargo feature `cuda`): [`GpuEngine`] on Burn's CUDA
//! backend, with explicit dtypes (bf16 really is bf16; see [`super::gpu`] for the per-device
//! default-dtype trap that made it silently f32).
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

use super::InferError;
pub use super::gpu::{BUCKETS, GpuEngine, bucket_for};
use crate::artifact::HostWeights;

/// The CUDA engines.
pub type CudaEngine<B> = GpuEngine<B>;

/// Probe the GPU, then build the engine named `label` on backend `B` computing in `dtype`.
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
}
