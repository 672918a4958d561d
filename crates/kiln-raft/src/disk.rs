//! The file abstraction the log store writes through: a real file with fsync, or a simulated
//! one that models the page cache (written but not yet synced data is lost on a crash).

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A boxed future, so [`Disk`] stays object safe.
pub type SyncFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// One append-only file. Writes land in the page cache; only [`Disk::sync`] makes them durable.
pub trait Disk: Send + Sync + 'static {
    /// Everything in the file (read once, at recovery).
    fn read_all(&self) -> io::Result<Vec<u8>>;
    /// Appends at the end of the file, without syncing.
    fn append(&self, bytes: &[u8]) -> io::Result<()>;
    /// Cuts the file to `len` bytes, without syncing.
    fn truncate(&self, len: u64) -> io::Result<()>;
    /// Resolves once everything written (and truncated) so far is on disk.
    fn sync(&self) -> SyncFuture;
    /// How log lines name this file (its path, for a real one).
    fn describe(&self) -> String {
        "a simulated file".to_string()
    }
}

/// A real file: `pwrite` appends, `fdatasync` (on a blocking thread) for sync.
pub struct FileDisk {
    path: PathBuf,
    file: Arc<File>,
    len: Mutex<u64>,
}

impl FileDisk {
    /// Opens or creates `path`. A newly created file's directory entry is fsynced too.
    pub fn open(path: &Path) -> io::Result<FileDisk> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if !existed {
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        let len = file.metadata()?.len();
        Ok(FileDisk {
            path: path.to_path_buf(),
            file: Arc::new(file),
            len: Mutex::new(len),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn len_guard(&self) -> MutexGuard<'_, u64> {
        self.len.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Disk for FileDisk {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn read_all(&self) -> io::Result<Vec<u8>> {
        let len = *self.len_guard();
        let mut buf = vec![0u8; usize::try_from(len).map_err(io::Error::other)?];
        self.file.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }

    fn append(&self, bytes: &[u8]) -> io::Result<()> {
        let mut len = self.len_guard();
        if let Err(e) = self.file.write_all_at(bytes, *len) {
            // Cut a partial write back so the next append starts at a record boundary.
            let _ = self.file.set_len(*len);
            return Err(e);
        }
        *len += bytes.len() as u64;
        Ok(())
    }

    fn truncate(&self, new_len: u64) -> io::Result<()> {
        let mut len = self.len_guard();
        self.file.set_len(new_len)?;
        *len = new_len;
        Ok(())
    }

    fn sync(&self) -> SyncFuture {
        let file = Arc::clone(&self.file);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let synced = file.sync_data();
                // The broker's fsync histogram covers replica logs as well as segments.
                kiln_log::stats::record_fsync(started.elapsed());
                synced
            })
            .await
            .map_err(io::Error::other)?
        })
    }
}

/// What a simulated disk does when asked to sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncBehaviour {
    /// Sync makes everything written so far durable (a correct disk).
    Honest,
    /// Sync returns success but only makes durable what was written before the *previous*
    /// sync (a disk with a volatile write cache that lies). For showing that the checker
    /// catches lost acknowledged records; never a model of a good disk.
    LyingWriteCache,
}

#[derive(Debug, Default)]
struct SimFileState {
    /// What a crash leaves (plus possibly a torn prefix of the unsynced tail).
    synced: Vec<u8>,
    /// What reads see: the page cache.
    current: Vec<u8>,
    /// For [`SyncBehaviour::LyingWriteCache`]: the contents at the last sync call.
    at_last_sync: Vec<u8>,
    /// Incremented on every crash; handles of an older incarnation fail.
    incarnation: u64,
    syncs: u64,
    /// Extra latency for the next sync only (see [`SimDisk::stall_next_sync`]).
    next_sync_stall: Duration,
}

/// What a crash of one simulated file did.
pub struct Crashed {
    /// The handle for the next incarnation.
    pub disk: SimDisk,
    /// Bytes the page cache held that did not survive: written but never synced.
    pub dropped_bytes: usize,
}

