//! Reference sketches of the training split's inputs, stored in the checkpoint, and the drift
//! statistics the serving tier computes against them.
//!
//! One sketch per raw input column, over the model's inputs before normalisation (the network
//! row a request decodes to, so a file, `kiln predict` and every transport are binned alike):
//!
//! * **numeric**: up to [`NUMERIC_BINS`] bins cut at the training split's deciles (ties
//!   merged, so a 0/1 column has two), the training range, and a last bin for missing values
//!   (recognised by the column's missing indicator; without one an imputed value is binned as
//!   the value it was imputed with);
//! * **categorical**: one bin per training category in one-hot order and a last bin for the
//!   unknown bucket (unknown categories, and missing ones unless an indicator says missing).
//!
//! The reference fractions are computed by binning the training rows with the same function
//! the server bins live rows with ([`DriftReference::bin`]), so an undrifted stream drawn from
//! the training rows has the reference's distribution exactly in expectation.
//!
//! Statistics (documented in `docs/serve.md`):
//! * **PSI** `Σ (a − e) ln(a / e)` over the bins, both fractions floored at [`PSI_FLOOR`] so an
//!   empty bin contributes a bounded amount (Evidently and NannyML floor the same way);
//! * **KS** (numeric columns): the largest gap between the live and reference cumulative
//!   fractions at the bin edges (missing last) — the binned two-sample KS statistic;
//! * **out of range**: the fraction of live values below the training minimum or above its
//!   maximum (numeric), or in the unknown bucket though not missing (categorical).

use serde::{Deserialize, Serialize};

use super::preprocess::Preprocessing;

/// Most value bins of a numeric column (deciles), plus the missing bin.
pub const NUMERIC_BINS: usize = 10;

/// Fractions below this count as this in the PSI (an empty bin would be infinite).
pub const PSI_FLOOR: f64 = 1e-4;

/// The sketch of one raw input column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnSketch {
    /// The raw column.
    pub name: String,
    /// Numeric: the ascending cut points; value `v` falls in bin `#{edges ≤ v}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edges: Vec<f64>,
    /// Categorical: the categories, in one-hot order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<Vec<String>>,
    /// Smallest training value (numeric).
    #[serde(default)]
    pub min: f64,
    /// Largest training value (numeric).
    #[serde(default)]
    pub max: f64,
    /// The training split's fraction per bin; the last bin is missing (numeric) or the unknown
    /// bucket (categorical).
    pub reference: Vec<f64>,
}

impl ColumnSketch {
    /// Bins, the last (missing / unknown) included.
    pub fn bins(&self) -> usize {
        self.reference.len()
    }

    /// Whether the column is categorical.
    pub fn is_categorical(&self) -> bool {
        self.categories.is_some()
    }
}

/// Where a raw column's values sit in a network row.
#[derive(Debug, Clone, PartialEq)]
struct ColumnLayout {
    start: usize,
    width: usize,
    indicator: Option<usize>,
}

/// The training inputs' sketches and the test split's mean predicted standard deviations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftReference {
    /// Training rows sketched.
    pub rows: usize,
    /// One sketch per raw input column, in input order.
    pub columns: Vec<ColumnSketch>,
    /// Per target, the mean predicted standard deviation on the test split (original units):
    /// the label-free reference of the live mean predicted std.
    #[serde(default)]
    pub prediction_std: Vec<f64>,
    #[serde(skip)]
    layout: Vec<ColumnLayout>,
}

/// One value's bin and whether it was outside the training range (or an unknown category).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binned {
    /// The bin.
    pub bin: usize,
    /// Outside the training range / unknown category.
    pub out_of_range: bool,
}

fn layout_of(pre: &Preprocessing) -> Vec<ColumnLayout> {
    let mut start = 0;
    let mut next_indicator = pre.inputs.iter().map(|c| c.width()).sum::<usize>();
    pre.inputs
        .iter()
        .map(|c| {
            let l = ColumnLayout {
                start,
                width: c.width(),
                indicator: c.indicator.then(|| {
                    next_indicator += 1;
                    next_indicator - 1
                }),
            };
            start += c.width();
            l
        })
        .collect()
}

