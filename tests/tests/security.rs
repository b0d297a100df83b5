//! Security basics: a node connects with user and password, a token, an nkey, a creds file
//! (operator mode, JWTs made here) and TLS with a client certificate (certificates made here),
//! all passed straight through `async_nats::ConnectOptions`. What a node, a client and an
//! operator may do with the least permissions is in `tests/tests/permissions.rs`.

use std::time::Duration;

use async_nats::ConnectOptions;
use jetshard_testkit::NatsServer;
use jetshard_tests::init_tracing;
use jetshard_tests::secure::{certificates, operator_setup, runs, server, tls_config};

/// Anonymous clients are refused.
async fn refuses_anonymous(server: &NatsServer) {
    let anonymous = ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await;
    assert!(anonymous.is_err(), "an anonymous client got in");
}

/// A server configured with `config` refuses anonymous clients, and a node and client that
/// connect with `options` run the ledger.
async fn a_node_runs_with(config: String, options: impl Fn() -> ConnectOptions) {
    let server = server(config, options()).await;
    refuses_anonymous(&server).await;
    let client = options().connect(server.url()).await.unwrap();
    runs("ledger", client.clone(), client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connects_with_user_and_password() {
    init_tracing();
    a_node_runs_with(
        "authorization { user: node, password: s3cret }\n".into(),
        || ConnectOptions::with_user_and_password("node".into(), "s3cret".into()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connects_with_a_token() {
    init_tracing();
    a_node_runs_with(
        "authorization { token: \"t0k3n-for-nodes\" }\n".into(),
        || ConnectOptions::with_token("t0k3n-for-nodes".into()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connects_with_an_nkey() {
    init_tracing();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    a_node_runs_with(
        format!(
            "authorization {{ users: [ {{ nkey: {} }} ] }}\n",
            user.public_key()
        ),
        || ConnectOptions::with_nkey(seed.clone()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connects_with_a_creds_file() {
    init_tracing();
    let (config, creds) = operator_setup();
    let dir = tempfile::tempdir().unwrap();
    let creds_path = dir.path().join("node.creds");
    std::fs::write(&creds_path, &creds).unwrap();
    let server = server(config, ConnectOptions::with_credentials(&creds).unwrap()).await;
    refuses_anonymous(&server).await;
    let client = ConnectOptions::with_credentials_file(&creds_path)
        .await
        .unwrap()
        .connect(server.url())
        .await
        .unwrap();
    runs("ledger", client.clone(), client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connects_over_tls_with_a_client_certificate() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let path = |name: &str| dir.path().join(name);
    let tls = |options: ConnectOptions| {
        options
            .require_tls(true)
            .add_root_certificates(path("ca.pem"))
            .add_client_certificate(path("client.pem"), path("client-key.pem"))
    };
    let server = server(tls_config(dir.path(), false), tls(ConnectOptions::new())).await;
    // Without a client certificate the server refuses, even over TLS.
    let no_certificate = ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(path("ca.pem"))
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await;
    assert!(
        no_certificate.is_err(),
        "a client without a certificate got in"
    );
    refuses_anonymous(&server).await;
    let client = tls(ConnectOptions::new())
        .connect(server.url())
        .await
        .unwrap();
    runs("ledger", client.clone(), client).await;
}
