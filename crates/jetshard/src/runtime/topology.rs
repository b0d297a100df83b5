//! Streams and consumers of one entity type: created if missing, validated if present.
//!
//! Architecture Invariant: only this module creates or changes streams and consumers. A stream
//! that exists with another partition count, or a consumer with other settings, is an error at
//! start, never a silent change. The one change made in place is additive: a journal stream
//! created by an earlier jetshard gains the subjects it lacks (per-entity dead letters,
//! snapshots) and roll-ups (`allow_rollup_hdrs`), which no existing record depends on.
//!
//! The settings that decide how stored bytes are read are recorded with every stream, in its
//! metadata, when it is created: the codec (`jetshard.codec`; commands, events, snapshots,
//! rejections and dead-lettered payloads are all its bytes) and the number of journal streams
//! (`jetshard.journal_streams`: which stream holds a partition's records). The partition count
//! is recorded by the command stream's subject transform. All three are checked at every
//! start, so nothing decodes a record with a codec other than the one it was written with, nor
//! looks for a partition's records in a stream that does not hold them. A stream created
//! before the records existed gets them on the first start of this version: the codec from
//! that process's configuration, the journal streams as 1 (a journal then was one stream; a
//! process configured for more is refused).

use async_nats::jetstream::consumer::{AckPolicy, PriorityPolicy, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType, SubjectTransform};
use async_nats::jetstream::{self, Context};

use crate::config::{CommandRetention, ShardConfig};
use crate::error::Error;
use crate::journal::server::{Streams, stream_info, stream_info_if_any};
use crate::wire::{
    METADATA_CODEC, METADATA_JOURNAL_STREAMS, METADATA_PARTITIONS, Names, PRIORITY_GROUP,
};

/// How often [`provision`] tries before its error is final.
const PROVISION_ATTEMPTS: u32 = 4;

