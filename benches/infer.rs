//! Criterion benches of the inference engines on the reference network (20 → 48 → 48 →
//! 3 + 3, ReLU, seeded weights), one thread, the same settings as
//! `kiln bench infer --reference --engine burn,fused,int8 --batch 1,32,1024 --threads 1`.
//!
//! `cargo bench --bench infer` (add `-- fused` to filter).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln::bench::infer::inputs;
use kiln::infer::{HeadOutput, REFERENCE_SEED, build_engine, reference_weights};

fn engines(c: &mut Criterion) {
    let weights = reference_weights(REFERENCE_SEED);
    for batch in [1usize, 32, 1024] {
        let mut group = c.benchmark_group(format!("infer/batch{batch}"));
        group.throughput(Throughput::Elements(batch as u64));
        let x = inputs(batch, 20, 7);
        for name in ["burn", "fused", "int8"] {
            let mut engine = build_engine(name.parse().unwrap(), &weights, 1).expect("CPU engine");
            engine.warm_up(&[batch]).expect("warm-up");
            let mut out = HeadOutput::default();
            group.bench_with_input(BenchmarkId::new(name, batch), &x, |b, x| {
                b.iter(|| {
                    engine
                        .forward(black_box(x), batch, &mut out)
                        .expect("forward");
                    black_box(&out);
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, engines);
criterion_main!(benches);
