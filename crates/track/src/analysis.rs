//! Cross-run analysis: latency regressions among runs of similar size, the accuracy–size
//! Pareto front, right-sizing, and config differences.
//!
//! **Regression rule.** A run is flagged when its latency is at least
//! [`RegressionRule::ratio`] (1.5×) the median latency of its *size peers* — the other runs
//! whose parameter count is within [`RegressionRule::size_tolerance`] (±5 %) of its own — and it
//! has at least [`RegressionRule::min_peers`] (2) peers. Comparing against peers of nearly the
//! same size, not against a fit over all sizes, is what the article's case needed: its slow
//! band (≈2,000 µs) sat among fast runs (≈600 µs) of the same ≈3,800-parameter size, where a
//! latency-vs-size trend is flat and any global fit would absorb the band. The median keeps a
//! minority band from dragging the reference up.
//!
//! A ratio alone is not enough for small models: at batch 1 kiln's engines answer in
//! 0.1–0.2 µs, where a run whose benchmark shared the CPU with a neighbour measures 0.16 µs
//! against its peers' 0.10 µs — 1.6×, and pure noise. So the run must also be slower than the
//! median by at least [`RegressionRule::min_delta_us`] (0.25 µs, about four times that noise);
//! a real fall off a fast path (0.1 → 1 µs, or the unfused engine's tens of µs) still clears it.

use serde::{Deserialize, Serialize};

/// One run as the analysis sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPoint {
    /// Run id.
    pub id: String,
    /// Parameter count.
    pub params: f64,
    /// Latency (µs, median at the chosen batch size).
    pub latency_us: f64,
}

/// The thresholds of the detector.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RegressionRule {
    /// Flag when latency ≥ ratio × the peers' median.
    pub ratio: f64,
    /// Peers are runs within this relative distance in parameter count.
    pub size_tolerance: f64,
    /// Fewest peers needed to judge a run.
    pub min_peers: usize,
    /// Flag only when latency − the peers' median is at least this (µs): the noise floor of
    /// sub-µs medians.
    #[serde(default = "default_min_delta_us")]
    pub min_delta_us: f64,
}

fn default_min_delta_us() -> f64 {
    0.25
}

impl Default for RegressionRule {
    fn default() -> Self {
        Self {
            ratio: 1.5,
            size_tolerance: 0.05,
            min_peers: 2,
            min_delta_us: default_min_delta_us(),
        }
    }
}

/// A flagged run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flagged {
    /// The slow run.
    pub id: String,
    /// Its latency, µs.
    pub latency_us: f64,
    /// Its parameter count.
    pub params: f64,
    /// The median latency of its size peers, µs.
    pub peer_median_us: f64,
    /// latency / peer median.
    pub ratio: f64,
    /// Number of size peers.
    pub peers: usize,
    /// The closest-sized unflagged peer (the comparison to explain).
    pub nearest_normal_peer: Option<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Apply the rule to a set of runs.
pub fn detect(points: &[RunPoint], rule: &RegressionRule) -> Vec<Flagged> {
    let peers_of = |i: usize| -> Vec<usize> {
        let p = points[i].params;
        (0..points.len())
            .filter(|&j| j != i && (points[j].params - p).abs() <= rule.size_tolerance * p.abs())
            .collect()
    };
    let mut flagged: Vec<(usize, f64, usize)> = Vec::new();
    for i in 0..points.len() {
        if !points[i].latency_us.is_finite() {
            continue;
        }
        let peers = peers_of(i);
        if peers.len() < rule.min_peers {
            continue;
        }
        let m = median(peers.iter().map(|&j| points[j].latency_us).collect());
        let l = points[i].latency_us;
        if m > 0.0 && l >= rule.ratio * m && l - m >= rule.min_delta_us {
            flagged.push((i, m, peers.len()));
        }
    }
    let is_flagged = |j: usize| flagged.iter().any(|f| f.0 == j);
    flagged
        .iter()
        .map(|&(i, m, n)| {
            let p = &points[i];
            let nearest = peers_of(i)
                .into_iter()
                .filter(|&j| !is_flagged(j))
                .min_by(|&a, &b| {
                    let da = (points[a].params - p.params).abs();
                    let db = (points[b].params - p.params).abs();
                    da.total_cmp(&db).then(
                        (points[a].latency_us - m)
                            .abs()
                            .total_cmp(&(points[b].latency_us - m).abs()),
                    )
                })
                .map(|j| points[j].id.clone());
            Flagged {
                id: p.id.clone(),
                latency_us: p.latency_us,
                params: p.params,
                peer_median_us: m,
                ratio: p.latency_us / m,
                peers: n,
                nearest_normal_peer: nearest,
            }
        })
        .collect()
}

/// Indices of the Pareto-optimal runs minimising both `x` (size) and `y` (metric), sorted by x.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..points.len())
        .filter(|&i| points[i].0.is_finite() && points[i].1.is_finite())
        .collect();
    idx.sort_by(|&a, &b| {
        points[a]
            .0
            .total_cmp(&points[b].0)
            .then(points[a].1.total_cmp(&points[b].1))
    });
    let mut front = Vec::new();
    let mut best = f64::INFINITY;
    for i in idx {
        if points[i].1 < best {
            best = points[i].1;
            front.push(i);
        }
    }
    front
}

