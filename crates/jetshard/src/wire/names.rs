//! Subject, stream and consumer names of one entity type (`Names`), and the entity type token.

use crate::wire::id::EntityId;
use crate::wire::partition::fnv1a_32;

/// The priority group every partition consumer uses.
pub const PRIORITY_GROUP: &str = "owners";

/// The stream metadata key recording the codec the stream's records are written with.
pub(crate) const METADATA_CODEC: &str = "jetshard.codec";

/// The stream metadata key recording how many streams the journal is spread over (absent: 1,
/// written before journals could be spread); the commands are spread over as many.
pub(crate) const METADATA_JOURNAL_STREAMS: &str = "jetshard.journal_streams";

/// The stream metadata key recording the partition count with the streams of a spread layout
/// (one command stream records it in its subject transform instead).
pub(crate) const METADATA_PARTITIONS: &str = "jetshard.partitions";

/// All names of one entity type, computed once.
#[derive(Debug, Clone)]
pub struct Names {
    /// `<t>`: the lowercase entity type token.
    pub(crate) entity_type: String,
    /// The command streams: `<T>_CMD` alone, or `<T>_CMD_<k>` for each `k` of a spread layout
    /// (partition `p` in stream `p % n`).
    command_streams: Vec<String>,
    /// The journal's streams: `<T>_JOURNAL` alone, or `<T>_JOURNAL_<k>` for each `k` of a
    /// journal spread over several (partition `p` in stream `p % n`).
    journal_streams: Vec<String>,
    /// The partition count, which a spread layout's subject lists and command subjects name (0:
    /// not known, [`Names::new`]).
    partitions: u32,
}

impl Names {
    /// The names of entity type `entity_type` with its journal in one stream, `<T>_JOURNAL`
    /// (not validated here: see [`ShardConfig::builder`](crate::ShardConfig::builder)).
    pub fn new(entity_type: &str) -> Self {
        Self::spread(entity_type, 1, 0)
    }

    /// The names of entity type `entity_type` with its commands and journal spread over
    /// `streams` streams each (`<T>_CMD_0` ... and `<T>_JOURNAL_0` ... ; one stream is `<T>_CMD`
    /// and `<T>_JOURNAL`, as [`Names::new`]) of `partitions` partitions: partition `p`'s
    /// commands and records are in stream `p % streams`.
    pub fn spread(entity_type: &str, streams: u32, partitions: u32) -> Self {
        let upper = entity_type.to_ascii_uppercase().replace('-', "_");
        let of = |kind: &str| {
            if streams <= 1 {
                vec![format!("{upper}_{kind}")]
            } else {
                (0..streams)
                    .map(|k| format!("{upper}_{kind}_{k}"))
                    .collect()
            }
        };
        Self {
            entity_type: entity_type.to_owned(),
            command_streams: of("CMD"),
            journal_streams: of("JOURNAL"),
            partitions,
        }
    }

    /// The partition count these names were made for (0 from [`Names::new`]).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Whether the streams are spread (several command and journal streams): producers then
    /// name the partition in a command's subject.
    pub fn is_spread(&self) -> bool {
        self.command_streams.len() > 1
    }

    /// The entity type token, `<t>`.
    pub fn entity_type(&self) -> &str {
        &self.entity_type
    }

    /// The command stream holding `partition`'s commands: `<T>_CMD`, or `<T>_CMD_<k>` with
    /// `k = partition % n` for a layout spread over `n` streams.
    pub fn command_stream(&self, partition: u32) -> &str {
        &self.command_streams[self.journal_index(partition)]
    }

    /// Every command stream, in order: stream `k` holds the partitions `p` with `p % n == k`.
    pub fn command_streams(&self) -> &[String] {
        &self.command_streams
    }

    /// The journal stream holding `partition`'s records: `<T>_JOURNAL`, or `<T>_JOURNAL_<k>`
    /// with `k = partition % n` for a journal spread over `n` streams.
    pub fn journal_stream(&self, partition: u32) -> &str {
        &self.journal_streams[self.journal_index(partition)]
    }

    /// Every stream of the journal, in order: stream `k` holds the partitions `p` with
    /// `p % n == k`.
    pub fn journal_streams(&self) -> &[String] {
        &self.journal_streams
    }

