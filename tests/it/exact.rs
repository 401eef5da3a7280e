//! Exact by default: the default engine (`auto`) computes the f32 model, and a row's answer
//! is bit-identical whatever the batch size, the row's position in the batch and the batch
//! it was served in.
//!
//! * every exact engine (`fused` on every instruction set this CPU has, one and two threads,
//!   and `auto`) gives each row the bits it gets alone, at batch sizes 1, 2, 7, 64, 820 (and
//!   2,100 rows, split over threads) with the rows shuffled;
//! * `kiln predict` on the baseball test split equals `--engine fused` bit for bit by
//!   default, and a player's answer from a 1-row file equals the one from a 10-row file;
//! * `kiln serve` (default engine, both batching policies) gives many identical concurrent
//!   1-row requests one answer, whatever they were batched with;
//! * int8 is used only when asked for, and then its measured max |Δ| vs `fused` is printed.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::common::{kiln, root, serve, trained};

use kiln::config::Activation;
use kiln::infer::{AutoEngine, Engine, FusedEngine, HeadOutput, Isa, build_engine, seeded_weights};
use kiln::loadgen::client::HttpClient;
use kiln::model::RegressionNetConfig;
use kiln::rng::SplitMix64;
use kiln::serve::BatchingPolicy;
use kiln::serve::protocol::{OutputData, decode_response};
use serde_json::json;

const BATCHES: [usize; 5] = [1, 2, 7, 64, 820];

fn networks() -> Vec<kiln::artifact::HostWeights> {
    let mk = |n_features, hidden: &[usize], n_targets, activation| RegressionNetConfig {
        n_features,
        hidden: hidden.to_vec(),
        n_targets,
        activation,
    };
    let mut v = vec![seeded_weights(&RegressionNetConfig::reference(), 31)];
    for (i, act) in [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Silu,
    ]
    .into_iter()
    .enumerate()
    {
        v.push(seeded_weights(&mk(10, &[16], 3, act), 40 + i as u64));
        v.push(seeded_weights(&mk(7, &[5, 9, 33], 2, act), 50 + i as u64));
    }
    v
}

/// A seeded permutation of `0..n`.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut r = SplitMix64::new(seed);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (r.next_u64() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Each row of `x` (the pool) run alone, then in batches of every size with the rows
/// shuffled: every row's outputs must carry the bits it had alone.
fn assert_batch_invariant(label: &str, e: &mut dyn Engine, x: &[f32], pool: usize) {
    let (nf, k) = (e.arch().n_features, e.arch().n_targets);
    let mut alone = Vec::with_capacity(pool);
    let mut out = HeadOutput::default();
    for r in 0..pool {
        e.forward(&x[r * nf..(r + 1) * nf], 1, &mut out).unwrap();
        alone.push((bits(&out.mean), bits(&out.log_var)));
    }
    let mut sizes = BATCHES.to_vec();
    if e.threads() > 1 {
        sizes.push(2100); // above PAR_MIN_ROWS: split across the engine's threads
    }
    for (s, &batch) in sizes.iter().enumerate() {
        // Rows drawn from the pool, shuffled (with repeats when the batch is larger).
        let order: Vec<usize> = shuffled(pool.max(batch), 7 + s as u64)
            .into_iter()
            .map(|i| i % pool)
            .take(batch)
            .collect();
        let xb: Vec<f32> = order
            .iter()
            .flat_map(|&r| x[r * nf..(r + 1) * nf].iter().copied())
            .collect();
        e.forward(&xb, batch, &mut out).unwrap();
        for (pos, &r) in order.iter().enumerate() {
            let got = (
                bits(&out.mean[pos * k..(pos + 1) * k]),
                bits(&out.log_var[pos * k..(pos + 1) * k]),
            );
            assert_eq!(
                got, alone[r],
                "{label}: row {r} at position {pos} of a batch of {batch} differs from the row alone"
            );
        }
    }
}

