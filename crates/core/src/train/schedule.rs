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
}

impl LrSchedule {
    /// Build from the config and the stage's base learning rate.
    pub fn new(cfg: &ScheduleConfig, base: f64) -> Self {
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
}