/// Creates or validates both streams and every partition consumer, retrying while the failure
/// is the server's (a timeout, a stream another process is creating at the same moment, a
/// fresh cluster still electing leaders): processes that start together race each other. A
/// settings mismatch is final at once.
pub(crate) async fn provision(
    js: &Context,
    names: &Names,
    config: &ShardConfig,
) -> Result<(), Error> {
    let mut delay = std::time::Duration::from_millis(250);
    let mut attempt = 1;
    loop {
        match provision_once(js, names, config).await {
            Err(e @ Error::JetStream { .. }) if attempt < PROVISION_ATTEMPTS => {
                tracing::warn!(entity_type = %names.entity_type, attempt, error = %e, "provisioning failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            done => return done,
        }
    }
}

async fn provision_once(js: &Context, names: &Names, config: &ShardConfig) -> Result<(), Error> {
    // The journal first: where its subjects are another layout's streams', the server refuses
    // it before anything is created.
    if names.journal_streams().len() == 1 {
        upgrade_journal_stream(js, names).await?;
    }
    for (index, name) in names.journal_streams().iter().enumerate() {
        let ensured = ensure_stream(
            js,
            journal_stream_config(names, config, index),
            |existing| check_journal_stream(names, config, index, existing),
        )
        .await;
        if let Err(Error::Incompatible { .. }) = &ensured
            && let Some(mismatch) = layout_mismatch(js, names, config).await
        {
            return Err(mismatch);
        }
        ensured?;
        record_stored_settings(js, name, config).await?;
    }
    for (index, name) in names.command_streams().iter().enumerate() {
        ensure_stream(
            js,
            command_stream_config(names, config, index),
            |existing| check_command_stream(names, config, index, existing),
        )
        .await?;
        record_stored_settings(js, name, config).await?;
    }
    let commands = Streams::open(js, names.command_streams()).await?;
    for partition in 0..config.partitions {
        ensure_consumer(
            commands.of(partition),
            consumer_config(names, config, partition),
        )
        .await?;
    }
    Ok(())
}

/// Why a journal stream was refused, when it is the other layout's (one stream where spread is
/// configured, or the other way round): the layout its command stream records, as the setting
/// it is. Asked only once a journal stream was refused, so that a start asks nothing of
/// streams its configuration does not name (a node's permissions cover only those); `None`
/// where no such command stream can be read.
async fn layout_mismatch(js: &Context, names: &Names, config: &ShardConfig) -> Option<Error> {
    let [one, spread] = Names::first_command_streams(names.entity_type());
    let other = if names.is_spread() { one } else { spread };
    let info = stream_info_if_any(js, &other).await.ok()??;
    let stored = info
        .config
        .metadata
        .get(METADATA_JOURNAL_STREAMS)
        .map_or("1", String::as_str);
    (stored != config.journal_streams.to_string()).then(|| Error::StoredSettingMismatch {
        stream: other,
        setting: "journal_streams",
        stored: stored.to_owned(),
        configured: config.journal_streams.to_string(),
    })
}

fn command_stream_config(names: &Names, config: &ShardConfig, index: usize) -> stream::Config {
    stream::Config {
        name: names.command_streams()[index].clone(),
        subjects: names.command_subjects(index),
        // One stream places each command in its partition itself; a spread layout's
        // publishers name the partition.
        subject_transform: (!names.is_spread()).then(|| SubjectTransform {
            source: names.command_subjects(0).remove(0),
            destination: names.command_transform_dest(config.partitions),
        }),
        retention: match config.command_retention {
            CommandRetention::WorkQueue => RetentionPolicy::WorkQueue,
            CommandRetention::Limits => RetentionPolicy::Limits,
        },
        storage: StorageType::File,
        num_replicas: config.replicas,
        allow_direct: true,
        // nats-server 2.15 limits a stream to 1,000 consumers unless it says otherwise (and
        // takes no value <= 0 for "unlimited"): one per partition, and room for the readers.
        max_consumers: config.partitions as i32 + 1000,
        metadata: stored_settings(config),
        ..Default::default()
    }
}

/// The settings recorded with a stream at its creation (see the module docs).
fn stored_settings(config: &ShardConfig) -> std::collections::HashMap<String, String> {
    let mut settings = std::collections::HashMap::from([
        (METADATA_CODEC.to_owned(), config.codec.name().to_owned()),
        (
            METADATA_JOURNAL_STREAMS.to_owned(),
            config.journal_streams.to_string(),
        ),
    ]);
    if config.journal_streams > 1 {
        settings.insert(
            METADATA_PARTITIONS.to_owned(),
            config.partitions.to_string(),
        );
    }
    settings
}

/// Refuses a stream whose recorded settings are not the configured ones; `None` if it lacks a
/// record (written before it existed: a journal then was one stream, so a process configured
/// for several is refused rather than recording its own).
fn check_stored_settings(
    stream: &str,
    config: &ShardConfig,
    existing: &stream::Config,
) -> Result<Option<()>, Error> {
    if let Some(stored) = existing.metadata.get(METADATA_PARTITIONS)
        && *stored != config.partitions.to_string()
    {
        return Err(Error::PartitionMismatch {
            stream: stream.to_owned(),
            existing: stored.clone(),
            configured: config.partitions,
        });
    }
    let journal_streams = existing.metadata.get(METADATA_JOURNAL_STREAMS);
    let stored_streams = journal_streams.map_or("1", String::as_str);
    if stored_streams != config.journal_streams.to_string() {
        return Err(Error::StoredSettingMismatch {
            stream: stream.to_owned(),
            setting: "journal_streams",
            stored: stored_streams.to_owned(),
            configured: config.journal_streams.to_string(),
        });
    }
    let Some(stored) = existing.metadata.get(METADATA_CODEC) else {
        return Ok(None);
    };
    if stored != config.codec.name() {
        return Err(Error::StoredSettingMismatch {
            stream: stream.to_owned(),
            setting: "codec",
            stored: stored.clone(),
            configured: config.codec.name().to_owned(),
        });
    }
    Ok(journal_streams.map(|_| ()))
}

/// Records the settings with a stream created before they were recorded (an upgrade: the
/// first process of this version to start writes its own configuration); a stream that has
/// them was checked by [`ensure_stream`].
async fn record_stored_settings(
    js: &Context,
    name: &str,
    config: &ShardConfig,
) -> Result<(), Error> {
    let info = stream_info(js, name).await?;
    if check_stored_settings(name, config, &info.config)?.is_some() {
        return Ok(());
    }
    tracing::info!(stream = %name, codec = config.codec.name(), journal_streams = config.journal_streams, "recording the settings with a stream created before they were recorded");
    let mut updated = info.config.clone();
    updated.metadata.extend(stored_settings(config));
    js.update_stream(updated)
        .await
        .map_err(|e| Error::jetstream(format!("update stream {name}"), e))?;
    Ok(())
}

fn journal_stream_config(names: &Names, config: &ShardConfig, index: usize) -> stream::Config {
    stream::Config {
        name: names.journal_streams()[index].clone(),
        subjects: names.journal_subjects(index),
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        num_replicas: config.replicas,
        duplicate_window: config.duplicate_window,
        allow_direct: true,
        allow_atomic_publish: true,
        // A snapshot rolls up the entity's previous one (`Nats-Rollup: sub`).
        allow_rollup: true,
        metadata: stored_settings(config),
        ..Default::default()
    }
}

/// Adds what a journal stream of an earlier jetshard lacks: the subjects of per-entity dead
/// letters and of snapshots, and roll-ups. A missing stream is left to [`ensure_stream`].
async fn upgrade_journal_stream(js: &Context, names: &Names) -> Result<(), Error> {
    let name = &names.journal_streams()[0];
    let Ok(mut stream) = js.get_stream(name).await else {
        return Ok(());
    };
    let info = stream
        .info()
        .await
        .map_err(|e| Error::jetstream(format!("read stream {name}"), e))?;
    let mut config = info.config.clone();
    let missing: Vec<String> = names
        .journal_subjects(0)
        .into_iter()
        .filter(|s| !config.subjects.contains(s))
        .collect();
    if missing.is_empty() && config.allow_rollup {
        return Ok(());
    }
    tracing::info!(stream = %name, ?missing, "adding the journal's new subjects and roll-ups");
    config.subjects.extend(missing);
    config.allow_rollup = true;
    js.update_stream(config)
        .await
        .map_err(|e| Error::jetstream(format!("update stream {name}"), e))?;
    Ok(())
}

pub(crate) fn consumer_config(names: &Names, config: &ShardConfig, partition: u32) -> pull::Config {
    pull::Config {
        durable_name: Some(names.consumer(partition)),
        filter_subject: names.partition_commands(partition),
        ack_policy: AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        // Unlimited at the server: a command is given up only by jetshard, with a dead-letter
        // record. Ownership changes (takeovers, hand-offs, stalls) use deliveries up too, and a
        // server limit would drop such a command silently: its ack floor moves past it and it
        // is never delivered again, though it was never applied (seen in tests/tests/cluster.rs).
        // jetshard's own `max_deliver` counts the server's delivery count on a failure.
        max_deliver: -1,
        max_ack_pending: i64::from(config.max_ack_pending),
        priority_policy: PriorityPolicy::PinnedClient,
        priority_groups: vec![PRIORITY_GROUP.to_owned()],
        priority_timeout: config.pin_ttl,
        num_replicas: config.replicas,
        ..Default::default()
    }
}

async fn ensure_stream(
    js: &Context,
    wanted: stream::Config,
    check: impl FnOnce(&stream::Config) -> Result<(), Error>,
) -> Result<(), Error> {
    let name = wanted.name.clone();
    match js.get_stream(&name).await {
        Ok(mut existing) => {
            let info = existing
                .info()
                .await
                .map_err(|e| Error::jetstream(format!("read stream {name}"), e))?;
            check(&info.config)
        }
        Err(e) => match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(err)
                if err.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                create_stream(js, wanted, check).await
            }
            _ => Err(Error::jetstream(format!("look up stream {name}"), e)),
        },
    }
}

