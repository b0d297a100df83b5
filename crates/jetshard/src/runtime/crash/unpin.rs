//! The unpin record: of the watches that find one claim dead, only the first to store it
//! unpins (see the [crash watch](super)).

use crate::wire::Names;

/// The server's answer to a store whose message id another store is still putting in the
/// stream ("duplicate message id is in process", R3: that one's proposal not yet applied).
const STORE_IN_PROCESS: u64 = 10158;

/// Stores the unpin record of the fence record at `fence_seq` (`what`: who found whom dead,
/// for people reading the journal): true if this watch stored it first (it unpins), false if
/// the server already had it or was storing it for another watch (that watch unpins; should its
/// store fail after all, nobody unpins and the pin moves after its TTL, as for any watch that
/// cannot store the record).
pub(super) async fn first_to_unpin(
    js: &async_nats::jetstream::Context,
    names: &Names,
    partition: u32,
    fence_seq: u64,
    what: String,
) -> Result<bool, String> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        crate::wire::HDR_MSG_ID,
        names.unpin_msg_id(partition, fence_seq).as_str(),
    );
    headers.insert(crate::wire::HDR_ROLLUP, "sub");
    let ack = js
        .publish_with_headers(names.unpin_subject(partition), headers, what.into())
        .await
        .map_err(|e| e.to_string())?
        .await;
    match ack {
        Ok(ack) => Ok(!ack.duplicate),
        Err(e) if crate::journal::server_error_code(&e) == Some(STORE_IN_PROCESS) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn of_the_watches_that_find_one_claim_dead_only_the_first_unpins() {
        use async_nats::jetstream::stream;
        let server = jetshard_testkit::NatsServer::start()
            .await
            .expect("nats-server");
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let names = Names::new("t");
        js.create_stream(stream::Config {
            name: names.journal_stream(0).to_owned(),
            subjects: names.journal_subjects(0),
            allow_rollup: true,
            ..Default::default()
        })
        .await
        .expect("create the journal");
        // Five watches found the claim at sequence 7 of partition 3 dead at once.
        let firsts = futures::future::join_all(
            (0..5).map(|i| first_to_unpin(&js, &names, 3, 7, format!("watch {i}"))),
        )
        .await;
        let firsts: Vec<bool> = firsts.into_iter().map(|r| r.expect("stored")).collect();
        assert_eq!(firsts.iter().filter(|f| **f).count(), 1, "{firsts:?}");
        // Later, again: still not first.
        assert!(
            !first_to_unpin(&js, &names, 3, 7, "late".into())
                .await
                .unwrap()
        );
        // Another claim (or another partition) is another verdict.
        assert!(
            first_to_unpin(&js, &names, 3, 9, "next claim".into())
                .await
                .unwrap()
        );
        assert!(
            first_to_unpin(&js, &names, 4, 7, "other partition".into())
                .await
                .unwrap()
        );
        // Rolled up: one record per partition.
        let stored = js
            .get_stream(names.journal_stream(0))
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages;
        assert_eq!(stored, 2);
    }

    /// On R3 a store of the same record by another watch may still be in process when this
    /// one's arrives (10158, seen in the `cluster` suite's logs): that watch is first, this one
    /// is not, and neither fails.
    #[tokio::test]
    async fn on_r3_a_watch_whose_record_another_is_storing_is_not_first() {
        use async_nats::jetstream::stream;
        let cluster = jetshard_testkit::NatsCluster::start(3)
            .await
            .expect("start the cluster");
        let js = async_nats::jetstream::new(cluster.connect().await.expect("connect"));
        let names = Names::new("t");
        js.create_stream(stream::Config {
            name: names.journal_stream(0).to_owned(),
            subjects: names.journal_subjects(0),
            allow_rollup: true,
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .expect("create the journal");
        // Until the new R3 stream answers, a publish through another server than its leader
        // may find no stream (seen: "claim 1: no stream found for given subject").
        let subject = names.unpin_subject(3);
        jetshard_testkit::wait_stream_writable(&js, &subject, std::time::Duration::from_secs(30))
            .await
            .expect("the journal writable");
        for fence_seq in 1..=20 {
            let firsts = futures::future::join_all(
                (0..8).map(|i| first_to_unpin(&js, &names, 3, fence_seq, format!("watch {i}"))),
            )
            .await;
            let firsts: Vec<bool> = firsts
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("claim {fence_seq}: {e}")))
                .collect();
            assert_eq!(firsts.iter().filter(|f| **f).count(), 1, "{firsts:?}");
        }
    }
}