    /// Which of [`journal_streams`](Self::journal_streams) holds `partition`'s records (and of
    /// [`command_streams`](Self::command_streams) its commands).
    pub fn journal_index(&self, partition: u32) -> usize {
        partition as usize % self.journal_streams.len()
    }

    /// Where clients publish a command: `<t>.cmd.<id>` to one command stream (its subject
    /// transform places it in its partition), `<t>.cmd.<p>.<id>` to a spread layout (the
    /// publisher names the partition, [`partition_of`](crate::partition_of), which decides the
    /// stream).
    pub fn command_subject(&self, id: &EntityId) -> String {
        if self.is_spread() {
            let partition = crate::wire::partition::partition_of(id, self.partitions);
            format!("{}.cmd.{partition}.{id}", self.entity_type)
        } else {
            format!("{}.cmd.{id}", self.entity_type)
        }
    }

    /// The subjects of command stream `index` (of [`command_streams`](Self::command_streams)):
    /// `<t>.cmd.*` for one stream (transformed to `<t>.cmd.<p>.<id>` as stored); for a spread
    /// layout, `<t>.cmd.<p>.*` for each partition `p` of the stream, as published and stored.
    pub fn command_subjects(&self, index: usize) -> Vec<String> {
        if !self.is_spread() {
            return vec![format!("{}.cmd.*", self.entity_type)];
        }
        self.partitions_of_stream(index)
            .map(|p| self.partition_commands(p))
            .collect()
    }

