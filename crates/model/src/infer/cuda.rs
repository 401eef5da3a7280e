//! The `cuda-bf16` and `cuda-f32` engines (cargo feature `cuda`): the Burn module on Burn's
//! CUDA backend.
//!
//! The f32 checkpoint is cast to the backend's float type when the module is built
//! (`Tensor::from_data` converts to the device dtype). Burn/cubecl compile and autotune a
//! kernel the first time each shape runs, so the engine runs every batch bucket of
//! [`BUCKETS`] once at build time and pads each request up to the next bucket: the request
//! path never meets a new shape. Requests above the largest bucket run in chunks of it.
//! On a machine without a GPU or driver, building fails with [`InferError::Unavailable`]
//! naming what is missing (Burn 0.21's CUDA device panics there; [`cuda_probe`] catches it).
//!
//! [`cuda_probe`]: crate::backend::cuda_probe

use burn::backend::cuda::CudaDevice;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::{Engine, HeadOutput, InferError, check_shape};
use crate::artifact::HostWeights;
use crate::model::{RegressionNet, RegressionNetConfig};

/// Batch buckets compiled at load; requests are padded up to the next one.
pub const BUCKETS: [usize; 7] = [1, 8, 32, 128, 1024, 8192, 65536];

/// The smallest bucket holding `rows` (the largest when none does).
pub fn bucket_for(rows: usize) -> usize {
    BUCKETS
        .iter()
        .copied()
        .find(|&b| b >= rows)
        .unwrap_or(BUCKETS[BUCKETS.len() - 1])
}

/// A Burn module on a CUDA backend with bucketed, pre-warmed shapes.
pub struct CudaEngine<B: Backend<Device = CudaDevice>> {
    model: RegressionNet<B>,
    arch: RegressionNetConfig,
    device: CudaDevice,
    label: String,
    staging: Vec<f32>,
}

impl<B: Backend<Device = CudaDevice>> CudaEngine<B> {
    /// Probe the GPU, upload `weights` (cast to `B`'s float type) and warm up every bucket.
    pub fn new(weights: &HostWeights, label: &str) -> Result<Self, InferError> {
        let device = crate::backend::cuda_probe().map_err(|reason| InferError::Unavailable {
            engine: label.to_string(),
            reason: reason.to_string(),
        })?;
        let model = weights.to_model::<B>(&device);
        let mut engine = Self {
            model,
            arch: weights.arch.clone(),
            device,
            label: label.to_string(),
            staging: Vec::new(),
        };
        let mut out = HeadOutput::default();
        for &b in &BUCKETS {
            let x = vec![0.0f32; b * engine.arch.n_features];
            engine.forward(&x, b, &mut out)?;
        }
        Ok(engine)
    }

    fn run_bucket(&mut self, x: &[f32], rows: usize, mean: &mut Vec<f32>, lv: &mut Vec<f32>) {
        let nf = self.arch.n_features;
        let bucket = bucket_for(rows);
        self.staging.clear();
        self.staging.extend_from_slice(x);
        self.staging.resize(bucket * nf, 0.0);
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(self.staging.clone(), [bucket, nf]),
            &self.device,
        );
        let o = self.model.forward(t);
        let k = self.arch.n_targets;
        let m: Vec<f32> = o
            .mean
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 output");
        let l: Vec<f32> = o
            .log_var
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 output");
        mean.extend_from_slice(&m[..rows * k]);
        lv.extend_from_slice(&l[..rows * k]);
    }
}

impl<B: Backend<Device = CudaDevice>> Engine for CudaEngine<B> {
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
        let (mut mean, mut lv) = (
            std::mem::take(&mut out.mean),
            std::mem::take(&mut out.log_var),
        );
        let max = BUCKETS[BUCKETS.len() - 1];
        let mut r = 0;
        while r < rows || (rows == 0 && r == 0) {
            let n = max.min(rows - r);
            if n == 0 {
                break;
            }
            self.run_bucket(&x[r * nf..(r + n) * nf], n, &mut mean, &mut lv);
            r += n;
        }
        out.mean = mean;
        out.log_var = lv;
        Ok(())
    }

    fn warm_up(&mut self, _batch_sizes: &[usize]) -> Result<(), InferError> {
        // Every bucket ran at build time; any batch size maps onto one of them.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_size() {
        assert_eq!(bucket_for(1), 1);
        assert_eq!(bucket_for(2), 8);
        assert_eq!(bucket_for(1000), 1024);
        assert_eq!(bucket_for(65536), 65536);
        assert_eq!(bucket_for(70000), 65536);
    }

    /// Without a usable GPU the engine is an `Unavailable` error naming it, not a panic;
    /// with one, a request of any size comes back with one row per input row.
    #[test]
    fn the_engine_is_an_error_without_a_gpu_and_pads_to_buckets_with_one() {
        let w = crate::infer::reference_weights(4);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            CudaEngine::<crate::backend::CudaF32>::new(&w, "cuda-f32")
        }))
        .expect("building the CUDA engine does not panic");
        match (crate::backend::cuda_probe(), built) {
            (Err(why), Err(InferError::Unavailable { engine, reason })) => {
                assert_eq!(engine, "cuda-f32");
                assert_eq!(reason, why.to_string());
            }
            (Ok(_), Ok(mut e)) => {
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
