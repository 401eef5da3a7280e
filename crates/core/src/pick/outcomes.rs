//! Pick probabilities checked against what happened (`kiln pick evaluate`).
//!
//! On a split's real rows it builds
//! * **single legs**: per row and target, "over the line", the line being the persistence value
//!   (feature `<target>_l1`) where the checkpoint has one, else the training split's median
//!   (an "under" leg has probability 1 − p and outcome 1 − hit, so its Brier score and log loss
//!   are the same: one side suffices);
//! * **multi-leg picks**: per row, every target over its line, and every target under it, priced
//!   by the checkpoint's residual correlation (as `kiln pick` does) and, for comparison, by the
//!   independence assumption (the product of the legs).
//!
//! Legs whose outcome equals the line exactly are pushes and left out (counted).
//! Each probability set is scored by the Brier score, the log loss (probabilities clamped to
//! [1e−12, 1 − 1e−12]) and a ten-bin reliability table, against a constant-probability
//! baseline: the hit rate of the same kind of pick on the baseline rows (the validation split),
//! never on the rows scored.

use super::PickError;
use crate::artifact::{Checkpoint, HostWeights};
use crate::data::{ColumnStats, DataError, Dataset};
use crate::model::mvn::{
    HaltonMvnCdf, HaltonMvnCdfConfig, Leg, MvnMethod, PickCorrelation, Side, pick_probabilities,
};
use crate::predict::Predictor;

/// Probabilities are clamped to `[EPS, 1 − EPS]` for the log loss.
pub const EPS: f64 = 1e-12;

pub use kiln_model::records::metrics::{
    PickEvaluation, PickKindReport, ProbabilityScores, ReliabilityBin,
};

/// Brier score of `p` against `hit`.
pub fn brier(p: &[f64], hit: &[bool]) -> f64 {
    let n = p.len().max(1) as f64;
    p.iter()
        .zip(hit)
        .map(|(&p, &h)| (p - f64::from(u8::from(h))).powi(2))
        .sum::<f64>()
        / n
}

/// Log loss of `p` against `hit` (clamped to [`EPS`]).
pub fn log_loss(p: &[f64], hit: &[bool]) -> f64 {
    let n = p.len().max(1) as f64;
    p.iter()
        .zip(hit)
        .map(|(&p, &h)| {
            let p = p.clamp(EPS, 1.0 - EPS);
            if h { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum::<f64>()
        / n
}

/// Score `p` against `hit`.
pub fn score(p: &[f64], hit: &[bool]) -> ProbabilityScores {
    let mut bins: Vec<(usize, f64, f64)> = vec![(0, 0.0, 0.0); 10];
    for (&p, &h) in p.iter().zip(hit) {
        let b = ((p * 10.0) as usize).min(9);
        bins[b].0 += 1;
        bins[b].1 += p;
        bins[b].2 += f64::from(u8::from(h));
    }
    let n = p.len();
    ProbabilityScores {
        n,
        brier: brier(p, hit),
        log_loss: log_loss(p, hit),
        mean_p: p.iter().sum::<f64>() / n.max(1) as f64,
        hit_rate: hit.iter().filter(|h| **h).count() as f64 / n.max(1) as f64,
        reliability: bins
            .iter()
            .enumerate()
            .filter(|(_, b)| b.0 > 0)
            .map(|(i, b)| ReliabilityBin {
                lo: i as f64 / 10.0,
                hi: (i + 1) as f64 / 10.0,
                count: b.0,
                mean_p: b.1 / b.0 as f64,
                hit_rate: b.2 / b.0 as f64,
            })
            .collect(),
    }
}

/// Rows of a split in original units.
#[derive(Debug, Clone, Copy)]
pub struct SplitRows<'a> {
    /// `rows × n_features`.
    pub x: &'a [f32],
    /// `rows × n_targets`.
    pub y: &'a [f32],
}

impl SplitRows<'_> {
    fn rows(&self, k: usize) -> usize {
        self.y.len() / k.max(1)
    }
}

/// Where a target's line comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LineSource {
    /// Feature index of `<target>_l1`.
    Persistence(usize),
    /// A fixed value (the training median).
    Fixed(f64),
}

