//! Learning-rate schedules, stepped once per optimizer step.

use crate::config::ScheduleConfig;

/// A learning-rate schedule: the rate to use at optimizer step `step` (0-based, within the
/// stage).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LrSchedule {
    /// `base` at every step.
    Constant {
        /// The rate.
        base: f64,
    },
    /// PyTorch's `CosineAnnealingWarmRestarts(optimizer, T_0, T_mult, eta_min)` stepped once
    /// per optimizer step: within a period of length `T_i` the rate falls from `base` to
    /// `eta_min` along half a cosine, then restarts at `base` with `T_{i+1} = T_mult · T_i`.
    CosineWarmRestarts {
        /// The maximum rate (the optimizer's lr).
        base: f64,
        /// First period, in steps.
        t_0: u64,
        /// Period growth factor (≥ 1).
        t_mult: u64,
        /// The floor.
        eta_min: f64,
    },
    /// Linear warmup over `warmup` steps, then half a cosine from `base` to `eta_min` over the
    /// remaining steps of a stage of `total` steps (`eta_min` from there on).
    Cosine {
        /// The peak rate (the optimizer's lr).
        base: f64,
        /// The stage's optimizer steps.
        total: u64,
        /// Warmup steps (< `total`).
        warmup: u64,
        /// The floor.
        eta_min: f64,
    },
}

impl LrSchedule {
    /// Build from the config, the stage's base learning rate and the stage's number of
    /// optimizer steps (epochs × batches per epoch; read by `cosine` only).
    pub fn new(cfg: &ScheduleConfig, base: f64, stage_steps: u64) -> Self {
        match *cfg {
            ScheduleConfig::Constant => LrSchedule::Constant { base },
            ScheduleConfig::CosineWarmRestarts {
                t_0,
                t_mult,
                eta_min,
            } => LrSchedule::CosineWarmRestarts {
                base,
                t_0,
                t_mult,
                eta_min,
            },
            ScheduleConfig::Cosine { warmup, eta_min } => {
                let total = stage_steps.max(1);
                let warmup =
                    ((warmup.clamp(0.0, 1.0) * total as f64).round() as u64).min(total - 1);
                LrSchedule::Cosine {
                    base,
                    total,
                    warmup,
                    eta_min,
                }
            }
        }
    }

    /// The position inside the current period: `(T_cur, T_i)`.
    pub fn period_position(t_0: u64, t_mult: u64, step: u64) -> (u64, u64) {
        // Integer walk over the periods: identical to PyTorch's closed form
        // n = ⌊log_{T_mult}(step/T_0·(T_mult−1)+1)⌋ without its floating-point rounding.
        let (mut t_cur, mut t_i) = (step, t_0);
        while t_cur >= t_i {
            t_cur -= t_i;
            t_i = t_i.saturating_mul(t_mult);
        }
        (t_cur, t_i)
    }

    /// The learning rate at `step`.
    pub fn lr(&self, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant { base } => base,
            LrSchedule::CosineWarmRestarts {
                base,
                t_0,
                t_mult,
                eta_min,
            } => {
                let (t_cur, t_i) = Self::period_position(t_0, t_mult, step);
                eta_min
                    + (base - eta_min)
                        * (1.0 + (std::f64::consts::PI * t_cur as f64 / t_i as f64).cos())
                        / 2.0
            }
            LrSchedule::Cosine {
                base,
                total,
                warmup,
                eta_min,
            } => {
                if step < warmup {
                    return base * (step + 1) as f64 / warmup as f64;
                }
                let span = (total - warmup).max(1) as f64;
                let t = ((step - warmup) as f64 / span).min(1.0);
                eta_min + (base - eta_min) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by PyTorch 2.15.0 (`torch.optim.lr_scheduler`):
    /// `opt = SGD([p], lr=0.1); s = CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2,
    /// eta_min=0.001)`, reading `opt.param_groups[0]['lr']` before each `opt.step(); s.step()`.
    /// Periods: steps 0–2 (T_0 = 3), 3–8 (6), 9–20 (12), 21–44 (24), restart at 45.
    #[test]
    fn matches_pytorch_cosine_warm_restarts_with_t_mult_2() {
        let s = LrSchedule::CosineWarmRestarts {
            base: 0.1,
            t_0: 3,
            t_mult: 2,
            eta_min: 0.001,
        };
        let pytorch: [(u64, f64); 11] = [
            (0, 0.1),
            (1, 0.07525000000000001),
            (2, 0.025750000000000012),
            (3, 0.1),
            (4, 0.09336825748732973),
            (8, 0.007631742512670284),
            (9, 0.1),
            (15, 0.0505),
            (20, 0.0026866715986911243),
            (21, 0.1),
            (45, 0.1),
        ];
        for (step, expected) in pytorch {
            let got = s.lr(step);
            assert!(
                (got - expected).abs() < 1e-15,
                "step {step}: {got} vs PyTorch {expected}"
            );
        }
        assert_eq!(LrSchedule::period_position(3, 2, 44), (23, 24));
    }

    #[test]
    fn t_mult_1_is_periodic_and_constant_is_constant() {
        let s = LrSchedule::CosineWarmRestarts {
            base: 1.0,
            t_0: 4,
            t_mult: 1,
            eta_min: 0.0,
        };
        for k in 0..4 {
            assert_eq!(s.lr(k), s.lr(k + 4));
        }
        assert!((s.lr(2) - 0.5).abs() < 1e-15);
        assert_eq!(LrSchedule::Constant { base: 0.3 }.lr(99), 0.3);
    }

    #[test]
    fn cosine_warms_up_then_decays_to_its_floor_over_the_stage() {
        let cfg = ScheduleConfig::Cosine {
            warmup: 0.1,
            eta_min: 0.01,
        };
        let s = LrSchedule::new(&cfg, 1.0, 100);
        assert_eq!(
            s,
            LrSchedule::Cosine {
                base: 1.0,
                total: 100,
                warmup: 10,
                eta_min: 0.01
            }
        );
        assert!(
            (s.lr(0) - 0.1).abs() < 1e-12,
            "warmup starts at base/warmup"
        );
        assert!((s.lr(9) - 1.0).abs() < 1e-12, "warmup ends at the peak");
        assert!(
            (s.lr(10) - 1.0).abs() < 1e-12,
            "the cosine starts at the peak"
        );
        assert!(
            (s.lr(55) - (0.01 + 0.99 * 0.5)).abs() < 1e-12,
            "half-way: the mean"
        );
        assert!((s.lr(100) - 0.01).abs() < 1e-12, "the floor at the end");
        assert!((s.lr(1000) - 0.01).abs() < 1e-12, "and after");
        for k in 10..100 {
            assert!(
                s.lr(k + 1) <= s.lr(k),
                "decays monotonically after the warmup"
            );
        }
        let no_warmup = LrSchedule::new(
            &ScheduleConfig::Cosine {
                warmup: 0.0,
                eta_min: 0.0,
            },
            0.5,
            0,
        );
        assert_eq!(no_warmup.lr(0), 0.5, "an empty stage still has a rate");
    }
}
