//! The batcher's unit tests: both policies over a gated instance.

use std::sync::Condvar;

use super::*;
use crate::metrics::Metrics;
use crate::model::InstanceError;
use crate::protocol::OutputData;

/// Echoes its inputs; records each batch's request count and blocks while the gate is
/// closed.
struct Gated {
    batches: Arc<Mutex<Vec<usize>>>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Instance for Gated {
    fn warm_up(&mut self, _rows: usize) -> Result<(), InstanceError> {
        Ok(())
    }

    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, InstanceError> {
        self.batches.lock().unwrap().push(inputs.len());
        let (open, cv) = &*self.gate;
        let mut g = open.lock().unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
        Ok(inputs
            .iter()
            .map(|i| match i {
                ModelInput::Regression { x, rows } => vec![OutputTensor {
                    name: "y".into(),
                    shape: vec![*rows],
                    data: OutputData::F32(x.clone()),
                }],
                _ => Vec::new(),
            })
            .collect())
    }
}

type Gate = Arc<(Mutex<bool>, Condvar)>;
/// The batcher, the request count of each batch, the gate and the metrics.
type Started = (Batcher, Arc<Mutex<Vec<usize>>>, Gate, Arc<VersionMetrics>);

fn input(v: f32) -> ModelInput {
    ModelInput::Regression {
        x: vec![v],
        rows: 1,
    }
}

fn start(policy: BatchingPolicy, open: bool) -> Started {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new((Mutex::new(open), Condvar::new()));
    let (b, g) = (batches.clone(), gate.clone());
    let factory: Arc<InstanceFactory> = Arc::new(move || {
        Ok(Box::new(Gated {
            batches: b.clone(),
            gate: g.clone(),
        }) as Box<dyn Instance>)
    });
    let metrics = Metrics::default().model("m").version(1);
    let config = BatcherConfig {
        policy,
        // Far above any scheduling noise: a request that waited for it would show.
        max_queue_delay: Duration::from_secs(30),
        ..BatcherConfig::default()
    };
    let batcher = Batcher::start(
        "m",
        &config,
        factory,
        metrics.clone(),
        Arc::new(AtomicUsize::new(0)),
    )
    .unwrap();
    (batcher, batches, gate, metrics)
}

fn poll_until(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_policy_launches_a_lone_request_at_once() {
    let (batcher, batches, _gate, metrics) = start(BatchingPolicy::Idle, true);
    for v in [1.0, 2.0] {
        let out = batcher
            .infer(input(v), 1, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(out.0[0].data, OutputData::F32(vec![v]));
    }
    // Two batches of one request each, neither queued (the delay is 30 s).
    assert_eq!(*batches.lock().unwrap(), [1, 1]);
    assert_eq!(metrics.batch_size.count(), 2);
    assert_eq!(metrics.queue.count(), 2);
    assert!(
        metrics.queue.sum() < 1_000_000,
        "queued {} µs",
        metrics.queue.sum()
    );
    assert_eq!(batcher.queue_depth(), 0);
}

#[test]
fn idle_policy_batches_what_queued_while_the_instance_was_busy() {
    let (batcher, batches, gate, metrics) = start(BatchingPolicy::Idle, false);
    let batcher = Arc::new(batcher);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The first request finds the instance idle and holds it (the gate is closed).
    let b = batcher.clone();
    let first = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(b.infer(input(0.0), 1, Duration::from_secs(60)))
    });
    poll_until("the first request computes", || {
        batches.lock().unwrap().len() == 1
    });
    // Five more arrive while it is busy: they queue.
    let rest: Vec<_> = (1..=5)
        .map(|i| {
            let b = batcher.clone();
            rt.spawn(async move { b.infer(input(i as f32), 1, Duration::from_secs(60)).await })
        })
        .collect();
    poll_until("five requests are queued", || batcher.queue_depth() == 5);
    {
        let (open, cv) = &*gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
    assert_eq!(
        first.join().unwrap().unwrap().0[0].data,
        OutputData::F32(vec![0.0])
    );
    for (i, r) in rest.into_iter().enumerate() {
        let out = rt.block_on(r).unwrap().unwrap();
        assert_eq!(out.0[0].data, OutputData::F32(vec![(i + 1) as f32]));
    }
    // One batch of one, then the five queued ones together.
    assert_eq!(*batches.lock().unwrap(), [1, 5]);
    assert_eq!(metrics.exec_count.load(Ordering::Relaxed), 2);
    assert_eq!(batcher.queue_depth(), 0);
}

#[test]
fn policies_are_parsed_and_named() {
    assert_eq!("idle".parse::<BatchingPolicy>(), Ok(BatchingPolicy::Idle));
    assert_eq!("delay".parse::<BatchingPolicy>(), Ok(BatchingPolicy::Delay));
    let e = "fast".parse::<BatchingPolicy>().unwrap_err();
    assert!(
        e.contains("`fast`") && e.contains("`idle` or `delay`"),
        "{e}"
    );
    assert_eq!(BatchingPolicy::default().to_string(), "idle");
}
