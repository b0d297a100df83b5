//! The `jetshard` admin command; see the library's docs for the commands.

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    jetshard_cli::run(std::env::args_os(), &mut std::io::stdout()).await
}
