//! The load loop: arrival schedules (constant or Poisson, [`arrivals`]) and [`drive`], which
//! sends from `workers` connections for a window — closed loop, or open loop at the scheduled
//! offsets with latency counted from each request's scheduled start — and gathers what the
//! window measured.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::LoadtestError;
use super::caller::Target;
use super::request::Rng;

/// How open-loop arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::EnumString)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "lowercase",
    parse_err_ty = String,
    parse_err_fn = unknown_distribution
)]
pub enum Distribution {
    /// Evenly: request i at i/rate.
    Constant,
    /// A Poisson process: exponential gaps with mean 1/rate (deterministic seed).
    Poisson,
}

/// `Distribution`'s derived `FromStr` error.
fn unknown_distribution(s: &str) -> String {
    format!("`{s}` is not a request distribution; expected constant or poisson")
}

/// Arrival offsets (from the start) of an open-loop window: `rate` per second for
/// `duration`, at most `max` of them.
pub fn arrivals(
    rate: f64,
    duration: Duration,
    dist: Distribution,
    seed: u64,
    max: u64,
) -> Vec<Duration> {
    let d = duration.as_secs_f64();
    let mut out = Vec::new();
    if !(rate > 0.0 && rate.is_finite()) {
        return out;
    }
    match dist {
        Distribution::Constant => {
            let n = ((rate * d).ceil() as u64).min(max);
            for i in 0..n {
                let t = i as f64 / rate;
                if t >= d {
                    break;
                }
                out.push(Duration::from_secs_f64(t));
            }
        }
        Distribution::Poisson => {
            let mut rng = Rng(seed ^ 0x5EED);
            let mut t = 0.0;
            while t < d && (out.len() as u64) < max {
                out.push(Duration::from_secs_f64(t));
                t += -(1.0 - rng.next()).ln() / rate;
            }
        }
    }
    out
}

/// What one window measured.
#[derive(Debug, Default)]
pub(super) struct Window {
    pub(super) lat: Vec<f64>,
    pub(super) svc: Vec<f64>,
    pub(super) errors: BTreeMap<String, u64>,
    pub(super) late: u64,
    pub(super) sent: u64,
    pub(super) unsent: u64,
    pub(super) elapsed_s: f64,
    pub(super) last_send_s: f64,
}

impl Window {
    pub(super) fn throughput(&self) -> f64 {
        self.lat.len() as f64 / self.elapsed_s.max(1e-9)
    }
    pub(super) fn mean_latency(&self) -> f64 {
        if self.lat.is_empty() {
            0.0
        } else {
            self.lat.iter().sum::<f64>() / self.lat.len() as f64
        }
    }
}

/// Send for `duration` from `workers` connections: closed loop when `schedule` is `None`,
/// else at the scheduled offsets (open loop; nothing is sent after the deadline).
pub(super) async fn drive(
    target: &Target,
    workers: usize,
    schedule: Option<Arc<Vec<Duration>>>,
    duration: Duration,
    max_requests: u64,
    timeout: Duration,
) -> Result<Window, LoadtestError> {
    let mut senders = Vec::with_capacity(workers);
    for _ in 0..workers {
        senders.push(target.sender(timeout).await?);
    }
    let total = match &schedule {
        Some(s) => (s.len() as u64).min(max_requests),
        None => max_requests,
    };
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now() + Duration::from_millis(20);
    let end = t0 + duration;
    let mut tasks = Vec::new();
    for mut sender in senders {
        let next = next.clone();
        let schedule = schedule.clone();
        tasks.push(tokio::spawn(async move {
            let mut w = Window::default();
            let mut last_send = t0;
            let mut last = t0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let start = if let Some(s) = &schedule {
                    let at = t0 + s[i as usize];
                    if at >= end {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    let now = Instant::now();
                    if now >= end {
                        // Due before the deadline, but every connection was busy until
                        // after it: not sent, so the run ends at the deadline.
                        w.unsent += 1;
                        continue;
                    }
                    if now > at + Duration::from_millis(2) {
                        w.late += 1;
                    }
                    at
                } else {
                    let now = Instant::now();
                    if now < t0 {
                        tokio::time::sleep_until(t0.into()).await;
                    }
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    now
                };
                w.sent += 1;
                let sent_at = Instant::now();
                last_send = last_send.max(sent_at);
                let r = sender.send().await;
                let done = Instant::now();
                last = last.max(done);
                match r {
                    Ok(()) => {
                        w.lat.push((done - start).as_secs_f64() * 1e3);
                        w.svc.push((done - sent_at).as_secs_f64() * 1e3);
                    }
                    Err(k) => *w.errors.entry(k).or_default() += 1,
                }
            }
            (w, last, last_send)
        }));
    }
    let mut out = Window::default();
    let (mut last, mut last_send) = (t0, t0);
    for t in tasks {
        let (w, l, ls) = t.await.map_err(LoadtestError::Task)?;
        out.lat.extend(w.lat);
        out.svc.extend(w.svc);
        for (k, v) in w.errors {
            *out.errors.entry(k).or_default() += v;
        }
        out.late += w.late;
        out.sent += w.sent;
        out.unsent += w.unsent;
        last = last.max(l);
        last_send = last_send.max(ls);
    }
    out.lat.sort_by(|a, b| a.total_cmp(b));
    out.svc.sort_by(|a, b| a.total_cmp(b));
    out.elapsed_s = last.saturating_duration_since(t0).as_secs_f64().max(1e-9);
    out.last_send_s = last_send.saturating_duration_since(t0).as_secs_f64();
    Ok(out)
}
