//! The scheduled profiler, built on `tracing` spans.
//!
//! Code marks its phases with spans under the target `kiln::prof` (see [`crate::prof_span!`]):
//! the training step and its parts (data wait, host-to-device copy, forward, loss, backward,
//! clipping, optimizer step), validation, and every module's forward (named by module path,
//! e.g. `RegressionNet/backbone/0`). A [`ProfilerLayer`] in the global subscriber turns them
//! into timed events while the [`Schedule`] says *record*:
//!
//! * **off** (outside the window, or profiling disabled): each span site costs one dynamic
//!   filter check (an atomic load); no span is created;
//! * **warm-up**: spans are live, nothing is kept;
//! * **record**: enter/exit times (and optionally RSS deltas, source locations and shapes) are
//!   kept; at the end of each phase the device is synchronised ([`sync`]), so on CUDA a span
//!   measures kernel time, not launch time.
//!
//! When the window ends the profiler writes a Chrome trace-event file (`trace.json`, opens in
//! Perfetto or chrome://tracing: one track per thread, named by process and thread metadata
//! events, so the data loader's workers show beside the training thread; with
//! `profile_memory`, resident and GPU memory as counter tracks) and a key-averages table (`key_averages.txt` / `.json`: calls,
//! total, self, average, % of step), like `torch.profiler`'s `key_averages().table()`.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::schedule::{Action, Schedule};
use crate::util::write_atomic;

/// The span target the profiler listens to.
pub const TARGET: &str = "kiln::prof";

static ARMED: AtomicBool = AtomicBool::new(false);
static RECORDING: AtomicBool = AtomicBool::new(false);
static STEP: AtomicU64 = AtomicU64::new(0);
static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
/// The name of each thread that has recorded a span, by its small id.
static THREAD_NAMES: Mutex<BTreeMap<u64, String>> = Mutex::new(BTreeMap::new());

thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
}

fn thread_id() -> u64 {
    TID.with(|t| {
        if t.get() == 0 {
            let id = NEXT_TID.fetch_add(1, Ordering::Relaxed);
            t.set(id);
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {id}"), str::to_string);
            if let Ok(mut names) = THREAD_NAMES.lock() {
                names.insert(id, name);
            }
        }
        t.get()
    })
}

/// The names of the threads with these ids (`thread N` for unnamed threads).
fn thread_names(ids: impl IntoIterator<Item = u64>) -> BTreeMap<u64, String> {
    let known = THREAD_NAMES.lock().map(|g| g.clone()).unwrap_or_default();
    ids.into_iter()
        .map(|id| {
            let name = known
                .get(&id)
                .cloned()
                .unwrap_or_else(|| format!("thread {id}"));
            (id, name)
        })
        .collect()
}

/// Options of a recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Keep span fields (tensor shapes) as event arguments and group the table by them.
    pub record_shapes: bool,
    /// Record the resident-set-size change over each span.
    pub profile_memory: bool,
    /// Record each span's source location.
    pub with_stack: bool,
}

/// One recorded span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Span name, or the module path for module spans.
    pub name: String,
    /// `module` or `phase`.
    pub cat: String,
    /// Start, µs since the recording began.
    pub ts_us: f64,
    /// Duration, µs.
    pub dur_us: f64,
    /// Thread (small integer).
    pub tid: u64,
    /// Optimizer step (or iteration) it belongs to.
    pub step: u64,
    /// Shapes and source location (when recorded).
    pub args: BTreeMap<String, String>,
}

/// A memory reading, drawn as counter tracks (Chrome trace phase `C`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CounterSample {
    /// Time, µs since the recording began.
    pub ts_us: f64,
    /// Resident set size of the process, MiB.
    pub rss_mb: Option<f64>,
    /// GPU memory in use, MiB (CUDA builds with NVML).
    pub gpu_mem_mb: Option<f64>,
}

/// What one recording holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    /// The timed spans, in the order they ended.
    pub events: Vec<Event>,
    /// Memory readings (with `profile_memory`): at every span's start and end (RSS) and at
    /// every step boundary (RSS and GPU memory).
    pub counters: Vec<CounterSample>,
    /// The name of each thread in `events`, by id.
    pub threads: BTreeMap<u64, String>,
}

/// The default byte cap of one recording ([`StepProfiler::with_max_bytes`]): 64 MiB.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// Bytes a `BTreeMap` entry costs beyond its key and value (its share of a node).
const MAP_ENTRY_OVERHEAD: usize = 16;

struct Recorder {
    origin: Instant,
    opts: Options,
    events: Vec<Event>,
    counters: Vec<CounterSample>,
    /// Most events (and, separately, counter samples) kept; later ones are counted only.
    max_events: usize,
    /// Most bytes the recording holds, by [`Recorder::bytes`]; later events are counted only.
    max_bytes: usize,
    /// Heap bytes of the kept events' strings and argument maps.
    heap: usize,
    /// Events and counter samples not kept because a cap was reached.
    dropped: u64,
}