#[test]
fn every_exact_engine_gives_a_row_the_same_bits_whatever_the_batch_and_position() {
    for w in networks() {
        let nf = w.arch.n_features;
        let pool = 900;
        let mut r = SplitMix64::new(nf as u64 * 1000 + w.arch.hidden.len() as u64);
        let x: Vec<f32> = (0..pool * nf).map(|_| (1.5 * r.normal()) as f32).collect();
        let net = format!("{:?} {:?}", w.arch.hidden, w.arch.activation);
        for isa in Isa::available() {
            for threads in [1, 2] {
                let mut e = FusedEngine::with_isa(&w, threads, isa).unwrap();
                let label = format!("fused/{} ×{threads} on {net}", isa.name());
                assert_batch_invariant(&label, &mut e, &x, pool);
            }
        }
        let mut auto = build_engine(kiln::records::EngineKind::Auto, &w, 1).unwrap();
        auto.warm_up(&[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
            .unwrap();
        assert_batch_invariant(&format!("auto on {net}"), auto.as_mut(), &x, pool);
        // `auto` is `fused` on this CPU's best instruction set, bit for bit, at any batch.
        let mut fused = FusedEngine::new(&w, 1).unwrap();
        let (mut a, mut b) = (HeadOutput::default(), HeadOutput::default());
        auto.forward(&x, pool, &mut a).unwrap();
        fused.forward(&x, pool, &mut b).unwrap();
        assert_eq!(
            (bits(&a.mean), bits(&a.log_var)),
            (bits(&b.mean), bits(&b.log_var)),
            "auto vs fused on {net}"
        );
    }
}

#[test]
fn auto_never_chooses_int8_and_auto_int8_says_how_far_int8_moves_the_answers() {
    let w = seeded_weights(&RegressionNetConfig::reference(), 21);
    let buckets = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
    let mut auto = AutoEngine::new(&w, 1).unwrap();
    auto.warm_up(&buckets).unwrap();
    let c = auto.choice().clone();
    assert_eq!(auto.name(), "auto");
    assert_eq!(c.candidates, ["fused"], "{}", c.summary());
    assert!(c.buckets.iter().all(|b| b.engine == "fused"), "{c:?}");
    assert!(
        c.rejected
            .iter()
            .any(|(e, why)| e == "int8" && why.contains("not exact")),
        "{c:?}"
    );
    assert_eq!(c.int8_max_abs_delta, None);

    let mut q = AutoEngine::with_int8(&w, 1).unwrap();
    q.warm_up(&buckets).unwrap();
    let c = q.choice().clone();
    assert_eq!(q.name(), "auto-int8");
    assert_eq!(
        build_engine(kiln::records::EngineKind::AutoInt8, &w, 1)
            .unwrap()
            .name(),
        "auto-int8"
    );
    assert_eq!(c.candidates, ["fused", "int8"], "{}", c.summary());
    // The bound it prints is int8's measured distance from fused on the probe rows.
    let d = c.int8_max_abs_delta.expect("int8 measured");
    assert!(d > 0.0 && d < 0.1, "{d}");
    let s = c.summary();
    assert!(
        s.starts_with("auto-int8 engine:") && s.contains("max |Δ| vs fused"),
        "{s}"
    );
}

/// The rows of the baseball data set in the test split of `configs/tiny.yaml` (2017–2019),
/// as a CSV file's text: header, then the selected lines.
fn test_split() -> (String, Vec<String>) {
    let text = std::fs::read_to_string(root().join("datasets/baseball.csv")).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().to_string();
    let si = header.split(',').position(|c| c == "season").unwrap();
    let rows: Vec<String> = lines
        .filter(|l| {
            let season: u32 = l.split(',').nth(si).unwrap().parse().unwrap();
            (2017..=2019).contains(&season)
        })
        .map(str::to_string)
        .collect();
    (header, rows)
}

fn write_csv(path: &Path, header: &str, rows: &[String]) {
    std::fs::write(path, format!("{header}\n{}\n", rows.join("\n"))).unwrap();
}

fn predict(input: &Path, engine: Option<&str>) -> (Vec<u8>, String) {
    let ckpt = trained().to_str().unwrap();
    let mut args = vec!["predict", "--checkpoint", ckpt, "--input"];
    args.push(input.to_str().unwrap());
    if let Some(e) = engine {
        args.extend(["--engine", e]);
    }
    let o = kiln(&args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{engine:?}: {err}");
    (o.stdout, err)
}

#[test]
fn kiln_predict_by_default_equals_fused_bit_for_bit_whatever_the_file_size() {
    let tmp = tempfile::tempdir().unwrap();
    let (header, rows) = test_split();
    assert_eq!(rows.len(), 820, "the baseball test split");
    let split = tmp.path().join("test.csv");
    write_csv(&split, &header, &rows);
    let (default, err) = predict(&split, None);
    let (fused, _) = predict(&split, Some("fused"));
    assert_eq!(default, fused, "default vs --engine fused");
    assert!(!err.contains("int8 is quantised"), "{err}");

    // The same player from a 1-row and from a 10-row file (first, middle and last there).
    let out_rows = |bytes: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(bytes)
            .lines()
            .skip(1)
            .map(str::to_string)
            .collect()
    };
    let all = out_rows(&default);
    assert_eq!(all.len(), 820);
    let ten: Vec<String> = rows[100..110].to_vec();
    let tf = tmp.path().join("ten.csv");
    write_csv(&tf, &header, &ten);
    let ten_out = out_rows(&predict(&tf, None).0);
    assert_eq!(ten_out, all[100..110], "10-row file vs the whole split");
    for i in [0, 4, 9] {
        let one = tmp.path().join(format!("one{i}.csv"));
        write_csv(&one, &header, &ten[i..i + 1]);
        let one_out = out_rows(&predict(&one, None).0);
        assert_eq!(
            one_out[..],
            ten_out[i..i + 1],
            "row {i}: 1-row vs 10-row file"
        );
    }

    // int8 by explicit choice only, with its measured distance from fused on these rows.
    for engine in ["int8", "auto-int8"] {
        let (_, err) = predict(&split, Some(engine));
        assert!(
            err.contains(&format!(
                "note: {engine} is quantised: on these 820 rows max |Δmean|"
            )) && err.contains("max |Δstd|"),
            "{engine}: {err}"
        );
    }
}

/// A 1-row JSON request for `x`.
fn request(x: &[f32]) -> serde_json::Value {
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, x.len()], "data": x}]})
}

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains("model=\"tiny\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_get_one_answer_whatever_they_are_batched_with() {
    let x = crate::common::rows_around_means(trained(), 1, 5);
    let body = request(&x);
    for policy in [BatchingPolicy::Delay, BatchingPolicy::Idle] {
        let repo = crate::common::repository_of(trained());
        let mut cfg = crate::common::serve_config(repo.path(), "auto");
        cfg.engine = None; // the default
        cfg.batcher.policy = policy;
        cfg.batcher.max_queue_size = 4096;
        cfg.batcher.max_queue_delay = Duration::from_millis(2);
        cfg.batcher.instances = 2;
        let h = serve(cfg).await;
        let addr = h.addr;
        // 48 connections × 25 requests each, all in flight together.
        let tasks: Vec<_> = (0..48)
            .map(|_| {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut c = HttpClient::new(addr);
                    let mut got = Vec::new();
                    for _ in 0..25 {
                        let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
                        assert_eq!(r.status, 200, "{}", r.text());
                        let hl = r
                            .header("inference-header-content-length")
                            .map(|v| v.parse().unwrap());
                        let (_, outs) = decode_response(&r.body, hl).unwrap();
                        let mut b = Vec::new();
                        for o in &outs {
                            match &o.2 {
                                OutputData::F32(v) => b.extend(v.iter().map(|f| f.to_bits())),
                                other => panic!("{other:?}"),
                            }
                        }
                        got.push(b);
                    }
                    got
                })
            })
            .collect();
        let mut answers = BTreeSet::new();
        for t in tasks {
            answers.extend(t.await.unwrap());
        }
        let text = HttpClient::new(addr)
            .get("/metrics")
            .await
            .unwrap()
            .text()
            .to_string();
        let (requests, batches) = (
            metric_sum(&text, "kiln_inference_count_total"),
            metric_sum(&text, "kiln_inference_exec_count_total"),
        );
        eprintln!(
            "{}: {requests} requests in {batches} batches, {} distinct answer(s)",
            policy.name(),
            answers.len()
        );
        assert_eq!(requests, 1200.0, "{text}");
        if policy == BatchingPolicy::Delay {
            // The delay policy did batch them (so the answers were computed in batches of
            // several sizes), yet every answer is the same.
            assert!(batches < requests, "{requests} requests, {batches} batches");
        }
        assert_eq!(answers.len(), 1, "{} policy", policy.name());
        h.shutdown().await.unwrap();
    }
}
