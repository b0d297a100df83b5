//! State queries: an entity's current state read without a command, answered by its owner.
//!
//! A reader sends a core NATS request to `<t>.query.<p>.<id>` (the partition computed as for
//! commands). Every process's owner of partition `p` listens there; only one that owns the
//! partition answers, and only
//!
//! - **after the commands in hand of that entity** that reached its actor before the query (the
//!   query waits in the entity actor's mailbox behind them), and
//! - **under the current generation**: right before answering, the owner reads the partition's
//!   last fence record and stays silent unless it names its own generation. During a hand-off
//!   the old owner therefore stops answering as soon as the new one has claimed, and the new one
//!   answers once it has rebuilt the entity. In between, a process that handed the partition off
//!   answers "moving" (`{"error":...,"moving":true}`) while no newer claim exists, and the
//!   reader asks again until its timeout: it gets the new owner's answer, or [`Error::Moving`],
//!   or, when nobody owns the partition, [`Error::NoAnswer`].
//!
//! So an answer reflects every command acknowledged before the query was sent, except that a
//! claim racing the answer may leave a stale answer a few milliseconds old (the fence read and
//! the answer are two steps). It never reflects an event that is not durable.
//!
//! The answer is JSON (docs/WIRE.md): `{"entity","partition","generation","last_command_seq",
//! "state":"<base64 of the state, encoded by Entity::encode_state>"}` or `{"error":"..."}`.

use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use async_nats::{Client, Subject};
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::command::CommandSender;
use crate::entity::{Entity, EntityId};
use crate::error::{CodecError, Error};
use crate::journal::fence;
use crate::wire::Names;
use crate::wire::partition::partition_of;

/// The longest a fence check before an answer may take; past it, no answer.
const FENCE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// An answered query, as on the wire: the state still encoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueryAnswer {
    /// The entity.
    pub entity: String,
    /// Its partition.
    pub partition: u32,
    /// The generation of the owner that answered: the partition's current one when it answered.
    pub generation: u64,
    /// The stream sequence of the last command applied to (or rejected or dead-lettered by) the
    /// entity; 0 if it has none.
    pub last_command_seq: u64,
    /// The state as [`Entity::encode_state`] encoded it (JSON: base64).
    #[serde(with = "base64_bytes")]
    pub state: Vec<u8>,
}

/// An entity's current state as its owner answered a query ([`CommandSender::get`]), decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CurrentState<S> {
    /// Its partition.
    pub partition: u32,
    /// The generation of the owner that answered.
    pub generation: u64,
    /// The last command the state reflects (0: none).
    pub last_command_seq: u64,
    /// The state.
    pub state: S,
}

/// The JSON body of an answer: an answer or an error.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum AnswerBody {
    Answer(QueryAnswer),
    Refused {
        error: String,
        /// The partition is changing hands: ask again (a process that handed it over says so).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        moving: bool,
        /// The refusal is passing (the entity's state is being rebuilt): ask again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        again: bool,
    },
}

/// How long one attempt of [`ask`] waits for an answer before it asks again: a query that
/// reached no owner (the partition was between owners) is not answered later.
const ATTEMPT: Duration = Duration::from_millis(500);

/// The pause before asking again after a refusal to answer or no responders.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// A query in hand: the entity, and where to answer.
#[derive(Debug)]
pub(crate) struct Query {
    pub(crate) entity: EntityId,
    pub(crate) reply: Subject,
}

/// What an owner knows of the entity when it answers.
pub(crate) struct EntityView {
    pub(crate) partition: u32,
    pub(crate) generation: u64,
    pub(crate) last_command_seq: u64,
    pub(crate) state: Result<Vec<u8>, CodecError>,
}

/// Listens on `subject` (a partition's queries) and hands each query to `sink` until it
/// refuses or the subscription ends. The returned task belongs to the owner that started it.
pub(crate) async fn listen(
    client: &Client,
    subject: String,
    sink: impl Fn(Query) -> bool + Send + 'static,
) -> Result<JoinHandle<()>, Error> {
    let mut queries = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| Error::jetstream(format!("subscribe to {subject}"), e))?;
    Ok(tokio::spawn(async move {
        while let Some(message) = queries.next().await {
            let (Some(reply), Some(entity)) = (
                message.reply,
                Names::entity_of_subject(&message.subject).and_then(|id| EntityId::new(id).ok()),
            ) else {
                continue;
            };
            if !sink(Query { entity, reply }) {
                return;
            }
        }
    }))
}

