//! Partition replication for Kiln: one partition as a Raft group of three replicas.
//!
//! * [`offsets`]: Raft index ↔ Kafka offset translation (high watermark, leader epoch).
//! * [`disk`]: the file the log store writes through: real (`fdatasync`) or simulated (page
//!   cache lost on crash).
//! * [`log_store`]: the Raft log on disk, which is also the partition's record store.
//! * [`recovery`]: what a replica finds in its files at start: a torn tail, or damage that
//!   it must repair from its peers.
//! * [`guard`]: the repair guard (a damaged replica neither votes nor stands until repaired)
//!   and [`ReplicaHealth`], which its transport and broker ask.
//! * `full_disk`: a full disk is waited out, not fatal.
//! * `elections`: the replica's election timer: off while repairing, and a random pause after
//!   a failed election (openraft 0.9 draws its timeout once, so two candidates can tie forever).
//! * [`state_machine`]: what applying committed entries does: advance the high watermark.
//! * [`partition`]: [`ReplicatedPartition`], one replica: append (acknowledged once a majority
//!   has fsynced), read below the high watermark, leader epoch.
//! * [`proposer`]: [`Proposer`], the leader's ordered, coalescing append queue.
//! * [`net`]: Raft RPCs between brokers over TCP: one listener per broker shared by every
//!   group, a length-prefixed, CRC-checked binary frame per RPC.
//! * [`sim`]: the deterministic simulation and its invariant checker.
//!
//! docs/replication.md has the design.

pub mod disk;
mod elections;
mod full_disk;
pub mod guard;
pub mod log_store;
pub mod net;
pub mod offsets;
pub mod partition;
pub mod proposer;
mod record;
pub mod recovery;
pub mod sim;
pub mod state_machine;
pub mod types;

pub use full_disk::is_disk_full;
pub use guard::ReplicaHealth;
pub use partition::{AppendAck, PartitionError, ReadBatch, ReplicatedPartition};
pub use proposer::Proposer;
pub use types::{KilnRaft, NodeId};