impl LineSource {
    fn line(self, x_row: &[f32]) -> f64 {
        match self {
            Self::Persistence(f) => x_row[f] as f64,
            Self::Fixed(v) => v,
        }
    }
}

/// The median of a slice (mean of the middle two for even length).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

fn hit(y: f64, line: f64, side: Side) -> Option<bool> {
    if y == line {
        None
    } else {
        Some(match side {
            Side::Over => y > line,
            Side::Under => y < line,
        })
    }
}

/// Outcomes of the single legs and multi-leg picks of `rows` (no prediction needed): the
/// baseline's hit rates.
fn outcomes(rows: SplitRows<'_>, nf: usize, k: usize, lines: &[LineSource]) -> (f64, f64) {
    let (mut single, mut ns, mut multi, mut nm) = (0usize, 0usize, 0usize, 0usize);
    for r in 0..rows.rows(k) {
        let xr = &rows.x[r * nf..(r + 1) * nf];
        let legs: Vec<Option<bool>> = (0..k)
            .map(|j| hit(rows.y[r * k + j] as f64, lines[j].line(xr), Side::Over))
            .collect();
        for h in legs.iter().flatten() {
            ns += 1;
            single += usize::from(*h);
        }
        if k > 1 && legs.iter().all(Option::is_some) {
            let all_over = legs.iter().all(|h| *h == Some(true));
            let all_under = legs.iter().all(|h| *h == Some(false));
            nm += 2;
            multi += usize::from(all_over) + usize::from(all_under);
        }
    }
    (
        single as f64 / ns.max(1) as f64,
        multi as f64 / nm.max(1) as f64,
    )
}

/// Build the picks of `test`, price them with `predictor` (and `mvn` with `corr` for the
/// multi-leg ones), and score them against outcomes; the constant baseline comes from
/// `baseline` rows' hit rates.
pub fn evaluate_outcomes(
    predictor: &mut Predictor,
    mvn: &HaltonMvnCdf<crate::backend::Cpu>,
    corr: &PickCorrelation,
    test: SplitRows<'_>,
    baseline: SplitRows<'_>,
    lines: &[LineSource],
    line_names: Vec<String>,
) -> Result<PickEvaluation, PickError> {
    let (nf, k) = (predictor.n_features(), predictor.n_targets());
    let rows = test.rows(k);
    let pred = predictor.predict(test.x, rows)?;
    let (c_single, c_multi) = outcomes(baseline, nf, k, lines);

    let (mut sp, mut sh, mut s_push) = (Vec::new(), Vec::new(), 0usize);
    let mut picks: Vec<Vec<Leg>> = Vec::new();
    let mut multi_hit = Vec::new();
    let mut m_push = 0usize;
    for r in 0..rows {
        let xr = &test.x[r * nf..(r + 1) * nf];
        let leg = |j: usize, side: Side| Leg {
            group: format!("row {r}"),
            target: j,
            mean: pred.mean[r * k + j] as f64,
            std: pred.std[r * k + j] as f64,
            line: lines[j].line(xr),
            side,
        };
        let mut all_decided = true;
        for j in 0..k {
            let l = leg(j, Side::Over);
            match hit(test.y[r * k + j] as f64, l.line, Side::Over) {
                Some(h) => {
                    sp.push(crate::model::mvn::leg_probability(&l));
                    sh.push(h);
                }
                None => {
                    s_push += 1;
                    all_decided = false;
                }
            }
        }
        if k > 1 {
            if !all_decided {
                m_push += 2;
                continue;
            }
            for side in [Side::Over, Side::Under] {
                let legs: Vec<Leg> = (0..k).map(|j| leg(j, side)).collect();
                multi_hit.push(
                    legs.iter()
                        .all(|l| hit(test.y[r * k + l.target] as f64, l.line, side) == Some(true)),
                );
                picks.push(legs);
            }
        }
    }
    let constant = |p: f64, hits: &[bool]| score(&vec![p; hits.len()], hits);
    let mut kinds = vec![PickKindReport {
        kind: "single legs".into(),
        pushes: s_push,
        model: score(&sp, &sh),
        independence: None,
        constant_p: c_single,
        constant: constant(c_single, &sh),
    }];
    if k > 1 && !picks.is_empty() {
        let refs: Vec<&[Leg]> = picks.iter().map(Vec::as_slice).collect();
        let mut p_corr = Vec::with_capacity(refs.len());
        let mut p_ind = Vec::with_capacity(refs.len());
        const CHUNK: usize = 4096;
        for chunk in refs.chunks(CHUNK) {
            for r in pick_probabilities(mvn, chunk, corr)? {
                p_corr.push(r.p);
                p_ind.push(r.independent_p);
            }
        }
        kinds.push(PickKindReport {
            kind: format!("{k}-leg picks"),
            pushes: m_push,
            model: score(&p_corr, &multi_hit),
            independence: Some(score(&p_ind, &multi_hit)),
            constant_p: c_multi,
            constant: constant(c_multi, &multi_hit),
        });
    }
    Ok(PickEvaluation {
        split: "test".into(),
        rows,
        lines: line_names,
        kinds,
    })
}

