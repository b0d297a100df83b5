//! Writes in doubt: a command whose journal write is answered "not confirmed" (the server
//! stopped while it was on its way) and lands once the server runs again.

use std::time::Duration;

use jetshard::{ShardConfigBuilder, ShardSystem};
use jetshard_testkit::history::Ack;
use jetshard_testkit::wait_until;

use crate::ledger::{LedgerCmd, on_decide};
use crate::model::Op;
use crate::scenario::Scenario;

impl Scenario {
    /// The configuration of node `node` with a short write timeout (500 ms) and retry delay
    /// (50 ms): a write held up by a stopped server is soon answered "not confirmed" and tried
    /// again.
    pub fn doubting_config(&self, node: &str) -> ShardConfigBuilder {
        self.config(node)
            .write_timeout(Duration::from_millis(500))
            .retry_delay(Duration::from_millis(50))
    }

    /// Sends `command` (a `Slow`, `Forward` or `Arm` numbered `n`) to `entity`, recorded as
    /// `op`, and stops the single server while its decide runs, so that its write goes out to
    /// a stopped server; resumes the server once `system` counts the write not confirmed
    /// (`write_timeout` past). The write is then stored as the server runs again: a write in
    /// doubt that landed. Returns the command's sequence.
    pub async fn send_unconfirmed(
        &mut self,
        system: &ShardSystem,
        entity: &str,
        n: u64,
        command: LedgerCmd,
        op: Op,
    ) -> u64 {
        let (deciding, decided) = std::sync::mpsc::channel();
        let (paused, on_pause) = std::sync::mpsc::channel::<()>();
        on_decide(n, move || {
            let _ = deciding.send(());
            let _ = on_pause.recv_timeout(Duration::from_secs(20));
        });
        let before = unconfirmed_writes(system).await;
        let seq = self.sender.send(entity, &command).await.expect("send");
        self.history.record(entity, op, Ack::Acked(seq));
        tokio::task::spawn_blocking(move || decided.recv_timeout(Duration::from_secs(20)))
            .await
            .expect("join")
            .expect("the command decided");
        self.server().pause().expect("pause the server");
        paused.send(()).expect("let the decide go on");
        let unconfirmed = wait_until(
            Duration::from_secs(20),
            "the write not confirmed",
            || async { unconfirmed_writes(system).await > before },
        )
        .await;
        self.server().resume().expect("resume the server");
        unconfirmed.expect("the write not confirmed");
        seq
    }
}

/// The writes `system`'s owners have counted not confirmed (0 while its status is not read).
async fn unconfirmed_writes(system: &ShardSystem) -> u64 {
    system
        .status()
        .await
        .map_or(0, |p| p.iter().map(|p| p.unconfirmed_writes).sum())
}
