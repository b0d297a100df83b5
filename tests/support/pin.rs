//! The pins of the ledger's consumers: which client each partition's consumer is pinned to,
//! and waiting for the server to unpin a holder that stopped pulling.

use jetshard_testkit::wait_until;

use crate::scenario::{OWN_WITHIN, Scenario};

impl Scenario {
    /// The pin each partition's consumer holds now (`None`: nobody is pinned).
    pub async fn pins(&self) -> Vec<Option<String>> {
        let names = crate::ledger_names(&self.js).await;
        let mut pins = Vec::new();
        for partition in 0..self.partitions {
            let stream = self
                .js
                .get_stream_no_info(names.command_stream(partition))
                .await
                .expect("the partition's command stream");
            let info = stream
                .consumer_info(names.consumer(partition))
                .await
                .expect("the partition's consumer");
            let pin = info
                .priority_groups
                .iter()
                .find_map(|group| group.pinned_client_id.clone())
                .filter(|pin| !pin.is_empty());
            pins.push(pin);
        }
        pins
    }

    /// Waits (bounded) until no partition's consumer is pinned to a pin of `before` any more:
    /// after its holder stopped pulling, the server unpins it within the pin TTL.
    pub async fn wait_unpinned(&self, before: &[Option<String>]) {
        let moved = wait_until(OWN_WITHIN, "the pins held before moved", || async {
            let now = self.pins().await;
            now.iter()
                .zip(before)
                .all(|(now, before)| before.is_none() || now != before)
        })
        .await;
        if let Err(e) = moved {
            panic!("{e}: pinned {:?}, before {before:?}", self.pins().await);
        }
    }
}