/// The estimator's settings for [`evaluate_checkpoint`].
#[derive(Debug, Clone, Copy)]
pub struct EstimatorSettings {
    /// Halton points per randomisation.
    pub points: usize,
    /// Randomisations.
    pub randomizations: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for EstimatorSettings {
    fn default() -> Self {
        Self {
            points: 4096,
            randomizations: 8,
            seed: 0,
        }
    }
}

/// [`evaluate_outcomes`] for a checkpoint on its own dataset (`data_cfg`, normally the config
/// that trained it): the dataset's SHA-256 and columns must match the manifest's; lines are
/// the persistence feature where present, else the training median; the baseline rows are the
/// validation split.
pub fn evaluate_checkpoint(
    ckpt: &Checkpoint,
    data_cfg: &crate::config::DataConfig,
    est: EstimatorSettings,
) -> Result<PickEvaluation, PickError> {
    let m = &ckpt.manifest;
    let data = Dataset::load(&data_cfg.as_trained(m.preprocessing.as_ref()))?;
    if data.sha256 != m.dataset.sha256 {
        return Err(PickError::Data(DataError::Other(format!(
            "{}: sha256 {} differs from the checkpoint's dataset ({}); the outcomes would not be the rows it was judged on",
            data.path.display(),
            data.sha256,
            m.dataset.sha256
        ))));
    }
    if data.features != m.feature_names() || data.targets != m.target_names() {
        return Err(PickError::Data(DataError::Other(format!(
            "{}: data.features/data.targets differ from the checkpoint's",
            data.path.display()
        ))));
    }
    let model = ModelParts {
        weights: &ckpt.weights,
        features: &m.features,
        targets: &m.targets,
        residual_correlation: &m.residual_correlation,
    };
    evaluate_model(model, OutcomeRows::of(&data, data.train.rows()), est)
}

/// A model as pick evaluation reads it: its weights and what its manifest holds (or will hold:
/// a training run evaluates before its export).
#[derive(Debug, Clone, Copy)]
pub struct ModelParts<'a> {
    /// The weights.
    pub weights: &'a HostWeights,
    /// Features in network order with their normalisation.
    pub features: &'a [ColumnStats],
    /// Targets with their normalisation.
    pub targets: &'a [ColumnStats],
    /// Residual correlation between targets (`k × k`).
    pub residual_correlation: &'a [Vec<f64>],
}

/// The rows of a dataset pick evaluation reads, in original units: the test rows it scores,
/// the validation rows of the constant baseline, and the training split's targets, whose
/// median is the line of a target without a persistence feature.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeRows<'a> {
    /// Feature names in network order.
    pub features: &'a [String],
    /// Target names.
    pub targets: &'a [String],
    /// The training split's targets (`rows × k`).
    pub train_y: &'a [f32],
    /// The baseline rows.
    pub validation: SplitRows<'a>,
    /// The rows scored.
    pub test: SplitRows<'a>,
}

impl<'a> OutcomeRows<'a> {
    /// The rows of `data` whose training split is its first `train_rows` rows (all of them,
    /// or fewer when validation rows were appended to it: a refit pass's data, whose lines
    /// stay those of the split the data file defines).
    pub fn of(data: &'a Dataset, train_rows: usize) -> Self {
        let k = data.targets.len();
        Self {
            features: &data.features,
            targets: &data.targets,
            train_y: &data.train.y[..(train_rows * k).min(data.train.y.len())],
            validation: SplitRows {
                x: &data.validation.x,
                y: &data.validation.y,
            },
            test: SplitRows {
                x: &data.test.x,
                y: &data.test.y,
            },
        }
    }