/// A simulated file shared by every incarnation of one replica. Sync takes `sync_delay` of
/// (virtual) time; a crash ([`SimDisk::crash`]) drops everything not synced, except a prefix
/// of the unsynced appended bytes of the crash's choosing (a torn write).
#[derive(Clone)]
pub struct SimDisk {
    state: Arc<Mutex<SimFileState>>,
    incarnation: u64,
    sync_delay: Duration,
    behaviour: SyncBehaviour,
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    // The usual case (one extends the other) in one comparison: the simulation asks this of
    // every file on every step while it waits for a write in flight.
    if a.get(..n) == b.get(..n) {
        return n;
    }
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn crashed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "simulated machine crashed")
}

impl SimDisk {
    pub fn new(sync_delay: Duration, behaviour: SyncBehaviour) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(SimFileState::default())),
            incarnation: 0,
            sync_delay,
            behaviour,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimFileState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> io::Result<MutexGuard<'_, SimFileState>> {
        let state = self.lock();
        if state.incarnation != self.incarnation {
            return Err(crashed());
        }
        Ok(state)
    }

    /// Power loss: the page cache is gone. `keep_torn` picks how many of the unsynced appended
    /// bytes happened to reach the platter (given their count; 0 keeps none). Returns the
    /// handle for the next incarnation; this one fails from now on.
    pub fn crash(&self, keep_torn: impl FnOnce(usize) -> usize) -> SimDisk {
        self.crash_counting(keep_torn).disk
    }

    /// [`SimDisk::crash`], also saying how many written bytes the crash dropped.
    pub fn crash_counting(&self, keep_torn: impl FnOnce(usize) -> usize) -> Crashed {
        let mut state = self.lock();
        let synced_len = state.synced.len();
        let extends = state.current.len() >= synced_len
            && state.current.get(..synced_len) == Some(state.synced.as_slice());
        let mut survived = state.synced.clone();
        if extends {
            let extra = state.current.len() - synced_len;
            let keep = keep_torn(extra).min(extra);
            survived.extend_from_slice(&state.current[synced_len..synced_len + keep]);
        }
        let dropped_bytes = state.current.len() - common_prefix(&state.current, &survived);
        state.current = survived.clone();
        state.at_last_sync = survived.clone();
        state.synced = survived;
        state.incarnation += 1;
        state.next_sync_stall = Duration::ZERO;
        Crashed {
            disk: SimDisk {
                state: Arc::clone(&self.state),
                incarnation: state.incarnation,
                sync_delay: self.sync_delay,
                behaviour: self.behaviour,
            },
            dropped_bytes,
        }
    }

    /// Bytes written but not yet synced that a crash now could drop (bytes written after an
    /// unsynced truncation included).
    pub fn unsynced_len(&self) -> usize {
        let state = self.lock();
        state.current.len() - common_prefix(&state.current, &state.synced)
    }

    /// Makes the next sync take `extra` longer than usual (a slow flush), so that what it
    /// covers stays unsynced for a while; a crash clears it. `Duration::ZERO` disarms it.
    pub fn stall_next_sync(&self, extra: Duration) {
        self.lock().next_sync_stall = extra;
    }

    /// Changes the file's durable bytes in place, as damage on the medium would (a flipped
    /// bit, a lost run of bytes), for a replica that is down: its page cache is dropped too.
    pub fn rot(&self, edit: impl FnOnce(&mut Vec<u8>)) {
        let mut state = self.lock();
        edit(&mut state.synced);
        state.current = state.synced.clone();
        state.at_last_sync = state.synced.clone();
    }

    /// The durable bytes.
    pub fn synced_bytes(&self) -> Vec<u8> {
        self.lock().synced.clone()
    }

    /// Bytes durable now.
    pub fn synced_len(&self) -> usize {
        self.lock().synced.len()
    }

    /// Bytes written (page cache).
    pub fn written_len(&self) -> usize {
        self.lock().current.len()
    }

    /// Sync calls that completed, over all incarnations.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }
}

impl Disk for SimDisk {
    fn read_all(&self) -> io::Result<Vec<u8>> {
        Ok(self.live()?.current.clone())
    }

