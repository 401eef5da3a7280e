//! `kiln config check FILE`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::config;

/// Validate a config without training.
pub fn check(path: &Path) -> CliResult {
    let loaded = config::load(path).map_err(CliError::input)?;
    let c = &loaded.config;
    println!(
        "{}: ok — {}, {}, hidden {:?} ({}), {}: {}; loader batch {} workers {} (resolves to {}); device {:?}",
        path.display(),
        kiln::util::count(c.data.features.len(), "feature"),
        kiln::util::count(c.data.targets.len(), "target"),
        c.model.hidden,
        c.model.activation.name(),
        kiln::util::count(c.stages.len(), "stage"),
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