impl DriftReference {
    /// Sketch the training rows `x` (`rows × pre.n_features()`, network inputs before
    /// normalisation) of a model with preprocessing `pre`; `prediction_std` per target.
    pub fn fit(pre: &Preprocessing, x: &[f32], prediction_std: Vec<f64>) -> Self {
        let nf = pre.n_features().max(1);
        let rows = x.len() / nf;
        let layout = layout_of(pre);
        let mut columns = Vec::with_capacity(pre.inputs.len());
        for (c, l) in pre.inputs.iter().zip(&layout) {
            let sketch = match &c.categories {
                Some(cats) => ColumnSketch {
                    name: c.name.clone(),
                    edges: Vec::new(),
                    categories: Some(cats.clone()),
                    min: 0.0,
                    max: 0.0,
                    reference: vec![0.0; cats.len() + 1],
                },
                None => {
                    let mut v: Vec<f64> = (0..rows)
                        .filter(|&r| l.indicator.is_none_or(|i| x[r * nf + i] < 0.5))
                        .map(|r| x[r * nf + l.start] as f64)
                        .collect();
                    v.sort_by(f64::total_cmp);
                    let mut edges: Vec<f64> = Vec::new();
                    if !v.is_empty() {
                        for k in 1..NUMERIC_BINS {
                            let q = v[(k * v.len() / NUMERIC_BINS).min(v.len() - 1)];
                            // A cut at the minimum would leave its bin empty.
                            if q > v[0] && edges.last().is_none_or(|&e| q > e) {
                                edges.push(q);
                            }
                        }
                    }
                    ColumnSketch {
                        name: c.name.clone(),
                        reference: vec![0.0; edges.len() + 2],
                        edges,
                        categories: None,
                        min: v.first().copied().unwrap_or(0.0),
                        max: v.last().copied().unwrap_or(0.0),
                    }
                }
            };
            columns.push(sketch);
        }
        let mut me = Self {
            rows,
            columns,
            prediction_std,
            layout,
        };
        let mut counts: Vec<Vec<u64>> = me.columns.iter().map(|c| vec![0; c.bins()]).collect();
        for row in x.chunks_exact(nf) {
            for (j, c) in counts.iter_mut().enumerate() {
                c[me.bin(j, row).bin] += 1;
            }
        }
        for (s, c) in me.columns.iter_mut().zip(counts) {
            let n = rows.max(1) as f64;
            s.reference = c.iter().map(|&k| k as f64 / n).collect();
        }
        me
    }

    /// Attach the network layout after deserialising (the sketches name the columns; the
    /// layout comes from the checkpoint's preprocessing). Fails when they disagree.
    pub fn bind(mut self, pre: &Preprocessing) -> Result<Self, String> {
        if self.columns.len() != pre.inputs.len() {
            return Err(format!(
                "the drift reference has {} columns, the preprocessing {}",
                self.columns.len(),
                pre.inputs.len()
            ));
        }
        for (s, c) in self.columns.iter().zip(&pre.inputs) {
            let want = c
                .categories
                .as_ref()
                .map_or(s.edges.len() + 2, |k| k.len() + 1);
            if s.name != c.name || s.bins() != want || s.categories != c.categories {
                return Err(format!(
                    "the drift reference of column `{}` does not match input `{}`",
                    s.name, c.name
                ));
            }
        }
        self.layout = layout_of(pre);
        Ok(self)
    }

