//! `kiln config check FILE`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::config;

/// Validate a config without training.
pub fn check(path: &Path) -> CliResult {
    let loaded = config::load(path).map_err(CliError::input)?;
    let c = &loaded.config;
    println!(
        "{}: ok — {} features, {} targets, hidden {:?} ({}), {} stage(s): {}; loader batch {} workers {} (resolves to {}); device {:?}",
        path.display(),
        c.data.features.len(),
        c.data.targets.len(),
        c.model.hidden,
        c.model.activation.name(),
        c.stages.len(),
        c.stages
            .iter()
            .map(|s| format!("{} ({} epochs)", s.name, s.epochs))
            .collect::<Vec<_>>()
            .join(", "),
        c.loader.batch_size,
        match c.loader.num_workers {
            config::WorkerCount::Auto => "auto".to_string(),
            config::WorkerCount::Fixed(n) => n.to_string(),
        },
        c.loader.num_workers.resolve(),
        c.device
    );
    Ok(())
}