/// Heap bytes `e` owns beyond its slot in the events vector: its strings' buffers and its
/// argument map's entries.
fn event_heap_bytes(e: &Event) -> usize {
    let entry = 2 * std::mem::size_of::<String>() + MAP_ENTRY_OVERHEAD;
    e.name.capacity()
        + e.cat.capacity()
        + e.args
            .iter()
            .map(|(k, v)| entry + k.capacity() + v.capacity())
            .sum::<usize>()
}

impl Recorder {
    fn new(opts: Options) -> Self {
        Self {
            origin: Instant::now(),
            opts,
            events: Vec::new(),
            counters: Vec::new(),
            max_events: usize::MAX,
            max_bytes: DEFAULT_MAX_BYTES,
            heap: 0,
            dropped: 0,
        }
    }

    /// What the recording holds, by its own accounting: both vectors' allocated capacity
    /// plus the kept events' heap ([`event_heap_bytes`]). Never above `max_bytes`.
    fn bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<Event>()
            + self.counters.capacity() * std::mem::size_of::<CounterSample>()
            + self.heap
    }

    /// Make room in `v` for one more item of `extra` heap bytes within `max_bytes` (growing
    /// by doubling while that fits, then by what still fits); false when it does not fit.
    fn room<T>(v: &mut Vec<T>, used: usize, extra: usize, max_bytes: usize) -> bool {
        let size = std::mem::size_of::<T>().max(1);
        if v.len() < v.capacity() {
            return used + extra <= max_bytes;
        }
        let Some(free) = max_bytes.checked_sub(used + extra) else {
            return false;
        };
        let fits = free / size;
        if fits == 0 {
            return false;
        }
        let want = v.capacity().max(64).min(fits);
        v.reserve_exact(want);
        true
    }

    /// Keep `e` unless a cap is reached (then count it as dropped).
    fn push(&mut self, e: Event) {
        let extra = event_heap_bytes(&e);
        let used = self.bytes();
        if self.events.len() < self.max_events
            && Self::room(&mut self.events, used, extra, self.max_bytes)
        {
            self.events.push(e);
            self.heap += extra;
        } else {
            self.dropped += 1;
        }
    }

    /// Keep a memory sample unless a cap is reached (then count it as dropped).
    fn push_counter(&mut self, c: CounterSample) {
        let used = self.bytes();
        if self.counters.len() < self.max_events
            && Self::room(&mut self.counters, used, 0, self.max_bytes)
        {
            self.counters.push(c);
        } else {
            self.dropped += 1;
        }
    }

    fn now_us(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.origin).as_secs_f64() * 1e6
    }
}

/// Record the process RSS (and, when `gpu`, GPU memory) at `at`, if memory is profiled.
fn sample_memory(at: Instant, gpu: bool) {
    let Ok(mut guard) = RECORDER.lock() else {
        return;
    };
    let Some(rec) = guard.as_mut() else { return };
    if !rec.opts.profile_memory {
        return;
    }
    let sample = CounterSample {
        ts_us: rec.now_us(at),
        rss_mb: super::resources::rss_kb().map(|kb| kb as f64 / 1024.0),
        gpu_mem_mb: if gpu {
            super::resources::gpu_memory_mb()
        } else {
            None
        },
    };
    rec.push_counter(sample);
}

/// Per-span data kept in the registry's extensions while recording.
struct Timing {
    name: String,
    cat: &'static str,
    args: BTreeMap<String, String>,
    start: Option<Instant>,
}

struct FieldCollector<'a> {
    name: &'a mut Option<String>,
    args: &'a mut BTreeMap<String, String>,
}

impl Visit for FieldCollector<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "path" {
            *self.name = Some(value.to_string());
        } else {
            self.args
                .insert(field.name().to_string(), value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "path" {
            *self.name = Some(v.trim_matches('"').to_string());
        } else {
            self.args.insert(field.name().to_string(), v);
        }
    }
}

/// The `tracing` layer that times `kiln::prof` spans while recording.
pub struct ProfilerLayer;

/// Whether a callsite belongs to the profiler.
pub fn is_profiler_callsite(meta: &Metadata<'_>) -> bool {
    meta.target() == TARGET
}

/// The per-layer filter: profiler spans only, and only while armed.
pub fn profiler_filter(meta: &Metadata<'_>) -> bool {
    is_profiler_callsite(meta) && ARMED.load(Ordering::Relaxed)
}

