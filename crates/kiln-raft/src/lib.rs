//! Partition replication for Kiln: one partition as a Raft group of three replicas.
//!
//! * [`offsets`]: Raft index ↔ Kafka offset translation (high watermark, leader epoch).
//! * [`disk`]: the file the log store writes through: real (`fdatasync`) or simulated (page
//!   cache lost on crash).
//! * [`log_store`]: the Raft log on disk, which is also the partition's record store.
//! * [`state_machine`]: what applying committed entries does: advance the high watermark.
//! * [`partition`]: [`ReplicatedPartition`], one replica: append (acknowledged once a majority
//!   has fsynced), read below the high watermark, leader epoch.
//! * [`sim`]: the deterministic simulation and its invariant checker.
//!
//! docs/replication.md has the design.

pub mod disk;
pub mod log_store;
pub mod offsets;
pub mod partition;
pub mod sim;
pub mod state_machine;
pub mod types;

pub use partition::{AppendAck, PartitionError, ReadBatch, ReplicatedPartition};
pub use types::{KilnRaft, NodeId};
