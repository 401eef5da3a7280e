//! `auto` and `auto-int8`: the engine chosen for this checkpoint on this machine.
//!
//! * **`auto`** (the default everywhere) chooses only among *exact* engines, those that
//!   compute the f32 model: today that is `fused` on the best instruction set of this CPU
//!   (whose kernels give a row the same bits whatever the batch size or the row's position
//!   in it, see [`super::fused`]). So a row's answer never depends on what it was batched
//!   with, and it equals `--engine fused` bit for bit. Nothing is timed.
//! * **`auto-int8`** (explicit only) may also pick the quantised `int8` engine per
//!   batch-size bucket: [`AutoEngine::with_int8`] builds every compiled CPU engine (`fused`,
//!   `int8`), drops those whose accuracy bound does not hold for this checkpoint, times the
//!   rest on each warm-up batch size and then answers every call with the engine that was
//!   fastest for that call's bucket (the smallest warmed batch size ≥ the call's rows, else
//!   the largest). Its outputs are those of the chosen engine, bit for bit — so a row's
//!   answer may depend on the size of the batch it came in. Its summary line carries int8's
//!   measured max |Δ| vs `fused` on the probe rows.
//!
//! For `auto-int8`:
//!
//! * **Candidates.** `fused` always; `int8` when its outputs on [`PROBE_ROWS`] seeded
//!   N(0, 1.5²) rows (normalised units) plus the all-zeros row (the training means) are within
//!   `int8::INT8_ABS_TOL + int8::INT8_REL_TOL × |fused|` of `fused`'s. The Burn engines are
//!   not candidates: they allocate per call and are an order of magnitude slower on these
//!   networks (`kiln bench infer`), so timing them would only lengthen the load.
//! * **Timing.** Per bucket, [`REPS`] repetitions; in each, every candidate runs about
//!   [`ROWS_PER_REP`] rows (⌈ROWS_PER_REP / batch⌉ calls, timed together) in a rotating
//!   order, so that load changes during the selection affect every candidate alike. The
//!   median time per call decides; `fused` (the exact engine) is kept unless another is at
//!   least [`MARGIN`] faster, so that a near tie does not flip from one load to the next.
//! * **Bounded.** The whole selection stops measuring after [`SELECTION_BUDGET`]; buckets
//!   not reached by then take the choice of the largest measured bucket below them (they are
//!   marked `measured: false`). On the reference network it takes a few tens of
//!   milliseconds for the 11 buckets of a server with `--max-batch-size 1024`
//!   ([`AutoChoice::selection_ms`] says how long it took).
//! * **Shared.** A selection is kept for the process, keyed by the weights, the thread count
//!   and the buckets: the instances of one served model measure once and agree, and
//!   [`last_choice`] lets the serving tier report it (model metadata, `/metrics`).
//!
//! A deterministic engine is always available by name (`--engine fused`, `int8`, …).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::int8::{INT8_ABS_TOL, INT8_REL_TOL};
use super::{Engine, FusedEngine, HeadOutput, InferError, Int8Engine, check_shape};
use crate::artifact::HostWeights;
use crate::model::RegressionNetConfig;
use crate::records::EngineKind;
use crate::rng::SplitMix64;

/// The exact automatic choice's name (the default engine).
pub const AUTO: &str = EngineKind::Auto.name();

/// The name of the automatic choice that may pick int8.
pub const AUTO_INT8: &str = EngineKind::AutoInt8.name();

/// Why `auto` leaves int8 out (listed in its choice's `rejected`).
pub const NOT_EXACT: &str =
    "not exact (auto chooses only engines that compute the f32 model; use auto-int8 or int8)";

/// Buckets selected at build, before any `warm_up` names the real ones.
pub const DEFAULT_BUCKETS: [usize; 3] = [1, 32, 1024];

/// Repetitions per bucket and candidate (the median of them decides).
pub const REPS: usize = 7;

/// Rows one candidate runs per repetition (in ⌈ROWS_PER_REP / batch⌉ calls).
pub const ROWS_PER_REP: usize = 2048;

/// A candidate replaces the exact `fused` engine only when its median is at least this
/// fraction faster.
pub const MARGIN: f64 = 0.05;

/// Time after which the selection stops measuring (remaining buckets inherit).
pub const SELECTION_BUDGET: Duration = Duration::from_millis(300);

/// Rows of the int8 accuracy probe (plus the all-zeros row).
pub const PROBE_ROWS: usize = 255;

