//! The request queue of one model version, shared by both batching policies: one FIFO per
//! priority level (Triton's numbering: level 1 is served first), with starvation bounded by
//! age — a request that has waited `max_wait` goes ahead of every level, oldest first.
//!
//! So under a saturating stream of level-1 requests a level-3 request still starts within
//! `max_wait` plus the time to serve the requests that aged before it. With one level the
//! queue is a plain FIFO. Choosing the next request looks at each level's head only
//! (O(levels)); withdrawing a request (its caller left, or its deadline passed) scans its own
//! level, which the queue limit bounds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::metrics::{Dropped, VersionMetrics};
use crate::model::ModelInput;
use crate::protocol::OutputTensor;

/// When and how a request's batch ran (for its trace spans).
#[derive(Debug, Clone, Copy)]
pub struct BatchTiming {
    /// The batch left the queue (for a request run at once: when it claimed the instance).
    pub taken: Instant,
    /// The engine started.
    pub compute_start: Instant,
    /// The engine returned.
    pub compute_end: Instant,
    /// Rows in the batch.
    pub rows: usize,
    /// Requests in the batch.
    pub requests: usize,
    /// The instance that ran it.
    pub instance: usize,
}

/// A job's answer: its outputs and how its batch ran, or the engine's error.
pub(crate) type Answer = Result<(Vec<OutputTensor>, BatchTiming), String>;

/// Where a job's answer goes.
pub(crate) type Reply = oneshot::Sender<Answer>;

/// One queued request.
pub(crate) struct Job {
    /// Unique within its batcher (withdrawal finds it by this).
    pub id: u64,
    /// Its priority level, 0-based (level 1 of the protocol is 0).
    pub level: usize,
    pub input: ModelInput,
    pub enqueued: Instant,
    pub deadline: Instant,
    pub reply: Reply,
}

/// The queue (see the module docs).
pub(crate) struct Queue {
    levels: Vec<VecDeque<Job>>,
    max_wait: Duration,
    len: usize,
    rows: usize,
}

