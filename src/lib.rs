//! kiln — a training-and-serving framework for compact regression networks, built on Burn.
//!
//! This crate is the `kiln` binary and a thin facade over the workspace's member crates, whose
//! dependency graph is the layering (every arrow points down; Cargo refuses any other):
//!
//! | crate | holds | depends on |
//! |---|---|---|
//! | `kiln-base` | [`simd`], [`rng`], [`util`] | — |
//! | `kiln-mvn` | [`model::mvn`]: the MVN CDF estimator, pick maths | base |
//! | `kiln-observe` ([`observe`]) | instrumentation: profiler, resource trace, verdict, plots | base |
//! | `kiln-model` | the model side: [`model`], [`artifact`], [`infer`], [`predict`], preprocessing, drift, latency, [`records`] | base, mvn, observe |
//! | `kiln-core` | config, data, train, run, bench, pick, export, import, doctor | model (and below) |
//! | `kiln-track` ([`track`]) | run registry, MLflow mirror, analysis, sweep, promote | core |
//! | `kiln-serve` ([`serve`]) | the serving tier: one service, HTTP and gRPC adapters | model (never core) |
//! | `kiln-loadgen` ([`loadgen`]) | loopback client, load generator, serving benchmark | serve, model |
//!
//! Everything of `kiln-core` (which re-exports the model side under the same names) is
//! re-exported at this crate's root (`kiln::config`, `kiln::train`, `kiln::artifact`, …); the
//! crates above it under their short names.

pub use kiln_core::*;
/// The client side of the serving tier: loopback client, load generator, serving benchmark.
pub use kiln_loadgen as loadgen;
/// The serving tier.
pub use kiln_serve as serve;
/// Tracking: the run registry, the MLflow mirror, analysis, sweeps, the promotion gate.
pub use kiln_track as track;
