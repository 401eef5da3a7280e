//! kiln's integration tests: one binary (one link after a library edit, not one per file),
//! a module per area, and one module of shared helpers ([`common`]). Unit tests stay beside
//! the code in each crate.

mod architecture;
mod calibration;
mod cells;
mod common;
mod data;
mod deploy;
mod distill;
mod early_stopping;
mod engines;
mod exact;
mod faults_serve;
mod faults_train;
mod finite;
mod gpu;
mod grpc;
mod hostile;
mod import;
mod mlflow_real;
mod monitor;
mod mvn;
mod nightly;
mod observability;
mod observe;
mod one_pass;
mod onnx;
mod own_data;
mod pick;
mod pipeline;
mod promote;
mod records_compat;
mod registry;
mod registry_conformance;
mod registry_reconnect;
mod replicas;
mod resume_records;
mod run_api;
mod schedule;
mod serve;
mod serve_bounds;
mod serve_trace;
mod serve_triton;
mod split_out;
mod sweep_indexed;
mod target_transform;
