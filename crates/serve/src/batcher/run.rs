//! Running one batch on an instance: assemble the inputs, compute (a panic or a wrong answer
//! count becomes the batch's error; a failed batch is retried request by request to isolate
//! the failing one), record the execution, answer each request.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use crate::metrics::VersionMetrics;
use crate::model::{Instance, ModelInput};
use crate::protocol::OutputTensor;
use crate::queue::{BatchTiming, Job};

/// Requests taken off the queue together.
pub(super) struct Batch {
    pub(super) jobs: Vec<Job>,
    /// When the batch left the queue (its assembly starts).
    pub(super) taken: Instant,
}

pub(super) fn record_batch(
    metrics: &VersionMetrics,
    id: usize,
    rows: usize,
    requests: usize,
    input: Duration,
    infer: Duration,
    output: Duration,
) {
    metrics.record_execution(rows, requests, input, infer, output);
    tracing::trace!(instance = id, rows, requests, ?infer, "batch computed");
}

/// Compute one batch and answer its requests.
pub(super) fn run_batch(
    id: usize,
    instance: &mut dyn Instance,
    batch: Batch,
    metrics: &VersionMetrics,
    delay: Duration,
) {
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let rows: usize = batch.jobs.iter().map(|j| j.input.rows()).sum();
    let inputs: Vec<&ModelInput> = {
        let _a =
            kiln_model::prof_span!("serve_batch_assembly", requests = batch.jobs.len()).entered();
        batch.jobs.iter().map(|j| &j.input).collect()
    };
    let t0 = Instant::now();
    let result = {
        let _c = kiln_model::prof_span!("serve_compute", rows = rows).entered();
        run_guarded(instance, &inputs)
    };
    if result.is_ok()
        && let Some(d) = instance.engine_time()
    {
        metrics.record_engine_time(rows, d);
    }
    let results = match result {
        Ok(r) => r.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(_) if inputs.len() > 1 => {
            // Isolate the failing request: run each alone.
            inputs
                .iter()
                .map(|i| run_guarded(instance, &[*i]).map(|mut v| v.remove(0)))
                .collect()
        }
        Err(e) => vec![Err(e)],
    };
    let t1 = Instant::now();
    let timing = BatchTiming {
        taken: batch.taken,
        compute_start: t0,
        compute_end: t1,
        rows,
        requests: batch.jobs.len(),
        instance: id,
    };
    record_batch(
        metrics,
        id,
        rows,
        timing.requests,
        t0.saturating_duration_since(batch.taken),
        t1 - t0,
        t1.elapsed(),
    );
    for (job, r) in batch.jobs.into_iter().zip(results) {
        let _ = job.reply.send(r.map(|o| (o, timing)));
    }
}

/// Run `inputs` on `instance`, a panic or a wrong answer count as the error.
pub(super) fn run_guarded(
    instance: &mut dyn Instance,
    inputs: &[&ModelInput],
) -> Result<Vec<Vec<OutputTensor>>, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| instance.execute(inputs))) {
        Ok(r) => {
            let r = r?;
            if r.len() != inputs.len() {
                return Err(format!(
                    "the instance answered {} of {} requests",
                    r.len(),
                    inputs.len()
                ));
            }
            Ok(r)
        }
        Err(p) => Err(format!(
            "the engine panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}