    /// The bin of column `j` in a network row (`row.len() == n_features`).
    #[inline]
    pub fn bin(&self, j: usize, row: &[f32]) -> Binned {
        let s = &self.columns[j];
        let l = &self.layout[j];
        let missing = l.indicator.is_some_and(|i| row[i] > 0.5);
        let last = s.bins() - 1;
        if s.categories.is_some() {
            if missing {
                return Binned {
                    bin: last,
                    out_of_range: false,
                };
            }
            let hot = row[l.start..l.start + l.width]
                .iter()
                .position(|&v| v > 0.5);
            match hot {
                Some(b) => Binned {
                    bin: b,
                    out_of_range: false,
                },
                None => Binned {
                    bin: last,
                    out_of_range: true,
                },
            }
        } else if missing {
            Binned {
                bin: last,
                out_of_range: false,
            }
        } else {
            let v = row[l.start] as f64;
            Binned {
                bin: s.edges.partition_point(|&e| e <= v),
                out_of_range: v < s.min || v > s.max,
            }
        }
    }
}

/// Most edges a numeric column may have for [`FastBins`] to bin it itself.
const FAST_EDGES: usize = 16;

/// A numeric column as the serving hot path bins it: f32 edges padded to a fixed width, so
/// that a value's bin is a branch-free count the compiler vectorises.
#[derive(Debug, Clone)]
struct FastNumeric {
    at: usize,
    indicator: Option<usize>,
    /// Each edge rounded up to the nearest f32 (NaN past the last): for an f32 `v`,
    /// `edge <= v` in f32 exactly when it holds in f64.
    edges: [f32; FAST_EDGES],
    /// The training minimum rounded up and maximum rounded down to f32, for the same reason.
    lo: f32,
    hi: f32,
    last: usize,
}

/// [`DriftReference::bin`] for the hot path: numeric columns of up to 16 edges are binned
/// from a compact f32 copy (bit-for-bit the same answer); other columns go to the reference.
#[derive(Debug, Clone)]
pub struct FastBins {
    reference: DriftReference,
    numeric: Vec<Option<FastNumeric>>,
}

/// The smallest f32 that is at least `x` (`x` finite).
fn f32_up(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x { f.next_up() } else { f }
}

/// The largest f32 that is at most `x` (`x` finite).
fn f32_down(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) > x { f.next_down() } else { f }
}

impl FastBins {
    /// The compact form of a bound reference ([`DriftReference::bind`]).
    pub fn new(reference: DriftReference) -> Self {
        let numeric = reference
            .columns
            .iter()
            .zip(&reference.layout)
            .map(|(c, l)| {
                let finite =
                    c.edges.iter().all(|e| e.is_finite()) && c.min.is_finite() && c.max.is_finite();
                (c.categories.is_none() && c.edges.len() <= FAST_EDGES && finite).then(|| {
                    let mut edges = [f32::NAN; FAST_EDGES];
                    for (d, &e) in edges.iter_mut().zip(&c.edges) {
                        *d = f32_up(e);
                    }
                    FastNumeric {
                        at: l.start,
                        indicator: l.indicator,
                        edges,
                        lo: f32_up(c.min),
                        hi: f32_down(c.max),
                        last: c.bins() - 1,
                    }
                })
            })
            .collect();
        Self { reference, numeric }
    }

    /// The reference.
    pub fn reference(&self) -> &DriftReference {
        &self.reference
    }

    /// Count the bins of every value of `x` (`rows × n_features` network rows) into
    /// `counts` (column `j`'s bins from `offsets[j]`) and the values out of the training
    /// range into `out_of_range[j]`: what [`FastBins::bin`] would count value by value,
    /// column by column so that each column's edges stay in registers.
    pub fn count(
        &self,
        x: &[f32],
        n_features: usize,
        offsets: &[usize],
        counts: &mut [u32],
        out_of_range: &mut [u32],
    ) {
        for (j, numeric) in self.numeric.iter().enumerate() {
            let rows = x.chunks_exact(n_features);
            match numeric {
                Some(n) => {
                    let c = &mut counts[offsets[j]..=offsets[j] + n.last];
                    let mut oor = 0u32;
                    for row in rows {
                        if n.indicator.is_some_and(|i| row[i] > 0.5) {
                            c[n.last] += 1;
                            continue;
                        }
                        let v = row[n.at];
                        let below: u32 = n.edges.iter().map(|&e| u32::from(e <= v)).sum();
                        c[below as usize] += 1;
                        oor += u32::from(v < n.lo || v > n.hi);
                    }
                    out_of_range[j] += oor;
                }
                None => {
                    for row in rows {
                        let b = self.reference.bin(j, row);
                        counts[offsets[j] + b.bin] += 1;
                        out_of_range[j] += u32::from(b.out_of_range);
                    }
                }
            }
        }
    }

