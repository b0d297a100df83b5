//! `dead-letters`: list, replay or purge the commands an entity type gave up.

use anyhow::Context as _;
use jetshard::admin::{Admin, DeadLetterPurge};
use serde_json::json;

use crate::command::DeadLetterAction;
use crate::report::Report;

/// Runs a dead-letter action and says what became of it.
pub(crate) async fn dead_letters(
    client: jetshard::async_nats::Client,
    action: DeadLetterAction,
) -> anyhow::Result<Report> {
    Ok(match action {
        DeadLetterAction::List { entity_type } => {
            let letters = Admin::new(client, &entity_type).dead_letters().await?;
            Report::DeadLetters {
                entity_type,
                letters,
            }
        }
        DeadLetterAction::Replay {
            entity_type,
            seq: Some(seq),
            partition,
            ..
        } => {
            let admin = Admin::new(client, &entity_type);
            let partition = match partition {
                Some(partition) => partition,
                None => partition_of(&admin, &entity_type, seq).await?,
            };
            let replayed = admin
                .replay(partition, seq)
                .await
                .with_context(|| format!("replaying dead letter {seq} of {entity_type}"))?;
            Report::Replayed(replayed)
        }
        DeadLetterAction::Replay {
            entity_type,
            seq: None,
            from,
            to,
            ..
        } => {
            let admin = Admin::new(client, &entity_type);
            let letters = admin.dead_letters().await?;
            let mut replayed = Vec::new();
            for letter in letters.iter().filter(|l| {
                from.is_none_or(|from| l.seq >= from) && to.is_none_or(|to| l.seq <= to)
            }) {
                replayed.push(
                    admin
                        .replay(letter.partition, letter.seq)
                        .await
                        .with_context(|| {
                            format!("replaying dead letter {} of {entity_type}", letter.seq)
                        })?,
                );
            }
            Report::ReplayedMany {
                entity_type,
                replayed,
            }
        }
        DeadLetterAction::Purge {
            entity_type,
            partition,
            upto,
        } => {
            let mut which = DeadLetterPurge::all();
            if let Some(partition) = partition {
                which = which.partition(partition);
            }
            if let Some(upto) = upto {
                which = which.up_to(upto);
            }
            let done = Admin::new(client, &entity_type)
                .purge_dead_letters(which)
                .await?;
            let mut text = format!("purged {} dead letters of {entity_type}", done.purged);
            if done.kept > 0 {
                text += &format!(
                    "; kept {}: their commands are not acknowledged yet and would be handled \
                     again without them (purge again once the partition has caught up)",
                    done.kept
                );
            }
            Report::Done {
                text,
                json: json!({"entity_type": entity_type, "partition": partition,
                             "upto": upto, "purged": done.purged, "kept": done.kept}),
            }
        }
    })
}

/// The partition of the one dead letter at journal sequence `seq`: in a journal spread over
/// several streams a sequence may name a dead letter in more than one.
async fn partition_of(admin: &Admin, entity_type: &str, seq: u64) -> anyhow::Result<u32> {
    let partitions: Vec<u32> = admin
        .dead_letters()
        .await?
        .iter()
        .filter(|l| l.seq == seq)
        .map(|l| l.partition)
        .collect();
    match partitions[..] {
        [partition] => Ok(partition),
        [] => anyhow::bail!("journal sequence {seq} is not a dead letter of {entity_type}"),
        _ => anyhow::bail!(
            "dead letters of {entity_type} at journal sequence {seq} in partitions {partitions:?} \
             (its journal is spread over several streams): name one with --partition"
        ),
    }
}
