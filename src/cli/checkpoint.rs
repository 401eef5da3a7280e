//! `kiln checkpoint reseal --checkpoint DIR`: re-seal a checkpoint whose manifest was edited on purpose.

use std::path::Path;

use super::{CliError, CliResult};

/// Recompute a checkpoint manifest's seal (after checking weights and architecture).
pub fn reseal(dir: &Path) -> CliResult {
    let r = kiln::artifact::reseal(dir).map_err(CliError::input)?;
    match &r.old {
        Some(old) if *old == r.new => println!("{}: seal unchanged ({})", r.path.display(), r.new),
        Some(old) => println!("{}: re-sealed {old} → {}", r.path.display(), r.new),
        None => println!("{}: sealed {}", r.path.display(), r.new),
    }
    Ok(())
}
