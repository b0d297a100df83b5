//! `jetshard-bench`: runs jetshard's benchmark scenarios; `--help` lists them and their sizes.

/// Counts the client's allocations per command (`jetshard_bench::allocs`).
#[global_allocator]
static ALLOCATOR: jetshard_bench::allocs::Counting = jetshard_bench::allocs::Counting;

fn main() -> anyhow::Result<()> {
    jetshard_bench::main_with_args(std::env::args_os())
}
