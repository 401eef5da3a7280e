//! The resource trace: the process CPU % (and normalised per core), resident memory and, on
//! CUDA builds, GPU utilisation and memory (NVML), with stage markers.
//!
//! A background thread samples `getrusage` and `/proc/self/statm` (a few µs per sample), so
//! the monitor is always on during `kiln train`: every [`FAST_INTERVAL`] for the first
//! [`FAST_PERIOD`] (a run of one second still gets a chart of 20 points), then at the
//! monitor's interval (0.5 s in training).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::util::write_atomic;

/// Resident set size of this process in KiB (Linux; `None` elsewhere).
pub fn rss_kb() -> Option<i64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(1) as i64 / 1024)
}

/// Sampling interval at the start of a trace.
pub const FAST_INTERVAL: Duration = Duration::from_millis(50);
/// How long the monitor samples at [`FAST_INTERVAL`] before slowing to its own interval.
pub const FAST_PERIOD: Duration = Duration::from_secs(2);
/// Fewest samples a chart needs to say anything; with fewer the figure says so instead.
pub const MIN_CHART_SAMPLES: usize = 5;

/// CPU time (user + system) consumed by this process, seconds: `getrusage` (microsecond
/// resolution, so 50 ms intervals read true), else `/proc/self/stat` (clock ticks).
pub fn cpu_seconds() -> Option<f64> {
    // SAFETY: `getrusage` writes into the zeroed struct it is given; no other precondition.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        return Some(tv(ru.ru_utime) + tv(ru.ru_stime));
    }
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / tick.max(1.0))
}

/// Logical cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// One sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the monitor started.
    pub t_s: f64,
    /// Process CPU use over the last interval, % of one core (can exceed 100).
    pub cpu_pct: f64,
    /// The same, % of all cores.
    pub cpu_pct_per_core: f64,
    /// Resident memory, MiB.
    pub rss_mb: f64,
    /// GPU utilisation % (CUDA builds with NVML).
    pub gpu_util_pct: Option<f64>,
    /// GPU memory used, MiB (CUDA builds with NVML).
    pub gpu_mem_mb: Option<f64>,
    /// The stage running when the sample was taken.
    pub stage: String,
}

/// A labelled point in time (a stage start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// Seconds since the monitor started.
    pub t_s: f64,
    /// Label.
    pub label: String,
}

/// The whole trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Samples in time order.
    pub samples: Vec<Sample>,
    /// Stage boundaries.
    pub markers: Vec<Marker>,
}

