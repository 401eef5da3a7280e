//! Export of a checkpoint to formats other runtimes read.
//!
//! * `onnx` (feature `onnx`, on in the default build): one self-contained ONNX graph, normalisation included, that
//!   answers like `kiln predict` (`kiln export onnx --checkpoint DIR --out model.onnx`).

#[cfg(feature = "onnx")]
pub mod onnx;