impl<S> Layer<S> for ProfilerLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !RECORDING.load(Ordering::Relaxed) {
            return;
        }
        let opts = match RECORDER.lock() {
            Ok(g) => match g.as_ref() {
                Some(r) => r.opts,
                None => return,
            },
            Err(_) => return,
        };
        let meta = attrs.metadata();
        let mut name = None;
        let mut args = BTreeMap::new();
        attrs.record(&mut FieldCollector {
            name: &mut name,
            args: &mut args,
        });
        if !opts.record_shapes {
            args.clear();
        }
        if opts.with_stack
            && let (Some(file), Some(line)) = (meta.file(), meta.line())
        {
            args.insert("source".into(), format!("{file}:{line}"));
        }
        let cat = if name.is_some() { "module" } else { "phase" };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Timing {
                name: name.unwrap_or_else(|| meta.name().to_string()),
                cat,
                args,
                start: None,
            });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(t) = span.extensions_mut().get_mut::<Timing>()
        {
            sample_memory(Instant::now(), false);
            t.start = Some(Instant::now());
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let end = Instant::now();
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(t) = ext.get_mut::<Timing>() else {
            return;
        };
        let Some(start) = t.start.take() else { return };
        let Ok(mut guard) = RECORDER.lock() else {
            return;
        };
        let Some(rec) = guard.as_mut() else { return };
        rec.push(Event {
            name: t.name.clone(),
            cat: t.cat.to_string(),
            ts_us: rec.now_us(start),
            dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            tid: thread_id(),
            step: STEP.load(Ordering::Relaxed),
            args: t.args.clone(),
        });
        drop(guard);
        sample_memory(end, false);
    }
}

/// Synchronise the device when recording, so the enclosing span measures completed work.
/// Costs one atomic load otherwise.
#[inline]
pub fn sync<B: burn::tensor::backend::Backend>(device: &B::Device) {
    if RECORDING.load(Ordering::Relaxed) {
        let _ = B::sync(device);
    }
}

/// Record a phase that began at `start` and ended at `end`, as if a span on this thread had
/// covered it, when a recording is on (for intervals no span can cover: a request's wait in
/// a queue, begun on the request's thread and ended by the worker that takes it). Costs one
/// atomic load otherwise.
#[inline]
pub fn record_interval(name: &str, start: Instant, end: Instant) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let tid = thread_id();
    let Ok(mut guard) = RECORDER.lock() else {
        return;
    };
    let Some(rec) = guard.as_mut() else { return };
    rec.push(Event {
        name: name.to_string(),
        cat: "phase".into(),
        ts_us: rec.now_us(start),
        dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
        tid,
        step: STEP.load(Ordering::Relaxed),
        args: BTreeMap::new(),
    });
}

/// Whether spans are currently recorded.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

fn set_action(action: Action) {
    let armed = action != Action::Off;
    RECORDING.store(action == Action::Record, Ordering::SeqCst);
    if ARMED.swap(armed, Ordering::SeqCst) != armed {
        // The per-layer filter's answer is cached per callsite (`Interest::always`/`never`),
        // which is what makes disarmed spans free; re-evaluate it when arming or disarming.
        tracing::callsite::rebuild_interest_cache();
    }
}

/// Drives one recording through a schedule and writes its outputs.
pub struct StepProfiler {
    schedule: Schedule,
    out_dir: PathBuf,
    step_name: String,
    done: bool,
    dropped: u64,
    bytes: usize,
}

impl StepProfiler {
    /// Start a profiler that records according to `schedule` into `out_dir`. Only one
    /// recording exists per process at a time.
    pub fn new(schedule: Schedule, opts: Options, out_dir: PathBuf, step_name: &str) -> Self {
        if let Ok(mut g) = RECORDER.lock() {
            *g = Some(Recorder::new(opts));
        }
        Self {
            schedule,
            out_dir,
            step_name: step_name.to_string(),
            done: false,
            dropped: 0,
            bytes: 0,
        }
    }

    /// Keep at most `max` events (and at most `max` memory samples): a recording's memory
    /// is bounded whatever the load; what comes after the cap is counted in
    /// [`StepProfiler::dropped`] and not kept.
    pub fn with_max_events(self, max: usize) -> Self {
        if let Ok(mut g) = RECORDER.lock()
            && let Some(rec) = g.as_mut()
        {
            rec.max_events = max;
        }
        self
    }

    /// Hold at most `max` bytes (default [`DEFAULT_MAX_BYTES`], 64 MiB) by the recording's
    /// own accounting: its vectors' allocated capacity plus every kept event's strings and
    /// argument map. Events and memory samples that would go past it are counted in
    /// [`StepProfiler::dropped`] and not kept; the memory is freed (and, with glibc, trimmed
    /// back to the system) when the recording finishes.
    pub fn with_max_bytes(self, max: usize) -> Self {
        if let Ok(mut g) = RECORDER.lock()
            && let Some(rec) = g.as_mut()
        {
            rec.max_bytes = max;
        }
        self
    }

    /// The most bytes the recording held (by the accounting of
    /// [`StepProfiler::with_max_bytes`]; known once it has finished).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Events and memory samples not kept because of [`StepProfiler::with_max_events`] or
    /// [`StepProfiler::with_max_bytes`] (known once the recording has finished).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Call at the start of every step (optimizer step or inference iteration). Returns the
    /// outputs when this step ends the recording window.
    pub fn on_step(&mut self, step: u64) -> std::io::Result<Option<ProfileOutputs>> {
        if self.done {
            return Ok(None);
        }
        if step >= self.schedule.end() {
            // Spans still ending on other threads (loader workers) keep the last recorded
            // step rather than one outside the window.
            return self.finish();
        }
        STEP.store(step, Ordering::Relaxed);
        let action = self.schedule.action(step);
        set_action(action);
        if action == Action::Record {
            sample_memory(Instant::now(), true);
        }
        Ok(None)
    }