impl Trace {
    /// Median of the per-core CPU % over all samples.
    pub fn median_cpu_per_core(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().map(|s| s.cpu_pct_per_core).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    /// Largest RSS, MiB.
    pub fn peak_rss_mb(&self) -> f64 {
        self.samples.iter().map(|s| s.rss_mb).fold(0.0, f64::max)
    }

    /// A trace read back from [`Trace::to_csv`]'s text (samples only: markers are not in
    /// the CSV, the `stage` column is). `None` when the header is not this format's; lines
    /// that do not parse (a torn last line) are skipped.
    pub fn from_csv(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()? != CSV_HEADER {
            return None;
        }
        let num = |c: &str| c.parse::<f64>().ok();
        let samples = lines
            .filter_map(|l| {
                let c: Vec<&str> = l.splitn(7, ',').collect();
                if c.len() != 7 {
                    return None;
                }
                Some(Sample {
                    t_s: num(c[0])?,
                    cpu_pct: num(c[1])?,
                    cpu_pct_per_core: num(c[2])?,
                    rss_mb: num(c[3])?,
                    gpu_util_pct: num(c[4]),
                    gpu_mem_mb: num(c[5]),
                    stage: c[6].to_string(),
                })
            })
            .collect();
        Some(Self {
            samples,
            markers: Vec::new(),
        })
    }

    /// This trace followed by `later` (a resumed process's, timed from its own start): the
    /// later samples and markers shifted to start where this trace ends, with a `resumed`
    /// marker at the join.
    pub fn followed_by(&self, later: &Trace) -> Trace {
        let offset = self
            .samples
            .last()
            .map(|s| s.t_s)
            .into_iter()
            .chain(self.markers.last().map(|m| m.t_s))
            .fold(0.0, f64::max);
        let mut out = self.clone();
        out.markers.push(Marker {
            t_s: offset,
            label: "resumed".into(),
        });
        out.samples.extend(later.samples.iter().map(|s| Sample {
            t_s: s.t_s + offset,
            ..s.clone()
        }));
        out.markers.extend(later.markers.iter().map(|m| Marker {
            t_s: m.t_s + offset,
            label: m.label.clone(),
        }));
        out
    }

    /// CSV text.
    pub fn to_csv(&self) -> String {
        let mut s = format!("{CSV_HEADER}\n");
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_default();
        for x in &self.samples {
            s.push_str(&format!(
                "{:.3},{:.1},{:.1},{:.1},{},{},{}\n",
                x.t_s,
                x.cpu_pct,
                x.cpu_pct_per_core,
                x.rss_mb,
                opt(x.gpu_util_pct),
                opt(x.gpu_mem_mb),
                x.stage
            ));
        }
        s
    }
}

/// The header line of `resources.csv`.
pub const CSV_HEADER: &str = "t_s,cpu_pct,cpu_pct_per_core,rss_mb,gpu_util_pct,gpu_mem_mb,stage";

struct Shared {
    trace: Trace,
    stage: String,
}

/// GPU readings, when available.
trait GpuProbe: Send {
    fn read(&mut self) -> (Option<f64>, Option<f64>);
}

struct NoGpu;

impl GpuProbe for NoGpu {
    fn read(&mut self) -> (Option<f64>, Option<f64>) {
        (None, None)
    }
}

#[cfg(feature = "cuda")]
struct Nvml {
    nvml: nvml_wrapper::Nvml,
}

#[cfg(feature = "cuda")]
impl GpuProbe for Nvml {
    fn read(&mut self) -> (Option<f64>, Option<f64>) {
        match self.nvml.device_by_index(0) {
            Ok(d) => (
                d.utilization_rates().ok().map(|u| u.gpu as f64),
                d.memory_info()
                    .ok()
                    .map(|m| m.used as f64 / (1024.0 * 1024.0)),
            ),
            Err(_) => (None, None),
        }
    }
}

fn gpu_probe() -> Box<dyn GpuProbe> {
    #[cfg(feature = "cuda")]
    if let Ok(nvml) = nvml_wrapper::Nvml::init() {
        return Box::new(Nvml { nvml });
    }
    Box::new(NoGpu)
}

/// GPU memory in use on device 0, MiB: CUDA builds with NVML; `None` elsewhere. The probe
/// is opened once per calling thread.
pub fn gpu_memory_mb() -> Option<f64> {
    thread_local! {
        static PROBE: RefCell<Option<Box<dyn GpuProbe>>> = const { RefCell::new(None) };
    }
    PROBE.with(|p| p.borrow_mut().get_or_insert_with(gpu_probe).read().1)
}

/// How long the sampler waits before its next sample, `elapsed` after the monitor started.
fn next_wait(elapsed: Duration, interval: Duration) -> Duration {
    if elapsed < FAST_PERIOD {
        interval.min(FAST_INTERVAL)
    } else {
        interval
    }
}

/// A running monitor.
pub struct Monitor {
    shared: Arc<Mutex<Shared>>,
    stop: Option<Sender<()>>,
    handle: Option<JoinHandle<()>>,
    start: Instant,
}

impl Monitor {
    /// Start sampling: every [`FAST_INTERVAL`] (or `interval`, if shorter) for the first
    /// [`FAST_PERIOD`], then every `interval`.
    pub fn start(interval: Duration) -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            trace: Trace::default(),
            stage: String::new(),
        }));
        let (tx, rx) = channel();
        let start = Instant::now();
        let s2 = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("kiln-resources".into())
            .spawn(move || sample_loop(s2, rx, interval, start))
            .expect("spawning the resource monitor");
        Self {
            shared,
            stop: Some(tx),
            handle: Some(handle),
            start,
        }
    }

    /// Samples taken so far.
    pub fn sample_count(&self) -> usize {
        self.shared.lock().map_or(0, |s| s.trace.samples.len())
    }

    /// Mark the start of a stage.
    pub fn mark(&self, label: &str) {
        if let Ok(mut s) = self.shared.lock() {
            s.stage = label.to_string();
            s.trace.markers.push(Marker {
                t_s: self.start.elapsed().as_secs_f64(),
                label: label.to_string(),
            });
        }
    }

    /// The trace so far (sampling goes on).
    pub fn current(&self) -> Trace {
        self.shared
            .lock()
            .map(|s| s.trace.clone())
            .unwrap_or_default()
    }

    /// Stop sampling (taking one last sample) and return the trace.
    pub fn stop(mut self) -> Trace {
        self.halt();
        self.shared
            .lock()
            .map(|s| s.trace.clone())
            .unwrap_or_default()
    }

    fn halt(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.halt();
    }
}

