//! How the command connects: flags (or the environment variables the `nats` CLI reads), over a
//! NATS context as the `nats` CLI saves it, over the defaults.
//!
//! A context is a JSON file, `$XDG_CONFIG_HOME/nats/context/<name>.json` (by default
//! `~/.config/nats/context/<name>.json`); `--context` also takes a path to such a file. Of its
//! fields, these are used: `url`, `user`, `password`, `token`, `creds`, `nkey` (a seed file),
//! `cert`, `key`, `ca`, `inbox_prefix`, `tls_first`; the others (`jetstream_domain`, `nsc`,
//! ...) are ignored. The context the `nats` CLI has selected is not used unless named.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Args;
use jetshard::async_nats::{self, ConnectOptions};
use serde::Deserialize;

/// The server used when neither a flag nor a context names one.
const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The connection flags, each global (it may follow the subcommand).
#[derive(Debug, Default, Args)]
pub(crate) struct Connection {
    /// NATS server URL(s), comma-separated [default: the context's, else nats://127.0.0.1:4222].
    #[arg(long, global = true, env = "NATS_URL", value_name = "URLS")]
    nats_url: Option<String>,
    /// A NATS context: a name under ~/.config/nats/context/ as the `nats` CLI saves them, or the
    /// path of such a JSON file. Flags override its settings.
    #[arg(long, global = true, env = "NATS_CONTEXT", value_name = "NAME")]
    context: Option<String>,
    /// User credentials file (JWT and seed, as `nsc` writes it).
    #[arg(long, global = true, env = "NATS_CREDS", value_name = "FILE")]
    creds: Option<PathBuf>,
    /// User name (with --password).
    #[arg(long, global = true, env = "NATS_USER")]
    user: Option<String>,
    /// Password (with --user).
    #[arg(long, global = true, env = "NATS_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// Authentication token.
    #[arg(long, global = true, env = "NATS_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// User nkey seed file.
    #[arg(long, global = true, env = "NATS_NKEY", value_name = "FILE")]
    nkey: Option<PathBuf>,
    /// CA certificate(s) to verify the server with (PEM); requires TLS.
    #[arg(long, global = true, env = "NATS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM, with --tls-key); requires TLS.
    #[arg(long, global = true, env = "NATS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Client certificate's private key (PEM, with --tls-cert).
    #[arg(long, global = true, env = "NATS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Start the TLS handshake before the server's INFO (a server with `handshake_first`).
    #[arg(long, global = true)]
    tls_first: bool,
    /// Prefix of this connection's reply subjects (for a user allowed only its own inbox).
    #[arg(long, global = true, env = "NATS_INBOX_PREFIX", value_name = "PREFIX")]
    inbox_prefix: Option<String>,
}

/// A context file's fields, as the `nats` CLI writes them (unknown ones ignored, empty strings
/// as absent).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContextFile {
    url: String,
    user: String,
    password: String,
    token: String,
    creds: String,
    nkey: String,
    cert: String,
    key: String,
    ca: String,
    inbox_prefix: String,
    tls_first: bool,
}

/// Where and how to connect, flags and context merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) url: String,
    pub(crate) creds: Option<PathBuf>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) nkey: Option<PathBuf>,
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) tls_first: bool,
    pub(crate) inbox_prefix: Option<String>,
}

impl Connection {
    /// Merges the flags over the context they name (if any), over the defaults.
    ///
    /// # Errors
    /// A context that cannot be found or read.
    pub(crate) fn resolve(self) -> anyhow::Result<Settings> {
        let home = std::env::var_os("HOME");
        let file = match &self.context {
            Some(name) => {
                let path = context_path(name, std::env::var_os("XDG_CONFIG_HOME"), home.clone())?;
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading NATS context {}", path.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("reading NATS context {}", path.display()))?
            }
            None => ContextFile::default(),
        };
        Ok(self.over(file, home.as_deref().map(Path::new)))
    }

    /// The flags over `file`; `home` expands a context path's leading `~/`.
    fn over(self, file: ContextFile, home: Option<&Path>) -> Settings {
        let text = |s: String| (!s.is_empty()).then_some(s);
        let path = |s: String| text(s).map(|s| expand_home(&s, home));
        Settings {
            url: self
                .nats_url
                .or(text(file.url))
                .unwrap_or_else(|| DEFAULT_URL.to_owned()),
            creds: self.creds.or(path(file.creds)),
            user: self.user.or(text(file.user)),
            password: self.password.or(text(file.password)),
            token: self.token.or(text(file.token)),
            nkey: self.nkey.or(path(file.nkey)),
            tls_ca: self.tls_ca.or(path(file.ca)),
            tls_cert: self.tls_cert.or(path(file.cert)),
            tls_key: self.tls_key.or(path(file.key)),
            tls_first: self.tls_first || file.tls_first,
            inbox_prefix: self.inbox_prefix.or(text(file.inbox_prefix)),
        }
    }
}