    /// Stop recording and write what was recorded (idempotent).
    pub fn finish(&mut self) -> std::io::Result<Option<ProfileOutputs>> {
        if self.done {
            return Ok(None);
        }
        self.done = true;
        if RECORDING.load(Ordering::Relaxed) {
            sample_memory(Instant::now(), true);
        }
        set_action(Action::Off);
        let Some(rec) = RECORDER.lock().ok().and_then(|mut g| g.take()) else {
            return Ok(None);
        };
        self.dropped = rec.dropped;
        self.bytes = rec.bytes();
        if rec.events.is_empty() {
            drop(rec);
            return_freed_memory();
            return Ok(None);
        }
        let threads = thread_names(rec.events.iter().map(|e| e.tid));
        let recording = Recording {
            events: rec.events,
            counters: rec.counters,
            threads,
        };
        let written = write_outputs(&recording, &self.out_dir, &self.step_name).map(Some);
        drop(recording);
        return_freed_memory();
        written
    }
}

/// Hand the heap freed by a finished recording back to the system (glibc keeps freed
/// memory in its arenas otherwise, and the process's RSS stays at the recording's peak).
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory at the top of glibc's heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Drop for StepProfiler {
    fn drop(&mut self) {
        if !self.done {
            set_action(Action::Off);
            if let Ok(mut g) = RECORDER.lock() {
                *g = None;
            }
        }
    }
}

/// One row of the key-averages table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyAverage {
    /// Span or module name.
    pub name: String,
    /// Shapes (when recorded).
    #[serde(default)]
    pub shapes: Option<String>,
    /// Number of spans.
    pub calls: u64,
    /// Total µs.
    pub total_us: f64,
    /// Total minus the time of spans nested directly inside, µs.
    pub self_us: f64,
    /// Mean µs per call.
    pub avg_us: f64,
    /// Total as a share of the step spans' total time (%).
    pub pct_of_step: f64,
}

/// The key-averages table of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyAverages {
    /// The span that delimits a step (`train_step`, `infer_step`).
    pub step_name: String,
    /// Steps recorded.
    pub steps: u64,
    /// Total µs of the step spans.
    pub step_total_us: f64,
    /// Rows, sorted by total time.
    pub rows: Vec<KeyAverage>,
}

/// Sort orders of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Total time.
    Total,
    /// Self time.
    SelfTime,
}

/// Self time of each event: its duration minus its direct children's (same thread, nested).
pub fn self_times(events: &[Event]) -> Vec<f64> {
    let mut self_us: Vec<f64> = events.iter().map(|e| e.dur_us).collect();
    let mut by_thread: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        by_thread.entry(e.tid).or_default().push(i);
    }
    for idx in by_thread.values_mut() {
        idx.sort_by(|&a, &b| {
            events[a]
                .ts_us
                .total_cmp(&events[b].ts_us)
                .then(events[b].dur_us.total_cmp(&events[a].dur_us))
        });
        let mut stack: Vec<usize> = Vec::new();
        for &i in idx.iter() {
            let s = events[i].ts_us;
            while let Some(&top) = stack.last() {
                let top_end = events[top].ts_us + events[top].dur_us;
                if s >= top_end - 1e-6 {
                    stack.pop();
                } else {
                    break;
                }
            }
            if let Some(&parent) = stack.last() {
                self_us[parent] -= events[i].dur_us;
            }
            stack.push(i);
        }
    }
    self_us.iter().map(|v| v.max(0.0)).collect()
}

/// Aggregate events into the key-averages table.
pub fn key_averages(events: &[Event], step_name: &str) -> KeyAverages {
    let selfs = self_times(events);
    let mut rows: BTreeMap<(String, Option<String>), KeyAverage> = BTreeMap::new();
    let (mut steps, mut step_total) = (0u64, 0.0f64);
    for (e, s) in events.iter().zip(&selfs) {
        if e.name == step_name {
            steps += 1;
            step_total += e.dur_us;
        }
        let shapes = e.args.get("shape").cloned();
        let row = rows
            .entry((e.name.clone(), shapes.clone()))
            .or_insert_with(|| KeyAverage {
                name: e.name.clone(),
                shapes,
                calls: 0,
                total_us: 0.0,
                self_us: 0.0,
                avg_us: 0.0,
                pct_of_step: 0.0,
            });
        row.calls += 1;
        row.total_us += e.dur_us;
        row.self_us += s;
    }
    let mut rows: Vec<KeyAverage> = rows.into_values().collect();
    for r in &mut rows {
        r.avg_us = r.total_us / r.calls.max(1) as f64;
        r.pct_of_step = if step_total > 0.0 {
            100.0 * r.total_us / step_total
        } else {
            0.0
        };
    }
    rows.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    KeyAverages {
        step_name: step_name.to_string(),
        steps,
        step_total_us: step_total,
        rows,
    }
}

