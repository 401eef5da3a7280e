//! The CPU path: validated queries → pivoted factors → per-randomisation sums → estimates.
//!
//! Queries are grouped by dimension (a stable sort by d), so that a mixed batch of 2-, 3- and
//! 5-leg picks runs as runs of equal-cost work, and answered in input order. Large batches are
//! parallel over queries (rayon); small batches (fewer queries than a few per thread, e.g. one
//! query) are split into (query, randomisation, point range) tasks instead, so one query
//! still uses every core.
//!
//! **Adaptive mode** (a `tolerance` in the config, Genz method only): each query integrates
//! over the first `min_points` points of every randomisation, then extends its point count in
//! stages — reusing the sums so far, since both point sets are extensible (Sobol' stages stop
//! at powers of two, where its prefixes are nets) — until its standard
//! error is at most the tolerance or all `points` are used (what SciPy's and mvtnorm's `abseps`
//! does). Easy queries (small or extreme probabilities, low dimension) stop early. In this
//! mode bivariate and one-factor queries are answered exactly (see [`super::bvn`] and
//! [`super::factor1`]).
//!
//! **Stage sizes.** The standard error of these randomised quasi-Monte Carlo sums falls like
//! 1/n (measured on the realistic families: median slope −0.99 at d = 4, −0.97 at d = 8), so a
//! query at n points with standard error se needs about n·se/tolerance points. The next stage
//! aims there with a 10% margin, taking at least 1.25× and at most 2× the points so far (a
//! prediction from few points is noisy; doubling was the old rule). Plain doubling overshoots
//! the points a query needs by 1.44× on average (for needs spread evenly on a log scale), so
//! queries used to stop well below the tolerance; aimed stages stop closer to it, with fewer
//! points. Every stage only adds points, so a stage that falls short costs nothing but a check.
//!
//! **The early-stop guard.** A standard error from R randomisations is itself an estimate;
//! on a peaked integrand at a few hundred points it can come out far too small (every
//! randomisation misses the same region), and a stop on it alone let the realised error reach
//! many standard errors. So a query stops early only when, besides se ≤ tolerance, its
//! estimate moved by at most 4·√(se² + se_half²) since the last stage that used at most half
//! its points: under honest standard errors that change has a standard deviation of about
//! 0.7·se_half, so the check almost never delays an honest stop, and it catches the
//! under-estimated ones. A query whose check fails doubles its points. So that easy queries
//! still stop after `min_points` points, the first stage is split in two halves (same points,
//! same cost): the first half is the reference of the check at `min_points`.

use rayon::prelude::*;

use super::cholesky::{Factor, factor};
use super::constants::HostConstants;
use super::error::MvnError;
use super::factor1::OneFactor;
use super::genz::{GenzPlan, GenzQuery, genz_sum, plan};
use super::naive::naive_count;
use super::normal::BLOCK;
use super::query::{MvnEstimate, Prepared};
use super::{MvnMethod, PointSet};
use kiln_base::simd::Kernel;

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
    /// The point sets (Sobol' stages end at powers of two, where its nets are).
    pub sequence: PointSet,
}

impl CpuOptions {
    fn adaptive(&self) -> Option<f64> {
        match self.method {
            MvnMethod::Genz => self.tolerance,
            MvnMethod::Naive => None,
        }
    }

