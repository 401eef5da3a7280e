//! The server's side of a sweep: its statistics (Triton's statistics extension, read into
//! `kiln_serve`'s own [`records`](kiln_serve::records) over HTTP or gRPC) before and after
//! each level, and the per-request queue / compute breakdown from their difference.

use std::time::Duration;

use serde::Serialize;

use super::caller::grpc_connect;
use super::pb;
use crate::client::HttpClient;
pub use kiln_serve::records::{StatDuration, StatsResponse};

/// A model's cumulative server-side statistics, summed over its versions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerStats {
    /// Rows inferred.
    pub inference_count: u64,
    /// Batches executed.
    pub execution_count: u64,
    /// Successful requests.
    pub success: StatDuration,
    /// Failed requests.
    pub fail: StatDuration,
    /// Time in queues.
    pub queue: StatDuration,
    /// Input preparation.
    pub compute_input: StatDuration,
    /// Model execution.
    pub compute_infer: StatDuration,
    /// Output extraction.
    pub compute_output: StatDuration,
}

fn add(a: &mut StatDuration, b: StatDuration) {
    a.count += b.count;
    a.ns += b.ns;
}

impl ServerStats {
    fn add(&mut self, o: &ServerStats) {
        self.inference_count += o.inference_count;
        self.execution_count += o.execution_count;
        add(&mut self.success, o.success);
        add(&mut self.fail, o.fail);
        add(&mut self.queue, o.queue);
        add(&mut self.compute_input, o.compute_input);
        add(&mut self.compute_infer, o.compute_infer);
        add(&mut self.compute_output, o.compute_output);
    }

    /// The statistics of `model` in a statistics answer (kiln's or Triton's, over HTTP or,
    /// mapped from protobuf, gRPC), its versions' entries summed.
    pub fn of_model(r: &StatsResponse, model: &str) -> ServerStats {
        let mut out = ServerStats::default();
        for m in r.model_stats.iter().filter(|m| m.name == model) {
            let i = &m.inference_stats;
            out.add(&ServerStats {
                inference_count: m.inference_count,
                execution_count: m.execution_count,
                success: i.success,
                fail: i.fail,
                queue: i.queue,
                compute_input: i.compute_input,
                compute_infer: i.compute_infer,
                compute_output: i.compute_output,
            });
        }
        out
    }
}

/// The server's view of one level: averages per request over the level's windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerBreakdown {
    /// Successful requests the server counted.
    pub requests: u64,
    /// Rows inferred.
    pub inferences: u64,
    /// Batches executed.
    pub executions: u64,
    /// Mean request time inside the server, µs.
    pub request_us: f64,
    /// Mean queue time, µs.
    pub queue_us: f64,
    /// Mean input preparation, µs.
    pub compute_input_us: f64,
    /// Mean model execution, µs.
    pub compute_infer_us: f64,
    /// Mean output extraction, µs.
    pub compute_output_us: f64,
}

fn mean_us(a: StatDuration, b: StatDuration) -> f64 {
    let n = b.count.saturating_sub(a.count);
    if n == 0 {
        0.0
    } else {
        b.ns.saturating_sub(a.ns) as f64 / n as f64 / 1e3
    }
}

impl ServerBreakdown {
    /// The difference between two snapshots.
    pub fn between(a: &ServerStats, b: &ServerStats) -> Self {
        Self {
            requests: b.success.count.saturating_sub(a.success.count),
            inferences: b.inference_count.saturating_sub(a.inference_count),
            executions: b.execution_count.saturating_sub(a.execution_count),
            request_us: mean_us(a.success, b.success),
            queue_us: mean_us(a.queue, b.queue),
            compute_input_us: mean_us(a.compute_input, b.compute_input),
            compute_infer_us: mean_us(a.compute_infer, b.compute_infer),
            compute_output_us: mean_us(a.compute_output, b.compute_output),
        }
    }
}

/// Where the statistics come from.
pub(super) enum StatsSource {
    Http(std::net::SocketAddr, String),
    Grpc(String, String),
}

impl StatsSource {
    pub(super) fn describe(&self) -> String {
        match self {
            StatsSource::Http(a, p) => format!("GET http://{a}{p}"),
            StatsSource::Grpc(u, _) => format!("gRPC ModelStatistics at {u}"),
        }
    }

    pub(super) async fn fetch(&self, model: &str) -> Result<ServerStats, String> {
        match self {
            StatsSource::Http(addr, path) => {
                let r = HttpClient::new(*addr)
                    .with_timeout(Duration::from_secs(10))
                    .get(path)
                    .await
                    .map_err(|e| format!("GET {path}: {e}"))?;
                if r.status != 200 {
                    return Err(format!(
                        "GET {path}: HTTP {}: {}",
                        r.status,
                        r.text().trim()
                    ));
                }
                let answer: StatsResponse = r.record().map_err(|e| {
                    format!("GET {path}: not a statistics answer (no `model_stats` array): {e}")
                })?;
                Ok(ServerStats::of_model(&answer, model))
            }
            StatsSource::Grpc(uri, model) => {
                let mut c = grpc_connect(uri).await.map_err(|e| e.to_string())?;
                let r = c
                    .model_statistics(pb::ModelStatisticsRequest {
                        name: model.clone(),
                        version: String::new(),
                    })
                    .await
                    .map_err(|s| format!("ModelStatistics: {:?}: {}", s.code(), s.message()))?;
                Ok(ServerStats::of_model(
                    &StatsResponse::from(&r.into_inner()),
                    model,
                ))
            }
        }
    }
}
