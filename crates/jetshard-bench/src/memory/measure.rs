//! One variant measured: the journal written, the child started, and its RSS and heap read at
//! each point.

use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use jetshard::{Codec, ShardConfig};

use super::child::{ChildStatus, MemoryChild};
use super::{
    BOUNDED_DIVISOR, CAP_DIVISOR, ENTITY_TYPE, Figures, NEVER, PARTITIONS, PASSIVATE_AFTER,
    Variant, WAVE,
};
use crate::entity::{BenchCmd, BenchEvt};
use crate::load::{self, AckWindow, CommandPublisher};

/// Runs one variant: a fresh server, the journal written, the child driven through its
/// three measuring points.
pub(super) async fn measure(variant: Variant, n: usize) -> anyhow::Result<Figures> {
    let server = crate::server::nats_server().await?;
    let control = server.connect().await?;
    let config = ShardConfig::builder(ENTITY_TYPE)
        .partitions(PARTITIONS)
        .node_id("provision")
        .build()?;
    load::provision(server.connect().await?, config).await?;
    let ids: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let codec = Codec::default();
    let event = if variant.state_bytes == 0 {
        BenchEvt::Stamped { at_ns: 1 }
    } else {
        BenchEvt::Filled {
            blob: vec![7; variant.state_bytes],
        }
    };
    let payload = Bytes::from(codec.encode(&event).context("encode an event")?);
    let events = ids.iter().map(|id| {
        let partition = jetshard::test_support::fnv1a_32(id.as_bytes()) % PARTITIONS;
        (partition, id.clone(), payload.clone())
    });
    load::write_events(control.clone(), ENTITY_TYPE, events).await?;

    let cap = if variant.bounded {
        Some((n / BOUNDED_DIVISOR).max(1))
    } else {
        variant.capped.then_some((n / CAP_DIVISOR).max(1))
    };
    let dormant_budget = variant.bounded.then_some((n / BOUNDED_DIVISOR).max(1));
    let passivate_after = if variant.passivated {
        PASSIVATE_AFTER
    } else {
        NEVER
    };
    let mut child = MemoryChild::start(&server.url(), cap, dormant_budget, passivate_after).await?;
    let mut figures = Figures {
        entities: n,
        cap,
        dormant_budget,
        standby_rss: child.rss().await?,
        ..Figures::default()
    };

    // One command per partition: every partition is acquired, every state rebuilt.
    let publisher = CommandPublisher::for_ids(control.clone(), ENTITY_TYPE, ids.clone());
    let mut window = AckWindow::default();
    for partition in 0..PARTITIONS {
        let index = ids
            .iter()
            .position(|id| {
                jetshard::test_support::fnv1a_32(id.as_bytes()) % PARTITIONS == partition
            })
            .context("an entity in every partition")?;
        window
            .push(publisher.send_to(index, &BenchCmd::Touch).await?)
            .await?;
    }
    window.drain().await?;
    child
        .wait_for(Duration::from_secs(300), "every partition acquired", |s| {
            s.owned == PARTITIONS as usize && s.in_hand == 0 && s.applied >= u64::from(PARTITIONS)
        })
        .await?;
    figures.rebuilt_rss = child.rss().await?;
    figures.rebuilt_heap = child.heap().await?;

    // In waves, so that the figure holds the entities, not a backlog's transient buffers.
    let started = tokio::time::Instant::now();
    let mut touched = 0;
    let mut status = ChildStatus::default();
    let tenth = n.div_ceil(10);
    let mut next_sample = tenth;
    while touched < n {
        let wave = WAVE.min(n - touched);
        publisher
            .preload_range(touched, wave, &BenchCmd::Touch)
            .await?;
        touched += wave;
        let expected = touched as u64 + u64::from(PARTITIONS);
        status = child
            .wait_for(
                Duration::from_secs(120),
                "a wave of entities touched",
                |s| s.applied >= expected && s.in_hand == 0,
            )
            .await?;
        if variant.bounded && (touched >= next_sample || touched == n) {
            let rss = child.rss().await?;
            let heap = child.heap().await?;
            eprintln!(
                "memory: {touched} of {n} touched, RSS {} MB, heap in use {} MB, {} resident, {} dormant",
                rss / (1024 * 1024),
                heap / (1024 * 1024),
                status.resident,
                status.dormant
            );
            figures.rss_by_tenth.push(rss);
            figures.heap_by_tenth.push(heap);
            next_sample += tenth;
        }
    }
    figures.dormant_at_end = status.dormant;
    figures.touch_secs = started.elapsed().as_secs_f64();
    figures.peak_resident = child.peak_resident;
    figures.resident_at_end = status.resident;
    figures.resident_rss = child.rss().await?;
    figures.resident_heap = child.heap().await?;
    if cap.is_none() && !variant.passivated && status.resident < n {
        bail!("only {} of {n} entities are resident", status.resident);
    }
    if variant.passivated {
        let started = tokio::time::Instant::now();
        child
            .wait_for(Duration::from_secs(120), "every entity passivated", |s| {
                s.resident == 0
            })
            .await?;
        figures.passivate_secs = started.elapsed().as_secs_f64();
        figures.passivated_rss = child.rss().await?;
        figures.passivated_heap = child.heap().await?;
    }
    child.quit().await?;
    Ok(figures)
}