    fn append(&self, bytes: &[u8]) -> io::Result<()> {
        self.live()?.current.extend_from_slice(bytes);
        Ok(())
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut state = self.live()?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        state.current.truncate(len);
        Ok(())
    }

    fn sync(&self) -> SyncFuture {
        let disk = self.clone();
        Box::pin(async move {
            let stall = std::mem::take(&mut disk.live()?.next_sync_stall);
            tokio::time::sleep(disk.sync_delay + stall).await;
            let mut state = disk.live()?;
            state.syncs += 1;
            match disk.behaviour {
                SyncBehaviour::Honest => state.synced = state.current.clone(),
                SyncBehaviour::LyingWriteCache => {
                    let now = state.current.clone();
                    state.synced = std::mem::replace(&mut state.at_last_sync, now);
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn crash_drops_unsynced_data_and_keeps_a_torn_prefix() {
        let disk = SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest);
        disk.append(b"hello").unwrap();
        disk.sync().await.unwrap();
        disk.append(b" world").unwrap();
        assert_eq!(disk.read_all().unwrap(), b"hello world");
        let after = disk.crash(|extra| {
            assert_eq!(extra, 6);
            2
        });
        assert_eq!(after.read_all().unwrap(), b"hello w");
        // The old incarnation can no longer write.
        assert!(disk.append(b"x").is_err());
        assert!(disk.sync().await.is_err());
        // A truncation that was not synced is undone by a crash.
        after.sync().await.unwrap();
        after.truncate(1).unwrap();
        let again = after.crash(|_| 0);
        assert_eq!(again.read_all().unwrap(), b"hello w");
    }

    #[tokio::test(start_paused = true)]
    async fn crash_counts_dropped_bytes_and_a_stall_delays_one_sync() {
        let disk = SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest);
        disk.append(b"abcd").unwrap();
        assert_eq!(disk.unsynced_len(), 4);
        disk.stall_next_sync(Duration::from_millis(50));
        let began = tokio::time::Instant::now();
        disk.sync().await.unwrap();
        assert_eq!(began.elapsed(), Duration::from_millis(51));
        assert_eq!(disk.unsynced_len(), 0);
        // The stall was for one sync only.
        let began = tokio::time::Instant::now();
        disk.sync().await.unwrap();
        assert_eq!(began.elapsed(), Duration::from_millis(1));
        disk.append(b"efgh").unwrap();
        let crashed = disk.crash_counting(|extra| extra - 1);
        assert_eq!(crashed.dropped_bytes, 1);
        assert_eq!(crashed.disk.read_all().unwrap(), b"abcdefg");
        // An unsynced truncation followed by a write: the write is what is dropped.
        let disk = crashed.disk;
        disk.sync().await.unwrap();
        disk.truncate(2).unwrap();
        disk.append(b"XY").unwrap();
        assert_eq!(disk.unsynced_len(), 2);
        let crashed = disk.crash_counting(|_| 0);
        assert_eq!(crashed.dropped_bytes, 2);
        assert_eq!(crashed.disk.read_all().unwrap(), b"abcdefg");
    }

    #[tokio::test(start_paused = true)]
    async fn lying_disk_loses_the_last_synced_write() {
        let disk = SimDisk::new(Duration::from_millis(1), SyncBehaviour::LyingWriteCache);
        disk.append(b"a").unwrap();
        disk.sync().await.unwrap();
        disk.append(b"b").unwrap();
        disk.sync().await.unwrap();
        let after = disk.crash(|_| 0);
        assert_eq!(after.read_all().unwrap(), b"a");
    }

    #[tokio::test]
    async fn file_disk_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let disk = FileDisk::open(&path).unwrap();
        disk.append(b"abc").unwrap();
        disk.append(b"def").unwrap();
        disk.sync().await.unwrap();
        disk.truncate(4).unwrap();
        disk.sync().await.unwrap();
        drop(disk);
        let disk = FileDisk::open(&path).unwrap();
        assert_eq!(disk.read_all().unwrap(), b"abcd");
        disk.append(b"!").unwrap();
        assert_eq!(disk.read_all().unwrap(), b"abcd!");
    }
}