/// The right-sizing answer: the smallest run whose metric is within `tolerance` (relative) of
/// the best metric. Returns `(index of best, index of chosen)`.
pub fn right_size(points: &[(f64, f64)], tolerance: f64) -> Option<(usize, usize)> {
    let best = (0..points.len())
        .filter(|&i| points[i].1.is_finite())
        .min_by(|&a, &b| points[a].1.total_cmp(&points[b].1))?;
    let limit = points[best].1 + tolerance * points[best].1.abs();
    let chosen = (0..points.len())
        .filter(|&i| points[i].1.is_finite() && points[i].1 <= limit)
        .min_by(|&a, &b| {
            points[a]
                .0
                .total_cmp(&points[b].0)
                .then(points[a].1.total_cmp(&points[b].1))
        })?;
    Some((best, chosen))
}

/// Flatten a config into `(key, value)` pairs with keys in `--set` syntax
/// (`stages[0].epochs`), so a difference can be pasted back as an override.
pub fn flatten_set_keys(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_set_keys(&key, x, out);
            }
        }
        serde_json::Value::Array(a) if a.iter().any(|x| x.is_object() || x.is_array()) => {
            for (i, x) in a.iter().enumerate() {
                flatten_set_keys(&format!("{prefix}[{i}]"), x, out);
            }
        }
        serde_json::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// Keys whose values differ between two configs, as `(key, a, b)` (keys in `--set` syntax).
pub fn config_diff(a: &serde_json::Value, b: &serde_json::Value) -> Vec<(String, String, String)> {
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    flatten_set_keys("", a, &mut fa);
    flatten_set_keys("", b, &mut fb);
    let ma: std::collections::BTreeMap<String, String> = fa.into_iter().collect();
    let mb: std::collections::BTreeMap<String, String> = fb.into_iter().collect();
    let mut keys: Vec<&String> = ma.keys().chain(mb.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (ma.get(k), mb.get(k));
            (x != y).then(|| {
                (
                    k.clone(),
                    x.cloned().unwrap_or_else(|| "—".into()),
                    y.cloned().unwrap_or_else(|| "—".into()),
                )
            })
        })
        .collect()
}

/// Points grouped by identical coordinates (bit for bit), in order of first appearance:
/// each group's point and the indices of the points at it. A chart draws each group once and
/// says how many runs it holds, so identical runs do not hide behind one another.
pub fn group_identical(points: &[(f64, f64)]) -> Vec<((f64, f64), Vec<usize>)> {
    let mut groups: Vec<((f64, f64), Vec<usize>)> = Vec::new();
    let mut at: std::collections::HashMap<(u64, u64), usize> = std::collections::HashMap::new();
    for (i, &(x, y)) in points.iter().enumerate() {
        let key = (x.to_bits(), y.to_bits());
        match at.get(&key) {
            Some(&g) => groups[g].1.push(i),
            None => {
                at.insert(key, groups.len());
                groups.push(((x, y), vec![i]));
            }
        }
    }
    groups
}

/// Whether values spread over more than a factor of 10 (all positive): worth a log axis.
pub fn spans_a_decade(values: &[f64]) -> bool {
    let pos = values.iter().copied().filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = pos.fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
    lo.is_finite() && hi / lo > 10.0
}

/// A config flattened into `key → value` (keys in `--set` syntax, see [`flatten_set_keys`]).
pub fn config_values(v: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    let mut flat = Vec::new();
    flatten_set_keys("", v, &mut flat);
    flat.into_iter().collect()
}