impl KeyAverages {
    /// The table as text, sorted as asked, at most `limit` rows.
    pub fn table(&self, sort: SortBy, limit: usize) -> String {
        let mut rows = self.rows.clone();
        match sort {
            SortBy::Total => rows.sort_by(|a, b| b.total_us.total_cmp(&a.total_us)),
            SortBy::SelfTime => rows.sort_by(|a, b| b.self_us.total_cmp(&a.self_us)),
        }
        let shapes = rows.iter().any(|r| r.shapes.is_some());
        let mut s = format!(
            "{:<34} {:>7} {:>12} {:>12} {:>10} {:>8}{}\n",
            "name",
            "calls",
            "total µs",
            "self µs",
            "avg µs",
            "% step",
            if shapes { "  shapes" } else { "" }
        );
        for r in rows.iter().take(limit) {
            s.push_str(&format!(
                "{:<34} {:>7} {:>12.1} {:>12.1} {:>10.2} {:>7.1}%{}\n",
                truncate(&r.name, 34),
                r.calls,
                r.total_us,
                r.self_us,
                r.avg_us,
                r.pct_of_step,
                r.shapes
                    .as_ref()
                    .map(|x| format!("  {x}"))
                    .unwrap_or_default()
            ));
        }
        s.push_str(&format!(
            "{} {} steps, {:.1} µs per step\n",
            self.step_name,
            self.steps,
            self.step_total_us / self.steps.max(1) as f64
        ));
        s
    }

    /// Read a saved table.
    pub fn load(path: &Path) -> Result<Self, TableError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TableError(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| {
            TableError(format!(
                "{}:{}:{}: not a kiln key-averages table: {e}",
                path.display(),
                e.line(),
                e.column()
            ))
        })
    }
}

/// A key-averages table that could not be read (the message names the file and position).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TableError(pub String);

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 1).collect();
        format!("{t}…")
    }
}

/// The Chrome trace-event JSON of a recording: metadata events (`M`) naming the process
/// (`process`) and each thread, one complete event (`X`) per span, and counter events (`C`)
/// for resident memory (`RSS (MiB)`) and GPU memory (`GPU memory (MiB)`).
pub fn chrome_trace(rec: &Recording, process: &str) -> serde_json::Value {
    let pid = std::process::id();
    let mut trace = vec![serde_json::json!({
        "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": {"name": process},
    })];
    // Tracks ordered by how many spans they hold: the thread that runs the steps on top,
    // helpers (loader workers) below it.
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for e in &rec.events {
        *count.entry(e.tid).or_default() += 1;
    }
    let mut tids: Vec<(u64, usize)> = count.into_iter().collect();
    tids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (rank, &(tid, _)) in tids.iter().enumerate() {
        let name = rec
            .threads
            .get(&tid)
            .cloned()
            .unwrap_or_else(|| format!("thread {tid}"));
        trace.push(serde_json::json!({
            "name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
            "args": {"name": name},
        }));
        trace.push(serde_json::json!({
            "name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
            "args": {"sort_index": rank},
        }));
    }
    trace.extend(rec.events.iter().map(|e| {
        let mut args: serde_json::Map<String, serde_json::Value> = e
            .args
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        args.insert("step".into(), e.step.into());
        serde_json::json!({
            "name": e.name,
            "cat": e.cat,
            "ph": "X",
            "ts": e.ts_us,
            "dur": e.dur_us,
            "pid": pid,
            "tid": e.tid,
            "args": args,
        })
    }));
    for c in &rec.counters {
        for (name, value) in [("RSS (MiB)", c.rss_mb), ("GPU memory (MiB)", c.gpu_mem_mb)] {
            if let Some(v) = value.filter(|v| v.is_finite()) {
                trace.push(serde_json::json!({
                    "name": name, "cat": "memory", "ph": "C", "ts": c.ts_us, "pid": pid,
                    "tid": 0, "args": {"MiB": v},
                }));
            }
        }
    }
    serde_json::json!({ "traceEvents": trace, "displayTimeUnit": "ms" })
}

/// Paths of a written recording.
#[derive(Debug, Clone)]
pub struct ProfileOutputs {
    /// Chrome trace.
    pub trace: PathBuf,
    /// Key averages as JSON (input of `kiln profile diff`).
    pub table_json: PathBuf,
    /// Key averages as text.
    pub table_txt: PathBuf,
    /// The table.
    pub averages: KeyAverages,
}

