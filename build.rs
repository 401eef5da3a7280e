//! Records build facts for `kiln doctor` and checkpoint manifests: the Burn version actually
//! locked in Cargo.lock, the rustc that compiled kiln, and the target triple.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut burn = "unknown".to_string();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"burn\"" {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = "))
            {
                burn = v.trim_matches('"').to_string();
            }
            break;
        }
    }
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
