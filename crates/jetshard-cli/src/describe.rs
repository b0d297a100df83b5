//! What an entity type's command stream says of it: that it exists, its partitions, its codec.

use anyhow::Context as _;

/// What the command stream of an entity type says of it.
pub(crate) struct Described {
    entity_type: String,
    /// From the stream's partition transform.
    partitions: Option<u32>,
    /// The codec recorded with the stream (`jetshard.codec`), if any.
    pub(crate) codec: Option<String>,
}

impl Described {
    /// Refuses a partition the entity type does not have, in words.
    pub(crate) fn check(&self, partition: u32) -> anyhow::Result<()> {
        match self.partitions {
            Some(n) if partition >= n => anyhow::bail!(
                "partition {partition} is out of range: {} has {n} partitions (0 to {})",
                self.entity_type,
                n - 1
            ),
            _ => Ok(()),
        }
    }
}

/// Reads the entity type's command stream (`<T>_CMD`, or `<T>_CMD_0` of a spread layout); an
/// entity type with none is an error in words.
pub(crate) async fn describe(
    client: &jetshard::async_nats::Client,
    entity_type: &str,
) -> anyhow::Result<Described> {
    use jetshard::async_nats::jetstream;
    use jetshard::wire::Names;
    let js = jetstream::new(client.clone());
    let [one, spread] = Names::first_command_streams(entity_type);
    for name in [&one, &spread] {
        let mut stream = match js.get_stream(name).await {
            Ok(stream) => stream,
            Err(e) => match e.kind() {
                jetstream::context::GetStreamErrorKind::JetStream(err)
                    if err.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    continue;
                }
                _ => return Err(e).with_context(|| format!("looking up stream {name}")),
            },
        };
        let info = stream
            .info()
            .await
            .with_context(|| format!("reading stream {name}"))?;
        return Ok(Described {
            entity_type: entity_type.to_owned(),
            partitions: Names::recorded_partitions(&info.config),
            codec: info.config.metadata.get("jetshard.codec").cloned(),
        });
    }
    anyhow::bail!(
        "unknown entity type {entity_type:?}: its command stream {} does not exist on this server (no node of that type has started here; types are lowercase tokens such as `order`)",
        one
    )
}