async fn create_stream(
    js: &Context,
    wanted: stream::Config,
    check: impl FnOnce(&stream::Config) -> Result<(), Error>,
) -> Result<(), Error> {
    let name = wanted.name.clone();
    // Another process may create it at the same moment; `get_or_create` then returns theirs,
    // which is validated like any existing stream.
    let mut created = js
        .get_or_create_stream(wanted)
        .await
        .map_err(|e| match e.kind() {
            // Another stream holds its subjects: a journal of the other layout (one stream where
            // it is configured spread, or the other way round), or another application's stream.
            jetstream::context::CreateStreamErrorKind::JetStream(err)
                if err.error_code() == jetstream::ErrorCode::STREAM_SUBJECT_OVERLAP =>
            {
                Error::Incompatible {
                    what: format!("stream {name}"),
                    detail: "another stream holds its subjects (a journal of the entity type in \
                         another number of streams than journal_streams says, or another \
                         application's stream); nothing was created"
                        .to_owned(),
                }
            }
            _ => Error::jetstream(format!("create stream {name}"), e),
        })?;
    let info = created
        .info()
        .await
        .map_err(|e| Error::jetstream(format!("read stream {name}"), e))?;
    check(&info.config)
}

fn check_command_stream(
    names: &Names,
    config: &ShardConfig,
    index: usize,
    existing: &stream::Config,
) -> Result<(), Error> {
    let name = &names.command_streams()[index];
    // A spread layout records its partition count (checked with the other settings); its
    // subjects must be the partitions' it holds, with no transform.
    check_stored_settings(name, config, existing)?;
    let dest = existing
        .subject_transform
        .as_ref()
        .map(|t| t.destination.as_str());
    let placed = if names.is_spread() {
        dest.is_none() && existing.subjects == names.command_subjects(index)
    } else {
        dest == Some(names.command_transform_dest(config.partitions).as_str())
    };
    if !placed {
        return Err(Error::PartitionMismatch {
            stream: name.clone(),
            existing: dest.map_or_else(
                || format!("subjects {}", existing.subjects.join(" ")),
                partition_count_of,
            ),
            configured: config.partitions,
        });
    }
    let wanted_retention = match config.command_retention {
        CommandRetention::WorkQueue => RetentionPolicy::WorkQueue,
        CommandRetention::Limits => RetentionPolicy::Limits,
    };
    if existing.retention != wanted_retention {
        return Err(Error::Incompatible {
            what: format!("stream {name}"),
            detail: format!(
                "retention is {:?}, configured {:?}",
                existing.retention, wanted_retention
            ),
        });
    }
    check_replicas(name, config, existing)
}

