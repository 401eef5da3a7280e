//! `kiln predict --checkpoint DIR --input rows.csv [--output out.csv] [--engine E]`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::artifact::Checkpoint;
use kiln::infer::{EngineKind, build_engine};
use kiln::predict::{
    PredictError, Predictor, max_delta_vs_fused, predict_csv_counted, write_output,
};

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
    let pre = ckpt.manifest.input_preprocessing();
    let (text, rows, cells) =
        predict_csv_counted(&mut predictor, input, &pre, &ckpt.manifest.target_names()).map_err(
            |e| match e {
                PredictError::Data(_) => CliError::input(e),
                other => CliError::from(other),
            },
        )?;
    // Never silent: one line naming the columns that met categories training did not have.
    if let Some(unseen) = cells.unknown_summary(&pre) {
        eprintln!(
            "note: categories the training split did not have (predicted as the unknown bucket): {unseen}"
        );
    }
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