fn sample_loop(shared: Arc<Mutex<Shared>>, stop: Receiver<()>, interval: Duration, start: Instant) {
    let mut gpu = gpu_probe();
    let n = cores() as f64;
    let mut last_t = Instant::now();
    let mut last_cpu = cpu_seconds().unwrap_or(0.0);
    loop {
        let finished = match stop.recv_timeout(next_wait(start.elapsed(), interval)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => false,
        };
        let now = Instant::now();
        let cpu = cpu_seconds().unwrap_or(last_cpu);
        let dt = now.duration_since(last_t).as_secs_f64();
        if dt > 1e-3 {
            let pct = 100.0 * (cpu - last_cpu) / dt;
            let (gu, gm) = gpu.read();
            if let Ok(mut s) = shared.lock() {
                let stage = s.stage.clone();
                s.trace.samples.push(Sample {
                    t_s: now.duration_since(start).as_secs_f64(),
                    cpu_pct: pct,
                    cpu_pct_per_core: pct / n,
                    rss_mb: rss_kb().unwrap_or(0) as f64 / 1024.0,
                    gpu_util_pct: gu,
                    gpu_mem_mb: gm,
                    stage,
                });
            }
        }
        last_t = now;
        last_cpu = cpu;
        if finished {
            break;
        }
    }
}

/// Write only `resources.csv` into `dir` (atomically): what a run keeps up to date while it
/// trains, so that a killed run leaves its trace for `--resume` to continue.
pub fn write_trace_csv(trace: &Trace, dir: &Path) -> std::io::Result<PathBuf> {
    let csv = dir.join("resources.csv");
    write_atomic(&csv, trace.to_csv().as_bytes())?;
    Ok(csv)
}

/// The trace an earlier process of the run in `dir` left in `resources.csv` (`None`
/// without one, or when it is not this format's).
pub fn read_trace(dir: &Path) -> Option<Trace> {
    Trace::from_csv(&std::fs::read_to_string(dir.join("resources.csv")).ok()?)
}

/// Write `resources.csv`, `resources.svg` and `resources.png` into `dir`.
pub fn write_trace(trace: &Trace, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let csv = dir.join("resources.csv");
    write_atomic(&csv, trace.to_csv().as_bytes())?;
    #[cfg(feature = "plots")]
    {
        let (svg, png) = figure(trace).save(&dir.join("resources"))?;
        Ok(vec![csv, svg, png])
    }
    #[cfg(not(feature = "plots"))]
    Ok(vec![csv])
}

