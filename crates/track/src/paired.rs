//! Paired comparison of two models on the same rows: the mean difference of a per-row loss,
//! with a bootstrap confidence interval that resamples rows — or whole groups of rows (e.g.
//! every season of one player) when a group is given, so that correlated rows do not pass for
//! independent evidence.
//!
//! The gate ([`crate::promote`]) calls a candidate *worse* only when the one-sided lower
//! confidence bound of its loss increase is above a tolerance, and *better* only when the upper
//! bound is below minus that tolerance; anything in between is *within noise*. The tolerance is
//! what absorbs training noise: the bootstrap sees only the finite test set, while two models
//! that differ by their seed alone also differ for real on that set (see `docs/nightly.md` for
//! the measured rates).

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

/// How a statistic is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// `(mean(candidate) − mean(incumbent)) / mean(incumbent)`: for losses whose size depends
    /// on the target's units (squared error).
    Relative,
    /// `mean(candidate − incumbent)`: for losses in comparable units (NLL in nats).
    Absolute,
}

/// The verdict on one paired statistic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Lower than the incumbent's beyond the tolerance, with confidence.
    Better,
    /// Neither better nor worse with confidence.
    WithinNoise,
    /// Higher than the incumbent's beyond the tolerance, with confidence.
    Worse,
}

impl Verdict {
    /// A word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::WithinNoise => "within noise",
            Verdict::Worse => "worse",
        }
    }
}

/// A paired difference and its confidence bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    /// The statistic on the rows as they are.
    pub estimate: f64,
    /// One-sided lower confidence bound.
    pub lower: f64,
    /// One-sided upper confidence bound.
    pub upper: f64,
    /// Resampling units (rows, or groups).
    pub units: usize,
}

impl Paired {
    /// Worse / better / within noise at `tolerance` (in the statistic's scale).
    pub fn verdict(&self, tolerance: f64) -> Verdict {
        if self.lower > tolerance {
            Verdict::Worse
        } else if self.upper < -tolerance {
            Verdict::Better
        } else {
            Verdict::WithinNoise
        }
    }
}

/// Resampling units: row indices grouped by `groups` (one unit per distinct value, in order of
/// first appearance), or one unit per row.
pub fn units(rows: usize, groups: Option<&[u64]>) -> Vec<Vec<usize>> {
    match groups {
        None => (0..rows).map(|i| vec![i]).collect(),
        Some(g) => {
            let mut index = std::collections::HashMap::new();
            let mut out: Vec<Vec<usize>> = Vec::new();
            for (i, &k) in g.iter().enumerate().take(rows) {
                let u = *index.entry(k).or_insert_with(|| {
                    out.push(Vec::new());
                    out.len() - 1
                });
                out[u].push(i);
            }
            out
        }
    }
}

/// The statistic over the rows of `units` picked (with multiplicity) by `pick`.
fn statistic(cand: &[f64], inc: &[f64], units: &[Vec<usize>], pick: &[usize], scale: Scale) -> f64 {
    let (mut sc, mut si, mut n) = (0.0, 0.0, 0usize);
    for &u in pick {
        for &i in &units[u] {
            sc += cand[i];
            si += inc[i];
            n += 1;
        }
    }
    let n = n.max(1) as f64;
    match scale {
        Scale::Relative => (sc - si) / si.abs().max(f64::MIN_POSITIVE),
        Scale::Absolute => (sc - si) / n,
    }
}

