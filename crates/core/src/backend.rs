//! Backend type aliases and device selection.
//!
//! CPU: `Flex` (default; fast at small batch) or `NdArray`. CUDA (cargo feature `cuda`):
//! `Cuda<f32>` or `Cuda<bf16>`. Burn 0.21's CUDA device panics when no driver or GPU is
//! present; [`cuda_probe`] turns that into an error that names what is missing.

use burn::backend::Autodiff;

/// The default CPU inference backend.
pub type Cpu = burn::backend::Flex;
/// The alternative CPU backend.
pub type CpuNdArray = burn::backend::NdArray;
/// Training on the default CPU backend.
pub type TrainCpu = Autodiff<Cpu>;
/// Training on NdArray.
pub type TrainNdArray = Autodiff<CpuNdArray>;

/// CUDA with f32 floats.
#[cfg(feature = "cuda")]
pub type CudaF32 = burn::backend::Cuda<f32>;
/// CUDA with bf16 floats.
#[cfg(feature = "cuda")]
pub type CudaBf16 = burn::backend::Cuda<burn::tensor::bf16>;

/// Why no CUDA device can be used (the message says what is missing).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CudaUnavailable(pub String);

/// Check that a CUDA device can be created and used, without letting Burn's panic escape.
#[cfg(feature = "cuda")]
pub fn cuda_probe() -> Result<burn::backend::cuda::CudaDevice, CudaUnavailable> {
    use burn::tensor::Tensor;
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(|| {
        let device = burn::backend::cuda::CudaDevice::default();
        let t = Tensor::<CudaF32, 1>::ones([4], &device);
        let _ = t.sum().into_data();
        device
    });
    std::panic::set_hook(prev);
    result.map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        CudaUnavailable(format!(
            "no usable CUDA device: the CUDA driver (libcuda.so) or an NVIDIA GPU is missing or unusable ({})",
            msg.lines().next().unwrap_or("")
        ))
    })
}

/// Without the `cuda` feature there is never a CUDA device.
#[cfg(not(feature = "cuda"))]
pub fn cuda_probe() -> Result<(), CudaUnavailable> {
    Err(CudaUnavailable(
        "this kiln was built without the `cuda` feature (rebuild with `--features cuda`)".into(),
    ))
}
