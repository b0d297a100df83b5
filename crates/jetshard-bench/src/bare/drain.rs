//! The bare loop drained by the throughput protocol ([`crate::drain`]): as a user writing it
//! by hand would run it ([`drain_bare`]), or with an experiment's knobs ([`drain_bare_with`]).

use std::time::Duration;

use jetshard::ShardConfig;

use super::{BareLoop, BareSettings, Knob};
use crate::drain::{DrainRun, DrainSpec, ENTITY_TYPE, timed_passes_with};
use crate::load;

/// Drains through the bare loop in this process, as a user writing it by hand would run it
/// ([`BareSettings::careful`]).
pub async fn drain_bare(spec: DrainSpec) -> anyhow::Result<DrainRun> {
    drain_bare_with(spec, BareSettings::careful()).await
}

/// [`drain_bare`] with an experiment's settings.
pub async fn drain_bare_with(spec: DrainSpec, settings: BareSettings) -> anyhow::Result<DrainRun> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let mut config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(spec.partitions)
        .node_id("provision")
        .max_ack_pending(crate::bare::MAX_ACK_PENDING);
    if settings.has(Knob::DefaultDuplicateWindow) {
        config = config.duplicate_window(Duration::from_secs(120));
    }
    if settings.has(Knob::OwnStreams) {
        crate::bare::provision_own(&control, ENTITY_TYPE, spec.partitions).await?;
    } else {
        load::provision(server.connect().await?, config.build()?).await?;
    }
    if !settings.has(Knob::NoSeed) {
        load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    }
    let bare = BareLoop::start_with_settings(
        server.connect().await?,
        ENTITY_TYPE,
        spec.partitions,
        settings,
    )
    .await?;
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let poll = settings
        .has(Knob::SlowDrainPoll)
        .then_some(Duration::from_millis(500));
    let hold = settings.has(Knob::NoPause).then_some(&bare);
    let passes = timed_passes_with(&pids, &control, spec, poll, hold, || bare.check()).await;
    bare.stop().await?;
    Ok(DrainRun {
        passes: passes?,
        acquisitions: None,
    })
}