/// A stream's replicas are what the configuration says: a process configured for R3 must not
/// run on an R1 stream believing its writes replicated (or the other way round).
fn check_replicas(
    stream: &str,
    config: &ShardConfig,
    existing: &stream::Config,
) -> Result<(), Error> {
    if existing.num_replicas.max(1) != config.replicas {
        return Err(Error::Incompatible {
            what: format!("stream {stream}"),
            detail: format!(
                "it has {} replicas, configured {} (ShardConfig::replicas)",
                existing.num_replicas.max(1),
                config.replicas
            ),
        });
    }
    Ok(())
}

fn check_journal_stream(
    names: &Names,
    config: &ShardConfig,
    index: usize,
    existing: &stream::Config,
) -> Result<(), Error> {
    let name = &names.journal_streams()[index];
    let what = || format!("stream {name}");
    for subject in names.journal_subjects(index) {
        if !existing.subjects.contains(&subject) {
            return Err(Error::Incompatible {
                what: what(),
                detail: format!("subject {subject} is missing"),
            });
        }
    }
    if existing.retention != RetentionPolicy::Limits {
        return Err(Error::Incompatible {
            what: what(),
            detail: "retention must be limits".to_owned(),
        });
    }
    if !existing.allow_atomic_publish {
        return Err(Error::Incompatible {
            what: what(),
            detail: "allow_atomic must be true".to_owned(),
        });
    }
    if !existing.allow_rollup {
        return Err(Error::Incompatible {
            what: what(),
            detail: "allow_rollup_hdrs must be true".to_owned(),
        });
    }
    check_stored_settings(name, config, existing)?;
    check_replicas(name, config, existing)
}

/// `order.cmd.{{partition(8,1)}}.{{wildcard(1)}}` -> "8".
fn partition_count_of(dest: &str) -> String {
    Names::partitions_of_transform(dest).map_or_else(
        || format!("an unknown transform ({dest})"),
        |n| n.to_string(),
    )
}

async fn ensure_consumer(
    commands: &jetstream::stream::Stream<()>,
    wanted: pull::Config,
) -> Result<(), Error> {
    let name = wanted.durable_name.clone().unwrap_or_default();
    let what = || format!("consumer {name}");
    match commands.consumer_info(&name).await {
        Ok(info) => check_consumer(&info.config, &wanted).map_err(|detail| Error::Incompatible {
            what: what(),
            detail,
        }),
        Err(_) => {
            // Missing (or unreadable): create. An identical concurrent create succeeds; a
            // different one fails and is reported.
            commands
                .create_consumer(wanted.clone())
                .await
                .map_err(|e| Error::jetstream(format!("create {}", what()), e))?;
            Ok(())
        }
    }
}

fn check_consumer(
    existing: &jetstream::consumer::Config,
    wanted: &pull::Config,
) -> Result<(), String> {
    let differs = |field: &str, have: String, want: String| {
        Err(format!("{field} is {have}, configured {want}"))
    };
    if existing.filter_subject != wanted.filter_subject {
        return differs(
            "filter_subject",
            existing.filter_subject.clone(),
            wanted.filter_subject.clone(),
        );
    }
    if existing.priority_policy != wanted.priority_policy
        || existing.priority_groups != wanted.priority_groups
    {
        return differs(
            "priority policy",
            format!(
                "{:?} {:?}",
                existing.priority_policy, existing.priority_groups
            ),
            format!("{:?} {:?}", wanted.priority_policy, wanted.priority_groups),
        );
    }
    if existing.ack_policy != AckPolicy::Explicit {
        return differs(
            "ack_policy",
            format!("{:?}", existing.ack_policy),
            "Explicit".to_owned(),
        );
    }
    if existing.priority_timeout != wanted.priority_timeout {
        return differs(
            "priority_timeout (pin TTL)",
            format!("{:?}", existing.priority_timeout),
            format!("{:?}", wanted.priority_timeout),
        );
    }
    if existing.ack_wait != wanted.ack_wait {
        return differs(
            "ack_wait",
            format!("{:?}", existing.ack_wait),
            format!("{:?}", wanted.ack_wait),
        );
    }
    if existing.max_deliver != wanted.max_deliver {
        return differs(
            "max_deliver",
            existing.max_deliver.to_string(),
            wanted.max_deliver.to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partition_count_is_read_back_from_a_transform() {
        assert_eq!(
            partition_count_of("order.cmd.{{partition(8,1)}}.{{wildcard(1)}}"),
            "8"
        );
        assert!(partition_count_of("order.cmd.x").contains("unknown"));
    }
}
