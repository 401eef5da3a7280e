//! The profiler's step schedule: `wait`, `warmup`, `active`, `repeat` — torch.profiler's
//! `schedule(wait, warmup, active, repeat)` counted in optimizer steps.

/// What the profiler does during one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Spans are off (cost: one atomic load per span site).
    Off,
    /// Spans are live but not recorded (warms caches and lazy initialisation).
    Warmup,
    /// Spans are recorded.
    Record,
}

/// A wait/warmup/active cycle, repeated `repeat` times, then off for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Steps skipped at the start of each cycle.
    pub wait: u64,
    /// Steps warmed up.
    pub warmup: u64,
    /// Steps recorded.
    pub active: u64,
    /// Cycles.
    pub repeat: u64,
}

impl Schedule {
    /// Steps in one cycle.
    pub fn cycle(&self) -> u64 {
        self.wait + self.warmup + self.active
    }

    /// The action at `step` (0-based).
    pub fn action(&self, step: u64) -> Action {
        let cycle = self.cycle();
        if cycle == 0 || self.active == 0 || step >= cycle.saturating_mul(self.repeat) {
            return Action::Off;
        }
        let pos = step % cycle;
        if pos < self.wait {
            Action::Off
        } else if pos < self.wait + self.warmup {
            Action::Warmup
        } else {
            Action::Record
        }
    }

    /// The step after the last recorded one (when the trace can be written).
    pub fn end(&self) -> u64 {
        self.cycle().saturating_mul(self.repeat)
    }

    /// The recorded steps.
    pub fn recorded_steps(&self) -> Vec<u64> {
        (0..self.end())
            .filter(|&s| self.action(s) == Action::Record)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    #[test]
    fn torch_style_schedule_arithmetic() {
        let s = Schedule {
            wait: 1,
            warmup: 1,
            active: 3,
            repeat: 1,
        };
        let got: Vec<Action> = (0..7).map(|k| s.action(k)).collect();
        assert_eq!(got, [Off, Warmup, Record, Record, Record, Off, Off]);
        assert_eq!(s.recorded_steps(), vec![2, 3, 4]);
        assert_eq!(s.end(), 5);

        let s = Schedule {
            wait: 2,
            warmup: 0,
            active: 2,
            repeat: 2,
        };
        assert_eq!(s.recorded_steps(), vec![2, 3, 6, 7]);
        assert_eq!(s.action(8), Off);

        let s = Schedule {
            wait: 0,
            warmup: 0,
            active: 1,
            repeat: 3,
        };
        assert_eq!(s.recorded_steps(), vec![0, 1, 2]);
        let none = Schedule { active: 0, ..s };
        assert!(none.recorded_steps().is_empty());
    }
}
