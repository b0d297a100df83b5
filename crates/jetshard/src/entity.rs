//! What an application defines: an [`Entity`] type, and the ids of its instances.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::data::Effects;
use crate::error::CodecError;
pub use crate::wire::id::{EntityId, MAX_ID_LEN};

/// One kind of stateful thing the application runs: an order, an account, a device.
///
/// An entity is event-sourced. [`decide`](Entity::decide) turns a command into events against
/// the current state, without side effects; [`apply`](Entity::apply) folds one event into the
/// state. jetshard makes the events durable (fenced by the partition's generation) before it
/// applies them and acknowledges the command, and rebuilds state by applying the journal's
/// events in order. Both functions are pure, so an entity's rules can be unit-tested without a
/// server:
///
/// ```
/// use jetshard::Entity;
/// use serde::{Deserialize, Serialize};
///
/// struct Counter;
///
/// #[derive(Serialize, Deserialize)]
/// enum Command { Add(u32) }
///
/// #[derive(Serialize, Deserialize)]
/// enum Event { Added(u32) }
///
/// impl Entity for Counter {
///     type Command = Command;
///     type Event = Event;
///     type State = u64;
///     type Rejection = String;
///
///     fn decide(state: &u64, command: Command) -> Result<Vec<Event>, String> {
///         match command {
///             Command::Add(0) => Err("nothing to add".into()),
///             Command::Add(n) if *state + u64::from(n) > 1_000 => Err("over the limit".into()),
///             Command::Add(n) => Ok(vec![Event::Added(n)]),
///         }
///     }
///
///     fn apply(state: &mut u64, event: &Event) {
///         match event {
///             Event::Added(n) => *state += u64::from(*n),
///         }
///     }
/// }
///
/// let mut state = 0;
/// for event in Counter::decide(&state, Command::Add(5)).unwrap() {
///     Counter::apply(&mut state, &event);
/// }
/// assert_eq!(state, 5);
/// assert!(Counter::decide(&state, Command::Add(0)).is_err());
/// ```
pub trait Entity: Send + Sync + 'static {
    /// What clients ask of an entity; published to `<type>.cmd.<id>`.
    type Command: Serialize + DeserializeOwned + Send + 'static;
    /// What happened to an entity; written to the journal at `<type>.evt.<partition>.<id>`.
    type Event: Serialize + DeserializeOwned + Send + 'static;
    /// The entity's state, rebuilt from its events; starts at `Default`. Serializable, because
    /// it is written into snapshots ([`snapshots`](Entity::snapshots), on by default); a state
    /// that holds something that does not serialize (a handle, a channel) marks that field
    /// `#[serde(skip)]` and opts out of snapshots.
    type State: Default + Serialize + DeserializeOwned + Send + 'static;
    /// Why [`decide`](Entity::decide) refused a command. A rejected command is acknowledged
    /// (it is not retried) and writes nothing. A client that asked gets it back typed
    /// ([`Reply::Rejected`](crate::Reply::Rejected), encoded with the entity type's codec), and
    /// its text as the reason of the JSON outcome.
    type Rejection: fmt::Display + Serialize + DeserializeOwned + Send + 'static;

    /// Decides the events a command causes, given the entity's state. Must not have side effects:
    /// it may run again for the same command after a crash.
    fn decide(
        state: &Self::State,
        command: Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Rejection>;

    /// As [`decide`](Entity::decide), and collects what else the command causes in `effects`:
    /// commands to other entities and messages to other subjects, published once the events
    /// are durable (at least once; stored once by a JetStream target: see docs/guide.md,
    /// "Effects"). jetshard calls this; the default calls `decide` and causes nothing.
    ///
    /// Still a pure function: `effects` only collects, and is dropped if the command is
    /// rejected. An entity that has effects implements this, and `decide` as
    /// `Self::decide_with_effects(state, command, &mut Effects::new(Codec::default()))` (or
    /// with its own rules for callers that want none).
    ///
    /// ```
    /// use jetshard::{Codec, Effects, Entity};
    /// # struct Order;
    /// # #[derive(serde::Serialize, serde::Deserialize)] enum Cmd { Place { sku: String } }
    /// # #[derive(serde::Serialize, serde::Deserialize)] enum Evt { Placed }
    /// impl Entity for Order {
    /// #   type Command = Cmd; type Event = Evt; type State = (); type Rejection = String;
    /// #   fn apply(_: &mut (), _: &Evt) {}
    ///     fn decide(state: &(), command: Cmd) -> Result<Vec<Evt>, String> {
    ///         Self::decide_with_effects(state, command, &mut Effects::new(Codec::default()))
    ///     }
    ///
    ///     fn decide_with_effects(_: &(), command: Cmd, effects: &mut Effects) -> Result<Vec<Evt>, String> {
    ///         let Cmd::Place { sku } = command;
    ///         effects.command("inventory", &sku, &"reserve");
    ///         Ok(vec![Evt::Placed])
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    /// The rejection, as `decide`.
    fn decide_with_effects(
        state: &Self::State,
        command: Self::Command,
        effects: &mut Effects,
    ) -> Result<Vec<Self::Event>, Self::Rejection> {
        let _ = effects;
        Self::decide(state, command)
    }

    /// Folds one durable event into the state.
    fn apply(state: &mut Self::State, event: &Self::Event);

    /// The version of [`Event`](Entity::Event)'s encoding that this code writes (default 1).
    /// Every event of a version other than 1 is written with it (header
    /// `Jetshard-Event-Version`; an event without it reads as version 1); raise it when a change
    /// of the event type changes its encoding, and read the older versions in
    /// [`upcast`](Entity::upcast).
    const EVENT_VERSION: u32 = 1;

    /// Reads an event written with another [`EVENT_VERSION`](Entity::EVENT_VERSION) than this
    /// code's (events written before versions were recorded count as version 1). The default
    /// decodes it as the current type, which is right as long as the encoding did not change.
    ///
    /// An event that neither decodes nor upcasts quarantines its entity (never the partition):
    /// the entity's commands are dead-lettered, naming the journal record, until a process
    /// whose code reads it owns the partition. See "Changing an event type" in docs/guide.md.
    ///
    /// # Errors
    /// [`CodecError`] if the bytes are no event of that version.
    fn upcast(version: u32, payload: &[u8], codec: Codec) -> Result<Self::Event, CodecError> {
        let _ = version;
        codec.decode(payload)
    }

    /// Encodes the state for a state query (`CommandSender::get`, `Admin::get`,
    /// `jetshard get <type> <id>`). The default refuses: an entity type answers queries only
    /// once it says how its state reads. For a `Serialize` state:
    ///
    /// ```ignore
    /// fn encode_state(state: &Self::State, codec: Codec) -> Result<Vec<u8>, CodecError> {
    ///     codec.encode(state)
    /// }
    /// ```
    ///
    /// # Errors
    /// [`CodecError`] if the state cannot be (or is not to be) encoded; the reader is told why.
    fn encode_state(state: &Self::State, codec: Codec) -> Result<Vec<u8>, CodecError> {
        let _ = (state, codec);
        Err(CodecError::Encode(
            "this entity type answers no state queries (Entity::encode_state)".to_owned(),
        ))
    }

    /// Whether and how the entity's state is written into snapshots (default: on, encoded
    /// with the entity type's codec, state version 1: [`Snapshots::serde(1)`](Snapshots::serde)).
    ///
    /// With snapshots, loading an entity reads its latest snapshot and only its records after
    /// it, instead of its whole history: a partition that moves (a deploy, a failover) or an
    /// entity loaded again after passivation costs reads of its latest state, not of everything
    /// it ever did. When they are written is [`ShardConfig`]'s policy (by default after every
    /// 100 events, when an entity is passivated and when a partition is released or handed
    /// off: [`snapshot_every`](crate::ShardConfigBuilder::snapshot_every),
    /// [`snapshot_on_passivation`](crate::ShardConfigBuilder::snapshot_on_passivation)). Each
    /// is one fenced journal write of the encoded state; see "Snapshots" in docs/guide.md for
    /// what they cost.
    ///
    /// Override it to mark a changed state encoding with another version (older snapshots are
    /// then ignored), or to opt out (every load then replays the entity's whole history):
    ///
    /// ```
    /// # use jetshard::{Entity, Snapshots};
    /// # use serde::{Deserialize, Serialize};
    /// # struct Counter;
    /// # #[derive(Serialize, Deserialize)] enum Command { Add(u32) }
    /// # #[derive(Serialize, Deserialize)] enum Event { Added(u32) }
    /// impl Entity for Counter {
    ///     # type Command = Command;
    ///     # type Event = Event;
    ///     type State = u64;
    ///     # type Rejection = String;
    ///     # fn decide(_: &u64, c: Command) -> Result<Vec<Event>, String> {
    ///     #     let Command::Add(n) = c; Ok(vec![Event::Added(n)]) }
    ///     # fn apply(s: &mut u64, e: &Event) { let Event::Added(n) = e; *s += u64::from(*n); }
    ///     // ...
    ///     fn snapshots() -> Option<Snapshots<u64>> {
    ///         None // no snapshots: every load replays the whole history
    ///     }
    /// }
    /// ```
    ///
    /// A snapshot is only a cache of the events: one that does not decode (another state
    /// version, a changed state type, a damaged record) is ignored and the entity is loaded
    /// from its events.
    ///
    /// [`ShardConfig`]: crate::ShardConfig
    fn snapshots() -> Option<Snapshots<Self::State>> {
        Some(Snapshots::serde(1))
    }
}

