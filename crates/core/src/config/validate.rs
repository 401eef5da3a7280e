//! Value checks of an experiment config, one function per section, in one place. Each error
//! names the file, the key path and the expected range.

use std::path::{Path, PathBuf};

use super::ConfigError;
use super::schema::*;

/// The most members `model.ensemble` packs.
const MAX_MEMBERS: usize = 16;

/// The most seeds `seed_spread` may train.
pub const MAX_SEED_SPREAD: usize = 32;

/// Builds the error for a key (the caller returns it).
type Bad<'a> = &'a dyn Fn(String, String) -> Result<(), ConfigError>;

impl ExperimentConfig {
    /// Check every value against its allowed range.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: String, message: String| {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                key,
                message,
            })
        };
        self.validate_identity(&bad)?;
        self.validate_data(&bad)?;
        self.validate_model(&bad)?;
        self.validate_loader(&bad)?;
        self.validate_stages(&bad)?;
        self.validate_distill(&bad)?;
        self.validate_runtime(&bad)
    }

    /// Check the distillation section: α in [0, 1], exactly one way to name the teacher, and
    /// at least one stage that uses it.
    fn validate_distill(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        let Some(d) = &self.distill else {
            return Ok(());
        };
        if !(d.alpha.is_finite() && (0.0..=1.0).contains(&d.alpha)) {
            return bad(
                "distill.alpha".into(),
                format!("expected 0 ≤ alpha ≤ 1, got {}", d.alpha),
            );
        }
        match (d.checkpoints.is_empty(), &d.config) {
            (true, None) => {
                return bad(
                    "distill".into(),
                    "name the teacher: `checkpoints: [DIR, …]` or `config: FILE.yaml`".into(),
                );
            }
            (false, Some(_)) => {
                return bad(
                    "distill".into(),
                    "give either `checkpoints` or `config`, not both".into(),
                );
            }
            _ => {}
        }
        if d.config.is_none() && !d.seeds.is_empty() {
            return bad(
                "distill.seeds".into(),
                "seeds select runs of `distill.config`; with `checkpoints` list each teacher"
                    .into(),
            );
        }
        if !self.stages.iter().any(|s| s.loss.is_distill()) {
            return bad(
                "distill".into(),
                "no stage uses the teacher: set a stage's loss to distill_mse or distill_nll"
                    .into(),
            );
        }
        Ok(())
    }

    /// Check the name and the serving engine.
    fn validate_identity(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad(
                "name".into(),
                format!(
                    "expected a non-empty name of letters, digits, '-' and '_', got {:?}",
                    self.name
                ),
            );
        }
        if !(1..=MAX_SEED_SPREAD).contains(&self.seed_spread) {
            return bad(
                "seed_spread".into(),
                format!(
                    "expected a number of seeds from 1 (no measurement) to {MAX_SEED_SPREAD}, got {}",
                    self.seed_spread
                ),
            );
        }
        if let Some(engine) = &self.export.engine {
            let known = crate::records::engine_names();
            if !known.contains(&engine.as_str()) {
                return bad(
                    "export.engine".into(),
                    format!("expected one of {}, got {engine:?}", known.join(", ")),
                );
            }
        }
        Ok(())
    }

    /// Check `data`: columns and the season split.
    fn validate_data(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        if self.data.features.is_empty() {
            return bad(
                "data.features".into(),
                "expected at least one feature column".into(),
            );
        }
        if self.data.targets.is_empty() {
            return bad(
                "data.targets".into(),
                "expected at least one target column".into(),
            );
        }
        if let super::NumericBins::Fixed(bins @ (1 | 65..)) = self.data.numeric_bins {
            return bad(
                "data.numeric_bins".into(),
                format!("expected 0 (no bins), 2 to 64 bins or `auto`, got {bins}"),
            );
        }
        for (list, key) in [
            (&self.data.features, "data.features"),
            (&self.data.targets, "data.targets"),
        ] {
            for (i, name) in list.iter().enumerate() {
                if list[..i].contains(name) {
                    return bad(
                        format!("{key}[{i}]"),
                        format!("column {name:?} is listed twice"),
                    );
                }
            }
        }
        if let Some(t) = self
            .data
            .targets
            .iter()
            .find(|t| self.data.features.contains(t))
        {
            return bad(
                "data.targets".into(),
                format!("column {t:?} is both a feature and a target"),
            );
        }
        for (t, tr) in &self.data.target_transform {
            if !self.data.targets.contains(t) {
                return bad(
                    format!("data.target_transform.{t}"),
                    format!(
                        "column {t:?} is not a target (data.targets: {})",
                        self.data.targets.join(", ")
                    ),
                );
            }
            if !tr.is_none() && self.distill.is_some() {
                return bad(
                    format!("data.target_transform.{t}"),
                    "a target transform cannot be combined with distillation yet (the teacher's predictions are in original units); remove one of them".into(),
                );
            }
        }
        if let Some(d) = self.data.delimiter
            && ![',', '\t', ';', '|'].contains(&d)
        {
            return bad(
                "data.delimiter".into(),
                format!("expected \",\", \"\\t\", \";\" or \"|\", got {d:?}"),
            );
        }
        for (i, c) in self.data.categorical.iter().enumerate() {
            if self.data.categorical[..i].contains(c) {
                return bad(
                    format!("data.categorical[{i}]"),
                    format!("column {c:?} is listed twice"),
                );
            }
            if !self.data.features.contains(c) {
                return bad(
                    format!("data.categorical[{i}]"),
                    format!(
                        "column {c:?} is not in data.features ({}); list it there too, where the network should see it",
                        self.data.features.join(", ")
                    ),
                );
            }
        }
        for (c, parts) in &self.data.dates {
            let key = format!("data.dates.{c}");
            if !self.data.features.contains(c) {
                return bad(
                    key,
                    format!(
                        "column {c:?} is not in data.features ({}); list it there too, where the network should see its parts",
                        self.data.features.join(", ")
                    ),
                );
            }
            if self.data.categorical.contains(c) {
                return bad(
                    key,
                    format!(
                        "column {c:?} is also in data.categorical; a column is a date or a category"
                    ),
                );
            }
            if parts.is_empty() {
                return bad(
                    key,
                    "expected at least one part: year, month, day_of_week, day_of_year, elapsed_days".into(),
                );
            }
            for (i, p) in parts.iter().enumerate() {
                if parts[..i].contains(p) {
                    return bad(key, format!("part {} is listed twice", p.name()));
                }
            }
        }
        for (i, c) in self.data.case_insensitive.iter().enumerate() {
            if !self.data.categorical.contains(c) {
                return bad(
                    format!("data.case_insensitive[{i}]"),
                    format!(
                        "column {c:?} is not in data.categorical ({}); only categorical columns can ignore case",
                        self.data.categorical.join(", ")
                    ),
                );
            }
        }
        if self.data.max_categories == 0 {
            return bad("data.max_categories".into(), "expected at least 1".into());
        }
        if let Some(w) = &self.data.weight
            && (self.data.features.contains(w) || self.data.targets.contains(w))
        {
            return bad(
                "data.weight".into(),
                format!("column {w:?} is also a feature or a target; a weight column is neither"),
            );
        }
        self.validate_missing(bad)?;
        self.validate_split(bad)
    }

    /// Check `data.missing`: listed columns are features; constants are given exactly when
    /// imputing a constant, and finite.
    fn validate_missing(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        let m = &self.data.missing;
        let mut all = vec![("data.missing.default".to_string(), &m.default)];
        for (name, p) in &m.columns {
            let key = format!("data.missing.columns.{name}");
            if !self.data.features.contains(name) {
                return bad(
                    key,
                    format!(
                        "expected a feature column ({}); a row with a missing target is always dropped",
                        self.data.features.join(", ")
                    ),
                );
            }
            all.push((key, p));
        }
        for (key, p) in all {
            if let MissingPolicy::Impute { with, value, .. } = p {
                match (with, value) {
                    (Imputation::Constant, None) => {
                        return bad(
                            key,
                            "expected `value: <number>` with `impute: constant`".into(),
                        );
                    }
                    (Imputation::Constant, Some(v)) if !v.is_finite() => {
                        return bad(key, format!("expected a finite `value`, got {v}"));
                    }
                    (Imputation::Mean | Imputation::Median, Some(_)) => {
                        return bad(
                            key,
                            "`value` is for `impute: constant`; mean and median come from the training split".into(),
                        );
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Check `data.split`: the parts fit the split kind, ranges are ordered and disjoint,
    /// fractions add up to at most 1.
    fn validate_split(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        let split = &self.data.split;
        let parts = [
            (&split.train, "data.split.train"),
            (&split.validation, "data.split.validation"),
            (&split.test, "data.split.test"),
        ];
        match split.by {
            SplitBy::Column => {
                if split.seed.is_some() {
                    return bad(
                        "data.split.seed".into(),
                        "a seed is for `by: random` or `by: group`; a column split is not random"
                            .into(),
                    );
                }
                for (part, key) in parts {
                    if let SplitPart::Fraction(_) = part {
                        return bad(
                            key.into(),
                            "expected {from: …, to: …} or {last: …} for a column split; fractions need `by: random` or `by: group`".into(),
                        );
                    }
                }
                if let SplitPart::Last(_) = split.train {
                    return bad(
                        "data.split.train".into(),
                        "expected {from: …, to: …} or nothing (everything older than the validation window); `last` is for validation and test".into(),
                    );
                }
                let relative = [&split.validation, &split.test]
                    .iter()
                    .filter(|p| matches!(p, SplitPart::Last(_)))
                    .count();
                if relative == 1 {
                    return bad(
                        "data.split.validation".into(),
                        "expected relative windows for both validation and test ({last: …}) or ranges for both".into(),
                    );
                }
                if matches!(split.validation, SplitPart::Rest)
                    || matches!(split.test, SplitPart::Rest)
                {
                    return bad(
                        "data.split.test".into(),
                        "expected a range or {last: …} for both validation and test".into(),
                    );
                }
                let mut kinds = Vec::new();
                for (part, key) in parts {
                    let SplitPart::Range(r) = part else {
                        if let SplitPart::Last(WindowLength::Duration(_)) = part {
                            kinds.push(("a duration", key));
                        }
                        continue;
                    };
                    let mut ends = [None, None];
                    for (k, b) in [&r.from, &r.to].into_iter().enumerate() {
                        let Some(b) = b else { continue };
                        kinds.push((
                            if matches!(b, Bound::Int(_)) {
                                "an integer"
                            } else {
                                "a date"
                            },
                            key,
                        ));
                        ends[k] = Some(super::values::bound_value(b, k == 1));
                    }
                    if let [Some(a), Some(b)] = ends
                        && a > b
                    {
                        return bad(
                            key.into(),
                            format!(
                                "`from` ({}) must be ≤ `to` ({})",
                                r.from.as_ref().expect("set"),
                                r.to.as_ref().expect("set")
                            ),
                        );
                    }
                }
                let ints = kinds.iter().find(|k| k.0 == "an integer");
                let dates = kinds.iter().find(|k| k.0 != "an integer");
                if let (Some(i), Some(d)) = (ints, dates) {
                    return bad(
                        d.1.into(),
                        format!(
                            "{} here but {} in `{}`: one split column has one kind",
                            d.0, i.0, i.1
                        ),
                    );
                }
                let ranges: Vec<(&SeasonRange, &str)> = parts
                    .iter()
                    .filter_map(|(p, k)| match p {
                        SplitPart::Range(r) => Some((r, *k)),
                        _ => None,
                    })
                    .collect();
                for i in 0..ranges.len() {
                    for j in i + 1..ranges.len() {
                        let (a, b) = (ranges[i].0, ranges[j].0);
                        if super::values::ranges_overlap(a, b) {
                            return bad(
                                ranges[j].1.into(),
                                format!(
                                    "values {b} overlap values {a} of another split; splits must be disjoint"
                                ),
                            );
                        }
                    }
                }
            }
            SplitBy::Random | SplitBy::Group => {
                let how = if split.by == SplitBy::Random {
                    "random"
                } else {
                    "group"
                };
                if split.by == SplitBy::Group && split.column.is_none() {
                    return bad(
                        "data.split.column".into(),
                        "expected the group column (`by: group` keeps each of its values in one split)".into(),
                    );
                }
                if split.by == SplitBy::Random && split.column.is_some() {
                    return bad(
                        "data.split.column".into(),
                        "`by: random` draws rows and reads no column; use `by: group` to keep a column's values together".into(),
                    );
                }
                let mut total = 0.0;
                for (part, key) in parts {
                    match part {
                        SplitPart::Fraction(x) if x.is_finite() && *x > 0.0 && *x < 1.0 => {
                            total += x
                        }
                        SplitPart::Rest if key == "data.split.train" => {}
                        other => {
                            return bad(
                                key.into(),
                                format!(
                                    "expected a fraction 0 < f < 1 for `by: {how}`, got {other}"
                                ),
                            );
                        }
                    }
                }
                if total > 1.0 + 1e-9 || (split.train.is_rest() && total >= 1.0) {
                    return bad(
                        "data.split".into(),
                        format!(
                            "expected the fractions to add up to at most 1 (leaving some rows for training), got {total}"
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// Check `model`: widths, members.
    fn validate_model(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        if self.model.hidden.is_empty() {
            return bad(
                "model.hidden".into(),
                "expected at least one hidden layer width".into(),
            );
        }
        let members = self.model.ensemble;
        if !(1..=MAX_MEMBERS).contains(&members) {
            return bad(
                "model.ensemble".into(),
                format!("expected 1 to {MAX_MEMBERS} members, got {members}"),
            );
        }
        for (i, &w) in self.model.hidden.iter().enumerate() {
            if w == 0 || w.saturating_mul(members) > 65_536 {
                let most = 65_536 / members;
                let why = match members {
                    1 => String::new(),
                    m => format!(" ({m} ensemble members side by side)"),
                };
                return bad(
                    format!("model.hidden[{i}]"),
                    format!("expected a width in 1..={most}{why}, got {w}"),
                );
            }
        }
        if members > 1 && self.distill.is_some() {
            return bad(
                "model.ensemble".into(),
                format!(
                    "a distilled student is one network: drop `ensemble: {members}` or \
                     `distill`"
                ),
            );
        }
        Ok(())
    }

    /// Check `loader`: batch size, workers, prefetch.
    fn validate_loader(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        if self.loader.batch_size == 0 || self.loader.batch_size > 1 << 20 {
            return bad(
                "loader.batch_size".into(),
                format!("expected 1..=1048576, got {}", self.loader.batch_size),
            );
        }
        if let WorkerCount::Fixed(n) = self.loader.num_workers
            && n > 256
        {
            return bad(
                "loader.num_workers".into(),
                format!("expected 0..=256 or \"auto\", got {n}"),
            );
        }
        if self.loader.prefetch == 0 || self.loader.prefetch > 4096 {
            return bad(
                "loader.prefetch".into(),
                format!("expected 1..=4096 batches, got {}", self.loader.prefetch),
            );
        }
        Ok(())
    }

    /// Check `stages`: parts, epochs, optimizer, schedule, clipping.
    fn validate_stages(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        if self.stages.is_empty() {
            return bad("stages".into(), "expected at least one stage".into());
        }
        for (i, s) in self.stages.iter().enumerate() {
            let k = |f: &str| format!("stages[{i}].{f}");
            if s.trainable.is_empty() {
                return bad(k("trainable"), "expected at least one part".into());
            }
            if s.epochs == 0 || s.epochs > 1_000_000 {
                return bad(
                    k("epochs"),
                    format!("expected 1..=1000000, got {}", s.epochs),
                );
            }
            if s.loss.is_distill() && self.distill.is_none() {
                return bad(
                    k("loss"),
                    format!(
                        "loss {} needs a top-level `distill:` section naming the teacher",
                        if s.loss == Loss::DistillMse {
                            "distill_mse"
                        } else {
                            "distill_nll"
                        }
                    ),
                );
            }
            match s.loss {
                Loss::Mse | Loss::DistillMse => {
                    if !s.trainable.contains(&Part::MeanHead) {
                        return bad(
                            k("trainable"),
                            "loss mse trains the mean head; include mean_head".into(),
                        );
                    }
                    if s.trainable.contains(&Part::LogvarHead) {
                        return bad(
                            k("trainable"),
                            "loss mse gives the log-variance head no gradient; remove logvar_head"
                                .into(),
                        );
                    }
                }
                Loss::GaussianNll | Loss::DistillNll => {
                    if !s.trainable.contains(&Part::LogvarHead) {
                        return bad(
                            k("trainable"),
                            "loss gaussian_nll needs logvar_head trainable".into(),
                        );
                    }
                }
            }
            let o = &s.optimizer;
            if !(o.lr.is_finite() && o.lr > 0.0 && o.lr <= 10.0) {
                return bad(
                    k("optimizer.lr"),
                    format!("expected 0 < lr ≤ 10, got {}", o.lr),
                );
            }
            for (v, name) in [(o.beta1, "beta1"), (o.beta2, "beta2")] {
                if !(0.0..1.0).contains(&v) {
                    return bad(
                        k(&format!("optimizer.{name}")),
                        format!("expected 0 ≤ {name} < 1, got {v}"),
                    );
                }
            }
            if !(o.eps.is_finite() && o.eps > 0.0) {
                return bad(
                    k("optimizer.eps"),
                    format!("expected eps > 0, got {}", o.eps),
                );
            }
            if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0 && o.lr * o.weight_decay < 1.0)
            {
                return bad(
                    k("optimizer.weight_decay"),
                    format!(
                        "expected weight_decay ≥ 0 with lr·weight_decay < 1, got {}",
                        o.weight_decay
                    ),
                );
            }
            if let ScheduleConfig::CosineWarmRestarts {
                t_0,
                t_mult,
                eta_min,
            } = s.schedule
            {
                if t_0 == 0 {
                    return bad(
                        k("schedule.t_0"),
                        "expected T_0 ≥ 1 optimizer steps, got 0".into(),
                    );
                }
                if t_mult == 0 {
                    return bad(k("schedule.t_mult"), "expected T_mult ≥ 1, got 0".into());
                }
                if !(eta_min.is_finite() && eta_min >= 0.0 && eta_min <= o.lr) {
                    return bad(
                        k("schedule.eta_min"),
                        format!(
                            "expected 0 ≤ eta_min ≤ optimizer.lr ({}), got {eta_min}",
                            o.lr
                        ),
                    );
                }
            }
            if let ScheduleConfig::Cosine { warmup, eta_min } = s.schedule {
                if !(warmup.is_finite() && (0.0..1.0).contains(&warmup)) {
                    return bad(
                        k("schedule.warmup"),
                        format!("expected a fraction of the stage's steps in [0, 1), got {warmup}"),
                    );
                }
                if !(eta_min.is_finite() && eta_min >= 0.0 && eta_min <= o.lr) {
                    return bad(
                        k("schedule.eta_min"),
                        format!(
                            "expected 0 ≤ eta_min ≤ optimizer.lr ({}), got {eta_min}",
                            o.lr
                        ),
                    );
                }
            }
            if let Some(c) = s.clip_norm
                && !(c.is_finite() && c > 0.0)
            {
                return bad(
                    k("clip_norm"),
                    format!("expected a positive number or null, got {c}"),
                );
            }
            if let Some(es) = s.early_stopping {
                if es.patience == 0 {
                    return bad(
                        k("early_stopping.patience"),
                        "expected patience ≥ 1 epochs, got 0".into(),
                    );
                }
                if !(es.min_delta.is_finite() && es.min_delta >= 0.0) {
                    return bad(
                        k("early_stopping.min_delta"),
                        format!("expected a finite min_delta ≥ 0, got {}", es.min_delta),
                    );
                }
            }
        }
        Ok(())
    }

    /// Check `profile`, `device` and `precision`.
    fn validate_runtime(&self, bad: Bad<'_>) -> Result<(), ConfigError> {
        let p = &self.profile;
        if p.enabled && (p.active == 0 || p.repeat == 0) {
            return bad(
                "profile.active".into(),
                format!(
                    "expected active ≥ 1 and repeat ≥ 1, got active {} repeat {}",
                    p.active, p.repeat
                ),
            );
        }
        if self.precision == Precision::Bf16 && self.device == DeviceKind::Cpu {
            return bad(
                "precision".into(),
                "bf16 training needs `device: cuda` (the CPU backends flex and ndarray train in f32 only)".into(),
            );
        }
        if self.device == DeviceKind::Cuda && !cfg!(feature = "cuda") {
            return bad(
                "device".into(),
                "`cuda` needs a kiln built with `--features cuda`; this build has CPU backends only".into(),
            );
        }
        Ok(())
    }

    /// The registry file: `registry.path`, else `<export.dir>/runs.db`.
    pub fn registry_path(&self) -> PathBuf {
        self.registry
            .path
            .clone()
            .unwrap_or_else(|| self.export.dir.join("runs.db"))
    }
}
