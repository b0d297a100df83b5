//! What the checker found: violations and counts.

use std::fmt;

/// A broken promise, with what is needed to find it in the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// An acknowledged command left no outcome.
    Lost {
        /// The entity.
        entity: String,
        /// The command's stream sequence.
        command_seq: u64,
    },
    /// A command left more than one outcome (applied twice, or applied and dead-lettered).
    Duplicated {
        /// The entity.
        entity: String,
        /// The command's stream sequence.
        command_seq: u64,
        /// Each outcome's first journal sequence and generation.
        outcomes: Vec<(u64, u64)>,
    },
    /// An outcome of a command no client sent to this entity (or more outcomes than unknown
    /// commands could explain).
    Unexpected {
        /// The entity of the outcome.
        entity: String,
        /// The command sequence it names.
        command_seq: u64,
        /// Its first journal sequence.
        journal_seq: u64,
    },
    /// An entity's outcome came after the outcome of a later command.
    Reordered {
        /// The entity.
        entity: String,
        /// The command sequence that came late.
        command_seq: u64,
        /// The later command already seen.
        after_command_seq: u64,
        /// The late outcome's first journal sequence.
        journal_seq: u64,
    },
    /// The model does not allow an outcome.
    Model {
        /// The entity.
        entity: String,
        /// The command.
        command_seq: u64,
        /// The outcome's first journal sequence.
        journal_seq: u64,
        /// The model's reason.
        reason: String,
    },
    /// An event or dead letter written under another generation than its partition's latest
    /// fence record before it: a stale (or premature) owner's write.
    StaleGeneration {
        /// The partition.
        partition: u32,
        /// The record's journal sequence.
        journal_seq: u64,
        /// Its entity.
        entity: String,
        /// Its command.
        command_seq: u64,
        /// The generation it carries.
        generation: u64,
        /// The generation of the latest fence record before it (0: none).
        fence_generation: u64,
    },
    /// A fence record that does not follow its predecessor by exactly one generation.
    GenerationJump {
        /// The partition.
        partition: u32,
        /// The fence record's journal sequence.
        journal_seq: u64,
        /// The previous generation (0: none).
        previous: u64,
        /// The generation it claims.
        generation: u64,
    },
    /// The history holds the same acknowledged sequence twice, for two commands.
    AmbiguousHistory {
        /// The sequence.
        command_seq: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Lost {
                entity,
                command_seq,
            } => write!(
                f,
                "lost: entity {entity:?} command {command_seq} was acknowledged but left no outcome"
            ),
            Violation::Duplicated {
                entity,
                command_seq,
                outcomes,
            } => {
                write!(
                    f,
                    "duplicated: entity {entity:?} command {command_seq} left {} outcomes:",
                    outcomes.len()
                )?;
                for (seq, generation) in outcomes {
                    write!(f, " [journal seq {seq}, generation {generation}]")?;
                }
                Ok(())
            }
            Violation::Unexpected {
                entity,
                command_seq,
                journal_seq,
            } => write!(
                f,
                "unexpected: entity {entity:?} has an outcome of command {command_seq} at journal seq {journal_seq}, which no client sent to it"
            ),
            Violation::Reordered {
                entity,
                command_seq,
                after_command_seq,
                journal_seq,
            } => write!(
                f,
                "reordered: entity {entity:?} command {command_seq} (journal seq {journal_seq}) came after command {after_command_seq}"
            ),
            Violation::Model {
                entity,
                command_seq,
                journal_seq,
                reason,
            } => write!(
                f,
                "model: entity {entity:?} command {command_seq} (journal seq {journal_seq}): {reason}"
            ),
            Violation::StaleGeneration {
                partition,
                journal_seq,
                entity,
                command_seq,
                generation,
                fence_generation,
            } => write!(
                f,
                "stale generation: partition {partition} journal seq {journal_seq} (entity {entity:?}, command {command_seq}) carries generation {generation}, but the latest fence before it is generation {fence_generation}"
            ),
            Violation::GenerationJump {
                partition,
                journal_seq,
                previous,
                generation,
            } => write!(
                f,
                "generation jump: partition {partition} fence at journal seq {journal_seq} claims generation {generation} after {previous}"
            ),
            Violation::AmbiguousHistory { command_seq } => write!(
                f,
                "ambiguous history: two recorded commands were acknowledged at sequence {command_seq}"
            ),
        }
    }
}

/// Counts of what was checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Commands in the history.
    pub commands: usize,
    /// Of those, acknowledged.
    pub acked: usize,
    /// Of those, unknown.
    pub unknown: usize,
    /// Unknown commands that turned out to be stored (they left an outcome).
    pub unknown_applied: usize,
    /// Entities with an outcome.
    pub entities: usize,
    /// Outcomes: commands applied (events) or given up (dead letters).
    pub outcomes: usize,
    /// Event records.
    pub events: usize,
    /// Dead-letter records.
    pub dead_letters: usize,
    /// Fence records.
    pub fences: usize,
    /// Acknowledged commands that left no outcome, as the model expects of them
    /// ([`Model::expects_outcome`](super::Model::expects_outcome)).
    pub silent: usize,
}

/// What [`check`](super::check) found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub(super) violations: Vec<Violation>,
    pub(super) summary: Summary,
}

impl Report {
    /// Whether no property was violated.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Every violation, journal-level ones first, then per entity.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Counts of what was checked.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    /// Takes out the violations another check judges instead (`elsewhere` says which: a loss
    /// that the entities' states judge, say, where the journal read had records purged), and
    /// returns them.
    pub fn set_aside(&mut self, elsewhere: impl Fn(&Violation) -> bool) -> Vec<Violation> {
        let (aside, kept) = std::mem::take(&mut self.violations)
            .into_iter()
            .partition(|v| elsewhere(v));
        self.violations = kept;
        aside
    }
}

/// At most this many violations are printed by `Display`; the rest are counted.
const DISPLAY_LIMIT: usize = 50;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.summary;
        write!(
            f,
            "{} violations; {} commands ({} acked, {} unknown of which {} applied), {} entities, {} outcomes, {} events, {} dead letters, {} fence records",
            self.violations.len(),
            s.commands,
            s.acked,
            s.unknown,
            s.unknown_applied,
            s.entities,
            s.outcomes,
            s.events,
            s.dead_letters,
            s.fences
        )?;
        if s.silent > 0 {
            write!(f, ", {} commands silent as expected", s.silent)?;
        }
        for violation in self.violations.iter().take(DISPLAY_LIMIT) {
            write!(f, "\n  {violation}")?;
        }
        if self.violations.len() > DISPLAY_LIMIT {
            write!(
                f,
                "\n  ... and {} more",
                self.violations.len() - DISPLAY_LIMIT
            )?;
        }
        Ok(())
    }
}
