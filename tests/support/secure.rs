//! Secured servers for the tests: operator mode with JWTs and a creds file, TLS certificates;
//! and the ledger run on them (`runs`).
//! Everything is made at run time (nkeys, rcgen); nothing secret is checked in.

use std::path::Path;
use std::time::Duration;

use async_nats::ConnectOptions;
use jetshard::{CommandSender, ShardConfig, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};

use crate::ledger::{Ledger, LedgerCmd};
use crate::{applied, counts};

/// base64url without padding, as JWTs are written.
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
        }
    }
    out
}

/// A NATS JWT (`ed25519-nkey`) for `subject`, signed by `issuer`.
pub fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let header = base64url(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let issued_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "jti": format!("{name}{issued_at}"),
        "iat": issued_at,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let payload = base64url(&serde_json::to_vec(&claims).unwrap());
    let signing_input = format!("{header}.{payload}");
    let signature = issuer.sign(signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", base64url(&signature))
}

/// Operator mode: an operator, an account with JetStream (and the system account), a user;
/// returns the server
/// configuration and the user's creds file contents.
pub fn operator_setup() -> (String, String) {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "jetshard-test-operator",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "APP",
        serde_json::json!({
            "type": "account", "version": 2,
            "limits": {
                "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                "wildcards": true, "conn": -1, "leaf": -1,
                "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
            },
            "default_permissions": {"pub": {}, "sub": {}}
        }),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "node",
        serde_json::json!({
            "type": "user", "version": 2,
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1
        }),
    );
    // JetStream needs a system account.
    let system = nkeys::KeyPair::new_account();
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"type": "account", "version": 2}),
    );
    let config = format!(
        "operator: \"{operator_jwt}\"\nsystem_account: {}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {}: \"{account_jwt}\"\n  {}: \"{system_jwt}\"\n}}\n",
        system.public_key(),
        account.public_key(),
        system.public_key()
    );
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n",
        user.seed().unwrap()
    );
    (config, creds)
}

/// A CA, and a server and a client certificate it signed, as PEM files in `dir`.
pub fn certificates(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name
        .push(DnType::CommonName, "jetshard test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (name, usage, names) in [
        (
            "server",
            ExtendedKeyUsagePurpose::ServerAuth,
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
        ),
        (
            "client",
            ExtendedKeyUsagePurpose::ClientAuth,
            vec!["node".to_owned()],
        ),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }
}

/// The server's `tls` block for the certificates [`certificates`] wrote to `dir`, verifying
/// client certificates; `handshake_first`: clients must start TLS before the server's INFO
/// (`ConnectOptions::tls_first`).
pub fn tls_config(dir: &Path, handshake_first: bool) -> String {
    let path = |name: &str| dir.join(name);
    format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  \
         handshake_first: {handshake_first}\n}}\n",
        path("server.pem").display(),
        path("server-key.pem").display(),
        path("ca.pem").display()
    )
}

/// The ledger's config for the security tests (`security.rs`, `permissions.rs`); `entity_type` lets one test run two types.
pub fn config(entity_type: &str) -> ShardConfig {
    crate::config(entity_type, 2, &format!("{entity_type}-node"))
        .codec(jetshard::Codec::Json)
        // A request the server refuses for want of permission is never answered: fail fast.
        .write_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Runs the entity type `entity_type` on `node`, sends it 30 commands through `client`, and
/// waits until all are applied, in order.
pub async fn runs(entity_type: &str, node: async_nats::Client, client: async_nats::Client) {
    let config = config(entity_type);
    let system = ShardSystem::start::<Ledger>(node, config.clone())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "start {entity_type}: {e}: {:?}",
                std::error::Error::source(&e)
            )
        });
    let sender = CommandSender::<Ledger>::new(client, &config);
    for n in 0..10 {
        for entity in ["a", "b", "c"] {
            sender.send(entity, &LedgerCmd::Append { n }).await.unwrap();
        }
    }
    wait_until(Duration::from_secs(20), "30 commands applied", || async {
        applied(&system).await == 30
    })
    .await
    .unwrap();
    let c = counts(&system).await;
    assert_eq!(c.rejected, 0, "{c:?}");
    system.shutdown().await.unwrap();
}

/// A server that requires authentication, with `options` for its readiness probe.
pub async fn server(config: String, options: ConnectOptions) -> NatsServer {
    NatsServer::builder()
        .config(config)
        .connect_options(options)
        .start()
        .await
        .unwrap()
}
