//! `kiln export onnx --checkpoint DIR --out model.onnx`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::export::onnx::{self, IR_VERSION, OPSET_VERSION, OnnxError};

/// Write a checkpoint's ONNX model and print what was written.
pub fn onnx(checkpoint: &Path, out: &Path) -> CliResult {
    let s = onnx::export_file(checkpoint, out).map_err(|e| match e {
        OnnxError::Artifact(_)
        | OnnxError::TargetTransform { .. }
        | OnnxError::DateFeature(_)
        | OnnxError::BinnedFeature(_) => CliError::input(e),
        other => CliError::from(other),
    })?;
    println!(
        "{}: ONNX opset {OPSET_VERSION} (IR {IR_VERSION}), {} nodes, {} bytes; features [batch, {}] → mean, std [batch, {}] in original units ({}; run {}, weights sha256 {})",
        s.path.display(),
        s.nodes,
        s.bytes,
        s.features,
        s.targets,
        s.activation.name(),
        s.run_id,
        s.weights_sha256
    );
    Ok(())
}
