//! `jetshard-bench`: runs jetshard's benchmark scenarios; `--help` lists them and their sizes.

fn main() -> anyhow::Result<()> {
    jetshard_bench::main_with_args(std::env::args_os())
}
