//! The `jetshard` admin command run in-process, through its entry point
//! (`jetshard_cli::run`), as the tests of it run it: its text, its JSON, its error.

use serde_json::Value;

/// Runs `jetshard --nats-url <url> <args>` (the binary's own entry point) and returns its output.
pub async fn jetshard(url: &str, args: &[&str]) -> String {
    let mut out = Vec::new();
    let argv = ["jetshard", "--nats-url", url]
        .into_iter()
        .chain(args.iter().copied());
    jetshard_cli::run(argv, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
    String::from_utf8(out).unwrap()
}

/// Runs `jetshard <args> --json` and parses its output.
pub async fn jetshard_json(args: &[&str]) -> Value {
    let mut out = Vec::new();
    let argv = ["jetshard"]
        .into_iter()
        .chain(args.iter().copied())
        .chain(["--json"]);
    jetshard_cli::run(argv, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
    serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out)))
}

/// The dead letters of the ledger, as `dead-letters --json` lists them.
pub async fn dead_letters(url: &str) -> Vec<Value> {
    let letters = jetshard_json(&["--nats-url", url, "dead-letters", "ledger"]).await;
    letters.as_array().unwrap().clone()
}

/// Runs `jetshard --nats-url <url> <args>` expecting it to fail; returns the error's text.
pub async fn jetshard_error(url: &str, args: &[&str]) -> String {
    let mut out = Vec::new();
    let argv = ["jetshard", "--nats-url", url]
        .into_iter()
        .chain(args.iter().copied());
    match jetshard_cli::run(argv, &mut out).await {
        Ok(()) => panic!("{args:?} succeeded: {}", String::from_utf8_lossy(&out)),
        Err(error) => format!("{error:#}"),
    }
}
