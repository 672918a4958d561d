//! Kiln's log storage engine. See `docs/ARCHITECTURE.md` for the codemap.
//!
//! A partition is a directory of segments. Each segment is `<base-offset>.log`
//! holding Kafka RecordBatch v2 bytes exactly as produced, except that the
//! base offset field is stamped by the log; `<base-offset>.index` is a sparse
//! offset index and `<base-offset>.timeindex` a sparse time index.
//!
//! This crate has no networking. `stats` times every segment fsync for the broker's metrics.

pub mod batch;
mod checkpoint;
mod config;
mod error;
mod flush;
mod index;
mod partition;
mod recovery;
mod segment;
pub mod stats;

pub use batch::{BatchHeader, BATCH_HEADER_LEN};
pub use config::{FlushPolicy, LogConfig};
pub use error::LogError;
pub use partition::{
    AppendInfo, PartitionLog, ReadResult, RecoveryReport, RetentionReport, TimestampLookup,
};