    /// Each target's line and its description: the persistence feature `<target>_l1` where
    /// there is one, else the training median.
    fn lines(&self) -> (Vec<LineSource>, Vec<String>) {
        let k = self.targets.len();
        let mut lines = Vec::with_capacity(k);
        let mut names = Vec::with_capacity(k);
        for (j, t) in self.targets.iter().enumerate() {
            let l1 = format!("{t}_l1");
            match self.features.iter().position(|f| *f == l1) {
                Some(f) => {
                    lines.push(LineSource::Persistence(f));
                    names.push(format!("{t}: persistence ({l1})"));
                }
                None => {
                    let ys: Vec<f64> = (0..self.train_y.len() / k.max(1))
                        .map(|i| self.train_y[i * k + j] as f64)
                        .collect();
                    let med = median(&ys);
                    lines.push(LineSource::Fixed(med));
                    names.push(format!("{t}: training median {med:.6}"));
                }
            }
        }
        (lines, names)
    }
}

/// [`evaluate_outcomes`] for `model` on `rows` (see [`evaluate_checkpoint`]; the same
/// estimator, engine and lines).
pub fn evaluate_model(
    model: ModelParts<'_>,
    rows: OutcomeRows<'_>,
    est: EstimatorSettings,
) -> Result<PickEvaluation, PickError> {
    let k = rows.targets.len();
    let (lines, names) = rows.lines();
    let mvn = HaltonMvnCdfConfig::new()
        .with_max_dim(k.max(1))
        .with_points(est.points)
        .with_randomizations(est.randomizations)
        .with_seed(est.seed)
        .with_method(MvnMethod::Genz)
        .init::<crate::backend::Cpu>(&Default::default())?;
    let engine = crate::infer::build_engine(crate::records::EngineKind::Burn, model.weights, 1)?;
    let mut predictor = Predictor::new(engine, model.features, model.targets);
    let corr = super::correlation_of(model.targets.len(), model.residual_correlation, None);
    evaluate_outcomes(
        &mut predictor,
        &mvn,
        &corr,
        rows.test,
        rows.validation,
        &lines,
        names,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brier_and_log_loss_by_hand() {
        let p = [0.9, 0.2, 0.5, 1.0];
        let h = [true, true, false, true];
        // (0.01 + 0.64 + 0.25 + 0)/4
        assert!((brier(&p, &h) - 0.225).abs() < 1e-15);
        let want = -(0.9f64.ln() + 0.2f64.ln() + 0.5f64.ln() + (1.0 - EPS).ln()) / 4.0;
        assert!((log_loss(&p, &h) - want).abs() < 1e-15);
        let s = score(&p, &h);
        assert_eq!(s.n, 4);
        assert_eq!(s.hit_rate, 0.75);
        // Bins [0.2,0.3), [0.5,0.6), [0.9,1.0] (1.0 falls in the last bin).
        assert_eq!(s.reliability.len(), 3);
        assert_eq!(s.reliability[2].count, 2);
        assert!((s.reliability[2].mean_p - 0.95).abs() < 1e-15);
        assert_eq!(s.reliability[2].hit_rate, 1.0);
    }

    #[test]
    fn median_and_pushes() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(hit(1.0, 1.0, Side::Over), None);
        assert_eq!(hit(2.0, 1.0, Side::Under), Some(false));
        // Two rows, two targets, lines fixed at 0: row 0 over/over, row 1 over/under.
        let x = [0.0f32, 0.0];
        let y = [1.0f32, 1.0, 1.0, -1.0];
        let lines = [LineSource::Fixed(0.0), LineSource::Fixed(0.0)];
        let (s, m) = outcomes(SplitRows { x: &x, y: &y }, 1, 2, &lines);
        assert_eq!(s, 0.75);
        // Picks: row 0 all-over hits, all-under misses; row 1 both miss → 1/4.
        assert_eq!(m, 0.25);
    }
}