/// The keys whose values are not the same in every one of `configs` (a key missing from
/// some counts as differing), sorted.
pub fn varying_keys(configs: &[std::collections::BTreeMap<String, String>]) -> Vec<String> {
    let mut keys: Vec<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| {
            let first = configs.first().and_then(|c| c.get(*k));
            configs.iter().any(|c| c.get(*k) != first)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// 34 runs near 3,800 parameters: a fast band around 600 µs, and one configuration
    /// (3,858 parameters) about 3.4× slower, as in the article's figure.
    fn article_runs(with_band: bool) -> Vec<RunPoint> {
        let mut r = SplitMix64::new(5);
        (0..34)
            .map(|i| {
                let slow = with_band && i % 7 == 3;
                let params = if slow {
                    3858.0
                } else {
                    3750.0 + r.uniform(0.0, 120.0)
                };
                let base = 600.0 * (1.0 + r.uniform(-0.08, 0.08));
                RunPoint {
                    id: format!("run-{i:02}"),
                    params,
                    latency_us: if slow { base * 3.4 } else { base },
                }
            })
            .collect()
    }

    #[test]
    fn planted_band_is_flagged_with_a_normal_peer() {
        let runs = article_runs(true);
        let flagged = detect(&runs, &RegressionRule::default());
        let expected: Vec<String> = (0..34)
            .filter(|i| i % 7 == 3)
            .map(|i| format!("run-{i:02}"))
            .collect();
        let got: Vec<String> = flagged.iter().map(|f| f.id.clone()).collect();
        assert_eq!(got, expected);
        for f in &flagged {
            assert!(f.ratio > 3.0 && f.ratio < 4.0, "{f:?}");
            let peer = f.nearest_normal_peer.as_ref().unwrap();
            assert!(!expected.contains(peer), "the peer is a normal run");
            let p = runs.iter().find(|r| &r.id == peer).unwrap();
            assert!((p.params - f.params).abs() <= 0.05 * f.params);
        }
    }

    #[test]
    fn sub_microsecond_noise_is_not_a_regression_but_a_real_fall_is() {
        // The case a CI run met: four fused runs at ~0.1 µs (batch 1), one measured 0.16 µs
        // while a neighbour shared the CPU; and the same set with one run 10× slower.
        let runs = |slow: f64| -> Vec<RunPoint> {
            [0.10, 0.11, 0.10, 0.09, slow]
                .iter()
                .enumerate()
                .map(|(i, &l)| RunPoint {
                    id: format!("r{i}"),
                    params: 3654.0,
                    latency_us: l,
                })
                .collect()
        };
        let rule = RegressionRule::default();
        assert!(detect(&runs(0.16), &rule).is_empty());
        let f = detect(&runs(1.0), &rule);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "r4");
        // The floor is a setting: at 0 the ratio alone decides, as before.
        let bare = RegressionRule {
            min_delta_us: 0.0,
            ..rule
        };
        assert_eq!(detect(&runs(0.16), &bare).len(), 1);
        // Rules saved before the floor existed read with the default floor.
        let old: RegressionRule =
            serde_json::from_str(r#"{"ratio":1.5,"size_tolerance":0.05,"min_peers":2}"#).unwrap();
        assert_eq!(old, rule);
    }

    #[test]
    fn a_clean_set_flags_nothing_and_size_alone_is_not_a_regression() {
        assert!(detect(&article_runs(false), &RegressionRule::default()).is_empty());
        // Latency growing with size across distinct sizes: no peers within 5 %, nothing flagged.
        let growing: Vec<RunPoint> = (0..10)
            .map(|i| RunPoint {
                id: i.to_string(),
                params: 1000.0 * 1.5f64.powi(i),
                latency_us: 100.0 * 1.5f64.powi(i),
            })
            .collect();
        assert!(detect(&growing, &RegressionRule::default()).is_empty());
    }

    #[test]
    fn pareto_and_right_sizing() {
        let pts = vec![
            (100.0, 0.50),
            (200.0, 0.41),
            (300.0, 0.40),
            (250.0, 0.45),
            (400.0, 0.405),
        ];
        assert_eq!(pareto_front(&pts), vec![0, 1, 2]);
        assert_eq!(right_size(&pts, 0.05), Some((2, 1)));
        assert_eq!(right_size(&pts, 0.0), Some((2, 2)));
        assert_eq!(right_size(&[], 0.1), None);
    }

    #[test]
    fn config_diff_lists_changed_keys() {
        let a = serde_json::json!({"model": {"hidden": [48, 48], "activation": "relu"}, "seed": 1});
        let b = serde_json::json!({"model": {"hidden": [48, 48], "activation": "gelu"}, "seed": 1});
        assert_eq!(
            config_diff(&a, &b),
            vec![(
                "model.activation".to_string(),
                "relu".to_string(),
                "gelu".to_string()
            )]
        );
    }

    #[test]
    fn varying_keys_are_those_not_shared_by_every_run() {
        let a =
            config_values(&serde_json::json!({"seed": 1, "model": {"hidden": [16]}, "name": "t"}));
        let b =
            config_values(&serde_json::json!({"seed": 2, "model": {"hidden": [16]}, "name": "t"}));
        let c = config_values(
            &serde_json::json!({"seed": 1, "model": {"hidden": [32]}, "name": "t", "extra": true}),
        );
        assert_eq!(varying_keys(&[a.clone(), b.clone()]), vec!["seed"]);
        assert_eq!(
            varying_keys(&[a.clone(), b, c]),
            vec!["extra", "model.hidden", "seed"]
        );
        assert!(varying_keys(&[a.clone(), a]).is_empty());
        assert!(varying_keys(&[]).is_empty());
    }

    #[test]
    fn identical_points_are_grouped_and_a_wide_spread_wants_a_log_axis() {
        let g = group_identical(&[(1.0, 2.0), (3.0, 4.0), (1.0, 2.0), (1.0, 2.0)]);
        assert_eq!(g, vec![((1.0, 2.0), vec![0, 2, 3]), ((3.0, 4.0), vec![1])]);
        assert!(group_identical(&[]).is_empty());
        assert!(spans_a_decade(&[500.0, 650.0, 7000.0]));
        assert!(!spans_a_decade(&[500.0, 650.0, 4999.0]));
        assert!(!spans_a_decade(&[]));
        assert!(
            !spans_a_decade(&[0.0, 5.0]),
            "non-positive values are ignored"
        );
    }
}