    /// The partitions whose commands and records stream `index` holds, of a spread layout.
    fn partitions_of_stream(&self, index: usize) -> impl Iterator<Item = u32> + '_ {
        let streams = self.journal_streams.len() as u32;
        (0..self.partitions).filter(move |p| p % streams == index as u32)
    }

    /// The partition `id` belongs to when it is not `partition` (`None`: it is, or the
    /// partition count is not known). A spread layout's publishers name the partition
    /// themselves, so a command may be stored in a partition its id does not hash to (a
    /// publisher that computed it wrongly, or with another partition count); fencing holds
    /// only if each entity is served by its own partition's owner.
    pub(crate) fn misplaced(&self, partition: u32, id: &EntityId) -> Option<u32> {
        let home = (self.partitions > 0)
            .then(|| crate::wire::partition::partition_of(id, self.partitions))?;
        (home != partition).then_some(home)
    }

    /// The entity type and id of a command subject in the one-stream form, `<t>.cmd.<id>`
    /// (what [`Effects::command`](crate::Effects::command) records); `None` for any other
    /// subject.
    pub(crate) fn command_target(subject: &str) -> Option<(&str, &str)> {
        let (entity_type, rest) = subject.split_once('.')?;
        let id = rest.strip_prefix("cmd.")?;
        (!id.contains('.')).then_some((entity_type, id))
    }

    /// The subject transform's destination for `n` partitions.
    pub fn command_transform_dest(&self, partitions: u32) -> String {
        format!(
            "{}.cmd.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}",
            self.entity_type
        )
    }

    /// The partition count of a command stream's subject transform destination (the inverse of
    /// [`Names::command_transform_dest`]); `None` if it is not one.
    pub(crate) fn partitions_of_transform(dest: &str) -> Option<u32> {
        let (_, rest) = dest.split_once("{{partition(")?;
        rest.split_once(',')?.0.parse().ok()
    }

    /// Where a reader that does not know an entity type's layout looks for what the type
    /// records: its first command stream in each layout, one stream (`<T>_CMD`) first, then
    /// spread (`<T>_CMD_0`).
    pub fn first_command_streams(entity_type: &str) -> [String; 2] {
        let [one, spread] = [1, 2].map(|streams| Self::spread(entity_type, streams, 0));
        [
            one.command_streams[0].clone(),
            spread.command_streams[0].clone(),
        ]
    }

    /// The partition count a command stream records (`config`: its configuration): in its
    /// subject transform (one stream) or its metadata (spread); `None` if it records none.
    pub fn recorded_partitions(config: &async_nats::jetstream::stream::Config) -> Option<u32> {
        config
            .subject_transform
            .as_ref()
            .and_then(|t| Self::partitions_of_transform(&t.destination))
            .or_else(|| config.metadata.get(METADATA_PARTITIONS)?.parse().ok())
    }

    /// A partition's stored commands: `<t>.cmd.<p>.*`.
    pub fn partition_commands(&self, partition: u32) -> String {
        format!("{}.cmd.{partition}.*", self.entity_type)
    }

    /// Where a reader asks the owner for an entity's state (core NATS request/reply, see
    /// docs/WIRE.md): `<t>.query.<p>.<id>`.
    pub fn query_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.query.{partition}.{id}", self.entity_type)
    }

    /// Where a partition's owners listen for state queries: `<t>.query.<p>.*`.
    pub fn partition_queries(&self, partition: u32) -> String {
        format!("{}.query.{partition}.*", self.entity_type)
    }

    /// A partition's durable consumer: `<t>-p<p>`.
    pub fn consumer(&self, partition: u32) -> String {
        format!("{}-p{partition}", self.entity_type)
    }

    /// The partition whose consumer is `consumer` (the inverse of [`Names::consumer`]).
    pub(crate) fn partition_of_consumer(&self, consumer: &str) -> Option<u32> {
        let number = consumer
            .strip_prefix(self.entity_type.as_str())?
            .strip_prefix("-p")?;
        // `u32::from_str` takes a leading `+`; a consumer name written by `consumer` has none.
        if number.starts_with('+') {
            return None;
        }
        number.parse().ok()
    }

    /// Every subject of the entity type (`<t>.>`): the whole journal, to a reader.
    pub fn all_subjects(&self) -> String {
        format!("{}.>", self.entity_type)
    }

    /// The subjects of one partition's journal records, of every kind (`<t>.*.<p>` and
    /// `<t>.*.<p>.*`).
    pub fn partition_subjects(&self, partition: u32) -> Vec<String> {
        let t = &self.entity_type;
        vec![format!("{t}.*.{partition}"), format!("{t}.*.{partition}.*")]
    }

    /// The subjects of journal stream `index` (of [`journal_streams`](Self::journal_streams)):
    /// every kind of record of every partition for one stream; for a spread journal, each
    /// kind once per partition of the stream, the partition spelled out.
    pub fn journal_subjects(&self, index: usize) -> Vec<String> {
        if self.journal_streams.len() == 1 {
            return Self::record_subjects(&self.entity_type, "*");
        }
        self.partitions_of_stream(index)
            .flat_map(|p| Self::record_subjects(&self.entity_type, &p.to_string()))
            .collect()
    }

    /// The subjects of every kind of journal record of partition token `p` (`*`: any).
    fn record_subjects(t: &str, p: &str) -> Vec<String> {
        vec![
            format!("{t}.evt.{p}.*"),
            format!("{t}.fence.{p}"),
            format!("{t}.dlq.{p}"),
            format!("{t}.dlq.{p}.*"),
            format!("{t}.snap.{p}.*"),
            format!("{t}.out.{p}"),
            format!("{t}.tmr.{p}.*"),
            format!("{t}.unpin.{p}"),
        ]
    }

    /// An entity's events: `<t>.evt.<p>.<id>`.
    pub fn event_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.evt.{partition}.{id}", self.entity_type)
    }

    /// All events of a partition: `<t>.evt.<p>.*`.
    pub fn partition_events(&self, partition: u32) -> String {
        format!("{}.evt.{partition}.*", self.entity_type)
    }

    /// A partition's fence records: `<t>.fence.<p>`.
    pub fn fence_subject(&self, partition: u32) -> String {
        format!("{}.fence.{partition}", self.entity_type)
    }

    /// Every partition's fence records: `<t>.fence.*` (a core subscription there sees each
    /// claim as it is published, whether it wins or not).
    pub fn fence_subjects(&self) -> String {
        format!("{}.fence.*", self.entity_type)
    }

    /// Where a dead letter of `entity` goes: `<t>.dlq.<p>.<id>` when `entity` is a valid id
    /// (so that loading one entity reads its own dead letters only), else `<t>.dlq.<p>` (a
    /// command whose subject held no valid id; dead letters written before per-entity subjects
    /// are there too).
    pub fn dead_letter_subject(&self, partition: u32, entity: &str) -> String {
        match EntityId::new(entity) {
            Ok(id) => self.entity_dead_letters(partition, &id),
            Err(_) => self.partition_dead_letters(partition),
        }
    }

    /// The dead letters of one entity: `<t>.dlq.<p>.<id>`.
    pub fn entity_dead_letters(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.dlq.{partition}.{id}", self.entity_type)
    }

    /// A partition's dead letters that name no valid entity (and those written before
    /// per-entity subjects): `<t>.dlq.<p>`.
    pub fn partition_dead_letters(&self, partition: u32) -> String {
        format!("{}.dlq.{partition}", self.entity_type)
    }

    /// Every dead letter of the entity type: `<t>.dlq.>`.
    pub fn all_dead_letters(&self) -> String {
        format!("{}.dlq.>", self.entity_type)
    }

    /// The partition of a dead letter's subject (`<t>.dlq.<p>` or `<t>.dlq.<p>.<id>`).
    pub fn partition_of_dead_letter(subject: &str) -> Option<u32> {
        subject.split('.').nth(2)?.parse().ok()
    }

    /// The latest snapshot of an entity's state: `<t>.snap.<p>.<id>` (one message per
    /// subject: each snapshot rolls the previous one up).
    pub fn snapshot_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.snap.{partition}.{id}", self.entity_type)
    }

    /// All snapshots of a partition: `<t>.snap.<p>.*`.
    pub fn partition_snapshots(&self, partition: u32) -> String {
        format!("{}.snap.{partition}.*", self.entity_type)
    }

    /// An entity's timer records (set, cancel, fired): `<t>.tmr.<p>.<id>`. Apart from its events,
    /// so that a new owner finds the partition's armed timers without reading its events.
    pub fn timer_subject(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.tmr.{partition}.{id}", self.entity_type)
    }

    /// All timer records of a partition: `<t>.tmr.<p>.*`.
    pub fn partition_timers(&self, partition: u32) -> String {
        format!("{}.tmr.{partition}.*", self.entity_type)
    }

    /// A partition's outbox records and their done records: `<t>.out.<p>`.
    pub fn outbox_subject(&self, partition: u32) -> String {
        format!("{}.out.{partition}", self.entity_type)
    }

    /// Where the processes of the entity type say how many partitions they own: `<t>.nodes`.
    pub fn membership_subject(&self) -> String {
        format!("{}.nodes", self.entity_type)
    }

    /// Where the processes of the entity type answer status requests (core NATS request/reply,
    /// one answer per process: a `NodeStatus`, JSON): `<t>.status`.
    pub fn status_subject(&self) -> String {
        format!("{}.status", self.entity_type)
    }

    /// Where the process of `incarnation` answers while it runs (core NATS request/reply, an
    /// empty answer): `<t>.alive.<incarnation>`.
    pub fn alive_subject(&self, incarnation: &str) -> String {
        format!("{}.alive.{incarnation}", self.entity_type)
    }

    /// The command subject of a wake-up of `partition` (of `partitions`): the
    /// [`command_subject`](Self::command_subject) of the first id `jetshard-wake-<k>` that
    /// hashes to the partition. Its header ([`HDR_WAKE`](crate::wire::HDR_WAKE)) tells the
    /// owner to acknowledge it and route it nowhere.
    pub fn wake_subject(&self, partition: u32, partitions: u32) -> String {
        let id = (0u64..)
            .map(|k| format!("jetshard-wake-{k}"))
            .find(|id| fnv1a_32(id.as_bytes()) % partitions.max(1) == partition)
            .and_then(|id| EntityId::new(&id).ok())
            .expect("some wake-up id hashes to every partition");
        self.command_subject(&id)
    }

    /// Where a crash watch records that it unpins a dead owner's partition: `<t>.unpin.<p>`
    /// (one record per fence record found dead, deduplicated by [`Names::unpin_msg_id`], rolled
    /// up: only the latest is kept).
    pub fn unpin_subject(&self, partition: u32) -> String {
        format!("{}.unpin.{partition}", self.entity_type)
    }

    /// Whether `subject` is one of this type's dead-letter subjects (`<t>.dlq.…`).
    pub(crate) fn is_dead_letter(&self, subject: &str) -> bool {
        subject
            .strip_prefix(self.entity_type.as_str())
            .is_some_and(|rest| rest.starts_with(".dlq."))
    }

    /// The dead letters of a partition's entities (each on `<t>.dlq.<p>.<id>`).
    pub(crate) fn partition_entities_dead_letters(&self, partition: u32) -> String {
        format!("{}.dlq.{partition}.*", self.entity_type)
    }

    /// Every record of one entity (`<t>.*.<p>.<id>`: its events, dead letters, timer records
    /// and snapshots, the journal's only four-token subjects).
    pub(crate) fn entity_records(&self, partition: u32, id: &EntityId) -> String {
        format!("{}.*.{partition}.{id}", self.entity_type)
    }

    /// Whether `subject` is one of an entity's own records other than its snapshot: an event
    /// (`<t>.evt.<p>.<id>`), a timer record (`<t>.tmr.<p>.<id>`) or a dead letter
    /// (`<t>.dlq.<p>.<id>`) of `id` in `partition`.
    pub(crate) fn is_record_of(&self, subject: &str, partition: u32, id: &str) -> bool {
        let Some(rest) = subject
            .strip_prefix(self.entity_type.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
        else {
            return false;
        };
        let Some(rest) = ["evt.", "tmr.", "dlq."]
            .iter()
            .find_map(|kind| rest.strip_prefix(kind))
        else {
            return false;
        };
        rest.split_once('.').is_some_and(|(p, rest)| {
            rest == id && !p.starts_with('+') && p.parse::<u32>() == Ok(partition)
        })
    }

    /// Whether `subject` is a snapshot's (`<t>.snap.<p>.<id>`), of any entity type.
    /// Scans bytes: a load asks it of each of its records several times, and `split` costs
    /// hundreds of instructions a subject.
    pub(crate) fn is_snapshot_subject(subject: &str) -> bool {
        let bytes = subject.as_bytes();
        let Some(dot) = bytes.iter().position(|&b| b == b'.') else {
            return false;
        };
        let rest = &bytes[dot + 1..];
        rest.starts_with(b"snap") && matches!(rest.get(4), None | Some(b'.'))
    }

    /// The entity id at the end of a stored command or event subject (after its last `.`; the
    /// whole subject if it has none). Scans bytes, as `is_snapshot_subject` does.
    pub fn entity_of_subject(subject: &str) -> Option<&str> {
        let start = subject
            .as_bytes()
            .iter()
            .rposition(|&b| b == b'.')
            .map_or(0, |dot| dot + 1);
        Some(&subject[start..])
    }
}

