//! `cargo bench -p jetshard-bench`: the whole harness at default sizes.
//!
//! cargo passes `--bench` (and any filter after `--`); the flag is dropped and the rest goes
//! to the harness, so `cargo bench -p jetshard-bench -- throughput --rounds 3` works too.

/// Counts the client's allocations per command (`jetshard_bench::allocs`).
#[global_allocator]
static ALLOCATOR: jetshard_bench::allocs::Counting = jetshard_bench::allocs::Counting;

fn main() -> anyhow::Result<()> {
    let args = std::env::args_os().filter(|arg| arg != "--bench");
    jetshard_bench::main_with_args(args)
}
