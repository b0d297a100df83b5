//! The subcommands and their arguments, as clap parses them.

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Per partition: owner node, generation, pinned, pending, ack pending, redelivered,
    /// waiting pulls, paused.
    Status {
        /// The entity type, e.g. `order`.
        entity_type: String,
    },
    /// Pause delivery of a partition's commands (they queue up).
    Pause {
        /// The entity type.
        entity_type: String,
        /// The partition.
        partition: u32,
        /// How long.
        #[arg(long, default_value_t = 3600)]
        for_secs: u64,
    },
    /// Resume a paused partition.
    Resume {
        /// The entity type.
        entity_type: String,
        /// The partition.
        partition: u32,
    },
    /// Move a partition to a standby process now.
    Unpin {
        /// The entity type.
        entity_type: String,
        /// The partition.
        partition: u32,
    },
    /// The running processes of an entity type, as they answer on `<t>.status`: the
    /// partitions each owns, and the entities it holds quarantined (their journal cannot be
    /// read back; docs/OPERATIONS.md, "Poison").
    Nodes {
        /// The entity type.
        entity_type: String,
        /// How long to wait for the processes' answers, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        wait_ms: u64,
    },
    /// An entity's current state, answered by the owner of its partition (only under the
    /// current generation, after the commands acknowledged before the query). A state encoded as
    /// JSON is shown as JSON.
    Get {
        /// The entity type.
        entity_type: String,
        /// The entity id.
        id: String,
        /// How long to wait for the owner's answer, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        wait_ms: u64,
    },
    /// List commands that were given up (`dead-letters <type>`), replay one, or purge them.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    DeadLetters(DeadLetters),
}

#[derive(Debug, Args)]
pub(crate) struct DeadLetters {
    #[command(subcommand)]
    pub(crate) action: Option<DeadLetterAction>,
    /// The entity type whose dead letters to list.
    #[arg(required = true)]
    pub(crate) entity_type: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DeadLetterAction {
    /// List the dead letters, oldest first (the same as `dead-letters <type>`).
    List {
        /// The entity type.
        entity_type: String,
    },
    /// Send dead letters' commands again, each as a new command to its entity (stored once
    /// even if replayed twice within the command stream's duplicate window): one (`SEQ`), all
    /// (`--all`), or those in a range of journal sequences (`--from`, `--to`, inclusive).
    #[command(
        override_usage = "jetshard dead-letters replay <ENTITY_TYPE> (<SEQ> [--partition <P>] | --all | [--from <SEQ>] [--to <SEQ>])"
    )]
    Replay {
        /// The entity type.
        entity_type: String,
        /// The dead letter's journal sequence (`seq` in the list).
        #[arg(required_unless_present_any = ["all", "from", "to"], conflicts_with_all = ["all", "from", "to"])]
        seq: Option<u64>,
        /// The dead letter's partition (`partition` in the list): needed only where the
        /// journal is spread over several streams and `SEQ` names a dead letter in more than
        /// one of them.
        #[arg(long, requires = "seq")]
        partition: Option<u32>,
        /// Every dead letter of the entity type, oldest first.
        #[arg(long, conflicts_with_all = ["from", "to"])]
        all: bool,
        /// Those at this journal sequence or after.
        #[arg(long)]
        from: Option<u64>,
        /// Those at this journal sequence or before.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Remove dead letters from the journal, except those whose command is not acknowledged
    /// yet (see docs/OPERATIONS.md).
    Purge {
        /// The entity type.
        entity_type: String,
        /// Only this partition's.
        #[arg(long)]
        partition: Option<u32>,
        /// Only those at this journal sequence or below.
        #[arg(long)]
        upto: Option<u64>,
    },
}