impl Settings {
    /// Connects.
    ///
    /// # Errors
    /// Incomplete settings (a user without a password, a certificate without its key), an
    /// unreadable credentials or seed file, or a refused connection.
    pub(crate) async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        let mut options = ConnectOptions::new();
        if let Some(creds) = &self.creds {
            options = options
                .credentials_file(creds)
                .await
                .with_context(|| format!("reading credentials {}", creds.display()))?;
        }
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => {
                options = options.user_and_password(user.clone(), password.clone());
            }
            (None, None) => {}
            (Some(_), None) => bail!("--user needs --password"),
            (None, Some(_)) => bail!("--password needs --user"),
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(nkey) = &self.nkey {
            let text = std::fs::read_to_string(nkey)
                .with_context(|| format!("reading nkey seed {}", nkey.display()))?;
            let Some(seed) = seed_of(&text) else {
                bail!("{} holds no user nkey seed (SU...)", nkey.display());
            };
            options = options.nkey(seed.to_owned());
        }
        // As the `nats` CLI does: a CA or a client certificate means TLS is required.
        if let Some(ca) = &self.tls_ca {
            options = options.require_tls(true).add_root_certificates(ca.clone());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                options = options
                    .require_tls(true)
                    .add_client_certificate(cert.clone(), key.clone());
            }
            (None, None) => {}
            (Some(_), None) => bail!("--tls-cert needs --tls-key"),
            (None, Some(_)) => bail!("--tls-key needs --tls-cert"),
        }
        if self.tls_first {
            options = options.tls_first();
        }
        if let Some(prefix) = &self.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        // Any server of a cluster will do: the client learns the others from the one it reaches.
        let servers: Vec<&str> = self
            .url
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .collect();
        options
            .connect(servers)
            .await
            .with_context(|| format!("connecting to {}", self.url))
    }
}

/// The file of context `name`: a path as given if it looks like one (it holds a `/` or ends in
/// `.json`), else `<config>/nats/context/<name>.json`, `<config>` being `$XDG_CONFIG_HOME` or
/// `$HOME/.config`.
fn context_path(
    name: &str,
    xdg_config_home: Option<OsString>,
    home: Option<OsString>,
) -> anyhow::Result<PathBuf> {
    if name.contains('/') || name.ends_with(".json") {
        return Ok(PathBuf::from(name));
    }
    let config = match (xdg_config_home, home) {
        (Some(xdg), _) if !xdg.is_empty() => PathBuf::from(xdg),
        (_, Some(home)) if !home.is_empty() => PathBuf::from(home).join(".config"),
        _ => bail!("cannot find NATS context {name}: neither XDG_CONFIG_HOME nor HOME is set"),
    };
    Ok(config
        .join("nats")
        .join("context")
        .join(format!("{name}.json")))
}

/// `~/x` as `<home>/x`; anything else as it is.
fn expand_home(path: &str, home: Option<&Path>) -> PathBuf {
    match (path.strip_prefix("~/"), home) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(path),
    }
}

/// The user seed in a seed file: its first word that starts with `SU`.
fn seed_of(text: &str) -> Option<&str> {
    text.split_whitespace().find(|w| w.starts_with("SU"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_name_is_looked_up_where_the_nats_cli_saves_it() {
        let path = |name, xdg: Option<&str>, home: Option<&str>| {
            context_path(name, xdg.map(OsString::from), home.map(OsString::from))
        };
        assert_eq!(
            path("prod", None, Some("/home/op")).unwrap(),
            Path::new("/home/op/.config/nats/context/prod.json")
        );
        assert_eq!(
            path("prod", Some("/etc/xdg"), Some("/home/op")).unwrap(),
            Path::new("/etc/xdg/nats/context/prod.json")
        );
        assert_eq!(
            path("./ops/prod.json", None, None).unwrap(),
            Path::new("./ops/prod.json")
        );
        assert!(path("prod", None, None).is_err());
    }

    #[test]
    fn flags_win_over_the_context_and_the_context_over_the_defaults() {
        let file: ContextFile = serde_json::from_str(
            r#"{"description": "ops", "url": "tls://nats-1:4222", "creds": "~/ops.creds",
                "user": "", "token": "", "ca": "/etc/ca.pem", "cert": "/etc/c.pem",
                "key": "/etc/c-key.pem", "nkey": "", "inbox_prefix": "_INBOX_ops",
                "jetstream_domain": "", "tls_first": true, "color_scheme": ""}"#,
        )
        .unwrap();
        let flags = Connection {
            tls_ca: Some(PathBuf::from("/tmp/other-ca.pem")),
            ..Connection::default()
        };
        let settings = flags.over(file, Some(Path::new("/home/op")));
        assert_eq!(settings.url, "tls://nats-1:4222");
        assert_eq!(settings.creds, Some(PathBuf::from("/home/op/ops.creds")));
        assert_eq!(settings.tls_ca, Some(PathBuf::from("/tmp/other-ca.pem")));
        assert_eq!(settings.tls_cert, Some(PathBuf::from("/etc/c.pem")));
        assert_eq!(settings.user, None);
        assert_eq!(settings.inbox_prefix.as_deref(), Some("_INBOX_ops"));
        assert!(settings.tls_first);

        let defaults = Connection::default().over(ContextFile::default(), None);
        assert_eq!(defaults.url, DEFAULT_URL);
        assert_eq!(defaults.creds, None);
    }

    #[test]
    fn the_seed_is_found_in_a_seed_file() {
        assert_eq!(seed_of("SUAXYZ\n"), Some("SUAXYZ"));
        assert_eq!(seed_of("# a comment\n  SUABC  \n"), Some("SUABC"));
        assert_eq!(seed_of("UABC"), None);
    }
}
