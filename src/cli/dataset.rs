//! `kiln dataset baseball|synthetic`.

use std::path::Path;

use super::{CliError, CliResult};
use kiln::data::baseball::{self, BaseballSpec};
use kiln::data::dataset::sha256_hex;
use kiln::data::synthetic::{self, SyntheticSpec};
use kiln::util::write_atomic;

/// Derive the baseball table from the Databank at `source` into `out`.
pub fn baseball(source: &Path, out: &Path, spec: BaseballSpec) -> CliResult {
    let (text, rows) = baseball::derive(source, spec).map_err(CliError::input)?;
    write_atomic(out, text.as_bytes())?;
    println!(
        "{}: {rows} player-seasons, sha256 {}",
        out.display(),
        sha256_hex(text.as_bytes())
    );
    Ok(())
}

/// Write a synthetic table.
pub fn synthetic(out: &Path, spec: SyntheticSpec) -> CliResult {
    if spec.rows == 0 || spec.features == 0 || spec.targets == 0 {
        return Err(CliError::input(anyhow::anyhow!(
            "--rows, --features and --targets must be ≥ 1"
        )));
    }
    let text = synthetic::generate_csv(spec);
    write_atomic(out, text.as_bytes())?;
    println!(
        "{}: {} × {}, {}, sha256 {}",
        out.display(),
        kiln::util::count(spec.rows, "row"),
        kiln::util::count(spec.features, "feature"),
        kiln::util::count(spec.targets, "target"),
        sha256_hex(text.as_bytes())
    );
    Ok(())
}
