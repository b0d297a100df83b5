//! Retrying: the one backoff, the one restart-intensity rule, and the one patience of a publish
//! that must not be lost, of the whole crate.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The one backoff: `base` doubled per `attempt` after the first, at most `cap`.
pub(crate) fn backoff(base: Duration, attempt: u64, cap: Duration) -> Duration {
    let doublings = attempt.clamp(1, 17) - 1;
    base.saturating_mul(1 << doublings).min(cap)
}

/// How long a publish that must not be lost (an outbox message, a wake-up) is offered to the
/// server, at least [`MIN_PUBLISH_ATTEMPTS`] times, before its caller gives up: long enough for a
/// clustered stream's leader election (5-11 s measured in `tests/tests/cluster.rs`), during which
/// the stream answers "no responders".
pub(crate) const PUBLISH_PATIENCE: Duration = Duration::from_secs(15);

/// Attempts of a publish that must not be lost, however long they take.
pub(crate) const MIN_PUBLISH_ATTEMPTS: u64 = 3;

/// The pause after a publish's first failed attempt; it doubles up to [`MAX_PUBLISH_PAUSE`].
const FIRST_PUBLISH_PAUSE: Duration = Duration::from_millis(200);

/// The longest pause between two attempts of a publish.
const MAX_PUBLISH_PAUSE: Duration = Duration::from_secs(2);

/// Runs `attempt` until it succeeds or [`PUBLISH_PATIENCE`] has passed after at least
/// [`MIN_PUBLISH_ATTEMPTS`] attempts, pausing by [`backoff`] between them; the last error then.
pub(crate) async fn with_publish_patience<T, E, F>(mut attempt: impl FnMut() -> F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut failures = 0;
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(e) => {
                failures += 1;
                if failures >= MIN_PUBLISH_ATTEMPTS && started.elapsed() >= PUBLISH_PATIENCE {
                    return Err(e);
                }
                tokio::time::sleep(backoff(FIRST_PUBLISH_PAUSE, failures, MAX_PUBLISH_PAUSE)).await;
            }
        }
    }
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

    #[tokio::test(start_paused = true)]
    async fn a_publish_is_retried_through_an_election_and_given_up_after_the_patience() {
        let attempts = std::cell::Cell::new(0);
        let started = Instant::now();
        let elected = with_publish_patience(|| {
            attempts.set(attempts.get() + 1);
            async {
                if attempts.get() < 5 {
                    Err("no responders")
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert_eq!(elected, Ok(()));
        assert_eq!(attempts.get(), 5);
        // 200 + 400 + 800 + 1600 ms of pauses.
        assert_eq!(started.elapsed(), Duration::from_millis(3000));

        attempts.set(0);
        let started = Instant::now();
        let never = with_publish_patience(|| {
            attempts.set(attempts.get() + 1);
            async { Err::<(), _>("no responders") }
        })
        .await;
        assert_eq!(never, Err("no responders"));
        assert!(
            started.elapsed() >= PUBLISH_PATIENCE,
            "{:?}",
            started.elapsed()
        );
        assert!(started.elapsed() < PUBLISH_PATIENCE + MAX_PUBLISH_PAUSE);
        // At 0, 0.2, 0.6, 1.4, 3 s, then every 2 s up to 15 s.
        assert_eq!(attempts.get(), 11);
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
