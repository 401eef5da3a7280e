//! The in-process cost of each stage of the request path — parse (kiln's reader and serde_json
//! alone, alternated), decode, the batcher round trip with compute, select and encode —
//! medians over many calls on the server's own objects.

use std::time::{Duration, Instant};

use kiln_serve::ServerHandle;
use kiln_serve::protocol::{InferRequest, JsonReader, encode_response, select_outputs};

use super::{ServeBenchError, StageCost};

/// The median time of `f` over `iters` calls, µs.
pub(super) fn median_us(iters: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The stage costs of each request body (name, model, body, binary header length).
pub(super) fn stage_costs(
    handle: &ServerHandle,
    bodies: &[(String, String, Vec<u8>, Option<usize>)],
    iters: usize,
) -> Result<Vec<StageCost>, ServeBenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeBenchError::Runtime)?;
    let max_batch = handle.repository().config().batcher.max_batch_size;
    let level = handle
        .repository()
        .config()
        .batcher
        .level(None)
        .map_err(ServeBenchError::Invalid)?;
    let invalid = |e: kiln_serve::protocol::ProtocolError| ServeBenchError::Invalid(e.0);
    let mut out = Vec::new();
    for (name, model, body, hlen) in bodies {
        let model = model.as_str();
        let Some(lv) = handle.repository().get(model).and_then(|s| s.current()) else {
            return Err(ServeBenchError::Invalid(format!(
                "model `{model}` is not loaded"
            )));
        };
        let version = lv.version.to_string();
        let bytes = hyper::body::Bytes::from(body.clone());
        let h = hlen.map(|n| n.to_string());
        let parse_with = |r| InferRequest::parse_with(bytes.clone(), h.as_deref(), r);
        let parse = || parse_with(JsonReader::Fast);
        let req = parse().map_err(invalid)?;
        let input = lv
            .spec
            .decode(&req.inputs, model, max_batch)
            .map_err(invalid)?;
        let outputs = rt
            .block_on(
                lv.batcher
                    .infer(input.clone(), level, Duration::from_secs(10)),
            )
            .map_err(|e| ServeBenchError::Invalid(e.to_string()))?
            .0;
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..iters.max(1) {
            for (k, r) in [JsonReader::Serde, JsonReader::Fast]
                .into_iter()
                .enumerate()
            {
                let t = Instant::now();
                std::hint::black_box(parse_with(r).ok());
                times[k].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let [parse_serde_us, parse_us] = times.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        });
        let decode_us = median_us(iters, || {
            std::hint::black_box(lv.spec.decode(&req.inputs, model, max_batch).ok());
        });
        let batcher_us = median_us(iters, || {
            std::hint::black_box(
                rt.block_on(
                    lv.batcher
                        .infer(input.clone(), level, Duration::from_secs(10)),
                )
                .ok(),
            );
        });
        let encode_us = median_us(iters, || {
            let sel = select_outputs(&req, outputs.clone()).expect("outputs exist");
            std::hint::black_box(encode_response(&lv.model, &version, None, &sel));
        });
        out.push(StageCost {
            request: name.clone(),
            parse_us,
            parse_serde_us,
            decode_us,
            batcher_us,
            encode_us,
        });
    }
    Ok(out)
}
