//! Criterion benches of the Halton multivariate-normal estimator (issue 3): the CPU path with
//! the Genz and naive methods over d ∈ {2, 4, 8, 12}, n ∈ {1024, 4096}, batches of 1 and 256
//! equicorrelated (ρ = ½) queries, and the tensor path on Flex for one setting.
//!
//! `cargo bench --bench mvn` (add `-- genz/d4` to filter). The full grid with errors against
//! exact answers is `kiln bench mvn --json`.
//!
//! `genz-realistic/d4` and `/d8`: the mix of the realistic families (normalised Wishart, AR(1),
//! one-factor with positive and mixed-sign loadings; limits from U[−1.5, 2.5] with one-sided
//! tails) of the fixture `benches/mvn_realistic.json`, as one batch. Per-query percentiles and
//! errors: `kiln bench mvn --realistic benches/mvn_realistic.json --d 4,8 --points 4096`.

use std::hint::black_box;
use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln::model::mvn::bench::{equicorrelated_cases, load_realistic};
use kiln::model::mvn::{HaltonMvnCdfConfig, MvnMethod, MvnQuery, MvnTensorBatch};

fn cpu_path(c: &mut Criterion) {
    let device = Default::default();
    for method in [MvnMethod::Genz, MvnMethod::Naive] {
        for d in [2usize, 4, 8, 12] {
            let mut group = c.benchmark_group(format!("{}/d{d}", method.name()));
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(3));
            for points in [1024usize, 4096] {
                let model = HaltonMvnCdfConfig::new()
                    .with_max_dim(d)
                    .with_points(points)
                    .with_method(method)
                    .init::<Flex>(&device)
                    .expect("config");
                for batch in [1usize, 256] {
                    let queries: Vec<MvnQuery> = equicorrelated_cases(d, 0.5, batch, 3)
                        .into_iter()
                        .map(|c| c.query)
                        .collect();
                    group.throughput(Throughput::Elements(batch as u64));
                    group.bench_with_input(
                        BenchmarkId::new(format!("n{points}"), batch),
                        &queries,
                        |b, q| b.iter(|| black_box(model.forward(q.as_slice()).expect("forward"))),
                    );
                }
            }
            group.finish();
        }
    }
}

fn tensor_path(c: &mut Criterion) {
    let device = Default::default();
    let d = 4;
    let batch = 64;
    let model = HaltonMvnCdfConfig::new()
        .with_max_dim(d)
        .with_points(1024)
        .init::<Flex>(&device)
        .expect("config");
    let cases = equicorrelated_cases(d, 0.5, batch, 3);
    let upper: Vec<f32> = cases
        .iter()
        .flat_map(|c| c.query.upper.iter().map(|&v| v as f32))
        .collect();
    let cov: Vec<f32> = cases[0].query.cov.iter().map(|&v| v as f32).collect();
    let mut group = c.benchmark_group("genz-tensor-flex/d4");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(batch as u64));
    group.bench_function(BenchmarkId::new("n1024", batch), |b| {
        b.iter(|| {
            let input = MvnTensorBatch::new(
                Tensor::<Flex, 2>::from_data(TensorData::new(upper.clone(), [batch, d]), &device),
                Tensor::<Flex, 3>::from_data(TensorData::new(cov.clone(), [1, d, d]), &device),
            );
            black_box(
                model
                    .forward(input)
                    .expect("forward")
                    .to_host()
                    .expect("read"),
            )
        })
    });
    group.finish();
}

fn realistic(c: &mut Criterion) {
    let device = Default::default();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/mvn_realistic.json");
    let cases = load_realistic(&path).expect("realistic fixture");
    for d in [4usize, 8] {
        let queries: Vec<MvnQuery> = cases
            .iter()
            .filter(|c| c.d == d)
            .map(|c| c.query.clone())
            .collect();
        let mut group = c.benchmark_group(format!("genz-realistic/d{d}"));
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(3));
        group.throughput(Throughput::Elements(queries.len() as u64));
        for points in [1024usize, 4096] {
            let model = HaltonMvnCdfConfig::new()
                .with_max_dim(d)
                .with_points(points)
                .init::<Flex>(&device)
                .expect("config");
            group.bench_with_input(
                BenchmarkId::new(format!("n{points}"), queries.len()),
                &queries,
                |b, q| b.iter(|| black_box(model.forward(q.as_slice()).expect("forward"))),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, cpu_path, tensor_path, realistic);
criterion_main!(benches);