/// Answers `query` with what the owner knows, if the partition's last fence record still names
/// `view.generation`; otherwise stays silent (a newer owner answers). Returns the newer
/// generation the fence names, if it names one: the answerer's owner is superseded.
pub(crate) async fn answer(
    client: &Client,
    journal: &Stream<()>,
    names: &Names,
    query: Query,
    view: EntityView,
) -> Option<u64> {
    let current = tokio::time::timeout(
        FENCE_CHECK_TIMEOUT,
        fence::latest(journal, names, view.partition),
    )
    .await;
    let generation = match current {
        Ok(Ok(Some((_, record)))) => record.generation,
        _ => return None,
    };
    if generation != view.generation {
        tracing::debug!(
            partition = view.partition,
            entity = %query.entity,
            generation = view.generation,
            current = generation,
            "query not answered: a newer generation owns the partition"
        );
        // Only a newer record supersedes this owner.
        return (generation > view.generation).then_some(generation);
    }
    let body = match view.state {
        Ok(state) => AnswerBody::Answer(QueryAnswer {
            entity: query.entity.to_string(),
            partition: view.partition,
            generation: view.generation,
            last_command_seq: view.last_command_seq,
            state,
        }),
        Err(e) => AnswerBody::Refused {
            error: e.to_string(),
            moving: false,
            again: false,
        },
    };
    refuse_or_send(client, query.reply, &body).await;
    None
}

/// Answers `query` with an error at once (a quarantined entity; `again`: a passing refusal,
/// such as a state being rebuilt, that the reader asks again after).
pub(crate) async fn refuse(client: &Client, query: Query, error: String, again: bool) {
    refuse_or_send(
        client,
        query.reply,
        &AnswerBody::Refused {
            error,
            moving: false,
            again,
        },
    )
    .await;
}

/// Answers `query` "moving, ask again" if the partition's last fence record still names
/// `generation`, the one this process handed over (no new owner has claimed yet); otherwise
/// stays silent (the new owner answers).
pub(crate) async fn moving(
    client: &Client,
    journal: &Stream<()>,
    names: &Names,
    partition: u32,
    generation: u64,
    query: Query,
) {
    let current = tokio::time::timeout(
        FENCE_CHECK_TIMEOUT,
        fence::latest(journal, names, partition),
    )
    .await;
    if !matches!(current, Ok(Ok(Some((_, ref record)))) if record.generation == generation) {
        return;
    }
    let body = AnswerBody::Refused {
        error: "the partition is changing hands: ask again".to_owned(),
        moving: true,
        again: true,
    };
    refuse_or_send(client, query.reply, &body).await;
}

async fn refuse_or_send(client: &Client, to: Subject, body: &AnswerBody) {
    let Ok(bytes) = serde_json::to_vec(body) else {
        return;
    };
    if let Err(e) = client.publish(to, bytes.into()).await {
        tracing::debug!(error = %e, "query answer not sent");
    }
}

