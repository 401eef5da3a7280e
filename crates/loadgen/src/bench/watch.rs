//! What the drift watch and OpenTelemetry tracing cost on the request path: one in-process
//! server per configuration, measured in interleaved rounds.

use std::time::{Duration, Instant};

use kiln_serve::ServeConfig;
use kiln_serve::records::{ModelConfig, ModelMetadata};

use super::pin::allowed_cpus;
use super::{Percentiles, ServeBenchError, ServeBenchOptions, WatchCost, check, in_process_config};
use crate::client::BlockingClient;
use crate::loadtest::request_body;

/// The on/off costs of the drift watch and of tracing: one in-process server per
/// configuration (same repository, engine and batching), all up at once, measured in
/// interleaved rounds so that drift in the machine's state falls on every configuration
/// alike. Every request carries a `traceparent` (sampled, except for `trace_unsampled`), so
/// the bytes on the wire are the same everywhere. The traced servers export to a loopback
/// listener that closes every connection: spans are built, batched and handed to the
/// exporter, whose network cost is not on the request path and is not measured.
pub(super) fn watch_costs(
    opts: &ServeBenchOptions,
    meta: &ModelMetadata,
    config: Option<&ModelConfig>,
) -> Result<Vec<WatchCost>, ServeBenchError> {
    // The traced servers' collector: a loopback listener that closes every connection at
    // once, so exports fail fast and off the request path.
    let sink_listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(ServeBenchError::Runtime)?;
    let sink = format!(
        "http://{}",
        sink_listener
            .local_addr()
            .map_err(ServeBenchError::Runtime)?
    );
    sink_listener
        .set_nonblocking(true)
        .map_err(ServeBenchError::Runtime)?;
    let sink_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = sink_stop.clone();
    let sink_thread = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match sink_listener.accept() {
                Ok((conn, _)) => drop(conn),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kiln-bench-watch")
        .worker_threads(allowed_cpus().len().max(1))
        .build()
        .map_err(ServeBenchError::Runtime)?;
    let configs: [(&str, bool, Option<f64>); 5] = [
        ("off", false, None),
        ("drift", true, None),
        ("trace_unsampled", false, Some(0.0)),
        ("trace_sampled", false, Some(1.0)),
        ("drift+trace_sampled", true, Some(1.0)),
    ];
    let mut servers = Vec::new();
    for (name, drift, ratio) in configs {
        let cfg = ServeConfig {
            watch: kiln_serve::monitor::WatchConfig {
                drift,
                ..Default::default()
            },
            trace: kiln_serve::otel::TraceConfig {
                endpoint: ratio.map(|_| sink.clone()),
                sample_ratio: Some(ratio.unwrap_or(1.0)),
                ..Default::default()
            },
            ..in_process_config(opts)
        };
        let h = rt.block_on(kiln_serve::start(cfg))?;
        super::await_ready(&rt, &h, &format!("the `{name}` server"))?;
        let sampled = name != "trace_unsampled";
        servers.push((name, sampled, h));
    }
    let mut series = Vec::new();
    for &b in &opts.batches {
        for binary in [false, true] {
            let (body, hlen) = request_body(meta, config, b, binary)?;
            let kind = if binary { "binary" } else { "json" };
            series.push((
                format!("infer_{kind}_b{b}"),
                body,
                hlen.map(|n| n.to_string()),
            ));
        }
    }
    let path = format!("/v2/models/{}/infer", opts.model);
    let mut clients = servers
        .iter()
        .map(|(_, _, h)| Ok(BlockingClient::new(h.addr)?.with_timeout(Duration::from_secs(30))))
        .collect::<Result<Vec<_>, ServeBenchError>>()?;
    let send = |c: &mut BlockingClient, sampled: bool, body: &[u8], hlen: Option<&str>| {
        let mut headers = vec![
            (
                "Content-Type",
                if hlen.is_some() {
                    "application/octet-stream"
                } else {
                    "application/json"
                },
            ),
            (
                "traceparent",
                if sampled {
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                } else {
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
                },
            ),
        ];
        if let Some(h) = hlen {
            headers.push(("Inference-Header-Content-Length", h));
        }
        let t = Instant::now();
        let r = c.request("POST", &path, &headers, body)?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        check(r, "watch-cost request").map(|_| us)
    };
    let per_round = opts.requests.div_ceil(opts.rounds);
    let mut samples = vec![vec![Vec::new(); series.len()]; servers.len()];
    for ((_, sampled, _), c) in servers.iter().zip(&mut clients) {
        for (_, body, hlen) in &series {
            for _ in 0..(opts.requests / 4).max(1) {
                send(c, *sampled, body, hlen.as_deref())?;
            }
        }
    }
    for _ in 0..opts.rounds {
        for (k, (_, body, hlen)) in series.iter().enumerate() {
            for (i, ((_, sampled, _), c)) in servers.iter().zip(&mut clients).enumerate() {
                for _ in 0..per_round {
                    samples[i][k].push(send(c, *sampled, body, hlen.as_deref())?);
                }
            }
        }
    }
    drop(clients);
    let pcts: Vec<Vec<Percentiles>> = samples
        .into_iter()
        .map(|per| per.into_iter().map(Percentiles::of).collect())
        .collect();
    let mut out = Vec::new();
    for (i, (name, _, _)) in servers.iter().enumerate() {
        for (k, (s, _, _)) in series.iter().enumerate() {
            let base = pcts[0][k].p50;
            let us = pcts[i][k].clone();
            out.push(WatchCost {
                config: name.to_string(),
                series: s.clone(),
                delta_p50_us: us.p50 - base,
                ratio_p50: if base > 0.0 { us.p50 / base } else { 0.0 },
                us,
            });
        }
    }
    for (_, _, h) in servers {
        rt.block_on(h.shutdown())?;
    }
    sink_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sink_thread.join();
    Ok(out)
}
