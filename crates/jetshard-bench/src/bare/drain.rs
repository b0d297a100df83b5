//! The bare loop drained by the throughput protocol ([`crate::drain`]), as a user writing it
//! by hand would run it ([`drain_bare`]).

use super::{BareLoop, BareSettings};
use crate::drain::{DrainRun, DrainSpec, ENTITY_TYPE, timed_passes_with};
use crate::load;

/// Drains through the bare loop in this process, as a user writing it by hand would run it
/// ([`BareSettings::careful`]).
pub async fn drain_bare(spec: DrainSpec) -> anyhow::Result<DrainRun> {
    let settings = BareSettings::careful();
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    crate::bare::provision_own(&control, ENTITY_TYPE, spec.partitions).await?;
    load::seed_entities(control.clone(), ENTITY_TYPE, spec.partitions, spec.entities).await?;
    let bare = BareLoop::start_with_settings(
        server.connect().await?,
        ENTITY_TYPE,
        spec.partitions,
        settings,
    )
    .await?;
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let passes = timed_passes_with(&pids, &control, spec, None, Some(&bare), || bare.check()).await;
    bare.stop().await?;
    Ok(DrainRun {
        passes: passes?,
        acquisitions: None,
    })
}