    /// Column `j`'s bin of a network row: [`DriftReference::bin`]'s answer.
    #[inline]
    pub fn bin(&self, j: usize, row: &[f32]) -> Binned {
        match &self.numeric[j] {
            Some(n) => {
                if n.indicator.is_some_and(|i| row[i] > 0.5) {
                    return Binned {
                        bin: n.last,
                        out_of_range: false,
                    };
                }
                let v = row[n.at];
                // Sixteen compares summed in u32 lanes: four SSE2 compares and adds (the
                // padding's NaN compares false).
                let below: u32 = n.edges.iter().map(|&e| u32::from(e <= v)).sum();
                Binned {
                    bin: below as usize,
                    out_of_range: v < n.lo || v > n.hi,
                }
            }
            None => self.reference.bin(j, row),
        }
    }
}

/// The PSI of live `counts` (one per bin) against `reference` fractions (0 with no counts).
pub fn psi(counts: &[u64], reference: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return 0.0;
    }
    counts
        .iter()
        .zip(reference)
        .map(|(&c, &e)| {
            let a = (c as f64 / n as f64).max(PSI_FLOOR);
            let e = e.max(PSI_FLOOR);
            (a - e) * (a / e).ln()
        })
        .sum()
}

/// The binned KS statistic of live `counts` against `reference` fractions (0 with no counts).
pub fn ks(counts: &[u64], reference: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return 0.0;
    }
    let (mut a, mut e, mut gap) = (0.0f64, 0.0f64, 0.0f64);
    for (&c, &r) in counts.iter().zip(reference) {
        a += c as f64 / n as f64;
        e += r;
        gap = gap.max((a - e).abs());
    }
    gap
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preprocess::{InputColumn, Preprocessing};

    fn pre() -> Preprocessing {
        let mut age = InputColumn::numeric("age");
        age.impute = Some(30.0);
        age.indicator = true;
        let mut store = InputColumn::numeric("store");
        store.categories = Some(vec!["a".into(), "b".into()]);
        store.missing_to_unknown = true;
        Preprocessing {
            inputs: vec![age, store, InputColumn::numeric("flag")],
            ..Preprocessing::default()
        }
    }

    /// Network rows: age, store=a, store=b, flag, age_missing.
    fn rows() -> Vec<f32> {
        let mut x = Vec::new();
        for i in 0..100 {
            let missing = i % 10 == 0;
            let age = if missing { 30.0 } else { i as f32 };
            let (a, b) = match i % 4 {
                0 | 1 => (1.0, 0.0),
                2 => (0.0, 1.0),
                _ => (0.0, 0.0),
            };
            x.extend([age, a, b, (i % 2) as f32, f32::from(missing)]);
        }
        x
    }

    #[test]
    fn the_fast_bins_answer_like_the_reference_to_the_last_value() {
        let p = pre();
        let r = DriftReference::fit(&p, &rows(), vec![1.5])
            .bind(&p)
            .unwrap();
        // Edges that f32 cannot hold exactly, and values on and next to them.
        let mut odd = r.clone();
        odd.columns[0].edges = vec![0.1, 1.0 / 3.0, 2.5, 1e-7, 7.0000001];
        odd.columns[0].edges.sort_by(f64::total_cmp);
        odd.columns[0].reference = vec![1.0 / 7.0; 7];
        odd.columns[0].min = 0.1;
        odd.columns[0].max = 7.0000001;
        for reference in [r, odd] {
            let fast = FastBins::new(reference.clone());
            let mut values: Vec<f32> = (-40..140).map(|i| i as f32 * 0.37).collect();
            for &e in &reference.columns[0].edges {
                let f = e as f32;
                values.extend([f, f.next_up(), f.next_down()]);
            }
            values.extend([f32::MIN, f32::MAX, 0.0, -0.0]);
            for v in values {
                for missing in [0.0, 1.0] {
                    for store in [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]] {
                        let row = [v, store[0], store[1], v.rem_euclid(2.0).floor(), missing];
                        for j in 0..3 {
                            assert_eq!(fast.bin(j, &row), reference.bin(j, &row), "{j} {row:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_reference_bins_the_training_rows_like_live_rows() {
        let r = DriftReference::fit(&pre(), &rows(), vec![1.5]);
        assert_eq!(r.rows, 100);
        let age = &r.columns[0];
        assert_eq!(age.edges.len(), 9, "{:?}", age.edges);
        assert_eq!((age.min, age.max), (1.0, 99.0));
        assert!((age.reference.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(*age.reference.last().unwrap(), 0.10, "the missing bin");
        let store = &r.columns[1];
        assert_eq!(store.reference, vec![0.5, 0.25, 0.25]);
        let flag = &r.columns[2];
        assert_eq!(flag.edges, vec![1.0], "a 0/1 column has two value bins");
        assert_eq!(flag.reference, vec![0.5, 0.5, 0.0]);
        // Binning the same rows again gives the reference exactly: PSI and KS are 0.
        let x = rows();
        for (j, s) in r.columns.iter().enumerate() {
            let mut c = vec![0u64; s.bins()];
            for row in x.chunks_exact(5) {
                c[r.bin(j, row).bin] += 1;
            }
            assert!(psi(&c, &s.reference).abs() < 1e-12);
            assert!(ks(&c, &s.reference).abs() < 1e-12);
        }
        // Out of range: above the training maximum, an unknown category.
        let row = [150.0, 0.0, 0.0, 1.0, 0.0];
        assert!(r.bin(0, &row).out_of_range);
        assert_eq!(r.bin(0, &row).bin, age.edges.len());
        assert!(r.bin(1, &row).out_of_range);
        let missing = [30.0, 0.0, 0.0, 1.0, 1.0];
        assert_eq!(r.bin(0, &missing).bin, age.bins() - 1);
        assert!(!r.bin(0, &missing).out_of_range);
    }

    #[test]
    fn the_reference_survives_serde_and_binds_to_its_preprocessing_only() {
        let r = DriftReference::fit(&pre(), &rows(), vec![1.5]);
        let text = serde_json::to_string(&r).unwrap();
        let back: DriftReference = serde_json::from_str(&text).unwrap();
        let back = back.bind(&pre()).unwrap();
        let row = [150.0, 0.0, 1.0, 1.0, 0.0];
        for j in 0..3 {
            assert_eq!(back.bin(j, &row), r.bin(j, &row));
        }
        let other = Preprocessing::plain(&["x".into()]);
        let again: DriftReference = serde_json::from_str(&text).unwrap();
        assert!(again.bind(&other).is_err());
    }

    #[test]
    fn psi_and_ks_grow_with_a_shift() {
        let reference = vec![0.25, 0.25, 0.25, 0.25, 0.0];
        assert_eq!(psi(&[25, 25, 25, 25, 0], &reference), 0.0);
        assert_eq!(psi(&[], &[]), 0.0);
        let small = psi(&[20, 25, 25, 30, 0], &reference);
        let large = psi(&[0, 10, 30, 60, 0], &reference);
        assert!(small > 0.0 && small < 0.1, "{small}");
        assert!(large > 0.5, "{large}");
        assert!((ks(&[0, 10, 30, 60, 0], &reference) - 0.4).abs() < 1e-12);
    }
}
