//! The CPU path: validated queries → pivoted factors → per-randomisation sums → estimates.
//!
//! Queries are grouped by dimension (a stable sort by d), so that a mixed batch of 2-, 3- and
//! 5-leg picks runs as runs of equal-cost work, and answered in input order. Large batches are
//! parallel over queries (rayon); small batches (fewer queries than a few per thread, e.g. one
//! query) are split into (query, randomisation, point range) tasks instead, so one query
//! still uses every core.
//!
//! **Adaptive mode** (a `tolerance` in the config, Genz method only): each query integrates
//! over the first `min_points` points of every randomisation, then doubles its point count —
//! reusing the sums so far, since the Halton sets are extensible — until its standard error
//! is at most the tolerance or all `points` are used (what SciPy's and mvtnorm's `abseps`
//! does). Easy queries (small or extreme probabilities, low dimension) stop early. In this
//! mode bivariate queries are answered exactly (see [`super::bvn`]).
//!
//! **The early-stop guard.** A standard error from R randomisations is itself an estimate;
//! on a peaked integrand at a few hundred points it can come out far too small (every
//! randomisation misses the same region), and a stop on it alone let the realised error reach
//! many standard errors. So a query stops early only when, besides se ≤ tolerance, its
//! estimate moved by at most 4·√(se² + se_prev²) since the previous stage (which used half the
//! points): under honest standard errors that change has a standard deviation of about
//! 0.7·se_prev, so the check almost never delays an honest stop, and it catches the
//! under-estimated ones. So that easy queries still stop after `min_points` points, the first
//! stage is split in two halves (same points, same cost): the first half is the "previous
//! stage" of the check at `min_points`.

use rayon::prelude::*;

use super::MvnMethod;
use super::cholesky::{Factor, factor};
use super::constants::HostConstants;
use super::error::MvnError;
use super::genz::{GenzPlan, GenzQuery, genz_sum, plan};
use super::naive::naive_count;
use super::normal::BLOCK;
use super::query::{MvnEstimate, Prepared};
use crate::simd::Kernel;

/// How the CPU path integrates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuOptions {
    /// The vector path of the Genz kernel.
    pub kernel: Kernel,
    /// The estimator.
    pub method: MvnMethod,
    /// Adaptive mode: stop a query once its standard error is at or below this.
    pub tolerance: Option<f64>,
    /// Adaptive mode: points per randomisation of the first stage.
    pub min_points: usize,
}

impl CpuOptions {
    fn adaptive(&self) -> Option<f64> {
        match self.method {
            MvnMethod::Genz => self.tolerance,
            MvnMethod::Naive => None,
        }
    }
}

/// Combines per-randomisation estimates into p and its standard error.
pub(crate) fn combine(estimates: &[f64]) -> MvnEstimate {
    let r = estimates.len() as f64;
    let mean = estimates.iter().sum::<f64>() / r;
    let se = if estimates.len() > 1 {
        let ss: f64 = estimates.iter().map(|p| (p - mean) * (p - mean)).sum();
        (ss / (r - 1.0) / r).sqrt()
    } else {
        0.0
    };
    MvnEstimate {
        p: mean.clamp(0.0, 1.0),
        se,
    }
}

/// Factorises every query (in parallel), failing with the first error in input order.
pub(crate) fn factor_all(prepared: &[Prepared]) -> Result<Vec<Factor>, MvnError> {
    prepared
        .par_iter()
        .enumerate()
        .map(|(q, p)| factor(q, p))
        .collect()
}

/// What a query needs: nothing (exact), the Genz kernel, or the naive count.
enum Work<'a> {
    Exact(f64),
    Genz(GenzQuery<'a>, Kernel),
    Naive(&'a Factor),
}

impl Work<'_> {
    /// Σ of the integrand (or count) over points `start..end` of randomisation `r`.
    fn sum(&self, host: &HostConstants, r: usize, start: usize, end: usize) -> f64 {
        match self {
            Work::Exact(p) => p * end.min(host.n).saturating_sub(start) as f64,
            Work::Genz(g, kernel) => genz_sum(*kernel, g, host, r, start, end),
            Work::Naive(f) => naive_count(f, host, r, start, end),
        }
    }
}

/// The running sums of one query being integrated.
struct Running {
    q: usize,
    /// Σ per randomisation over points `0..done`.
    sums: Vec<f64>,
    /// Points (per randomisation, a multiple of [`BLOCK`] or n_pad) integrated so far.
    done: usize,
    /// The estimate after the previous stage (adaptive mode's guard).
    prev: Option<MvnEstimate>,
}

impl Running {
    /// The estimate from the points so far.
    fn estimate(&self, host: &HostConstants) -> MvnEstimate {
        let count = self.done.min(host.n) as f64;
        let per_r: Vec<f64> = self.sums.iter().map(|s| s / count).collect();
        combine(&per_r)
    }
}

/// The end of the first stage, and of the stage after one ending at `done`.
fn first_stage(host: &HostConstants, tolerance: Option<f64>, min_points: usize) -> usize {
    match tolerance {
        Some(_) => {
            // Half of the first stage, so that the guard has a previous estimate at min_points.
            let full = (min_points.max(1).div_ceil(BLOCK) * BLOCK).min(host.n_pad);
            ((full / 2).div_ceil(BLOCK) * BLOCK).clamp(BLOCK.min(full), full)
        }
        None => host.n_pad,
    }
}