/// Whether `s` is a valid entity type token: lowercase ASCII letters, digits, `-` and `_`,
/// starting with a letter, at most 32 bytes.
pub(crate) fn is_valid_entity_type(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && s.len() <= 32
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte scans answer as the `split`s they replace, on every shape of subject.
    #[test]
    fn subject_scans_agree_with_splitting() {
        for subject in [
            "t.snap.0.a",
            "t.evt.0.a",
            "t.snap",
            "t.snapx.0.a",
            "t.sna.0.a",
            "snap.snap.1",
            "t..snap",
            "t.snap.",
            "",
            ".",
            "a",
            "t.evt.0.snap",
            "order.cmd.12.order-7",
        ] {
            let snapshot = subject.split('.').nth(1) == Some("snap");
            assert_eq!(Names::is_snapshot_subject(subject), snapshot, "{subject:?}");
            let entity = subject.rsplit('.').next();
            assert_eq!(Names::entity_of_subject(subject), entity, "{subject:?}");
        }
    }

    #[test]
    fn a_consumer_name_gives_its_partition_back() {
        let n = Names::new("order");
        for p in [0, 7, 1023] {
            assert_eq!(n.partition_of_consumer(&n.consumer(p)), Some(p));
        }
        for other in [
            "order-p",
            "order-px",
            "order-p+1",
            "orders-p1",
            "ship-p1",
            "order-q1",
        ] {
            assert_eq!(n.partition_of_consumer(other), None, "{other}");
        }
    }

    #[test]
    fn names_follow_the_wire_contract() {
        let n = Names::new("order");
        let id = EntityId::new("o-1").unwrap();
        assert_eq!(n.command_stream(5), "ORDER_CMD");
        assert_eq!(n.command_subjects(0), ["order.cmd.*"]);
        assert_eq!(n.journal_stream(5), "ORDER_JOURNAL");
        assert_eq!(n.journal_streams(), ["ORDER_JOURNAL"]);
        assert_eq!(n.command_subject(&id), "order.cmd.o-1");
        assert_eq!(
            n.command_transform_dest(8),
            "order.cmd.{{partition(8,1)}}.{{wildcard(1)}}"
        );
        assert_eq!(n.partition_commands(3), "order.cmd.3.*");
        assert_eq!(n.consumer(3), "order-p3");
        assert_eq!(n.event_subject(3, &id), "order.evt.3.o-1");
        assert_eq!(n.fence_subject(3), "order.fence.3");
        assert_eq!(n.dead_letter_subject(3, "o-1"), "order.dlq.3.o-1");
        assert_eq!(n.dead_letter_subject(3, "a.b"), "order.dlq.3");
        assert_eq!(Names::partition_of_dead_letter("order.dlq.3.o-1"), Some(3));
        assert_eq!(Names::partition_of_dead_letter("order.dlq.3"), Some(3));
        assert_eq!(n.snapshot_subject(3, &id), "order.snap.3.o-1");
        assert_eq!(n.event_msg_id(42, 1), "order:42:1");
        assert_eq!(Names::entity_of_subject("order.evt.3.o-1"), Some("o-1"));
    }

    #[test]
    fn a_spread_journal_holds_each_partition_in_one_stream() {
        let n = Names::spread("order", 3, 8);
        assert_eq!(
            n.journal_streams(),
            ["ORDER_JOURNAL_0", "ORDER_JOURNAL_1", "ORDER_JOURNAL_2"]
        );
        assert_eq!(n.journal_stream(4), "ORDER_JOURNAL_1");
        assert_eq!(n.journal_index(7), 1);
        let id = EntityId::new("o-1").unwrap();
        // Every record of a partition is on a subject of its stream, and of no other.
        for p in 0..8 {
            let records = [
                n.event_subject(p, &id),
                n.fence_subject(p),
                n.dead_letter_subject(p, "o-1"),
                n.dead_letter_subject(p, "a.b"),
                n.snapshot_subject(p, &id),
                n.outbox_subject(p),
                n.timer_subject(p, &id),
                n.unpin_subject(p),
            ];
            for k in 0..3 {
                let subjects = n.journal_subjects(k);
                for record in &records {
                    let held = subjects.iter().any(|s| subject_matches(s, record));
                    assert_eq!(held, k == n.journal_index(p), "{record} in stream {k}");
                }
            }
        }
        assert_eq!(n.journal_subjects(2).len(), 2 * 8);
        // The commands spread the same way: published where they are stored, the partition
        // named by the publisher.
        assert_eq!(
            n.command_streams(),
            ["ORDER_CMD_0", "ORDER_CMD_1", "ORDER_CMD_2"]
        );
        assert_eq!(n.command_stream(4), "ORDER_CMD_1");
        let p = crate::wire::partition::partition_of(&id, 8);
        assert_eq!(n.command_subject(&id), format!("order.cmd.{p}.o-1"));
        for k in 0..3 {
            let held = n
                .command_subjects(k)
                .iter()
                .any(|s| subject_matches(s, &n.command_subject(&id)));
            assert_eq!(held, k == n.journal_index(p), "stream {k}");
        }
        assert_eq!(
            n.command_subjects(1),
            ["order.cmd.1.*", "order.cmd.4.*", "order.cmd.7.*"]
        );
        for partition in 0..8 {
            let wake = n.wake_subject(partition, 8);
            assert!(
                subject_matches(&n.partition_commands(partition), &wake),
                "{wake}"
            );
        }
        // One stream is the layout of `Names::new`.
        assert_eq!(
            Names::spread("order", 1, 8).journal_subjects(0),
            Names::new("order").journal_subjects(0)
        );
    }

    /// Whether NATS filter `filter` (`*` one token, `>` the rest) matches `subject`.
    fn subject_matches(filter: &str, subject: &str) -> bool {
        let (mut f, mut s) = (filter.split('.'), subject.split('.'));
        loop {
            match (f.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some(a), Some(b)) if a == "*" || a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    #[test]
    fn a_command_target_is_read_from_the_one_stream_form_only() {
        assert_eq!(
            Names::command_target("order.cmd.o-1"),
            Some(("order", "o-1"))
        );
        assert_eq!(Names::command_target("order.cmd.3.o-1"), None);
        assert_eq!(Names::command_target("order.evt.o-1"), None);
        assert_eq!(Names::command_target("audit"), None);
    }

    #[test]
    fn entity_types_are_lowercase_tokens() {
        assert!(is_valid_entity_type("order"));
        assert!(is_valid_entity_type("sensor-2_b"));
        for bad in ["", "Order", "2x", "a.b", "a b", "a*"] {
            assert!(!is_valid_entity_type(bad), "{bad:?}");
        }
    }
}