impl Queue {
    /// An empty queue of `levels` levels (at least one).
    pub fn new(levels: usize, max_wait: Duration) -> Self {
        Self {
            levels: (0..levels.max(1)).map(|_| VecDeque::new()).collect(),
            max_wait,
            len: 0,
            rows: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows queued, all levels together.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Queue `job` behind the others of its level.
    pub fn push(&mut self, job: Job) {
        let l = job.level.min(self.levels.len() - 1);
        self.len += 1;
        self.rows += job.input.rows();
        self.levels[l].push_back(job);
    }

    /// When the longest-waiting request was queued.
    pub fn oldest(&self) -> Option<Instant> {
        self.levels
            .iter()
            .filter_map(|q| q.front().map(|j| j.enqueued))
            .min()
    }

    /// The level whose head goes next at `now`: the oldest head that has waited `max_wait`,
    /// else the head of the highest non-empty level.
    fn next_level(&self, now: Instant) -> Option<usize> {
        let mut aged: Option<(Instant, usize)> = None;
        for (l, q) in self.levels.iter().enumerate() {
            if let Some(h) = q.front()
                && now.saturating_duration_since(h.enqueued) >= self.max_wait
                && aged.is_none_or(|(t, _)| h.enqueued < t)
            {
                aged = Some((h.enqueued, l));
            }
        }
        aged.map(|(_, l)| l)
            .or_else(|| self.levels.iter().position(|q| !q.is_empty()))
    }

    /// The request that goes next at `now`.
    pub fn peek(&self, now: Instant) -> Option<&Job> {
        self.next_level(now).and_then(|l| self.levels[l].front())
    }

    /// Take the request that goes next at `now`.
    pub fn pop(&mut self, now: Instant) -> Option<Job> {
        let l = self.next_level(now)?;
        let j = self.levels[l].pop_front()?;
        self.len -= 1;
        self.rows -= j.input.rows();
        Some(j)
    }

    /// Remove the request `id` of `level`, if it is still queued.
    pub fn remove(&mut self, id: u64, level: usize) -> Option<Job> {
        let q = self.levels.get_mut(level)?;
        let at = q.iter().position(|j| j.id == id)?;
        let j = q.remove(at)?;
        self.len -= 1;
        self.rows -= j.input.rows();
        Some(j)
    }

    /// Take the next batch at `now`: requests in service order up to `max_rows` rows (at
    /// least one request), skipping — and counting as dropped — those whose caller left or
    /// whose deadline passed. `taken` is called once per request leaving the queue (for the
    /// depth counters).
    pub fn take_batch(
        &mut self,
        now: Instant,
        max_rows: usize,
        metrics: &VersionMetrics,
        mut taken: impl FnMut(),
    ) -> Vec<Job> {
        let mut jobs = Vec::new();
        let mut rows = 0;
        while let Some(j) = self.peek(now) {
            let r = j.input.rows();
            if !jobs.is_empty() && rows + r > max_rows {
                break;
            }
            let j = self.pop(now).expect("peeked");
            taken();
            if j.reply.is_closed() {
                metrics.record_dropped(Dropped::Cancelled);
                continue;
            }
            if now >= j.deadline {
                metrics.record_dropped(Dropped::Deadline);
                continue;
            }
            metrics.record_queue(now - j.enqueued);
            crate::observe::profiler::record_interval("serve_queue_wait", j.enqueued, now);
            rows += r;
            jobs.push(j);
        }
        jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, level: usize, enqueued: Instant) -> (Job, oneshot::Receiver<Answer>) {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            id,
            level,
            input: ModelInput::Regression {
                x: vec![id as f32],
                rows: 1,
            },
            enqueued,
            deadline: enqueued + Duration::from_secs(3600),
            reply,
        };
        (job, rx)
    }

    fn order(q: &mut Queue, now: Instant) -> Vec<u64> {
        std::iter::from_fn(|| q.pop(now).map(|j| j.id)).collect()
    }

    #[test]
    fn higher_levels_go_first_and_each_level_is_fifo() {
        let t = Instant::now();
        let mut q = Queue::new(3, Duration::from_secs(1));
        let mut keep = Vec::new();
        for (id, level) in [(1, 2), (2, 1), (3, 2), (4, 0), (5, 1), (6, 0)] {
            let (j, rx) = job(id, level, t + Duration::from_millis(id));
            keep.push(rx);
            q.push(j);
        }
        assert_eq!((q.len, q.rows()), (6, 6));
        assert_eq!(q.oldest(), Some(t + Duration::from_millis(1)));
        assert_eq!(
            order(&mut q, t + Duration::from_millis(10)),
            [4, 6, 2, 5, 1, 3]
        );
        assert!(q.is_empty() && q.rows() == 0);
    }

    #[test]
    fn a_request_that_waited_max_wait_goes_ahead_of_every_level() {
        let t = Instant::now();
        let wait = Duration::from_millis(100);
        let mut q = Queue::new(3, wait);
        let mut keep = Vec::new();
        // A low request, then a stream of high ones arriving after it.
        let (j, rx) = job(1, 2, t);
        keep.push(rx);
        q.push(j);
        for id in 2..6 {
            let (j, rx) = job(id, 0, t + Duration::from_millis(10 * id));
            keep.push(rx);
            q.push(j);
        }
        // Before it has waited 100 ms the high ones go first …
        assert_eq!(q.peek(t + Duration::from_millis(99)).map(|j| j.id), Some(2));
        // … from then on it goes next, whatever keeps arriving.
        assert_eq!(q.peek(t + wait).map(|j| j.id), Some(1));
        // Among aged heads the oldest goes first: at 125 ms request 2 (queued at 20 ms) has
        // aged too, and request 1 (0 ms) is older.
        let now = t + Duration::from_millis(125);
        assert_eq!(order(&mut q, now), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn withdrawn_requests_leave_and_dead_ones_are_counted_not_taken() {
        let t = Instant::now();
        let vm = crate::metrics::Metrics::default().model("m").version(1);
        let mut q = Queue::new(2, Duration::from_secs(1));
        let (a, _ra) = job(1, 0, t);
        let (b, rb) = job(2, 0, t);
        let (mut c, _rc) = job(3, 1, t);
        c.deadline = t + Duration::from_millis(5);
        let (d, _rd) = job(4, 1, t);
        let (e, _re) = job(5, 1, t);
        for j in [a, b, c, d, e] {
            q.push(j);
        }
        assert_eq!(q.remove(5, 1).map(|j| j.id), Some(5));
        assert!(q.remove(5, 1).is_none() && q.remove(1, 1).is_none());
        drop(rb); // request 2's caller left
        let mut left = 0;
        let jobs = q.take_batch(t + Duration::from_millis(10), 64, &vm, || left += 1);
        assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(left, 4);
        assert!(q.is_empty());
        assert_eq!(
            vm.dropped[Dropped::Cancelled as usize].load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(
            vm.dropped[Dropped::Deadline as usize].load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}
