//! `kiln predict --checkpoint DIR --input rows.csv [--output out.csv] [--engine E]`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::artifact::Checkpoint;
use kiln::infer::{EngineKind, build_engine};
use kiln::predict::{PredictError, Predictor, max_delta_vs_fused, predict_csv, write_output};

/// Load a checkpoint once and predict every row of `input`.
pub fn run(checkpoint: &Path, input: &Path, output: Option<&Path>, kind: EngineKind) -> CliResult {
    let ckpt = Checkpoint::load(checkpoint).map_err(CliError::input)?;
    let engine = build_engine(kind, &ckpt.weights, 1).map_err(CliError::input)?;
    if let Some(choice) = engine.auto_choice() {
        eprintln!("{}", choice.summary());
    }
    if kind.is_quantised() {
        // Quantisation is never silent: say how far it moved these very rows.
        let (dm, ds, rows) = max_delta_vs_fused(&ckpt, input, kind).map_err(|e| match e {
            PredictError::Data(_) => CliError::input(e),
            other => CliError::from(other),
        })?;
        eprintln!(
            "note: {kind} is quantised: on these {rows} rows max |Δmean| {dm:.3e}, max |Δstd| {ds:.3e} vs fused (exact: --engine auto or fused)"
        );
    }
    let mut predictor = Predictor::for_checkpoint(&ckpt, engine);
    let (text, rows) = predict_csv(
        &mut predictor,
        input,
        &ckpt.manifest.input_preprocessing(),
        &ckpt.manifest.target_names(),
    )
    .map_err(|e| match e {
        PredictError::Data(_) => CliError::input(e),
        other => CliError::from(other),
    })?;
    write_output(&text, output)?;
    if let Some(out) = output {
        eprintln!(
            "{}: {rows} rows predicted by {}",
            out.display(),
            predictor.engine_name()
        );
    }
    Ok(())
}
