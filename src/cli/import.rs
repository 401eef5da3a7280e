//! `kiln import pytorch --weights FILE.safetensors --config FILE.yaml --out DIR`.

use std::path::PathBuf;

use kiln::import::{KeyMap, PytorchImport};

use super::{CliError, CliResult};

/// Arguments of `kiln import pytorch`.
#[derive(clap::Args, Debug)]
pub struct PytorchArgs {
    /// The `state_dict` as a safetensors file (F32, F64, F16 or BF16 tensors).
    #[arg(long)]
    pub weights: PathBuf,
    /// An experiment config: `data.features`, `data.targets`, `model.hidden` and
    /// `model.activation` describe the network (other keys are ignored); an optional
    /// top-level `normalization:` section gives feature/target mean and std (identity when
    /// absent).
    #[arg(long)]
    pub config: PathBuf,
    /// The checkpoint directory to create (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Rename tensors: `--map OLD_PREFIX=NEW_PREFIX` (repeatable, first match wins), e.g.
    /// `--map net.=backbone. --map mu.=mean_head.`.
    #[arg(long = "map", value_name = "OLD=NEW")]
    pub maps: Vec<String>,
}

/// Run the import and print the checkpoint directory.
pub fn pytorch(a: &PytorchArgs) -> CliResult {
    let maps = a
        .maps
        .iter()
        .map(|m| KeyMap::parse(m))
        .collect::<Result<Vec<_>, _>>()
        .map_err(CliError::input)?;
    let job = PytorchImport {
        weights: a.weights.clone(),
        config: a.config.clone(),
        out: a.out.clone(),
        maps,
    };
    let m = job.run().map_err(CliError::input)?;
    eprintln!(
        "imported {} → {} ({} → {:?} → {}, {} parameters, {} activation, run id {})",
        a.weights.display(),
        a.out.display(),
        m.architecture.n_features,
        m.architecture.hidden,
        m.architecture.n_targets,
        m.parameter_count,
        m.architecture.activation.name(),
        m.run_id
    );
    println!("{}", super::printed(&a.out).display());
    Ok(())
}