    /// Whether structured queries (bivariate, one-factor) get exact answers: in the adaptive
    /// mode only, so that a fixed-mode answer never depends on what was detected.
    pub fn exact_answers(&self) -> bool {
        self.adaptive().is_some()
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

/// Factorises every query (in parallel), failing with the first error in input order; with
/// `opts.exact_answers()`, also detects each covariance's one-factor structure.
pub(crate) fn factor_all(
    prepared: &[Prepared],
    opts: &CpuOptions,
) -> Result<Vec<Factor>, MvnError> {
    let one_factor = opts.exact_answers();
    prepared
        .par_iter()
        .enumerate()
        .map(|(q, p)| {
            let mut f = factor(q, p)?;
            if one_factor {
                f.one_factor =
                    OneFactor::detect(&p.cov, p.d).map(|o| (o, p.a.clone(), p.b.clone()));
            }
            Ok(f)
        })
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
    /// The end of the stage being integrated.
    end: usize,
    /// (points, estimate) after every earlier stage, oldest first (adaptive mode's guard).
    history: Vec<(usize, MvnEstimate)>,
}

impl Running {
    fn new(q: usize, randomizations: usize, first: usize) -> Self {
        Running {
            q,
            sums: vec![0.0; randomizations],
            done: 0,
            end: first,
            history: Vec::new(),
        }
    }

    /// The estimate from the points so far.
    fn estimate(&self, host: &HostConstants) -> MvnEstimate {
        let count = self.done.min(host.n) as f64;
        let per_r: Vec<f64> = self.sums.iter().map(|s| s / count).collect();
        combine(&per_r)
    }

    /// After the stage ending at `end` was added to the sums: the answer if the query stops,
    /// else `None` with the next stage set.
    fn finish_stage(
        &mut self,
        host: &HostConstants,
        tolerance: Option<f64>,
        sequence: PointSet,
    ) -> Option<MvnEstimate> {
        self.done = self.end;
        let e = self.estimate(host);
        if self.done >= host.n_pad {
            return Some(e);
        }
        let Some(t) = tolerance else {
            // Fixed points: one stage of every point.
            self.end = host.n_pad;
            return None;
        };
        // The guard's reference: the last stage with at most half the points.
        let half = self
            .history
            .iter()
            .rev()
            .find(|(n, _)| 2 * n <= self.done)
            .map(|(_, e)| *e);
        let steady = half.is_some_and(|h| (e.p - h.p).abs() <= 4.0 * e.se.hypot(h.se));
        if e.se <= t && steady {
            return Some(e);
        }
        self.end = match sequence {
            PointSet::Halton => next_stage(host, self.done, &e, t, steady),
            PointSet::Sobol => (self.done + 1).next_power_of_two().min(host.n_pad),
        };
        self.history.push((self.done, e));
        None
    }
}

/// The end of the first stage.
fn first_stage(
    host: &HostConstants,
    tolerance: Option<f64>,
    min_points: usize,
    sequence: PointSet,
) -> usize {
    match tolerance {
        Some(_) if sequence == PointSet::Sobol => {
            // Powers of two, where the Sobol' sets are nets: half of min_points rounded up.
            let full = min_points.max(2 * BLOCK).next_power_of_two();
            (full / 2).min(host.n_pad)
        }
        Some(_) => {
            // Half of the first stage, so that the guard has a reference at min_points.
            let full = (min_points.max(1).div_ceil(BLOCK) * BLOCK).min(host.n_pad);
            ((full / 2).div_ceil(BLOCK) * BLOCK).clamp(BLOCK.min(full), full)
        }
        None => host.n_pad,
    }
}

/// The end of the stage after one ending at `done` with estimate `e` (see the module docs):
/// aimed at the points the 1/n decay predicts for the tolerance `t`, with a 10% margin, within
/// [1.25, 2]× `done`; doubling when the guard failed or had no reference yet (`aim` false).
fn next_stage(host: &HostConstants, done: usize, e: &MvnEstimate, t: f64, aim: bool) -> usize {
    let target = if aim && e.se.is_finite() {
        let want = done as f64 * 1.1 * e.se / t;
        want.clamp(1.25 * done as f64, 2.0 * done as f64)
    } else {
        2.0 * done as f64
    };
    let end = ((target / BLOCK as f64).ceil() as usize * BLOCK).max(done + BLOCK);
    end.min(host.n_pad)
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
            MvnMethod::Genz => match plan(f, opts.exact_answers()) {
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
    let first = first_stage(host, tolerance, opts.min_points, opts.sequence);

    if factors.len() >= 4 * threads {
        // Many queries: one task per query, its stages run in turn.
        let results: Vec<(usize, MvnEstimate, usize)> = order
            .par_iter()
            .map(|&q| {
                if let Work::Exact(p) = work[q] {
                    return (q, MvnEstimate { p, se: 0.0 }, 0);
                }
                let mut run = Running::new(q, rr, first);
                loop {
                    for (r, s) in run.sums.iter_mut().enumerate() {
                        *s += work[q].sum(host, r, run.done, run.end);
                    }
                    if let Some(e) = run.finish_stage(host, tolerance, opts.sequence) {
                        return (q, e, run.done.min(host.n));
                    }
                }
            })
            .collect();
        for (q, e, n) in results {
            out[q] = e;
            used[q] = n;
        }
        return (out, used);
    }

    // Few queries: every round of stages is split into (query, randomisation, point range)
    // tasks so that every thread has work; queries that converge drop out.
    let mut active: Vec<Running> = Vec::new();
    for &q in &order {
        match work[q] {
            Work::Exact(p) => out[q] = MvnEstimate { p, se: 0.0 },
            _ => active.push(Running::new(q, rr, first)),
        }
    }
    while !active.is_empty() {
        // About 4 tasks per thread over all (query, randomisation, block) units.
        let units: usize = active
            .iter()
            .map(|run| (run.end - run.done) / BLOCK * rr)
            .sum();
        let blocks_per_chunk = units.div_ceil(4 * threads).max(1);
        let mut tasks = Vec::new();
        for (slot, run) in active.iter().enumerate() {
            let n_blocks = (run.end - run.done) / BLOCK;
            for r in 0..rr {
                let mut b = 0;
                while b < n_blocks {
                    let e = (b + blocks_per_chunk).min(n_blocks);
                    tasks.push((slot, r, run.done + b * BLOCK, run.done + e * BLOCK));
                    b = e;
                }
            }
        }
        let sums: Vec<f64> = tasks
            .par_iter()
            .map(|&(slot, r, s, e)| work[active[slot].q].sum(host, r, s, e))
            .collect();
        for (&(slot, r, _, _), s) in tasks.iter().zip(sums) {
            active[slot].sums[r] += s;
        }
        active.retain_mut(
            |run| match run.finish_stage(host, tolerance, opts.sequence) {
                Some(e) => {
                    out[run.q] = e;
                    used[run.q] = run.done.min(host.n);
                    false
                }
                None => true,
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constants::RawConstants;

    #[test]
    fn stages_aim_at_the_predicted_points_within_their_bounds() {
        let host = HostConstants::from_raw(&RawConstants::generate(4096, 2, 2, 7, false), false);
        let e = |se: f64| MvnEstimate { p: 0.5, se };
        // se ∝ 1/n: 1024 points at se 2.4e−6 predict 1229 for 2e−6; with the 10% margin,
        // rounded up to a block, 1408.
        assert_eq!(next_stage(&host, 1024, &e(2.4e-6), 2e-6, true), 1408);
        // Far from the target: at most doubling; nearly there: at least 1.25×.
        assert_eq!(next_stage(&host, 1024, &e(9e-6), 2e-6, true), 2048);
        assert_eq!(next_stage(&host, 1024, &e(1.0e-6), 2e-6, true), 1280);
        // The guard failed (or had no reference): double.
        assert_eq!(next_stage(&host, 1024, &e(1.0e-6), 2e-6, false), 2048);
        // Never past the padded point count, always at least one block more.
        assert_eq!(next_stage(&host, 3072, &e(9e-6), 2e-6, true), host.n_pad);
        assert_eq!(next_stage(&host, 64, &e(2.0e-6), 2e-6, true), 128);
    }

    #[test]
    fn a_query_stops_when_its_error_is_met_and_the_guard_agrees() {
        let host = HostConstants::from_raw(&RawConstants::generate(4096, 2, 2, 7, false), false);
        let t = Some(2e-6);
        let first = first_stage(&host, t, 256, PointSet::Halton);
        assert_eq!(first, 128);
        // Two randomisations whose per-point means are 0.5 ± 1e−6: se = 1e−6 ≤ t, but the
        // first half has no reference yet, so it goes on to min_points (doubling).
        let mut run = Running::new(0, 2, first);
        run.sums = vec![0.5 * 128.0 + 1e-6 * 128.0, 0.5 * 128.0 - 1e-6 * 128.0];
        assert!(run.finish_stage(&host, t, PointSet::Halton).is_none());
        assert_eq!(run.end, 256);
        // At min_points the estimate agrees with the half: stop.
        run.sums = vec![0.5 * 256.0 + 1e-6 * 256.0, 0.5 * 256.0 - 1e-6 * 256.0];
        let e = run
            .finish_stage(&host, t, PointSet::Halton)
            .expect("converged");
        assert!((e.p - 0.5).abs() < 1e-12 && (e.se - 1e-6).abs() < 1e-12);
        // The same small se after a jump of 20 se from the half's estimate: not trusted,
        // the points double.
        let mut run = Running::new(0, 2, first);
        run.sums = vec![0.5 * 128.0 + 1e-6 * 128.0, 0.5 * 128.0 - 1e-6 * 128.0];
        assert!(run.finish_stage(&host, t, PointSet::Halton).is_none());
        let p = 0.5 + 2e-5;
        run.sums = vec![p * 256.0 + 1e-6 * 256.0, p * 256.0 - 1e-6 * 256.0];
        assert!(run.finish_stage(&host, t, PointSet::Halton).is_none());
        assert_eq!(run.end, 512);
    }
}
