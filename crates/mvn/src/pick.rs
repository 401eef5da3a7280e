//! Pick probabilities: P(all legs of a pick hit) from a model's predicted means and standard
//! deviations and the residual correlation between targets.
//!
//! Each leg is one predicted quantity (a target of a row of features, e.g. a player-season's
//! home runs) with a line and a side. Over hits when the outcome is above the line, under when
//! it is below. Outcomes are modelled as jointly normal with the predicted means, the predicted
//! standard deviations, and correlations:
//!
//! * legs on the same row (same `group`) correlate through the k × k residual correlation
//!   between targets (`target_corr[t_i][t_j]`; two legs on the same row and target are
//!   perfectly correlated, which the estimator handles as a semi-definite covariance);
//! * legs on different rows are independent, unless a k × k cross-row correlation is given,
//!   in which case `cross_row_corr[t_i][t_j]` applies.
//!
//! Over becomes the lower limit `line`, under the upper limit `line`, and the estimator answers
//! P(lower ≤ X ≤ upper) with its standard error.

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::error::MvnError;
use super::module::HaltonMvnCdf;
use super::normal::norm_cdf;
use super::query::{MvnQuery, SYMMETRY_TOLERANCE};

/// Which side of the line a leg needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The outcome must be above the line.
    Over,
    /// The outcome must be below the line.
    Under,
}

impl std::str::FromStr for Side {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "over" | "o" => Ok(Side::Over),
            "under" | "u" => Ok(Side::Under),
            other => Err(format!(
                "unknown side `{other}`; expected `over` or `under`"
            )),
        }
    }
}

/// One leg of a pick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Leg {
    /// The row (feature vector) the prediction comes from; legs with equal groups correlate
    /// through the target correlation.
    pub group: String,
    /// Index of the target in the correlation matrices.
    pub target: usize,
    /// Predicted mean of the outcome.
    pub mean: f64,
    /// Predicted standard deviation (≥ 0; 0 is a certain outcome).
    pub std: f64,
    /// The line.
    pub line: f64,
    /// The side that hits.
    pub side: Side,
}

/// The residual correlations that couple legs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PickCorrelation {
    /// Number of targets k.
    pub targets: usize,
    /// k × k correlation between targets on the same row (row-major; unit diagonal).
    pub target_corr: Vec<f64>,
    /// Optional k × k correlation between targets on different rows (row-major); `None`
    /// means legs on different rows are independent.
    pub cross_row_corr: Option<Vec<f64>>,
}

impl PickCorrelation {
    /// Targets that do not correlate at all (identity), rows independent.
    pub fn independent(targets: usize) -> Self {
        let mut target_corr = vec![0.0; targets * targets];
        for t in 0..targets {
            target_corr[t * targets + t] = 1.0;
        }
        Self {
            targets,
            target_corr,
            cross_row_corr: None,
        }
    }

    /// Checks shapes, symmetry, range [−1, 1] and the unit diagonal of `target_corr`.
    pub fn validate(&self) -> Result<(), MvnError> {
        let k = self.targets;
        check_corr("target", &self.target_corr, k, true)?;
        if let Some(c) = &self.cross_row_corr {
            check_corr("cross-row", c, k, false)?;
        }
        Ok(())
    }
}

fn check_corr(which: &'static str, c: &[f64], k: usize, unit_diag: bool) -> Result<(), MvnError> {
    let bad = |problem: String| MvnError::InvalidCorrelation { which, problem };
    if c.len() != k * k {
        return Err(bad(format!(
            "has {} entries; expected {} ({k} × {k} targets)",
            c.len(),
            k * k
        )));
    }
    for i in 0..k {
        for j in 0..k {
            let v = c[i * k + j];
            if !v.is_finite() || !(-1.0..=1.0).contains(&v) {
                return Err(bad(format!(
                    "entry [{i}][{j}] = {v}; expected a number in [-1, 1]"
                )));
            }
            if (v - c[j * k + i]).abs() > SYMMETRY_TOLERANCE {
                return Err(bad(format!(
                    "entry [{i}][{j}] = {v} but [{j}][{i}] = {}; expected a symmetric matrix",
                    c[j * k + i]
                )));
            }
        }
        if unit_diag && (c[i * k + i] - 1.0).abs() > 1e-9 {
            return Err(bad(format!(
                "diagonal entry [{i}][{i}] = {}; expected 1",
                c[i * k + i]
            )));
        }
    }
    Ok(())
}

