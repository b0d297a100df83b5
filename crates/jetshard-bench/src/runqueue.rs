//! Time on a CPU and time runnable but waiting for one, summed over a process's threads
//! (`/proc/<pid>/task/*/schedstat`, Linux; no PMU needed): whether a latency stage that crosses
//! processes waits for the machine's cores (docs/PERFORMANCE.md, "What we learned"). `latency
//! --latency-stages` prints it for the bench's process and its `nats-server` per side.

use std::time::Instant;

/// A process's threads' scheduler times so far, ns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sched {
    /// On a CPU.
    pub on_cpu_ns: u64,
    /// Runnable, waiting on a run queue.
    pub waiting_ns: u64,
}

/// `pid`'s threads' times now; `None` where `/proc` does not say (not Linux, process gone).
pub fn of(pid: u32) -> Option<Sched> {
    let mut sched = Sched::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread that ended meanwhile is skipped: its times leave the sum.
        let Ok(line) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        if let (Some(Ok(on_cpu)), Some(Ok(waiting))) = (fields.next(), fields.next()) {
            sched.on_cpu_ns += on_cpu;
            sched.waiting_ns += waiting;
        }
    }
    Some(sched)
}

/// Processes' times from a start, for a share of one core each over the wall clock since.
pub struct Sampled {
    started: Instant,
    processes: Vec<(&'static str, u32, Option<Sched>)>,
}

impl Sampled {
    /// Starts counting `processes` (a name and a pid each).
    pub fn start(processes: &[(&'static str, u32)]) -> Self {
        Self {
            started: Instant::now(),
            processes: processes
                .iter()
                .map(|(name, pid)| (*name, *pid, of(*pid)))
                .collect(),
        }
    }

    /// Each process's time on a CPU and waiting for one since the start, each as a share of
    /// one core over the wall clock (a thread-second per second is 100%).
    pub fn report(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let share = |ns: u64| ns as f64 / 1e9 / secs * 100.0;
        self.processes
            .iter()
            .map(|(name, pid, start)| match (start, of(*pid)) {
                (Some(start), Some(now)) => format!(
                    "{name} on CPU {:.0}% waiting {:.0}%",
                    share(now.on_cpu_ns.saturating_sub(start.on_cpu_ns)),
                    share(now.waiting_ns.saturating_sub(start.waiting_ns)),
                ),
                _ => format!("{name} n/a"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