/// How an entity's state is encoded into snapshots: see [`Entity::snapshots`].
pub struct Snapshots<S> {
    version: u32,
    encode: fn(&S, Codec) -> Result<Vec<u8>, CodecError>,
    decode: fn(&[u8], Codec) -> Result<S, CodecError>,
}

impl<S> Clone for Snapshots<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Snapshots<S> {}

impl<S> fmt::Debug for Snapshots<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshots")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl<S: Serialize + DeserializeOwned> Snapshots<S> {
    /// Snapshots encoded with the entity type's codec (serde), marked with `version`: raise it
    /// when a change of the state type changes its encoding (older snapshots are then ignored,
    /// and each entity is loaded from its events once, until its next snapshot).
    pub fn serde(version: u32) -> Self {
        Self {
            version,
            encode: |state, codec| codec.encode(state),
            decode: |bytes, codec| codec.decode(bytes),
        }
    }
}

impl<S> Snapshots<S> {
    /// The version of the state's encoding written with each snapshot.
    pub fn version(&self) -> u32 {
        self.version
    }

    pub(crate) fn encode(&self, state: &S, codec: Codec) -> Result<Vec<u8>, CodecError> {
        (self.encode)(state, codec)
    }

    pub(crate) fn decode(&self, bytes: &[u8], codec: Codec) -> Result<S, CodecError> {
        (self.decode)(bytes, codec)
    }
}

/// Reads a stored event of `E` written with encoding `version`.
pub(crate) fn decode_event<E: Entity>(
    version: u32,
    payload: &[u8],
    codec: Codec,
) -> Result<E::Event, CodecError> {
    if version == E::EVENT_VERSION {
        codec.decode(payload)
    } else {
        E::upcast(version, payload, codec)
    }
}
