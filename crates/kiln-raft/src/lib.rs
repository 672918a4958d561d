//! Replication for Kiln: every partition (and the cluster metadata and the consumer offsets)
//! is a Raft group whose log is a kiln-log directory.
//!
//! * [`log_store`]: openraft's log storage on kiln-log: each Raft entry is its record batches
//!   (or one control batch), written once; a bounded cache of recent entries.
//! * [`state_machine`]: what applying does: the high watermark of a data partition, or a
//!   broker-provided [`state_machine::Table`] for the offsets and metadata groups; snapshots
//!   (the log start, or the table) so logs can be purged.
//! * [`state`]: the `state` file (applied position, log start, a table's snapshot).
//! * [`vote`] and [`guard`]: the `vote` file, and the repair guard (a damaged replica neither
//!   votes nor stands until repaired) with [`ReplicaHealth`], which its transport and broker ask.
//! * `full_disk`: a full disk is waited out, not fatal.
//! * `elections`: the replica's election timer: off while repairing, and a random pause after
//!   a failed election (openraft 0.9 draws its timeout once, so two candidates can tie forever).
//! * [`liveness`]: per replica, when it last heard from its leader and when its followers
//!   last acknowledged it: check-quorum as a lease (a leader cut off from its quorum stops
//!   serving), the votes it refuses, when it stands for election.
//! * [`pulse`]: the broker's one task that runs those timers for all its replicas: beats to
//!   each peer for every group it leads (idle groups send nothing else), elections, lapses.
//! * [`partition`]: [`ReplicatedPartition`], one replica: append (acknowledged once a majority
//!   has fsynced), read below the high watermark, leader epoch, retention's command.
//! * [`proposer`]: [`Proposer`], the leader's ordered, coalescing append queue.
//! * [`payload`]: what an entry carries (records, or a command).
//! * [`producers`]: idempotent producers' state per data partition (sequences, epochs).
//! * [`bootstrap`]: writing a single-replica group offline (taking in an older layout).
//! * [`net`]: Raft RPCs between brokers over TCP: one listener per broker shared by every
//!   group, a length-prefixed, CRC-checked binary frame per RPC.
//! * [`rng`]: a random generator whose output does not change with dependency versions.
//! * [`sim`]: the deterministic simulation and its invariant checker.
//!
//! docs/replication.md has the design.

pub mod bootstrap;
mod elections;
mod full_disk;
pub mod guard;
pub mod liveness;
pub mod log_store;
pub mod net;
pub mod partition;
pub mod payload;
pub mod producers;
pub mod proposer;
pub mod pulse;
mod record;
pub mod rng;

pub mod sim;
pub mod state;
pub mod state_machine;
pub mod types;
pub mod vote;

pub use full_disk::is_disk_full;
pub use guard::ReplicaHealth;
pub use partition::{AppendAck, PartitionError, ReplicatedPartition, StartOptions};
pub use payload::{Command, Payload};
pub use proposer::Proposer;
pub use state_machine::{GroupKind, Table};
pub use types::{KilnRaft, NodeId};
