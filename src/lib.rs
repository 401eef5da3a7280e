//! kiln — a training-and-serving framework for compact regression networks, built on Burn.
//!
//! This crate is the `kiln` binary and a thin facade over the workspace's member crates, whose
//! dependency graph is the layering (every arrow points down; Cargo refuses any other):
//!
//! | crate | holds | depends on |
//! |---|---|---|
//! | `kiln-base` | [`simd`], [`rng`], [`util`] | — |
//! | `kiln-mvn` | [`model::mvn`]: the MVN CDF estimator, pick maths | base |
//! | `kiln-core` | config, data, model, train, artifact, infer, predict, bench, pick, export, import, run, observe (instrumentation) | base, mvn |
//! | `kiln-track` ([`track`]) | run registry, MLflow mirror, analysis, sweep, promote | core |
//! | `kiln-serve` ([`serve`]) | the serving tier: one service, HTTP and gRPC adapters | core |
//! | `kiln-loadgen` ([`loadgen`]) | loopback client, load generator, serving benchmark | serve, core |
//!
//! Everything of `kiln-core` is re-exported at this crate's root (`kiln::config`,
//! `kiln::train`, …); the crates above it under their short names.

pub use kiln_core::*;
/// The client side of the serving tier: loopback client, load generator, serving benchmark.
pub use kiln_loadgen as loadgen;
/// The serving tier.
pub use kiln_serve as serve;
/// Tracking: the run registry, the MLflow mirror, analysis, sweeps, the promotion gate.
pub use kiln_track as track;