/// Write `trace.json`, `key_averages.json` and `key_averages.txt` into `dir`.
pub fn write_outputs(
    rec: &Recording,
    dir: &Path,
    step_name: &str,
) -> std::io::Result<ProfileOutputs> {
    let events = &rec.events;
    std::fs::create_dir_all(dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let trace = dir.join("trace.json");
    write_atomic(
        &trace,
        &serde_json::to_vec(&chrome_trace(rec, &format!("kiln ({step_name})"))).expect("json"),
    )?;
    let averages = key_averages(events, step_name);
    let table_json = dir.join("key_averages.json");
    write_atomic(
        &table_json,
        &serde_json::to_vec_pretty(&averages).expect("json"),
    )?;
    let table_txt = dir.join("key_averages.txt");
    let text = format!(
        "{}\n-- sorted by self time --\n{}",
        averages.table(SortBy::Total, 60),
        averages.table(SortBy::SelfTime, 60)
    );
    write_atomic(&table_txt, text.as_bytes())?;
    Ok(ProfileOutputs {
        trace,
        table_json,
        table_txt,
        averages,
    })
}

/// Where an operator of a comparison was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    /// In both profiles.
    Both,
    /// Only in B (new).
    New,
    /// Only in A (gone).
    Gone,
}

/// One row of a comparison of two tables.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffRow {
    /// Span or module name.
    pub name: String,
    /// Whether it is in both profiles, new in B or gone from B.
    pub presence: Presence,
    /// Calls per step in A and B.
    pub calls: (f64, f64),
    /// Total µs per step in A and B.
    pub total_per_step_us: (f64, f64),
    /// Mean µs per call in A and B.
    pub avg_us: (f64, f64),
    /// B's per-step total over A's: ∞ (JSON `null`) when new, 0 when gone; see `presence`.
    pub ratio: f64,
    /// B − A, µs per step.
    pub delta_us: f64,
}

/// Compare two tables operator by operator, per step, largest regression first.
pub fn diff(a: &KeyAverages, b: &KeyAverages) -> Vec<DiffRow> {
    let per = |t: &KeyAverages| -> BTreeMap<String, (f64, f64)> {
        let steps = t.steps.max(1) as f64;
        let mut m: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for r in &t.rows {
            let e = m.entry(r.name.clone()).or_default();
            e.0 += r.calls as f64 / steps;
            e.1 += r.total_us / steps;
        }
        m
    };
    let (pa, pb) = (per(a), per(b));
    let mut names: Vec<&String> = pa.keys().chain(pb.keys()).collect();
    names.sort();
    names.dedup();
    let mut rows: Vec<DiffRow> = names
        .into_iter()
        .map(|n| {
            let (ca, ta) = pa.get(n).copied().unwrap_or((0.0, 0.0));
            let (cb, tb) = pb.get(n).copied().unwrap_or((0.0, 0.0));
            let presence = match (pa.contains_key(n), pb.contains_key(n)) {
                (true, true) => Presence::Both,
                (false, _) => Presence::New,
                (true, false) => Presence::Gone,
            };
            DiffRow {
                name: n.clone(),
                presence,
                calls: (ca, cb),
                total_per_step_us: (ta, tb),
                avg_us: (ta / ca.max(1e-12), tb / cb.max(1e-12)),
                ratio: if ta > 0.0 { tb / ta } else { f64::INFINITY },
                delta_us: tb - ta,
            }
        })
        .collect();
    rows.sort_by(|x, y| y.delta_us.total_cmp(&x.delta_us));
    rows
}

/// What kind of work a table profiles, from its step span: `training` (`train_step`),
/// `inference` (`infer_step`), else the step name itself.
pub fn profile_kind(t: &KeyAverages) -> &str {
    match t.step_name.as_str() {
        "train_step" => "training",
        "infer_step" => "inference",
        other => other,
    }
}

/// A warning when two tables profile different kinds of work (a training step against an
/// inference step): their operators are not comparable one to one.
pub fn kind_mismatch(a: &KeyAverages, b: &KeyAverages) -> Option<String> {
    (a.step_name != b.step_name).then(|| {
        format!(
            "comparing a {} profile (A, steps of `{}`) with a {} profile (B, steps of `{}`): \
             per-step times and operators are not comparable one to one",
            profile_kind(a),
            a.step_name,
            profile_kind(b),
            b.step_name
        )
    })
}

/// The diff as text.
pub fn diff_table(rows: &[DiffRow]) -> String {
    let mut s = format!(
        "{:<34} {:>9} {:>9} {:>12} {:>12} {:>10} {:>10} {:>8} {:>11}\n",
        "name",
        "calls A",
        "calls B",
        "µs/step A",
        "µs/step B",
        "avg A",
        "avg B",
        "ratio",
        "Δ µs/step"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<34} {:>9.1} {:>9.1} {:>12.2} {:>12.2} {:>10.2} {:>10.2} {:>8} {:>+11.2}\n",
            truncate(&r.name, 34),
            r.calls.0,
            r.calls.1,
            r.total_per_step_us.0,
            r.total_per_step_us.1,
            r.avg_us.0,
            r.avg_us.1,
            match r.presence {
                Presence::New => "new".into(),
                Presence::Gone => "gone".into(),
                Presence::Both if r.ratio.is_finite() => format!("{:.2}×", r.ratio),
                Presence::Both => "∞".into(),
            },
            r.delta_us
        ));
    }
    s
}

