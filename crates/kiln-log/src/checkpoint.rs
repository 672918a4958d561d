//! The recovery checkpoint: how far the log is known to be fsynced, so that recovery only has to
//! scan what lies past it.
//!
//! File format (big-endian, 44 bytes): magic "KLNCKPT" + version byte 1, segment base i64,
//! byte position u64, next offset i64, max timestamp i64, CRC32C u32 of the preceding bytes.
//! It is replaced atomically: write a temp file, fsync it, rename over the old one, fsync the
//! directory. A torn or corrupt checkpoint is ignored (recovery then scans everything).

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::Path;

use crate::LogError;

pub(crate) const CHECKPOINT_FILE: &str = "recovery-checkpoint";
pub(crate) const CHECKPOINT_TMP: &str = "recovery-checkpoint.tmp";

const MAGIC: &[u8; 8] = b"KLNCKPT\x01";
const LEN: usize = 8 + 8 + 8 + 8 + 8 + 4;

/// Everything below (`segment_base`, `position`) was fsynced, and offset `next_offset` starts at
/// `position`. `max_timestamp` is the largest batch timestamp in that segment before `position`
/// (`i64::MIN` for none), which the sparse time index alone cannot give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub segment_base: i64,
    pub position: u64,
    pub next_offset: i64,
    pub max_timestamp: i64,
}

impl Checkpoint {
    /// Checkpoints only move forward; an older one is still true but would cost a longer scan.
    pub fn is_after(&self, other: &Checkpoint) -> bool {
        (self.segment_base, self.position) > (other.segment_base, other.position)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.segment_base.to_be_bytes());
        out.extend_from_slice(&self.position.to_be_bytes());
        out.extend_from_slice(&self.next_offset.to_be_bytes());
        out.extend_from_slice(&self.max_timestamp.to_be_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
        if bytes.len() != LEN {
            return Err(format!("{} bytes, expected {LEN}", bytes.len()));
        }
        let field = |at: usize| -> Result<[u8; 8], String> {
            bytes
                .get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| "short field".to_string())
        };
        let (body, crc) = bytes.split_at(LEN - 4);
        let stored = u32::from_be_bytes(crc.try_into().map_err(|_| "short crc".to_string())?);
        let actual = crc32c::crc32c(body);
        if stored != actual {
            return Err(format!(
                "CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"
            ));
        }
        if field(0)? != *MAGIC {
            return Err("bad magic or version".to_string());
        }
        Ok(Checkpoint {
            segment_base: i64::from_be_bytes(field(8)?),
            position: u64::from_be_bytes(field(16)?),
            next_offset: i64::from_be_bytes(field(24)?),
            max_timestamp: i64::from_be_bytes(field(32)?),
        })
    }
}

/// Reads the checkpoint of `dir`. A missing file is `Ok(None)`; an unreadable or damaged one is
/// logged and also `Ok(None)`, because the fallback (scan everything) is always safe.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>, LogError> {
    let path = dir.join(CHECKPOINT_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io("read checkpoint", &path)(e)),
    };
    match Checkpoint::decode(&bytes) {
        Ok(cp) => Ok(Some(cp)),
        Err(reason) => {
            tracing::warn!(path = %path.display(), %reason, "ignoring damaged recovery checkpoint; scanning the whole log");
            Ok(None)
        }
    }
}

/// Atomically replaces the checkpoint of `dir`.
pub(crate) fn write(dir: &Path, cp: &Checkpoint) -> Result<(), LogError> {
    let tmp = dir.join(CHECKPOINT_TMP);
    let path = dir.join(CHECKPOINT_FILE);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(LogError::io("create checkpoint", &tmp))?;
    file.write_all(&cp.encode())
        .map_err(LogError::io("write checkpoint", &tmp))?;
    file.sync_all()
        .map_err(LogError::io("fsync checkpoint", &tmp))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(LogError::io("rename checkpoint", &path))?;
    sync_dir(dir)
}

/// fsyncs a directory so that file creations, renames and deletions in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LogError::io("fsync directory", dir))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let cp = Checkpoint {
            segment_base: 7,
            position: 1234,
            next_offset: 99,
            max_timestamp: -1,
        };
        write(dir.path(), &cp).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(cp));
        let path = dir.path().join(CHECKPOINT_FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes[20] ^= 0x10;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        fs::write(&path, &bytes[..10]).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
    }
}
