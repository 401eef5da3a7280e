//! kiln — a training-and-serving framework for compact regression networks, built on Burn.
//!
//! Data flows one way: `config` → `data` → `model` → `train` → `artifact` → (`infer`,
//! `predict`, `serve`). `observe` is called from every stage and calls none of them.

pub mod artifact;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod config;
pub mod data;
pub mod infer;
pub mod model;
pub mod observe;
pub mod pick;
pub mod predict;
pub mod rng;
pub mod run;
pub mod serve;
pub mod sweep;
pub mod train;
pub mod util;

/// The Burn version locked in Cargo.lock at build time.
pub const BURN_VERSION: &str = env!("KILN_BURN_VERSION");
/// The rustc that compiled kiln.
pub const RUSTC_VERSION: &str = env!("KILN_RUSTC_VERSION");