/// Open a profiler span: `prof_span!("forward")`, `prof_span!("module", path = "Net/head")`,
/// `prof_span!("forward", shape = ?[b, f])`. Compiled out when kiln is built with the
/// `no-spans` feature (the baseline for measuring the spans' cost). Works from any crate: it
/// reaches `tracing` through kiln, so the caller needs no `tracing` dependency of its own.
///
/// ```
/// let rows = 3;
/// let _span = kiln_observe::prof_span!("my_stage", rows = rows).entered();
/// ```
#[cfg(not(feature = "no-spans"))]
#[macro_export]
macro_rules! prof_span {
    ($name:literal $(, $($fields:tt)*)?) => {
        $crate::__tracing::trace_span!(target: "kiln::prof", $name $(, $($fields)*)?)
    };
}

/// Open a profiler span (compiled out: this kiln was built with `no-spans`).
#[cfg(feature = "no-spans")]
#[macro_export]
macro_rules! prof_span {
    ($name:literal $(, $($fields:tt)*)?) => {
        $crate::__tracing::Span::none()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, ts: f64, dur: f64) -> Event {
        Event {
            name: name.into(),
            cat: "phase".into(),
            ts_us: ts,
            dur_us: dur,
            tid: 1,
            step: 0,
            args: BTreeMap::new(),
        }
    }

    #[test]
    fn a_recording_stays_within_its_byte_cap_and_counts_what_it_drops() {
        let cap = 64 << 10;
        let mut rec = Recorder::new(Options::default());
        rec.max_bytes = cap;
        let mut kept_bytes = 0;
        for i in 0..20_000u64 {
            let mut e = ev(&format!("span_{i}"), i as f64, 1.0);
            e.args.insert("shape".into(), format!("[{i}, 128]"));
            rec.push(e);
            rec.push_counter(CounterSample {
                ts_us: i as f64,
                rss_mb: Some(1.0),
                gpu_mem_mb: None,
            });
            assert!(rec.bytes() <= cap, "{} > {cap} after {i}", rec.bytes());
            kept_bytes = kept_bytes.max(rec.bytes());
        }
        assert!(!rec.events.is_empty() && !rec.counters.is_empty());
        let kept = (rec.events.len() + rec.counters.len()) as u64;
        assert_eq!(kept + rec.dropped, 40_000);
        assert!(rec.dropped > 30_000, "{} dropped", rec.dropped);
        // The accounting covers what is really held: the vectors' capacity and each event's
        // strings and map.
        let held = rec.events.capacity() * std::mem::size_of::<Event>()
            + rec.counters.capacity() * std::mem::size_of::<CounterSample>()
            + rec.events.iter().map(event_heap_bytes).sum::<usize>();
        assert_eq!(rec.bytes(), held);
        // Most of the cap is used (growth is not stopped early).
        assert!(kept_bytes > cap / 2, "{kept_bytes} of {cap}");
        // An event cap still applies under the byte cap.
        let mut rec = Recorder::new(Options::default());
        rec.max_events = 10;
        for i in 0..100 {
            rec.push(ev("x", i as f64, 1.0));
        }
        assert_eq!((rec.events.len(), rec.dropped), (10, 90));
        // A cap below one event keeps nothing.
        let mut rec = Recorder::new(Options::default());
        rec.max_bytes = 8;
        rec.push(ev("x", 0.0, 1.0));
        assert_eq!((rec.events.len(), rec.dropped, rec.bytes()), (0, 1, 0));
    }

    #[test]
    fn self_time_subtracts_direct_children_only() {
        let events = vec![
            ev("train_step", 0.0, 100.0),
            ev("forward", 10.0, 40.0),
            ev("RegressionNet/backbone/0", 12.0, 10.0),
            ev("RegressionNet/backbone/1", 25.0, 20.0),
            ev("backward", 60.0, 30.0),
            ev("train_step", 100.0, 50.0),
        ];
        let s = self_times(&events);
        assert_eq!(s, vec![30.0, 10.0, 10.0, 20.0, 30.0, 50.0]);
        let t = key_averages(&events, "train_step");
        assert_eq!(t.steps, 2);
        assert_eq!(t.step_total_us, 150.0);
        let step = t.rows.iter().find(|r| r.name == "train_step").unwrap();
        assert_eq!((step.calls, step.total_us, step.self_us), (2, 150.0, 80.0));
        for r in &t.rows {
            assert!(r.self_us <= r.total_us + 1e-9);
        }
        let fwd = t.rows.iter().find(|r| r.name == "forward").unwrap();
        assert!((fwd.pct_of_step - 100.0 * 40.0 / 150.0).abs() < 1e-9);
        assert!(
            t.table(SortBy::SelfTime, 10)
                .lines()
                .nth(1)
                .unwrap()
                .starts_with("train_step")
        );
    }

    #[test]
    fn diff_sorts_by_largest_regression() {
        let mk = |rows: Vec<(&str, u64, f64)>, steps| KeyAverages {
            step_name: "infer_step".into(),
            steps,
            step_total_us: 0.0,
            rows: rows
                .into_iter()
                .map(|(n, c, t)| KeyAverage {
                    name: n.into(),
                    shapes: None,
                    calls: c,
                    total_us: t,
                    self_us: t,
                    avg_us: t / c as f64,
                    pct_of_step: 0.0,
                })
                .collect(),
        };
        let a = mk(
            vec![("matmul", 10, 100.0), ("relu", 10, 20.0), ("gone", 10, 5.0)],
            10,
        );
        let b = mk(
            vec![("matmul", 20, 400.0), ("relu", 20, 40.0), ("new", 20, 30.0)],
            20,
        );
        let d = diff(&a, &b);
        // Per step: matmul 10 → 20 µs (+10), new 0 → 1.5 (+1.5), relu 2 → 2, gone 0.5 → 0.
        assert_eq!(d[0].name, "matmul");
        assert_eq!(d[0].total_per_step_us, (10.0, 20.0));
        assert_eq!(d[0].ratio, 2.0);
        assert_eq!(d[1].name, "new");
        assert!(d[1].ratio.is_infinite());
        assert_eq!(d[1].presence, Presence::New);
        assert_eq!(d[0].presence, Presence::Both);
        let gone = d.last().unwrap();
        assert_eq!(
            (gone.name.as_str(), gone.presence),
            ("gone", Presence::Gone)
        );
        let table = diff_table(&d);
        let line = |n: &str| {
            table
                .lines()
                .find(|l| l.starts_with(n))
                .unwrap()
                .to_string()
        };
        assert!(line("new").contains(" new "), "{table}");
        assert!(line("gone").contains(" gone "), "{table}");
        assert!(!table.contains("0.00×"), "{table}");
        assert!(line("matmul").contains("2.00×"), "{table}");
        let json = serde_json::to_value(gone).unwrap();
        assert_eq!(json["presence"], "gone");
        // Same kind: no warning; a training step against an inference step: a warning.
        assert_eq!(kind_mismatch(&a, &b), None);
        let mut t = a.clone();
        t.step_name = "train_step".into();
        let w = kind_mismatch(&t, &b).unwrap();
        assert!(w.contains("training") && w.contains("inference"), "{w}");
    }

    #[test]
    fn chrome_trace_names_threads_and_draws_memory_as_counters() {
        let mut e = ev("RegressionNet/backbone/0", 1.0, 2.0);
        e.cat = "module".into();
        e.args.insert("shape".into(), "[128, 20]".into());
        let mut w = ev("load_batch", 0.5, 1.0);
        w.tid = 2;
        let rec = Recording {
            events: vec![e, w],
            counters: vec![CounterSample {
                ts_us: 1.0,
                rss_mb: Some(12.5),
                gpu_mem_mb: Some(300.0),
            }],
            threads: BTreeMap::from([(1, "main".into()), (2, "kiln-loader-0".into())]),
        };
        let v = chrome_trace(&rec, "kiln (train_step)");
        let ev = v["traceEvents"].as_array().unwrap();
        let of = |ph: &'static str| ev.iter().filter(move |e| e["ph"] == ph);
        let meta = |name: &str, tid: u64| {
            of("M")
                .find(|e| e["name"] == name && e["tid"] == tid)
                .map(|e| e["args"]["name"].clone())
        };
        assert_eq!(meta("process_name", 0).unwrap(), "kiln (train_step)");
        assert_eq!(meta("thread_name", 1).unwrap(), "main");
        assert_eq!(meta("thread_name", 2).unwrap(), "kiln-loader-0");
        let sort = |tid: u64| {
            of("M")
                .find(|e| e["name"] == "thread_sort_index" && e["tid"] == tid)
                .map(|e| e["args"]["sort_index"].as_u64().unwrap())
        };
        assert!(sort(1).is_some() && sort(2).is_some());
        let x: Vec<&serde_json::Value> = of("X").collect();
        assert_eq!(x.len(), 2);
        assert_eq!(x[0]["name"], "RegressionNet/backbone/0");
        assert_eq!(x[0]["args"]["shape"], "[128, 20]");
        let c: Vec<&serde_json::Value> = of("C").collect();
        assert_eq!(c.len(), 2);
        assert!(
            c.iter()
                .any(|e| e["name"] == "RSS (MiB)" && e["args"]["MiB"] == 12.5)
        );
        assert!(
            c.iter()
                .any(|e| e["name"] == "GPU memory (MiB)" && e["args"]["MiB"] == 300.0)
        );
        assert!(x.iter().all(|e| e["args"].get("rss_delta_kb").is_none()));
    }
}
