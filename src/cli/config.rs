//! `kiln config check FILE`, `kiln config split FILE` and `kiln init --data FILE --target COL…`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::config;

/// Validate a config without training, and check it against its data: the file is
/// readable, the columns exist with the right kinds, every split has rows. `set` holds
/// `--set KEY=VALUE` overrides, applied as `kiln train` applies them.
pub fn check(path: &Path, set: &[String]) -> CliResult {
    let loaded = config::load_with_overrides(path, set).map_err(CliError::input)?;
    let c = &loaded.config;
    let data = kiln::data::Dataset::load(&c.data).map_err(CliError::input)?;
    println!(
        "{}: ok — {}, {}, hidden {}{:?} ({}), {}: {}; loader batch {} workers {} (resolves to {}); device {:?}",
        path.display(),
        kiln::util::count(c.data.features.len(), "feature"),
        kiln::util::count(c.data.targets.len(), "target"),
        match c.model.ensemble {
            1 => String::new(),
            m => format!("{m} members × "),
        },
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
    println!("{}", data.check_report());
    if c.data.numeric_bins == config::NumericBins::Auto {
        let without = data.without_bins().features.len();
        println!(
            "  numeric_bins auto: {} network inputs with {} bins, {without} without; `kiln train` trains the stages through the last mse one with each and keeps the lower validation loss",
            data.features.len(),
            config::NumericBins::AUTO_CANDIDATES[0],
        );
    }
    Ok(())
}

/// `kiln config split FILE [--out OUT]`: the row → split membership training uses.
pub fn split(path: &Path, out: Option<&Path>, set: &[String]) -> CliResult {
    let loaded = config::load_with_overrides(path, set).map_err(CliError::input)?;
    let data = kiln::data::Dataset::load(&loaded.config.data).map_err(CliError::input)?;
    let text = kiln::predict::split_membership(&data);
    kiln::predict::write_output(&text, out)?;
    if let Some(out) = out {
        eprintln!(
            "{}: {} train, {} validation, {} test rows of {}",
            out.display(),
            data.train.rows(),
            data.validation.rows(),
            data.test.rows(),
            data.path.display()
        );
    }
    Ok(())
}

/// Write a starter config for a table and say what it chose.
pub fn init(data: &Path, targets: &[String], out: &Path) -> CliResult {
    if out.exists() {
        return Err(CliError::input(anyhow::anyhow!(
            "{} exists; choose another --out or remove it",
            out.display()
        )));
    }
    let s = kiln::data::init::starter_config(data, targets).map_err(CliError::input)?;
    kiln::util::write_atomic(out, s.yaml.as_bytes()).map_err(CliError::from)?;
    for n in &s.notes {
        eprintln!("{n}");
    }
    println!("{}", super::printed(out).display());
    Ok(())
}
