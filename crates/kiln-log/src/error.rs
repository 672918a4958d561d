//! The one error type of the crate. Every variant says what went wrong and where.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A producer's bytes are not a well-formed RecordBatch v2 (`position` is within the appended buffer).
    #[error("invalid record batch at byte {position}: {reason}")]
    InvalidBatch { position: usize, reason: String },
    /// A producer's batch fails its CRC32C (`position` is within the appended buffer).
    #[error("record batch at byte {position} fails its CRC: header says {expected:#010x}, bytes give {actual:#010x}")]
    CrcMismatch {
        position: usize,
        expected: u32,
        actual: u32,
    },
    #[error("offset {requested} is out of range: the log holds [{log_start}, {log_end})")]
    OffsetOutOfRange {
        requested: i64,
        log_start: i64,
        log_end: i64,
    },
    /// Stored data failed a check on read. It is never served.
    #[error("corrupt log data in {} at byte {position}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// ENOSPC or EDQUOT on a write or fsync ([`crate::fs::is_disk_full`]). The partial write
    /// was cut back (or, for an fsync, the caller cuts back with `rewind_unsynced`); the log is
    /// still usable.
    #[error("disk full writing {}; the partial write was cut back", path.display())]
    DiskFull { path: PathBuf },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An fsync failed. After that the page cache can no longer be trusted to match the disk
    /// (PostgreSQL's "fsyncgate"), so the log refuses appends until it is reopened and recovered.
    #[error("log is poisoned and refuses appends until reopened: {0}")]
    Poisoned(String),
    /// The caller broke the log's order (an entry out of sequence, a term going back, a cut
    /// below the start): a bug upstream, reported rather than absorbed.
    #[error("log order violated: {0}")]
    OutOfOrder(String),
}

impl LogError {
    /// Builds a closure for `map_err` that wraps an `io::Error` with the operation and path; a
    /// full disk becomes [`LogError::DiskFull`] wherever it is met (segment, index, header).
    pub(crate) fn io<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> LogError + 'a {
        move |source| {
            if crate::fs::is_disk_full(&source) {
                return LogError::DiskFull {
                    path: path.to_path_buf(),
                };
            }
            LogError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        }
    }
}