/// Compare per-row losses `cand` and `inc` (same rows, same order) with `resamples` bootstrap
/// resamples of `units` (seeded: the same inputs give the same bounds) at one-sided
/// `confidence` (e.g. 0.95).
pub fn compare(
    cand: &[f64],
    inc: &[f64],
    units: &[Vec<usize>],
    scale: Scale,
    confidence: f64,
    resamples: usize,
    seed: u64,
) -> Paired {
    assert_eq!(cand.len(), inc.len(), "paired losses cover the same rows");
    let all: Vec<usize> = (0..units.len()).collect();
    let estimate = statistic(cand, inc, units, &all, scale);
    let mut rng = SplitMix64::new(seed);
    let mut pick = vec![0usize; units.len()];
    let mut stats: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            for p in pick.iter_mut() {
                *p = rng.below(units.len().max(1) as u64) as usize;
            }
            statistic(cand, inc, units, &pick, scale)
        })
        .collect();
    stats.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let i = ((stats.len() - 1) as f64 * p).round() as usize;
        stats[i.min(stats.len() - 1)]
    };
    Paired {
        estimate,
        lower: q(1.0 - confidence),
        upper: q(confidence),
        units: units.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_become_units_in_order_of_first_appearance() {
        let u = units(5, Some(&[7, 3, 7, 9, 3]));
        assert_eq!(u, vec![vec![0, 2], vec![1, 4], vec![3]]);
        assert_eq!(units(3, None), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn the_estimate_is_the_plain_statistic() {
        let inc = [1.0, 2.0, 3.0, 4.0];
        let cand = [1.5, 2.5, 3.0, 5.0];
        let u = units(4, None);
        let r = compare(&cand, &inc, &u, Scale::Relative, 0.95, 200, 1);
        assert!((r.estimate - 2.0 / 10.0).abs() < 1e-12);
        let a = compare(&cand, &inc, &u, Scale::Absolute, 0.95, 200, 1);
        assert!((a.estimate - 0.5).abs() < 1e-12);
        assert!(a.lower <= a.estimate && a.estimate <= a.upper);
        // Seeded: the same call gives the same bounds.
        assert_eq!(a, compare(&cand, &inc, &u, Scale::Absolute, 0.95, 200, 1));
    }

    /// A shift far larger than the rows' noise is called worse; the same rows compared with
    /// themselves are within noise; the reverse shift is better.
    #[test]
    fn verdicts_follow_the_bounds() {
        let mut rng = SplitMix64::new(3);
        let inc: Vec<f64> = (0..400).map(|_| 1.0 + rng.normal().abs()).collect();
        let worse: Vec<f64> = inc.iter().map(|v| v * 1.2).collect();
        let u = units(inc.len(), None);
        let w = compare(&worse, &inc, &u, Scale::Relative, 0.95, 500, 2);
        assert_eq!(w.verdict(0.05), Verdict::Worse, "{w:?}");
        let b = compare(&inc, &worse, &u, Scale::Relative, 0.95, 500, 2);
        assert_eq!(b.verdict(0.05), Verdict::Better, "{b:?}");
        let same = compare(&inc, &inc, &u, Scale::Relative, 0.95, 500, 2);
        assert_eq!(same.verdict(0.0), Verdict::WithinNoise);
        // A 20 % increase is not "worse" under a 30 % tolerance.
        assert_eq!(w.verdict(0.3), Verdict::WithinNoise);
    }

    /// The bootstrap's one-sided 95 % bound is exceeded by chance about 5 % of the time when
    /// the two losses are exchangeable (noise only): checked over 400 seeded experiments
    /// against a binomial band.
    #[test]
    fn the_false_alarm_rate_matches_the_confidence_under_pure_noise() {
        let mut rng = SplitMix64::new(11);
        let mut alarms = 0;
        let trials = 400;
        for t in 0..trials {
            let a: Vec<f64> = (0..200).map(|_| rng.normal().powi(2)).collect();
            let b: Vec<f64> = (0..200).map(|_| rng.normal().powi(2)).collect();
            let u = units(200, None);
            let r = compare(&a, &b, &u, Scale::Absolute, 0.95, 400, t);
            if r.lower > 0.0 {
                alarms += 1;
            }
        }
        // Expected 20 of 400; ±3 binomial standard deviations (σ ≈ 4.4), plus the
        // percentile bootstrap's small-sample slack.
        assert!((5..=40).contains(&alarms), "{alarms} of {trials}");
    }

    /// Blocking by group widens the interval when the rows of a group move together.
    #[test]
    fn blocking_widens_the_interval_for_correlated_rows() {
        let mut rng = SplitMix64::new(5);
        let mut inc = Vec::new();
        let mut cand = Vec::new();
        let mut groups = Vec::new();
        for g in 0..60u64 {
            let shared = rng.normal();
            for _ in 0..8 {
                inc.push(1.0);
                cand.push(1.0 + shared + 0.05 * rng.normal());
                groups.push(g);
            }
        }
        let rows = units(inc.len(), None);
        let blocks = units(inc.len(), Some(&groups));
        let r = compare(&cand, &inc, &rows, Scale::Absolute, 0.95, 500, 9);
        let b = compare(&cand, &inc, &blocks, Scale::Absolute, 0.95, 500, 9);
        assert_eq!(b.units, 60);
        assert!(
            b.upper - b.lower > 2.0 * (r.upper - r.lower),
            "rows {r:?} blocks {b:?}"
        );
    }
}
