//! Retrying: the one backoff, and the one restart-intensity rule, of the whole crate.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The one backoff: `base` doubled per `attempt` after the first, at most `cap`.
pub(crate) fn backoff(base: Duration, attempt: u64, cap: Duration) -> Duration {
    let doublings = attempt.clamp(1, 17) - 1;
    base.saturating_mul(1 << doublings).min(cap)
}

/// Counts failures within a sliding window: the one restart-intensity rule of entity actors
/// (per partition) and of owners (per system).
#[derive(Debug)]
pub(crate) struct RestartWindow {
    max: u32,
    window: Duration,
    at: VecDeque<Instant>,
}

impl RestartWindow {
    pub(crate) fn new(max: u32, window: Duration) -> Self {
        Self {
            max,
            window,
            at: VecDeque::new(),
        }
    }

    /// Counts a failure at `now`; `true` if more than `max` fell within the window.
    pub(crate) fn exceeded(&mut self, now: Instant) -> bool {
        self.at.push_back(now);
        while self
            .at
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.at.pop_front();
        }
        self.at.len() > self.max as usize
    }

    /// Failures within the window at the last count.
    pub(crate) fn count(&self) -> usize {
        self.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let base = Duration::from_millis(250);
        let cap = Duration::from_secs(2);
        let delays: Vec<_> = (0..6).map(|a| backoff(base, a, cap)).collect();
        assert_eq!(
            delays,
            [250, 250, 500, 1000, 2000, 2000].map(Duration::from_millis)
        );
        assert_eq!(backoff(base, u64::MAX, Duration::MAX), base * (1 << 16));
    }

    #[test]
    fn the_restart_window_counts_failures_within_it_only() {
        let mut window = RestartWindow::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(!window.exceeded(t0));
        assert!(!window.exceeded(t0 + Duration::from_secs(1)));
        assert!(window.exceeded(t0 + Duration::from_secs(2)));
        // The first two fell out of the window.
        assert!(!window.exceeded(t0 + Duration::from_secs(12)));
        assert_eq!(window.count(), 2);
    }
}