/// The article's figure: memory and CPU over time, stage boundaries marked.
#[cfg(feature = "plots")]
pub fn figure(trace: &Trace) -> super::plot::Figure {
    use super::plot::{Color, Figure, Panel, Series, VLine};
    let pts = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        trace.samples.iter().map(|s| (s.t_s, f(s))).collect()
    };
    let vlines: Vec<VLine> = trace
        .markers
        .iter()
        .map(|m| VLine {
            x: m.t_s,
            label: m.label.clone(),
        })
        .collect();
    let mut mem = Panel::new("Resident memory", "time (s)", "RSS (MiB)").series(Series::line(
        "RSS",
        Color::BLUE,
        pts(&|s| s.rss_mb),
    ));
    let mut cpu = Panel::new("CPU", "time (s)", "CPU (% of all cores)").series(Series::line(
        "process CPU",
        Color::ORANGE,
        pts(&|s| s.cpu_pct_per_core),
    ));
    if trace.samples.iter().any(|s| s.gpu_util_pct.is_some()) {
        cpu = cpu.series(Series::line(
            "GPU util",
            Color::GREEN,
            pts(&|s| s.gpu_util_pct.unwrap_or(0.0)),
        ));
    }
    cpu.y_range = Some((0.0, 100.0));
    // Memory from zero, so a plateau reads as a plateau rather than as noise.
    mem.y_range = Some((0.0, (trace.peak_rss_mb() * 1.15).max(1.0)));
    for v in &vlines {
        mem = mem.vline(v.x, v.label.clone());
        cpu = cpu.vline(v.x, v.label.clone());
    }
    let median = trace.median_cpu_per_core().unwrap_or(0.0);
    let n = trace.samples.len();
    let title = if n < MIN_CHART_SAMPLES {
        // Too few points to chart: say so rather than quote a "peak" and a "median" of one.
        format!(
            "Resource trace: too few samples to chart ({n} < {MIN_CHART_SAMPLES}; the run lasted {:.2} s)",
            trace.samples.last().map_or(0.0, |s| s.t_s)
        )
    } else {
        format!(
            "Resource trace: peak RSS {:.0} MiB, median CPU {:.0}% of {} cores ({n} samples)",
            trace.peak_rss_mb(),
            median,
            cores()
        )
    };
    Figure {
        title,
        width: 960,
        height: 640,
        panels: vec![mem, cpu],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_readings_are_sane() {
        let rss = rss_kb().unwrap();
        assert!(rss > 1000, "{rss} KiB");
        let t0 = cpu_seconds().unwrap();
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(cpu_seconds().unwrap() >= t0, "{x}");
    }

    #[test]
    fn a_one_second_run_is_sampled_at_least_ten_times() {
        // The schedule: how many samples fall within the first second at the training interval.
        let interval = Duration::from_millis(500);
        let (mut t, mut n) = (Duration::ZERO, 0);
        loop {
            t += next_wait(t, interval);
            if t > Duration::from_secs(1) {
                break;
            }
            n += 1;
        }
        assert!(n >= 10, "{n} samples in the first second");
        assert_eq!(next_wait(Duration::from_secs(60), interval), interval);
        // The sampler follows it: the first samples are FAST_INTERVAL apart (never closer;
        // a loaded machine can only make them later, so this waits instead of timing).
        let m = Monitor::start(interval);
        let deadline = Instant::now() + Duration::from_secs(60);
        while m.sample_count() < 10 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let t = m.stop();
        assert!(t.samples.len() >= 10, "{}", t.samples.len());
        // All but the last sample, which `stop` takes at once.
        let scheduled = &t.samples[..t.samples.len() - 1];
        let early: Vec<&Sample> = scheduled.iter().filter(|s| s.t_s < 1.9).collect();
        for w in early.windows(2) {
            let gap = w[1].t_s - w[0].t_s;
            assert!(gap >= 0.045, "gap {gap} s");
        }
    }

    #[cfg(feature = "plots")]
    #[test]
    fn a_trace_round_trips_through_its_csv_and_a_resumed_one_continues_it() {
        let sample = |t_s: f64, stage: &str| Sample {
            t_s,
            cpu_pct: 50.0,
            cpu_pct_per_core: 25.0,
            rss_mb: 100.5,
            gpu_util_pct: None,
            gpu_mem_mb: Some(3.0),
            stage: stage.into(),
        };
        let first = Trace {
            samples: vec![sample(0.0, "mean"), sample(0.5, "mean")],
            markers: Vec::new(),
        };
        let back = Trace::from_csv(&first.to_csv()).unwrap();
        assert_eq!(back, first);
        let later = Trace {
            samples: vec![sample(0.1, "variance")],
            markers: vec![Marker {
                t_s: 0.05,
                label: "variance".into(),
            }],
        };
        let joined = first.followed_by(&later);
        let t: Vec<f64> = joined.samples.iter().map(|s| s.t_s).collect();
        assert_eq!(t, [0.0, 0.5, 0.6]);
        assert_eq!(joined.markers[0].label, "resumed");
        assert_eq!(joined.markers[0].t_s, 0.5);
        assert_eq!(joined.markers[1].t_s, 0.55);
        assert!(Trace::from_csv("something,else\n1,2\n").is_none());
    }

    #[test]
    fn a_chart_with_too_few_samples_says_so() {
        let sample = |t_s: f64| Sample {
            t_s,
            cpu_pct: 50.0,
            cpu_pct_per_core: 25.0,
            rss_mb: 100.0,
            gpu_util_pct: None,
            gpu_mem_mb: None,
            stage: "mean".into(),
        };
        let short = Trace {
            samples: vec![sample(0.4)],
            markers: Vec::new(),
        };
        let title = figure(&short).title;
        assert!(title.contains("too few samples"), "{title}");
        assert!(
            !title.contains("peak") && !title.contains("median"),
            "{title}"
        );
        let long = Trace {
            samples: (0..12).map(|i| sample(i as f64 * 0.05)).collect(),
            markers: Vec::new(),
        };
        let title = figure(&long).title;
        assert!(
            title.contains("peak RSS 100 MiB") && title.contains("12 samples"),
            "{title}"
        );
    }

    #[test]
    fn monitor_samples_and_marks_stages() {
        let m = Monitor::start(Duration::from_millis(20));
        m.mark("mean");
        // Spin until this thread has really run (CPU time, not wall time, so a loaded machine
        // only makes the test longer) and several sampling intervals have passed.
        let (start, cpu0) = (Instant::now(), cpu_seconds().unwrap());
        while (start.elapsed() < Duration::from_millis(200) || cpu_seconds().unwrap() - cpu0 < 0.1)
            && start.elapsed() < Duration::from_secs(20)
        {
            std::hint::black_box(start.elapsed());
        }
        m.mark("variance");
        std::thread::sleep(Duration::from_millis(60));
        let t = m.stop();
        assert!(t.samples.len() >= 3, "{}", t.samples.len());
        assert_eq!(t.markers.len(), 2);
        assert!(t.samples.iter().any(|s| s.stage == "variance"));
        assert!(t.samples.windows(2).all(|w| w[0].t_s <= w[1].t_s));
        let busy = t
            .samples
            .iter()
            .filter(|s| s.stage == "mean")
            .map(|s| s.cpu_pct)
            .fold(0.0, f64::max);
        assert!(busy > 0.0, "a spinning thread shows CPU use: {busy}");
        let csv = t.to_csv();
        assert_eq!(csv.lines().count(), t.samples.len() + 1);
    }
}
