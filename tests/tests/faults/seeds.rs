//! Seeds and their random choices: a generator per seed, the seeds a test runs, and the lock
//! that runs one schedule at a time.

use std::time::Duration;

/// A small deterministic generator (SplitMix64): the same seed gives the same choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1A4_F00D)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A duration between `low` and `high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }

    /// One of `items`.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }

    /// Puts `items` in a random order (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The seeds a scenario runs: `JETSHARD_SEED=<s>` runs that one; otherwise `JETSHARD_SEEDS`
/// (default `default_count`) seeds from `JETSHARD_SEED_BASE` (default `default_base`).
pub fn seeds(default_base: u64, default_count: u64) -> Vec<u64> {
    let var = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
    };
    if let Some(seed) = var("JETSHARD_SEED") {
        return vec![seed];
    }
    let base = var("JETSHARD_SEED_BASE").unwrap_or(default_base);
    let count = var("JETSHARD_SEEDS").unwrap_or(default_count);
    (base..base + count).collect()
}

/// Schedules of one process-wide suite run one at a time: each starts a server and several
/// node processes, and two at once on a 2-core machine would starve each other's pin TTLs.
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    // A tokio mutex: held across awaits, and not poisoned by a failed schedule.
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
