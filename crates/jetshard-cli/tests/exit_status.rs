//! The `jetshard` binary itself, as an operator runs it: help and version succeed on stdout,
//! a usage error and a failed command fail on stderr with a one-line reason, never an
//! `Error: ...` debug dump or a backtrace.

use std::process::{Command, Output};

/// Runs the binary with `args`, backtraces asked for (they must not appear).
fn jetshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jetshard"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("NATS_URL")
        .env_remove("NATS_CONTEXT")
        .output()
        .expect("run the jetshard binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_and_version_print_to_stdout_and_exit_zero() {
    for args in [
        &["--help"][..],
        &["-h"],
        &["help"],
        &["dead-letters", "--help"],
        &["dead-letters", "purge", "--help"],
    ] {
        let output = jetshard(args);
        let stdout = text(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {output:?}");
        assert!(stdout.contains("Usage: jetshard"), "{args:?}: {stdout}");
        assert!(output.stderr.is_empty(), "{args:?}: {output:?}");
    }
    let help = text(&jetshard(&["--help"]).stdout);
    for flag in [
        "--creds",
        "--user",
        "--password",
        "--token",
        "--nkey",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
        "--tls-first",
        "--context",
        "--json",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }

    let version = jetshard(&["--version"]);
    assert_eq!(version.status.code(), Some(0), "{version:?}");
    assert_eq!(
        text(&version.stdout).trim(),
        format!("jetshard {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_usage_error_exits_two_with_the_usage_on_stderr() {
    let output = jetshard(&["pause", "order", "not-a-number"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    assert!(stderr.starts_with("error: invalid value"), "{stderr}");
    assert!(
        !stderr.contains("Error:") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

#[test]
fn a_failed_command_exits_one_with_one_line_and_no_backtrace() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let output = jetshard(&["--nats-url", &url, "status", "order"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.starts_with(&format!("error: connecting to {url}")),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("Stack backtrace"), "{stderr}");
}
