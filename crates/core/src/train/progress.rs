//! Progress display: indicatif bars on a terminal, plain periodic log lines elsewhere
//! (CI, cron, pipes).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::epoch::EpochStats;
use super::state::EpochRecord;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Bars when stderr is a terminal, log lines otherwise.
    Auto,
    /// Log lines only.
    Plain,
    /// Nothing but warnings and errors.
    Quiet,
}

/// Shows training progress.
pub struct Reporter {
    bars: bool,
    quiet: bool,
    bar: Option<ProgressBar>,
    last_line: Instant,
    every: Duration,
}

impl Reporter {
    /// A reporter for the given mode.
    pub fn new(mode: ProgressMode) -> Self {
        Self {
            bars: mode == ProgressMode::Auto && std::io::stderr().is_terminal(),
            quiet: mode == ProgressMode::Quiet,
            bar: None,
            last_line: Instant::now(),
            every: Duration::from_secs(30),
        }
    }

    /// Print a line (through the bar when one is shown, so it is not garbled).
    pub fn line(&self, text: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// An epoch starts.
    pub fn epoch_start(&mut self, stage: &str, epoch: usize, epochs: usize, batches: usize) {
        self.last_line = Instant::now();
        if self.bars {
            let bar = ProgressBar::new(batches as u64);
            bar.set_style(
                ProgressStyle::with_template("{prefix:>18} [{bar:28}] {pos:>5}/{len:5} {msg}")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("{stage} {}/{epochs}", epoch + 1));
            self.bar = Some(bar);
        }
    }

    /// A step of `stage`'s epoch `epoch` (of `batches` steps) ended with loss `loss` at rate
    /// `lr`; `stats` counts the epoch's steps so far (called every step; cheap).
    pub fn step(
        &mut self,
        stage: &str,
        epoch: usize,
        batches: usize,
        loss: f64,
        lr: f64,
        stats: &EpochStats,
    ) {
        let step_in_epoch = stats.steps().saturating_sub(1) as usize;
        let (samples_per_s, wait_frac) = (stats.samples_per_s(), stats.wait_frac());
        if let Some(bar) = &self.bar {
            bar.set_position(step_in_epoch as u64 + 1);
            if step_in_epoch.is_multiple_of(16) {
                bar.set_message(format!(
                    "loss {loss:.4} lr {lr:.2e} {samples_per_s:>8.0} samples/s wait {:>4.1}%",
                    wait_frac * 100.0
                ));
            }
        } else if !self.quiet && self.last_line.elapsed() >= self.every {
            self.last_line = Instant::now();
            eprintln!(
                "  {stage} epoch {} step {}/{batches}: loss {loss:.4} lr {lr:.2e} {samples_per_s:.0} samples/s data wait {:.1}%",
                epoch + 1,
                step_in_epoch + 1,
                wait_frac * 100.0
            );
        }
    }

    /// An epoch ended.
    pub fn epoch_end(&mut self, r: &EpochRecord, epochs: usize, best: bool) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.line(&format!(
            "{} epoch {:>3}/{epochs}: train {:.5} val {:.5}{} lr {:.2e} |g| {:.3} (max {:.3}, clipped {:.0}%) {:.0} samples/s, data wait {:.1}%",
            r.stage_name,
            r.epoch + 1,
            r.train_loss,
            r.val_loss,
            if best { "*" } else { " " },
            r.lr,
            r.grad_norm_mean,
            r.grad_norm_max,
            r.clipped_frac * 100.0,
            r.samples_per_s,
            r.data_wait_frac * 100.0
        ));
    }
}
