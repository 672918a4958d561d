//! Kiln's log storage engine: one partition's Raft log, which is also its record store. See
//! `docs/storage.md` for the design and `docs/ARCHITECTURE.md` for the codemap.
//!
//! A log is a directory of segments. Each segment is `<first index>.log`: a header (where the
//! segment starts and how much of it is known synced, see [`header`]) followed by Kafka
//! RecordBatch v2 bytes exactly as produced but for two fields the CRC does not cover (the
//! base offset and the epoch field, see [`batch`]). `<first index>.index` is a sparse index by
//! Kafka offset and Raft index, `<first index>.timeindex` a sparse time index; both are read on
//! demand, never held in memory.
//!
//! All file I/O goes through [`fs::Fs`], real or simulated ([`sim_fs`]; [`faulty_fs`] fails on
//! command, for tests of full disks); the real one keeps at most a bounded number of
//! descriptors open, process-wide ([`fds`]). This crate has no networking; `stats` times every
//! fsync for the broker's metrics.

pub mod batch;
mod config;
mod error;
pub mod faulty_fs;
pub mod fds;
pub mod fs;
pub mod header;
mod index;
mod log;
mod points;
mod recovery;
mod segment;
pub mod sim_fs;
pub mod stats;

pub use batch::{BatchHeader, ControlKind, ProducerBatch, BATCH_HEADER_LEN};
pub use config::LogConfig;
pub use error::LogError;
pub use log::{
    EntryBody, Log, NewEntry, PurgeReport, ReadMode, ReadResult, RollSettings, SegmentInfo,
    StoredBody, StoredEntry, Tail, TimestampLookup, HEADER_CLAIM_DELAY,
};
pub use recovery::{Damage, LogTail, RecoveryReport};
