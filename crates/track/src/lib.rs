//! kiln's tracking, above the library core: the run registry on SQLite or PostgreSQL
//! ([`registry`]), the MLflow mirror ([`mlflow`]), the latency-regression analysis over the
//! registry ([`analysis`]), sweeps ([`sweep`]), the promotion gate ([`promote`]) and its
//! records ([`promotion`]), the `kiln runs` reports over the registry's typed rows
//! ([`report`]), and the observers that connect a
//! [`TrainingRun`](kiln_core::run::TrainingRun) to the first two ([`RegistryObserver`],
//! [`MlflowObserver`]).

#![warn(missing_docs)]

pub mod analysis;
pub mod mlflow;
mod observers;
pub mod paired;
pub mod promote;
pub mod promotion;
pub mod registry;
pub mod report;
pub mod sweep;

pub use observers::{MlflowObserver, RegistryObserver};

// The library core's modules, under the names this crate's files use.
use kiln_core::{
    artifact, bench, config, data, infer, observe, predict, records, rng, run, train, util,
};
