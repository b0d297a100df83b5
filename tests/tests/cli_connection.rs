//! The `jetshard` admin command reaches servers that require a creds file and TLS (first) with a
//! client certificate, a token or an nkey seed file, as the `nats` CLI's flags and contexts say.

use std::time::Duration;

use async_nats::ConnectOptions;
use jetshard::{CommandSender, ShardSystem};
use jetshard_testkit::{NatsServer, wait_until};
use jetshard_tests::cli::{jetshard_error, jetshard_json};
use jetshard_tests::ledger::{Ledger, LedgerCmd};
use jetshard_tests::secure::{certificates, operator_setup, tls_config};
use jetshard_tests::{applied, init_tracing, ledger_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_reaches_a_server_that_requires_creds_and_tls() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (operator_config, creds) = operator_setup();
    std::fs::write(dir.path().join("admin.creds"), &creds).unwrap();
    let options = || {
        ConnectOptions::with_credentials(&creds)
            .unwrap()
            .require_tls(true)
            .add_root_certificates(path("ca.pem").into())
            .add_client_certificate(path("client.pem").into(), path("client-key.pem").into())
            .tls_first()
    };
    // TLS first, too: the server expects the handshake before it says anything.
    let server = NatsServer::builder()
        .config(format!("{operator_config}{}", tls_config(dir.path(), true)))
        .connect_options(options())
        .start()
        .await
        .unwrap();
    let url = server.url();
    let client = options().connect(&url).await.unwrap();
    let config = ledger_config(2, "node-a").build().unwrap();
    let system = ShardSystem::start::<Ledger>(client.clone(), config.clone())
        .await
        .unwrap();
    CommandSender::<Ledger>::new(client, &config)
        .send("e", &LedgerCmd::Append { n: 0 })
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "applied", || async {
        applied(&system).await == 1
    })
    .await
    .unwrap();

    // With flags: the creds or not, TLS first or not (the URL is the caller's).
    let (creds_path, ca, cert, key) = (
        path("admin.creds"),
        path("ca.pem"),
        path("client.pem"),
        path("client-key.pem"),
    );
    let flags = |creds: bool, tls_first: bool| {
        let mut flags = vec!["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
        if creds {
            flags.extend(["--creds", creds_path.as_str()]);
        }
        if tls_first {
            flags.push("--tls-first");
        }
        flags.extend(["status", "ledger"]);
        flags
    };
    let status =
        jetshard_json(&[vec!["--nats-url", url.as_str()], flags(true, true)].concat()).await;
    let partitions = status.as_array().unwrap();
    assert_eq!(partitions.len(), 2, "{status:#}");
    let owned = partitions.iter().find(|p| p["owner"] == "node-a");
    let owned = owned.unwrap_or_else(|| panic!("no partition owned: {status:#}"));
    for column in [
        "partition",
        "generation",
        "pinned",
        "pending",
        "ack_pending",
        "redelivered",
        "waiting",
        "paused",
        "pause_remaining_secs",
    ] {
        assert!(owned.get(column).is_some(), "{column} missing: {owned}");
    }
    assert_eq!(owned["generation"], 1, "{owned}");

    // With a context file, as the `nats` CLI saves one.
    let context = dir.path().join("secure.json");
    let settings = serde_json::json!({
        "description": "the test server", "url": url, "creds": creds_path, "ca": ca,
        "cert": cert, "key": key, "nkey": "", "token": "", "user": "", "password": "",
        "jetstream_domain": "", "inbox_prefix": "", "tls_first": true,
    });
    std::fs::write(&context, settings.to_string()).unwrap();
    let context = context.display().to_string();
    let from_context = jetshard_json(&["--context", &context, "status", "ledger"]).await;
    assert_eq!(
        from_context.as_array().unwrap().len(),
        2,
        "{from_context:#}"
    );

    // Without --tls-first, the server does not answer (it waits for a TLS handshake).
    jetshard_error(&url, &flags(true, false)).await;
    // Without the creds, the server refuses.
    jetshard_error(&url, &flags(false, true)).await;
    system.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_connects_with_a_token_or_an_nkey_seed_file() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let seed_file = dir.path().join("user.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let seed_file = seed_file.display().to_string();
    let cases = [
        (
            "authorization { token: \"t0k3n\" }\n".to_owned(),
            ConnectOptions::with_token("t0k3n".into()),
            ["--token", "t0k3n"],
        ),
        (
            format!(
                "authorization {{ users: [ {{ nkey: {} }} ] }}\n",
                user.public_key()
            ),
            ConnectOptions::with_nkey(seed.clone()),
            ["--nkey", seed_file.as_str()],
        ),
    ];
    for (server_config, options, flags) in cases {
        let server = NatsServer::builder()
            .config(server_config)
            .connect_options(options.clone())
            .start()
            .await
            .unwrap();
        let url = server.url();
        // The streams exist: a system started and stopped.
        let client = options.connect(&url).await.unwrap();
        let config = ledger_config(2, "node-a").build().unwrap();
        ShardSystem::start::<Ledger>(client, config)
            .await
            .unwrap()
            .shutdown()
            .await
            .unwrap();
        let args = [
            "--nats-url",
            url.as_str(),
            flags[0],
            flags[1],
            "status",
            "ledger",
        ];
        let status = jetshard_json(&args).await;
        assert_eq!(status.as_array().unwrap().len(), 2, "{flags:?}: {status}");
        // Without the flags, the server refuses.
        jetshard_error(&url, &["status", "ledger"]).await;
    }
}