/// Asks the owner of `id`'s partition for its state.
pub(crate) async fn ask(
    client: &Client,
    names: &Names,
    partitions: u32,
    id: &str,
    timeout: Duration,
) -> Result<QueryAnswer, Error> {
    let id = EntityId::new(id)?;
    let subject = names.query_subject(partition_of(&id, partitions), &id);
    let deadline = tokio::time::Instant::now() + timeout;
    // Asked again until the deadline: during a hand-off a query reaches the old owner after it
    // let go (it says "moving") or nobody (between the two), and the new owner answers a later
    // one.
    let (mut moving, mut refused) = (false, None);
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            let (entity, waited) = (id.to_string(), timeout);
            return Err(match (moving, refused) {
                (true, _) => Error::Moving { entity, waited },
                (false, Some(reason)) => Error::QueryRefused { entity, reason },
                (false, None) => Error::NoAnswer { entity, waited },
            });
        }
        let request = client.request(subject.clone(), Default::default());
        let message = match tokio::time::timeout(remaining.min(ATTEMPT), request).await {
            Ok(Ok(message)) => message,
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                tokio::time::sleep(RETRY_PAUSE.min(remaining)).await;
                continue;
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::TimedOut => continue,
            Ok(Err(e)) => return Err(Error::jetstream("query", e)),
            Err(_) => continue,
        };
        match serde_json::from_slice(&message.payload) {
            Ok(AnswerBody::Answer(answer)) => return Ok(answer),
            Ok(AnswerBody::Refused {
                error,
                moving: m,
                again: true,
            }) => {
                moving |= m;
                refused = Some(error);
                tokio::time::sleep(RETRY_PAUSE.min(remaining)).await;
            }
            Ok(AnswerBody::Refused { error, .. }) => {
                return Err(Error::QueryRefused {
                    entity: id.to_string(),
                    reason: error,
                });
            }
            Err(e) => return Err(Error::jetstream("read the query answer", e)),
        }
    }
}

impl<E: Entity> CommandSender<E> {
    /// Reads the current state of entity `id` from its owner, without a command: the state after
    /// every command acknowledged before this call, under the partition's current generation
    /// (see the consistency notes of docs/guide.md, "Reading state").
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use jetshard::{CommandSender, Entity};
    /// # async fn run<E: Entity>(sender: CommandSender<E>) -> Result<(), jetshard::Error>
    /// # where E::State: serde::de::DeserializeOwned {
    /// let current = sender.get("acc-17", Duration::from_secs(2)).await?;
    /// let _state: E::State = current.state;
    /// # Ok(()) }
    /// ```
    ///
    /// The query is asked again until `timeout` while no owner answers: a query during a
    /// hand-off is answered by the new owner once it has the entity.
    ///
    /// # Errors
    /// [`Error::InvalidId`]; [`Error::Moving`] if the partition was changing hands all along
    /// (the process that handed it over said so; ask again); [`Error::NoAnswer`] if no owner
    /// answered within `timeout` (nobody owns the partition); [`Error::QueryRefused`] if the owner cannot
    /// answer (the entity type does not answer queries, the entity is quarantined);
    /// [`Error::Codec`] if the state does not decode.
    pub async fn get(&self, id: &str, timeout: Duration) -> Result<CurrentState<E::State>, Error>
    where
        E::State: DeserializeOwned,
    {
        let answer = ask(&self.js.client(), &self.names, self.partitions, id, timeout).await?;
        Ok(CurrentState {
            partition: answer.partition,
            generation: answer.generation,
            last_command_seq: answer.last_command_seq,
            state: self.codec.decode(&answer.state)?,
        })
    }
}

mod base64_bytes {
    use super::BASE64;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&BASE64.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        BASE64.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_and_a_refusal_read_back() {
        let answer = AnswerBody::Answer(QueryAnswer {
            entity: "o-1".into(),
            partition: 3,
            generation: 7,
            last_command_seq: 42,
            state: b"{\"n\":1}".to_vec(),
        });
        let json = serde_json::to_string(&answer).unwrap();
        assert!(json.contains("\"state\":\"eyJuIjoxfQ==\""), "{json}");
        assert!(matches!(
            serde_json::from_str::<AnswerBody>(&json).unwrap(),
            AnswerBody::Answer(QueryAnswer { generation: 7, .. })
        ));
        let refused: AnswerBody = serde_json::from_str(r#"{"error":"quarantined"}"#).unwrap();
        assert!(
            matches!(refused, AnswerBody::Refused { error, moving: false, again: false } if error == "quarantined")
        );
        let moving = AnswerBody::Refused {
            error: "changing hands".into(),
            moving: true,
            again: true,
        };
        let json = serde_json::to_string(&moving).unwrap();
        assert_eq!(
            json,
            r#"{"error":"changing hands","moving":true,"again":true}"#
        );
    }
}