fn next_stage(host: &HostConstants, done: usize) -> usize {
    (2 * done).min(host.n_pad)
}

/// Whether a query may stop after `done` points with estimate `e`, the previous stage's
/// being `prev` (see the module docs for the guard).
fn converged(
    host: &HostConstants,
    tolerance: Option<f64>,
    done: usize,
    e: &MvnEstimate,
    prev: Option<&MvnEstimate>,
) -> bool {
    if done >= host.n_pad {
        return true;
    }
    match (tolerance, prev) {
        (Some(t), Some(prev)) => e.se <= t && (e.p - prev.p).abs() <= 4.0 * e.se.hypot(prev.se),
        _ => false,
    }
}

/// Estimates every factorised query; answers come back in input order, each with the number
/// of points per randomisation it used.
pub(crate) fn estimate_all_counted(
    factors: &[Factor],
    host: &HostConstants,
    opts: &CpuOptions,
) -> (Vec<MvnEstimate>, Vec<usize>) {
    let rr = host.randomizations;
    let tolerance = opts.adaptive();
    // Group by dimension, keeping input order within a group.
    let mut order: Vec<usize> = (0..factors.len()).collect();
    order.sort_by_key(|&q| factors[q].d);

    let work: Vec<Work<'_>> = factors
        .iter()
        .map(|f| match opts.method {
            MvnMethod::Genz => match plan(f, tolerance.is_some()) {
                GenzPlan::Exact(p) => Work::Exact(p),
                GenzPlan::Integrate(g) => Work::Genz(g, opts.kernel),
            },
            MvnMethod::Naive => Work::Naive(f),
        })
        .collect();

    let threads = rayon::current_num_threads().max(1);
    let mut out = vec![
        MvnEstimate {
            p: f64::NAN,
            se: f64::NAN
        };
        factors.len()
    ];
    let mut used = vec![0usize; factors.len()];
    let first = first_stage(host, tolerance, opts.min_points);

    if factors.len() >= 4 * threads {
        // Many queries: one task per query, its stages run in turn.
        let results: Vec<(usize, MvnEstimate, usize)> = order
            .par_iter()
            .map(|&q| {
                if let Work::Exact(p) = work[q] {
                    return (q, MvnEstimate { p, se: 0.0 }, 0);
                }
                let mut run = Running {
                    q,
                    sums: vec![0.0; rr],
                    done: 0,
                    prev: None,
                };
                let mut end = first;
                loop {
                    for (r, s) in run.sums.iter_mut().enumerate() {
                        *s += work[q].sum(host, r, run.done, end);
                    }
                    run.done = end;
                    let e = run.estimate(host);
                    if converged(host, tolerance, run.done, &e, run.prev.as_ref()) {
                        return (q, e, run.done.min(host.n));
                    }
                    run.prev = Some(e);
                    end = next_stage(host, run.done);
                }
            })
            .collect();
        for (q, e, n) in results {
            out[q] = e;
            used[q] = n;
        }
        return (out, used);
    }

    // Few queries: every stage is split into (query, randomisation, point range) tasks so
    // that every thread has work; queries that converge drop out.
    let mut active: Vec<Running> = Vec::new();
    for &q in &order {
        match work[q] {
            Work::Exact(p) => out[q] = MvnEstimate { p, se: 0.0 },
            _ => active.push(Running {
                q,
                sums: vec![0.0; rr],
                done: 0,
                prev: None,
            }),
        }
    }
    let mut end = first;
    while !active.is_empty() {
        let start = active[0].done;
        let blocks = (end - start) / BLOCK;
        let wanted_tasks = 4 * threads;
        let chunks_per_r = wanted_tasks
            .div_ceil((active.len() * rr).max(1))
            .clamp(1, blocks.max(1));
        let blocks_per_chunk = blocks.div_ceil(chunks_per_r).max(1);
        let mut tasks = Vec::new();
        for (slot, run) in active.iter().enumerate() {
            for r in 0..rr {
                let mut b = 0;
                while b < blocks {
                    let e = (b + blocks_per_chunk).min(blocks);
                    tasks.push((slot, r, start + b * BLOCK, start + e * BLOCK));
                    b = e;
                }
            }
            debug_assert_eq!(run.done, start);
        }
        let sums: Vec<f64> = tasks
            .par_iter()
            .map(|&(slot, r, s, e)| work[active[slot].q].sum(host, r, s, e))
            .collect();
        for (&(slot, r, _, _), s) in tasks.iter().zip(sums) {
            active[slot].sums[r] += s;
        }
        active.retain_mut(|run| {
            run.done = end;
            let e = run.estimate(host);
            if converged(host, tolerance, run.done, &e, run.prev.as_ref()) {
                out[run.q] = e;
                used[run.q] = run.done.min(host.n);
                false
            } else {
                run.prev = Some(e);
                true
            }
        });
        end = next_stage(host, end);
    }
    (out, used)
}

/// Estimates every factorised query; answers come back in input order.
pub(crate) fn estimate_all(
    factors: &[Factor],
    host: &HostConstants,
    opts: &CpuOptions,
) -> Vec<MvnEstimate> {
    estimate_all_counted(factors, host, opts).0
}
