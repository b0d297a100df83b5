//! The `jetshard` admin command; see the library's docs for the commands.

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // `--help` and `--version` arrive as clap errors: `exit` prints them to stdout and exits
    // with 0, a usage error to stderr with 2. Never through `anyhow` (no "Error:", no backtrace).
    let cli = jetshard_cli::parse(std::env::args_os()).unwrap_or_else(|e| e.exit());
    match jetshard_cli::execute(cli, &mut std::io::stdout()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