/// One bucket's choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketChoice {
    /// The bucket (rows per call it was timed at).
    pub batch: usize,
    /// The chosen engine.
    pub engine: EngineKind,
    /// Whether it was timed (false: a single candidate, or the selection budget ran out and
    /// the choice was inherited from the bucket below).
    pub measured: bool,
    /// Median µs per call of each candidate, in candidate order (empty when not measured).
    pub median_us: Vec<f64>,
}

/// What `auto` chose, and from what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoChoice {
    /// Candidates that were timed, in order (`fused` first).
    pub candidates: Vec<EngineKind>,
    /// Engines left out, with why (accuracy bound not met, unavailable).
    pub rejected: Vec<(EngineKind, String)>,
    /// Threads per call of every candidate.
    pub threads: usize,
    /// One entry per bucket, ascending.
    pub buckets: Vec<BucketChoice>,
    /// Wall time of the selection in ms (0 when reused from an earlier selection).
    pub selection_ms: f64,
    /// The automatic choice's name (`auto` or `auto-int8`).
    pub mode: EngineKind,
    /// For `auto-int8` with int8 a candidate: int8's largest |Δ| vs `fused` on the probe
    /// rows (normalised units, both heads).
    pub int8_max_abs_delta: Option<f32>,
}

impl AutoChoice {
    /// The engine for a call of `rows` rows: that of the smallest bucket ≥ `rows`, else
    /// of the largest.
    pub fn engine_for(&self, rows: usize) -> EngineKind {
        self.buckets[bucket_index(&self.buckets, rows)].engine
    }

    /// One line for the log: `batch→engine` per bucket, with the selection time.
    pub fn summary(&self) -> String {
        let picks: Vec<String> = self
            .buckets
            .iter()
            .map(|b| {
                format!(
                    "{}→{}{}",
                    b.batch,
                    b.engine,
                    if b.measured { "" } else { "*" }
                )
            })
            .collect();
        let mut s = format!(
            "{} engine: {} ({} thread(s), chosen in {:.1} ms among {})",
            self.mode,
            picks.join(" "),
            self.threads,
            self.selection_ms,
            self.candidates
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (e, why) in &self.rejected {
            s.push_str(&format!("; {e} left out: {why}"));
        }
        if let Some(d) = self.int8_max_abs_delta {
            s.push_str(&format!(
                "; int8 is quantised: max |Δ| vs fused {d:.3e} (normalised units, {} probe rows)",
                PROBE_ROWS + 1
            ));
        }
        s
    }

    /// Prometheus sample lines (no `# HELP`/`# TYPE`, see [`PROMETHEUS_HEADER`]): one
    /// `kiln_auto_engine_choice{model,bucket,engine} 1` per bucket.
    pub fn prometheus_lines(&self, model: &str) -> String {
        let model = model.replace('\\', "\\\\").replace('"', "\\\"");
        self.buckets
            .iter()
            .map(|b| {
                format!(
                    "kiln_auto_engine_choice{{model=\"{model}\",bucket=\"{}\",engine=\"{}\"}} 1\n",
                    b.batch, b.engine
                )
            })
            .collect()
    }
}

/// `# HELP` and `# TYPE` of the `kiln_auto_engine_choice` series.
pub const PROMETHEUS_HEADER: &str = "# HELP kiln_auto_engine_choice The engine the auto engine \
chose per batch-size bucket (1 for the chosen one).\n# TYPE kiln_auto_engine_choice gauge\n";

fn bucket_index(buckets: &[BucketChoice], rows: usize) -> usize {
    buckets
        .iter()
        .position(|b| b.batch >= rows)
        .unwrap_or(buckets.len() - 1)
}

/// An engine that dispatches each call to the fastest candidate for its batch size.
pub struct AutoEngine {
    int8: bool,
    arch: RegressionNetConfig,
    threads: usize,
    fingerprint: u64,
    engines: Vec<Box<dyn Engine>>,
    /// Index into `engines` per bucket of `choice`.
    pick: Vec<usize>,
    choice: AutoChoice,
}

/// (weights, threads, buckets, int8 allowed).
type Key = (u64, usize, Vec<usize>, bool);

static SELECTIONS: Mutex<Vec<(Key, AutoChoice)>> = Mutex::new(Vec::new());

/// The most recent selection made in this process for these weights (any thread count or
/// buckets), if any.
pub fn last_choice(weights: &HostWeights) -> Option<AutoChoice> {
    let f = fingerprint(weights);
    let s = SELECTIONS.lock().unwrap_or_else(|p| p.into_inner());
    s.iter()
        .rev()
        .find(|(k, _)| k.0 == f)
        .map(|(_, c)| c.clone())
}

/// The selection made in this process for these weights, `threads` per call (0 = 1) and
/// these buckets (as `warm_up` was given them), if any: what the serving tier reports for a
/// model served on `auto` (its instances share it).
pub fn choice_for(weights: &HostWeights, threads: usize, buckets: &[usize]) -> Option<AutoChoice> {
    let mut b: Vec<usize> = buckets.iter().copied().filter(|&b| b > 0).collect();
    b.sort_unstable();
    b.dedup();
    let key = (fingerprint(weights), threads.max(1), b);
    let s = SELECTIONS.lock().unwrap_or_else(|p| p.into_inner());
    s.iter()
        .rev()
        .find(|(k, _)| (k.0, k.1, &k.2) == (key.0, key.1, &key.2))
        .map(|(_, c)| c.clone())
}

impl AutoEngine {
    /// `auto`: the exact engines for `weights` (`threads` per call, 0 = 1), selected on
    /// [`DEFAULT_BUCKETS`]. Every call runs `fused` on this CPU's best instruction set.
    pub fn new(weights: &HostWeights, threads: usize) -> Result<Self, InferError> {
        let mut me = Self::unselected(weights, threads, false)?;
        me.select(&DEFAULT_BUCKETS, false)?;
        Ok(me)
    }

