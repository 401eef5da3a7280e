//! A small criterion bench of stage-1 training through the real loop: the reference network
//! on a 10,000-row synthetic table, batch 128, AdamW, global clipping at 1.0, one epoch per
//! iteration (`kiln bench train` runs the full 200,000-row version).
//!
//! `cargo bench --bench train`.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kiln::bench::{TrainBenchOptions, run_train};

fn stage1(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("kiln-criterion-train-{}", std::process::id()));
    let opts = TrainBenchOptions {
        rows: 10_000,
        workers: vec![1],
        dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut group = c.benchmark_group("train");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(opts.rows as u64));
    group.bench_function("stage1_reference_10k_rows_1_worker", |b| {
        b.iter(|| run_train(&opts).expect("training run"))
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, stage1);
criterion_main!(benches);
