//! The partitions' consumers resumed, told to their pull loops.
//!
//! A pull request waiting when its consumer is resumed by API (`jetshard resume`,
//! [`Admin::resume`](crate::admin::Admin::resume), `nats consumer resume`) is not served: the
//! server's delivery loop sleeps while the consumer is paused, and only a new message, a new
//! pull request or the nearest expiry of a waiting one wakes it; a resume by API is none of these
//! (`tests/tests/nats_facts.rs`, `an_open_pull_is_not_served_after_an_api_resume_only_a_new_pull_is`).
//! The commands stored during the pause then waited for the pull loop's next pull, up to
//! `expires` (a third of the pin TTL) after the resume. So each process listens to its command
//! stream's pause advisories (one subscription per process; nothing on the wire but one advisory
//! per pause or resume) and tells the partition's pull loop, which sends a pull at once. The
//! advisory comes from the consumer's leader once it applies the resume, so the pull cannot
//! arrive before it (an R3 resume is answered before it is applied). A pause that ends by itself
//! needs none of this (the server wakes its loop then), but is told too: one spare pull.

use std::sync::Arc;

use async_nats::Client;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::wire::Names;

/// One signal per partition: its consumer was resumed.
pub(crate) struct Resumes {
    partitions: Vec<watch::Sender<()>>,
}

impl Resumes {
    pub(crate) fn new(partitions: u32) -> Self {
        Self {
            partitions: (0..partitions).map(|_| watch::Sender::new(())).collect(),
        }
    }

    /// What partition `partition`'s pull loop watches: it changes at each resume from now on.
    pub(crate) fn watch(&self, partition: u32) -> watch::Receiver<()> {
        match self.partitions.get(partition as usize) {
            Some(sender) => sender.subscribe(),
            // No such partition: a receiver that is never told (its sender is gone).
            None => watch::Sender::new(()).subscribe(),
        }
    }

    fn tell(&self, partition: u32) {
        if let Some(sender) = self.partitions.get(partition as usize) {
            sender.send_replace(());
        }
    }
}

/// The part of a pause advisory read here (`io.nats.jetstream.advisory.v1.consumer_pause`).
#[derive(serde::Deserialize)]
struct PauseAdvisory {
    consumer: String,
    #[serde(default)]
    paused: bool,
}

/// The partition an advisory says was resumed (`None`: a pause, another consumer, or unreadable).
fn resumed_partition(names: &Names, payload: &[u8]) -> Option<u32> {
    let advisory: PauseAdvisory = serde_json::from_slice(payload).ok()?;
    if advisory.paused {
        return None;
    }
    names.partition_of_consumer(&advisory.consumer)
}

/// Listens to the pause advisories of `names`' command streams and tells `resumes` of each
/// partition resumed, until the task is aborted or the subscription ends. Without the
/// permission to subscribe (docs/SECURITY.md), nothing is told: the loops pull again at their
/// next refresh, as before.
pub(crate) async fn listen(
    client: &Client,
    names: Arc<Names>,
    resumes: Arc<Resumes>,
) -> Result<JoinHandle<()>, async_nats::SubscribeError> {
    let mut subscriptions = Vec::with_capacity(names.command_streams().len());
    for stream in names.command_streams() {
        subscriptions.push(
            client
                .subscribe(crate::wire::pause_advisories(stream))
                .await?,
        );
    }
    let mut advisories = futures::stream::select_all(subscriptions);
    Ok(tokio::spawn(async move {
        while let Some(advisory) = advisories.next().await {
            if let Some(partition) = resumed_partition(&names, &advisory.payload) {
                tracing::debug!(partition, "consumer resumed: pulling again");
                resumes.tell(partition);
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_of_one_of_the_partitions_is_told_to_it_alone() {
        let names = Names::new("order");
        let resume = br#"{"type":"io.nats.jetstream.advisory.v1.consumer_pause","id":"x","timestamp":"2026-11-27T07:00:00Z","stream":"ORDER_CMD","consumer":"order-p3","paused":false}"#;
        assert_eq!(resumed_partition(&names, resume), Some(3));
        let pause = br#"{"stream":"ORDER_CMD","consumer":"order-p3","paused":true,"pause_until":"2099-01-01T00:00:00Z"}"#;
        assert_eq!(resumed_partition(&names, pause), None);
        let other = br#"{"stream":"ORDER_CMD","consumer":"reader","paused":false}"#;
        assert_eq!(resumed_partition(&names, other), None);
        assert_eq!(resumed_partition(&names, b"not json"), None);

        let resumes = Resumes::new(4);
        let (mut three, two) = (resumes.watch(3), resumes.watch(2));
        resumes.tell(3);
        resumes.tell(9);
        assert!(three.has_changed().unwrap());
        assert!(!two.has_changed().unwrap());
        three.borrow_and_update();
        assert!(!three.has_changed().unwrap());
        assert!(resumes.watch(9).has_changed().is_err(), "never told");
    }
}