/// The answer for one pick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PickResult {
    /// P(all legs hit).
    pub p: f64,
    /// Its standard error.
    pub se: f64,
    /// Each leg's own hit probability.
    pub leg_p: Vec<f64>,
    /// The product of the legs' probabilities (what independence would give).
    pub independent_p: f64,
}

/// Checks one leg.
fn check_leg(index: usize, leg: &Leg, targets: usize) -> Result<(), MvnError> {
    let bad = |field, problem: String| MvnError::InvalidLeg {
        leg: index,
        field,
        problem,
    };
    if leg.target >= targets {
        return Err(bad(
            "target",
            format!(
                "is {}; expected an index below {targets} (the number of targets)",
                leg.target
            ),
        ));
    }
    if !leg.mean.is_finite() {
        return Err(bad(
            "mean",
            format!("is {}; expected a finite number", leg.mean),
        ));
    }
    if !leg.std.is_finite() || leg.std < 0.0 {
        return Err(bad(
            "std",
            format!("is {}; expected a finite number >= 0", leg.std),
        ));
    }
    if !leg.line.is_finite() {
        return Err(bad(
            "line",
            format!("is {}; expected a finite number", leg.line),
        ));
    }
    Ok(())
}

/// The multivariate-normal query of a pick: means, covariance from std and correlation, and
/// limits from lines and sides.
pub fn pick_query(legs: &[Leg], corr: &PickCorrelation) -> Result<MvnQuery, MvnError> {
    corr.validate()?;
    if legs.is_empty() {
        return Err(MvnError::InvalidLeg {
            leg: 0,
            field: "legs",
            problem: "are empty; expected at least one leg".into(),
        });
    }
    for (i, leg) in legs.iter().enumerate() {
        check_leg(i, leg, corr.targets)?;
    }
    let d = legs.len();
    let k = corr.targets;
    let mut cov = vec![0.0; d * d];
    for (i, li) in legs.iter().enumerate() {
        for (j, lj) in legs.iter().enumerate() {
            let rho = if i == j {
                1.0
            } else if li.group == lj.group {
                corr.target_corr[li.target * k + lj.target]
            } else {
                corr.cross_row_corr
                    .as_ref()
                    .map_or(0.0, |c| c[li.target * k + lj.target])
            };
            cov[i * d + j] = li.std * lj.std * rho;
        }
    }
    let mut lower = vec![f64::NEG_INFINITY; d];
    let mut upper = vec![f64::INFINITY; d];
    for (i, leg) in legs.iter().enumerate() {
        match leg.side {
            Side::Over => lower[i] = leg.line,
            Side::Under => upper[i] = leg.line,
        }
    }
    Ok(MvnQuery {
        upper,
        lower: Some(lower),
        mean: Some(legs.iter().map(|l| l.mean).collect()),
        cov,
    })
}

/// One leg's own hit probability.
pub fn leg_probability(leg: &Leg) -> f64 {
    if leg.std == 0.0 {
        let hit = match leg.side {
            Side::Over => leg.mean >= leg.line,
            Side::Under => leg.mean <= leg.line,
        };
        return if hit { 1.0 } else { 0.0 };
    }
    let z = (leg.line - leg.mean) / leg.std;
    match leg.side {
        Side::Over => norm_cdf(-z),
        Side::Under => norm_cdf(z),
    }
}

/// P(all legs hit) for one pick, with its standard error (CPU path).
pub fn pick_probability<B: Backend>(
    model: &HaltonMvnCdf<B>,
    legs: &[Leg],
    corr: &PickCorrelation,
) -> Result<PickResult, MvnError> {
    let mut all = pick_probabilities(model, &[legs], corr)?;
    Ok(all.remove(0))
}

/// P(all legs hit) for many picks of any sizes in one call (grouped by size internally,
/// answered in order). Errors name the pick as the query index.
pub fn pick_probabilities<B: Backend>(
    model: &HaltonMvnCdf<B>,
    picks: &[&[Leg]],
    corr: &PickCorrelation,
) -> Result<Vec<PickResult>, MvnError> {
    let queries = picks
        .iter()
        .map(|legs| pick_query(legs, corr))
        .collect::<Result<Vec<_>, _>>()?;
    let estimates = model.forward(queries.as_slice())?;
    Ok(picks
        .iter()
        .zip(estimates)
        .map(|(legs, e)| {
            let leg_p: Vec<f64> = legs.iter().map(leg_probability).collect();
            PickResult {
                p: e.p,
                se: e.se,
                independent_p: leg_p.iter().product(),
                leg_p,
            }
        })
        .collect())
}