    /// `auto-int8`: build the candidates (int8 too), check their accuracy and select on
    /// [`DEFAULT_BUCKETS`] (or reuse this process's selection for them).
    pub fn with_int8(weights: &HostWeights, threads: usize) -> Result<Self, InferError> {
        let mut me = Self::unselected(weights, threads, true)?;
        me.select(&DEFAULT_BUCKETS, false)?;
        Ok(me)
    }

    /// The candidates, accuracy checked, nothing timed yet (everything on `fused`).
    fn unselected(weights: &HostWeights, threads: usize, int8: bool) -> Result<Self, InferError> {
        let fused = FusedEngine::new(weights, threads)?;
        let threads = fused.threads();
        let mut engines: Vec<Box<dyn Engine>> = vec![Box::new(fused)];
        let mut candidates = vec![EngineKind::Fused];
        let mut rejected = Vec::new();
        let mut int8_max_abs_delta = None;
        if !int8 {
            rejected.push((EngineKind::Int8, NOT_EXACT.to_string()));
        } else {
            match Int8Engine::new(weights, threads) {
                Ok(e) => match int8_holds(engines[0].as_mut(), Box::new(e))? {
                    Ok((e, d)) => {
                        engines.push(e);
                        candidates.push(EngineKind::Int8);
                        int8_max_abs_delta = Some(d);
                    }
                    Err(why) => rejected.push((EngineKind::Int8, why)),
                },
                Err(e) => rejected.push((EngineKind::Int8, e.to_string())),
            }
        }
        Ok(Self {
            int8,
            arch: weights.arch.clone(),
            threads,
            fingerprint: fingerprint(weights),
            engines,
            pick: vec![0],
            choice: AutoChoice {
                candidates,
                rejected,
                threads,
                buckets: vec![BucketChoice {
                    batch: 1,
                    engine: EngineKind::Fused,
                    measured: false,
                    median_us: Vec::new(),
                }],
                selection_ms: 0.0,
                mode: if int8 {
                    EngineKind::AutoInt8
                } else {
                    EngineKind::Auto
                },
                int8_max_abs_delta,
            },
        })
    }

    /// What was chosen (per bucket), and from what.
    pub fn choice(&self) -> &AutoChoice {
        &self.choice
    }

    /// Select on `batch_sizes` (sorted, deduplicated, zeros dropped); reuse a selection made
    /// earlier in this process for the same weights, threads and buckets unless `fresh`.
    pub fn select(&mut self, batch_sizes: &[usize], fresh: bool) -> Result<(), InferError> {
        let mut buckets: Vec<usize> = batch_sizes.iter().copied().filter(|&b| b > 0).collect();
        buckets.sort_unstable();
        buckets.dedup();
        if buckets.is_empty() {
            buckets = DEFAULT_BUCKETS.to_vec();
        }
        let key: Key = (self.fingerprint, self.threads, buckets.clone(), self.int8);
        let reused = if fresh {
            None
        } else {
            let s = SELECTIONS.lock().unwrap_or_else(|p| p.into_inner());
            s.iter().find(|(k, _)| *k == key).map(|(_, c)| c.clone())
        };
        let choice = match reused {
            Some(mut c) if c.candidates == self.choice.candidates => {
                c.selection_ms = 0.0;
                c
            }
            _ => {
                let c = self.measure(&buckets)?;
                tracing::info!("{}", c.summary());
                let mut s = SELECTIONS.lock().unwrap_or_else(|p| p.into_inner());
                s.retain(|(k, _)| *k != key);
                s.push((key, c.clone()));
                c
            }
        };
        self.pick = choice
            .buckets
            .iter()
            .map(|b| {
                choice
                    .candidates
                    .iter()
                    .position(|&k| k == b.engine)
                    .unwrap_or(0)
            })
            .collect();
        self.choice = choice;
        Ok(())
    }

