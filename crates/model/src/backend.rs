//! Backend type aliases and device selection.
//!
//! CPU: `Flex` (default; fast at small batch) or `NdArray`. CUDA (cargo feature `cuda`):
//! `Cuda<f32>` or `Cuda<bf16>`. Burn 0.21's CUDA device panics when no driver or GPU is
//! present; [`cuda_probe`] turns that into an error that names what is missing. wgpu (cargo
//! feature `wgpu`): `Wgpu<f32>` / `Wgpu<f16>` on any Vulkan device, Mesa's software lavapipe
//! included: the same CubeCL code path as CUDA, tested in CI without a GPU ([`wgpu_probe`]).
//!
//! Burn 0.21 keeps the default float dtype per *device*: the first tensor created on a device
//! fixes it for the process, whatever backend type later asks. The probes therefore create
//! their tensors with an explicit dtype, the GPU engines create every tensor with theirs
//! ([`crate::infer::gpu`]), and bf16 training sets the device's default with
//! [`set_float_dtype`] before building anything.

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

/// wgpu (Vulkan) with f32 floats.
#[cfg(feature = "wgpu")]
pub type WgpuF32 = burn::backend::Wgpu<f32, i32>;
/// wgpu (Vulkan) with f16 floats (lavapipe has no bf16: the half-precision stand-in in tests).
#[cfg(feature = "wgpu")]
pub type WgpuF16 = burn::backend::Wgpu<burn::tensor::f16, i32>;

/// Why no CUDA device can be used (the message says what is missing).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CudaUnavailable(pub String);

/// Check that a CUDA device can be created and used, without letting Burn's panic escape.
#[cfg(feature = "cuda")]
pub fn cuda_probe() -> Result<burn::backend::cuda::CudaDevice, CudaUnavailable> {
    use burn::tensor::{DType, Tensor};
    // Without a loadable driver library, asking cubecl for a device only logs a warning from
    // its device thread and panics: say what is missing before touching it.
    if let Err(e) = dlopen(std::path::Path::new("libcuda.so.1")) {
        return Err(CudaUnavailable(format!(
            "no usable CUDA device: the CUDA driver library libcuda.so.1 cannot be loaded ({e})"
        )));
    }
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(|| {
        let device = burn::backend::cuda::CudaDevice::default();
        // An explicit dtype: the probe must not fix the device's default float dtype.
        let t = Tensor::<CudaF32, 1>::from_data([1.0f32; 4], (&device, DType::F32));
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

/// Check that a wgpu (Vulkan) device can be created and used, without letting the device
/// thread's panic escape (no Vulkan driver: "No possible adapter available"). Creates its
/// tensor with an explicit dtype, so the device's default float dtype stays unset.
#[cfg(feature = "wgpu")]
pub fn wgpu_probe() -> Result<burn::backend::wgpu::WgpuDevice, String> {
    use burn::tensor::{DType, Tensor};
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(|| {
        let device = burn::backend::wgpu::WgpuDevice::default();
        let t = Tensor::<WgpuF32, 1>::from_data([1.0f32, 2.0, 3.0, 4.0], (&device, DType::F32));
        let v: f32 = t.sum().into_scalar();
        (device, v)
    });
    std::panic::set_hook(prev);
    match result {
        Ok((device, v)) => {
            if (v - 10.0).abs() < 1e-6 {
                Ok(device)
            } else {
                Err(format!(
                    "the wgpu device answered 1+2+3+4 = {v}: it is not usable"
                ))
            }
        }
        Err(p) => Err(format!(
            "no usable wgpu (Vulkan) device; install a Vulkan driver, e.g. Debian's \
             mesa-vulkan-drivers (lavapipe) ({})",
            panic_text(&*p)
        )),
    }
}

/// Make `dtype` the default float dtype of `device` for backend `B` (what Burn's module
/// initialisation and `Tensor::from_data(data, &device)` create), before anything else creates
/// a tensor there. An error when the device's default was already fixed to another dtype
/// (Burn keeps one per device and process): the caller must not then train in `dtype` while
/// silently computing in the other.
pub fn set_float_dtype<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    dtype: burn::tensor::DType,
) -> Result<(), String> {
    use burn::tensor::Element;
    let int = <B::IntElem as Element>::dtype();
    match burn::tensor::set_default_dtypes::<B>(device, dtype, int) {
        Ok(()) => Ok(()),
        Err(e) => {
            let now: burn::tensor::DType = burn::tensor::get_device_settings::<B>(device)
                .float_dtype
                .into();
            if now == dtype {
                Ok(())
            } else {
                Err(format!(
                    "the device's default float dtype is already {now:?} in this process, \
                     {dtype:?} was asked ({e:?})"
                ))
            }
        }
    }
}

/// The first line of a caught panic's message.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Open `path` (a file, or a bare soname the dynamic loader searches for) with the dynamic
/// loader, and keep it open so that a later load by its soname finds it; the loader's message
/// when it cannot.
pub fn dlopen(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a valid NUL-terminated path; dlopen and dlerror have no other
    // preconditions, and the handle is deliberately never closed.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message or null.
        let msg = unsafe { libc::dlerror() };
        let msg = if msg.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated, valid until the next dl* call.
            unsafe { std::ffi::CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn dlopen_names_what_is_missing() {
        let e = super::dlopen(std::path::Path::new("libkiln-no-such-library.so.7")).unwrap_err();
        assert!(e.contains("libkiln-no-such-library.so.7"), "{e}");
        // The C library is always there.
        super::dlopen(std::path::Path::new("libc.so.6")).unwrap();
    }
}
