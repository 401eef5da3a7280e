//! The measurements over HTTP: concurrency-1 round trips over one keep-alive connection
//! (health, inference JSON and binary per batch size, the pick model), the closed-loop maximum
//! and the open-loop sweep at fractions of it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kiln_serve::ServerHandle;
use kiln_serve::records::{ModelConfig, ModelMetadata};
use serde_json::Value;

use super::stages::stage_costs;
use super::watch::watch_costs;
use super::{
    Percentiles, Pinning, RoundTrip, ServeBenchError, ServeBenchOptions, ServeBenchReport,
    SweepPoint, check,
};
use crate::client::{BlockingClient, HttpResponse};
use crate::loadtest::{LoadtestConfig, LoadtestReport, request_body, run_loadtest};

/// A metadata answer read into its record.
fn record(r: &HttpResponse, path: &str) -> Result<ModelMetadata, ServeBenchError> {
    r.record()
        .map_err(|e| ServeBenchError::Invalid(format!("GET {path}: not model metadata: {e}")))
}

/// A request of one series.
struct Series {
    name: String,
    path: String,
    method: &'static str,
    body: Vec<u8>,
    hlen: Option<String>,
}

impl Series {
    fn send(&self, c: &mut BlockingClient) -> Result<(), ServeBenchError> {
        let hlen = self.hlen.as_deref();
        let mut headers = vec![(
            "Content-Type",
            if hlen.is_some() {
                "application/octet-stream"
            } else {
                "application/json"
            },
        )];
        if let Some(h) = hlen {
            headers.push(("Inference-Header-Content-Length", h));
        }
        let r = c.request(self.method, &self.path, &headers, &self.body)?;
        check(r, &self.name)
    }
}

