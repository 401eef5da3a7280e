//! Records build facts for `kiln doctor` and checkpoint manifests: the Burn version kiln is
//! built against, the rustc that compiled kiln, and the target triple.
//!
//! The Burn version comes from the workspace manifest (`[workspace.dependencies]`), where Burn
//! is pinned exactly (`=x.y.z`), so it is right whether kiln is the root package or a
//! dependency of another crate (which has its own Cargo.lock, or none that kiln can see).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../../Cargo.toml");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let manifest = std::fs::read_to_string(std::path::Path::new(&dir).join("../../Cargo.toml"))
        .unwrap_or_default();
    let burn = manifest
        .lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("burn")?.trim_start();
            let rest = rest.strip_prefix('=')?;
            let v = rest.split("version").nth(1)?;
            let v = v.split('"').nth(1)?;
            Some(v.trim_start_matches('=').to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KILN_BURN_VERSION={burn}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KILN_RUSTC_VERSION={version}");
    println!(
        "cargo:rustc-env=KILN_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=KILN_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_default()
    );
}
