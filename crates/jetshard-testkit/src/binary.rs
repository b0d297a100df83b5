//! Finding a `nats-server` binary that is new enough.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::Error;

/// The oldest server the testkit accepts: 2.11 brought consumer pause and pinned clients.
const MIN_VERSION: (u32, u32) = (2, 11);

/// The environment variable that names the binary explicitly.
const ENV_VAR: &str = "NATS_SERVER_BIN";

/// The script, relative to the repository root, that installs a suitable binary.
const INSTALL_SCRIPT: &str = "scripts/install-nats-server";

/// Returns the path of a `nats-server` binary of version 2.11 or newer.
///
/// Looks, in order, at:
/// 1. `NATS_SERVER_BIN`: when set, it must name a suitable binary; nothing else is tried.
/// 2. `.tools/venv/bin/nats-server` under the repository root (the first directory above
///    this crate that contains `scripts/install-nats-server`), where that script installs it.
/// 3. `nats-server` on `PATH`.
///
/// The answer is remembered for the rest of the process.
///
/// # Errors
///
/// [`Error::BinaryNotFound`], [`Error::BinaryTooOld`] or [`Error::BinaryUnusable`]; each
/// message tells to run `scripts/install-nats-server`.
pub fn nats_server_binary() -> Result<PathBuf, Error> {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let repo_venv = repo_root().map(|root| {
        root.join(".tools")
            .join("venv")
            .join("bin")
            .join("nats-server")
    });
    let found = find(
        std::env::var_os(ENV_VAR),
        repo_venv,
        std::env::var_os("PATH"),
    )?;
    Ok(FOUND.get_or_init(|| found).clone())
}

/// The discovery itself, with its inputs passed in so that tests need not touch the
/// process environment.
fn find(
    explicit: Option<OsString>,
    repo_venv: Option<PathBuf>,
    path_var: Option<OsString>,
) -> Result<PathBuf, Error> {
    if let Some(explicit) = explicit.filter(|value| !value.is_empty()) {
        let path = PathBuf::from(explicit);
        if !is_executable(&path) {
            return Err(Error::BinaryNotFound {
                searched: format!("{ENV_VAR}={}", path.display()),
            });
        }
        check_version(&path)?;
        return Ok(path);
    }

    let on_path = path_var.and_then(|value| {
        std::env::split_paths(&value)
            .map(|dir| dir.join("nats-server"))
            .find(|candidate| is_executable(candidate))
    });
    let mut first_failure = None;
    for candidate in [repo_venv.clone(), on_path].into_iter().flatten() {
        if !is_executable(&candidate) {
            continue;
        }
        match check_version(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(error) => {
                first_failure.get_or_insert(error);
            }
        }
    }
    if let Some(error) = first_failure {
        return Err(error);
    }
    let venv = repo_venv.map_or_else(
        || "the repository's .tools/venv (no repository found)".to_owned(),
        |path| path.display().to_string(),
    );
    Err(Error::BinaryNotFound {
        searched: format!("{ENV_VAR} (unset), {venv}, PATH"),
    })
}

/// Runs `<path> --version` and checks the version it prints.
fn check_version(path: &Path) -> Result<(), Error> {
    let output = Command::new(path)
        .arg("--version")
        .output()
        .map_err(|source| Error::BinaryUnusable {
            path: path.to_owned(),
            output: String::new(),
            source: Some(source),
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let Some((version, major, minor)) = parse_version(&text) else {
        return Err(Error::BinaryUnusable {
            path: path.to_owned(),
            output: text.trim().to_owned(),
            source: None,
        });
    };
    if (major, minor) < MIN_VERSION {
        return Err(Error::BinaryTooOld {
            path: path.to_owned(),
            version,
        });
    }
    Ok(())
}

/// Finds the first `[v]MAJOR.MINOR[.PATCH...]` word, e.g. in `nats-server: v2.15.1`.
fn parse_version(text: &str) -> Option<(String, u32, u32)> {
    text.split_whitespace().find_map(|word| {
        let version = word.trim_start_matches('v');
        let mut parts = version.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((version.to_owned(), major, minor))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The first directory at or above this crate's manifest that holds the install script.
fn repo_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join(INSTALL_SCRIPT).is_file())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Writes an executable script that prints `version_line` for `--version`.
    fn fake_server(dir: &Path, version_line: &str) -> PathBuf {
        let path = dir.join("nats-server");
        std::fs::write(&path, format!("#!/bin/sh\necho '{version_line}'\n")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    #[test]
    fn versions_are_read_from_the_servers_banner() {
        assert_eq!(
            parse_version("nats-server: v2.15.1\n"),
            Some(("2.15.1".to_owned(), 2, 15))
        );
        assert_eq!(
            parse_version("nats-server: v2.12.0-RC.1"),
            Some(("2.12.0-RC.1".to_owned(), 2, 12))
        );
        assert_eq!(parse_version("command not found"), None);
    }

    #[test]
    fn a_missing_binary_names_the_install_script() {
        let error = find(Some("/nonexistent/nats-server".into()), None, None).unwrap_err();
        assert!(matches!(error, Error::BinaryNotFound { .. }), "{error:?}");
        assert!(error.to_string().contains(INSTALL_SCRIPT), "{error}");

        let error = find(None, None, Some("".into())).unwrap_err();
        assert!(error.to_string().contains(INSTALL_SCRIPT), "{error}");
    }

    /// One test for everything that executes a fake binary: a binary written while another
    /// test thread forks can fail to execute with ETXTBSY.
    #[test]
    fn too_old_binaries_are_refused_and_a_new_enough_one_is_found() {
        let old_dir = tempfile::tempdir().expect("tempdir");
        let new_dir = tempfile::tempdir().expect("tempdir");
        let old = fake_server(old_dir.path(), "nats-server: v2.9.10");
        let new = fake_server(new_dir.path(), "nats-server: v2.11.0");

        let error = find(Some(old.clone().into()), None, None).unwrap_err();
        assert!(matches!(error, Error::BinaryTooOld { .. }), "{error:?}");
        assert!(error.to_string().contains(INSTALL_SCRIPT), "{error}");

        // Found on PATH only: still refused, with the reason rather than "not found".
        let old_path = Some(old_dir.path().as_os_str().to_owned());
        let error = find(None, None, old_path).unwrap_err();
        assert!(matches!(error, Error::BinaryTooOld { .. }), "{error:?}");

        let new_path = Some(new_dir.path().as_os_str().to_owned());
        assert_eq!(find(None, Some(old), new_path).expect("found"), new);
    }
}