    fn measure(&mut self, buckets: &[usize]) -> Result<AutoChoice, InferError> {
        let start = Instant::now();
        let nf = self.arch.n_features;
        let probe = probe_rows(nf);
        let n = self.engines.len();
        let mut out = HeadOutput::default();
        let mut chosen: Vec<BucketChoice> = Vec::with_capacity(buckets.len());
        for &batch in buckets {
            let over = start.elapsed() >= SELECTION_BUDGET;
            if n == 1 || over {
                let engine = match (n, chosen.last()) {
                    (1, _) | (_, None) => self.choice.candidates[0],
                    (_, Some(prev)) => prev.engine,
                };
                chosen.push(BucketChoice {
                    batch,
                    engine,
                    measured: false,
                    median_us: Vec::new(),
                });
                continue;
            }
            let x: Vec<f32> = probe.iter().copied().cycle().take(batch * nf).collect();
            let calls = ROWS_PER_REP.div_ceil(batch);
            for e in self.engines.iter_mut() {
                e.warm_up(&[batch])?;
                e.forward(&x, batch, &mut out)?;
            }
            let mut times = vec![Vec::with_capacity(REPS); n];
            for r in 0..REPS {
                for i in 0..n {
                    let ei = (r + i) % n;
                    let e = &mut self.engines[ei];
                    let t = Instant::now();
                    for _ in 0..calls {
                        e.forward(&x, batch, &mut out)?;
                    }
                    times[ei].push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
                }
            }
            let median_us: Vec<f64> = times
                .iter_mut()
                .map(|t| {
                    t.sort_by(|a, b| a.total_cmp(b));
                    t[t.len() / 2]
                })
                .collect();
            let mut best = 0;
            for (i, &m) in median_us.iter().enumerate().skip(1) {
                if m < median_us[best] && m <= median_us[0] * (1.0 - MARGIN) {
                    best = i;
                }
            }
            chosen.push(BucketChoice {
                batch,
                engine: self.choice.candidates[best],
                measured: true,
                median_us,
            });
        }
        Ok(AutoChoice {
            candidates: self.choice.candidates.clone(),
            rejected: self.choice.rejected.clone(),
            threads: self.threads,
            buckets: chosen,
            selection_ms: start.elapsed().as_secs_f64() * 1e3,
            mode: self.choice.mode,
            int8_max_abs_delta: self.choice.int8_max_abs_delta,
        })
    }
}

static NOTICED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// For a model forced onto `int8`: one line with int8's measured max |Δ| vs `fused` on the
/// probe rows, and where `int8` is slower than `fused` for these weights on this CPU (timed
/// as `auto-int8` times them, on `buckets`) or fails its accuracy bound, so that neither the
/// quantisation nor a slower engine runs silently; `None` after the first call for these
/// weights in this process (so a line per model, not per instance).
pub fn int8_notice_once(
    weights: &HostWeights,
    threads: usize,
    buckets: &[usize],
) -> Result<Option<String>, InferError> {
    let f = fingerprint(weights);
    {
        let mut n = NOTICED.lock().unwrap_or_else(|p| p.into_inner());
        if n.contains(&f) {
            return Ok(None);
        }
        n.push(f);
    }
    let mut a = AutoEngine::unselected(weights, threads, true)?;
    if let Some((_, why)) = a
        .choice
        .rejected
        .iter()
        .find(|(e, _)| *e == EngineKind::Int8)
    {
        return Ok(Some(format!(
            "note: int8 is not a good fit for this model on this CPU ({why}): use fused or auto"
        )));
    }
    a.select(buckets, false)?;
    let Some(q) = a
        .choice
        .candidates
        .iter()
        .position(|&c| c == EngineKind::Int8)
    else {
        return Ok(None);
    };
    let bound = format!(
        "note: int8 is quantised: max |Δ| vs fused {:.3e} (normalised units, {} probe rows)",
        a.choice.int8_max_abs_delta.unwrap_or(f32::NAN),
        PROBE_ROWS + 1
    );
    let slower: Vec<String> = a
        .choice
        .buckets
        .iter()
        .filter(|b| b.median_us.len() > q && b.median_us[q] > b.median_us[0])
        .map(|b| {
            format!(
                "batch {} ({:.2}× fused's rows/s)",
                b.batch,
                b.median_us[0] / b.median_us[q]
            )
        })
        .collect();
    Ok(Some(if slower.is_empty() {
        bound
    } else {
        format!(
            "{bound}; int8 is slower than fused on this CPU for this model at {}: use fused or auto there",
            slower.join(", ")
        )
    }))
}

/// Seeded N(0, 1.5²) rows in normalised units, then the all-zeros row.
fn probe_rows(nf: usize) -> Vec<f32> {
    let mut r = SplitMix64::derive(0x6175_746f, &[nf as u64]);
    let mut x: Vec<f32> = (0..PROBE_ROWS * nf)
        .map(|_| (1.5 * r.normal()) as f32)
        .collect();
    x.extend(std::iter::repeat_n(0.0, nf));
    x
}

/// `Ok((int8, max |Δ|))` when its outputs on the probe are within the documented bound of
/// `fused`'s, else `Err(why)`.
#[allow(clippy::type_complexity)]
fn int8_holds(
    fused: &mut dyn Engine,
    mut int8: Box<dyn Engine>,
) -> Result<Result<(Box<dyn Engine>, f32), String>, InferError> {
    let nf = fused.arch().n_features;
    let x = probe_rows(nf);
    let rows = PROBE_ROWS + 1;
    let (mut a, mut b) = (HeadOutput::default(), HeadOutput::default());
    fused.forward(&x, rows, &mut a)?;
    int8.forward(&x, rows, &mut b)?;
    let worst = b
        .mean
        .iter()
        .chain(&b.log_var)
        .zip(a.mean.iter().chain(&a.log_var))
        .map(|(q, f)| (q - f).abs() / (INT8_ABS_TOL + INT8_REL_TOL * f.abs()))
        .fold(
            0f32,
            |m, v| if v.is_nan() { f32::INFINITY } else { m.max(v) },
        );
    let max_abs = b
        .mean
        .iter()
        .chain(&b.log_var)
        .zip(a.mean.iter().chain(&a.log_var))
        .map(|(q, f)| (q - f).abs())
        .fold(
            0f32,
            |m, v| if v.is_nan() { f32::INFINITY } else { m.max(v) },
        );
    if worst <= 1.0 {
        Ok(Ok((int8, max_abs)))
    } else {
        Ok(Err(format!(
            "its error on the probe rows is {worst:.2}× the documented bound \
             ({INT8_ABS_TOL} + {INT8_REL_TOL}·|y|)"
        )))
    }
}

/// FNV-1a over the architecture and every weight's bits.
fn fingerprint(w: &HostWeights) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |v: u64| {
        for byte in v.to_le_bytes() {
            h ^= byte as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(w.arch.n_features as u64);
    eat(w.arch.n_targets as u64);
    eat(w.arch.hidden.len() as u64);
    for &d in &w.arch.hidden {
        eat(d as u64);
    }
    for byte in format!("{:?}", w.arch.activation).bytes() {
        eat(byte as u64);
    }
    for l in w.backbone.iter().chain([&w.mean_head, &w.logvar_head]) {
        eat(l.fan_in as u64);
        eat(l.fan_out as u64);
        for v in l.w.iter().chain(&l.b) {
            eat(v.to_bits() as u64);
        }
    }
    h
}

impl Engine for AutoEngine {
    fn name(&self) -> String {
        self.choice.mode.to_string()
    }

    fn arch(&self) -> &RegressionNetConfig {
        &self.arch
    }

    fn forward(&mut self, x: &[f32], rows: usize, out: &mut HeadOutput) -> Result<(), InferError> {
        check_shape(x, rows, self.arch.n_features)?;
        let i = self.pick[bucket_index(&self.choice.buckets, rows)];
        self.engines[i].forward(x, rows, out)
    }

    fn threads(&self) -> usize {
        self.threads
    }

    /// Warm every candidate up on `batch_sizes`, then select on them (or reuse this
    /// process's selection for the same weights, threads and buckets).
    fn warm_up(&mut self, batch_sizes: &[usize]) -> Result<(), InferError> {
        for e in self.engines.iter_mut() {
            e.warm_up(batch_sizes)?;
        }
        let mut b: Vec<usize> = batch_sizes.iter().copied().filter(|&b| b > 0).collect();
        b.sort_unstable();
        b.dedup();
        if !b.is_empty()
            && self
                .choice
                .buckets
                .iter()
                .map(|c| c.batch)
                .ne(b.iter().copied())
        {
            self.select(&b, false)?;
        }
        Ok(())
    }

    fn auto_choice(&self) -> Option<&AutoChoice> {
        Some(&self.choice)
    }
}