/// Measure the server at `addr`: round trips, the closed loop and the open-loop sweep,
/// and (in-process) the stage and watch costs.
pub(super) fn measure(
    opts: &ServeBenchOptions,
    addr: SocketAddr,
    handle: Option<&ServerHandle>,
    client_pinned: bool,
) -> Result<ServeBenchReport, ServeBenchError> {
    let mut c = BlockingClient::new(addr)?.with_timeout(Duration::from_secs(30));
    let model_path = format!("/v2/models/{}", opts.model);
    let meta = c.get(&model_path)?;
    if meta.status != 200 {
        return Err(ServeBenchError::Status {
            what: format!("GET {model_path}"),
            status: meta.status,
            body: meta.text(),
        });
    }
    let meta: ModelMetadata = record(&meta, &model_path)?;
    let config = c.get(&format!("{model_path}/config"))?;
    let config: Option<ModelConfig> = (config.status == 200)
        .then(|| config.record().ok())
        .flatten();
    let mut series = vec![Series {
        name: "health".into(),
        path: "/v2/health/live".into(),
        method: "GET",
        body: Vec::new(),
        hlen: None,
    }];
    let mut bodies = Vec::new();
    for &b in &opts.batches {
        for binary in [false, true] {
            let (body, hlen) = request_body(&meta, config.as_ref(), b, binary)?;
            let name = format!("{}_b{b}", if binary { "binary" } else { "json" });
            bodies.push((name.clone(), opts.model.clone(), body.clone(), hlen));
            series.push(Series {
                name: format!("infer_{name}"),
                path: format!("{model_path}/infer"),
                method: "POST",
                body,
                hlen: hlen.map(|n| n.to_string()),
            });
        }
    }
    if let Some(pick) = &opts.pick_model {
        let p = format!("/v2/models/{pick}");
        let pm = c.get(&p)?;
        check_meta(&pm, &p)?;
        let pm: ModelMetadata = record(&pm, &p)?;
        let pc = c.get(&format!("{p}/config"))?;
        let pc: Option<ModelConfig> = (pc.status == 200).then(|| pc.record().ok()).flatten();
        let (body, _) = request_body(&pm, pc.as_ref(), 1, false)?;
        bodies.push(("pick_json_b1".into(), pick.clone(), body.clone(), None));
        series.push(Series {
            name: "pick_json_b1".into(),
            path: format!("{p}/infer"),
            method: "POST",
            body,
            hlen: None,
        });
    }
    // Warm-up, then interleaved rounds.
    for s in &series {
        for _ in 0..(opts.requests / 4).max(1) {
            s.send(&mut c)?;
        }
    }
    let per_round = opts.requests.div_ceil(opts.rounds);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); series.len()];
    for _ in 0..opts.rounds {
        for (s, out) in series.iter().zip(&mut samples) {
            for _ in 0..per_round {
                let t = Instant::now();
                s.send(&mut c)?;
                out.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    let pcts: Vec<Percentiles> = samples.into_iter().map(Percentiles::of).collect();
    let health = pcts[0].p50;
    let round_trips = series
        .iter()
        .zip(pcts)
        .map(|(s, us)| RoundTrip {
            name: s.name.clone(),
            minus_health_p50_us: us.p50 - health,
            us,
        })
        .collect();
    drop(c);

    // Closed loop, then the open-loop sweep, from a runtime on the client's CPU.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeBenchError::Runtime)?;
    let url = format!("http://{addr}");
    let lt = |rps: f64, duration: Duration| LoadtestConfig {
        url: url.clone(),
        model: opts.model.clone(),
        rps,
        duration,
        concurrency: opts.connections,
        batch: 1,
        binary: false,
        max_requests: u64::MAX,
        timeout: Duration::from_secs(10),
    };
    let closed: LoadtestReport = rt.block_on(run_loadtest(&lt(0.0, opts.closed_duration)))?;
    let max = closed.achieved_rps;
    let mut open_loop = Vec::new();
    for &f in &opts.fractions {
        let r = rt.block_on(run_loadtest(&lt((max * f).max(1.0), opts.sweep_duration)))?;
        open_loop.push(SweepPoint {
            fraction: f,
            target_rps: r.target_rps,
            achieved_rps: r.achieved_rps,
            service_p50_ms: r.service_latency_ms.p50,
            service_p99_ms: r.service_latency_ms.p99,
            latency_p99_ms: r.latency_ms.p99,
            late: r.late,
            errors: r.errors.values().sum(),
        });
    }
    let stages = match handle {
        Some(h) => stage_costs(h, &bodies, opts.stage_iters)?,
        None => Vec::new(),
    };
    let watch_costs = match handle {
        Some(_) => watch_costs(opts, &meta, config.as_ref())?,
        None => Vec::new(),
    };
    let b = &opts.batcher;
    Ok(ServeBenchReport {
        bench: "serve",
        server: opts
            .url
            .clone()
            .unwrap_or_else(|| format!("in-process http://{addr}")),
        model: opts.model.clone(),
        batching: if opts.url.is_some() {
            // As the server reports it.
            config
                .as_ref()
                .and_then(|c| serde_json::to_value(&c.dynamic_batching).ok())
                .unwrap_or(Value::Null)
        } else {
            serde_json::json!({
                "policy": b.policy.name(),
                "instances": b.instances,
                "threads_per_instance": b.threads_per_instance,
                "max_batch_size": b.max_batch_size,
                "max_queue_delay_us": b.max_queue_delay.as_micros() as u64,
            })
        },
        server_workers: 0,
        pinning: Pinning {
            applied: client_pinned,
            client_cpus: Vec::new(),
            server_cpus: Vec::new(),
            note: String::new(),
        },
        round_trips,
        connections: opts.connections,
        closed_loop_rps: max,
        closed_loop_service_ms: [closed.service_latency_ms.p50, closed.service_latency_ms.p99],
        closed_loop_errors: closed.errors.values().sum(),
        open_loop,
        stages,
        watch_costs,
    })
}

fn check_meta(r: &HttpResponse, path: &str) -> Result<(), ServeBenchError> {
    if r.status == 200 {
        Ok(())
    } else {
        Err(ServeBenchError::Status {
            what: format!("GET {path}"),
            status: r.status,
            body: r.text(),
        })
    }
}
