//! The file system the log writes through: the real one ([`RealFs`]), or a simulated one
//! ([`crate::sim_fs::SimFs`]) that keeps written-but-unsynced data in a page cache a crash can
//! drop, tear or let survive, and whose synced bytes can rot. Every file and directory the log
//! touches (segments, indexes, the vote and state files of a replica) goes through here, so the
//! seeded simulation crashes the very code that runs in production.
//!
//! Durability rules, which both implementations keep and the log relies on:
//! * a write is durable only after a [`FsFile::sync`] (or [`FsFile::sync_now`]) of that file
//!   that began after it returned;
//! * a created, renamed or removed directory entry is durable only after [`Fs::sync_dir`] of
//!   its directory;
//! * a crash keeps every durable byte; of the rest, any prefix of the writes made since the
//!   last sync may survive (the simulation picks one).

use std::fs::{self, File};
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use crate::fds::Slot;

/// A boxed future, so [`FsFile`] stays object safe.
pub type SyncFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// One open file.
// A file's length is an I/O call that can fail; an `is_empty` beside it would add nothing.
#[allow(clippy::len_without_is_empty)]
pub trait FsFile: Send + Sync + 'static {
    /// The file's length now (what reads see, synced or not).
    fn len(&self) -> io::Result<u64>;
    /// Fills `buf` from `pos`; an error if the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Writes all of `buf` at `pos`, extending the file if needed. Not durable until synced.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// Cuts or extends the file to `len` bytes. Not durable until synced.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every earlier write and `set_len` of this file durable (`fdatasync`). The real
    /// file runs it on a blocking thread; the simulated one takes virtual time.
    fn sync(&self) -> SyncFuture;
    /// [`FsFile::sync`] on the calling thread, for the rare paths that are not async (opening
    /// and recovering a log). The simulated file completes it at once.
    fn sync_now(&self) -> io::Result<()>;
    /// How log lines name this file (its path).
    fn describe(&self) -> String;
}

/// Directory operations and opening files.
pub trait Fs: Send + Sync + 'static {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir` (files and directories), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens `path` for reading and writing; with `create`, creates it empty if missing.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn FsFile>>;
    fn exists(&self, path: &Path) -> bool;
    /// Removes a file. Removing a missing file is not an error.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything in it. A missing directory is not an error.
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Writes `bytes` to `path` atomically and durably: a temporary file, fsynced, renamed over
/// `path`, then the directory fsynced. A reader finds the old content or the new, never a mix.
pub fn write_atomic(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no directory", path.display())))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = fs.open(&tmp, true)?;
    file.set_len(0)?;
    file.write_all_at(bytes, 0)?;
    file.sync_now()?;
    drop(file);
    fs.rename(&tmp, path)?;
    fs.sync_dir(dir)
}

/// Reads a whole file; `None` when it does not exist.
pub fn read_all(fs: &dyn Fs, path: &Path) -> io::Result<Option<Vec<u8>>> {
    if !fs.exists(path) {
        return Ok(None);
    }
    let file = fs.open(path, false)?;
    let len = usize::try_from(file.len()?).map_err(io::Error::other)?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, 0)?;
    Ok(Some(buf))
}

/// The operating system's file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

/// A real file; its descriptor is opened on demand within the process-wide bound
/// (`fds.rs`).
struct RealFile {
    slot: Arc<Slot>,
}

impl FsFile for RealFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.slot.get()?.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        FileExt::read_exact_at(self.slot.get()?.as_ref(), buf, pos)
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        FileExt::write_all_at(self.slot.get()?.as_ref(), buf, pos)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.slot.get()?.set_len(len)
    }

    fn sync(&self) -> SyncFuture {
        let file = self.slot.get();
        Box::pin(async move {
            let file = file?;
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(move || timed_sync(&file))
                    .await
                    .map_err(io::Error::other)?,
                Err(_) => timed_sync(&file),
            }
        })
    }

    fn sync_now(&self) -> io::Result<()> {
        timed_sync(&*self.slot.get()?)
    }

    fn describe(&self) -> String {
        self.slot.path().display().to_string()
    }
}

/// fdatasync, timed into the process-wide histogram the broker's metrics export.
fn timed_sync(file: &File) -> io::Result<()> {
    let started = std::time::Instant::now();
    let result = file.sync_data();
    crate::stats::record_fsync(started.elapsed());
    result
}

impl Fs for RealFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn FsFile>> {
        Ok(Arc::new(RealFile {
            slot: Slot::open(path, create)?,
        }))
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        match fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        match fs::remove_dir_all(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Linux's ENOSPC and EDQUOT.
const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// True for "no space left on device" and "disk quota exceeded": the errors a full disk gives,
/// which the log reports as [`crate::LogError::DiskFull`] and callers wait out.
pub fn is_disk_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn real_fs_round_trip_and_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let fs = RealFs;
        let path = dir.path().join("f");
        let f = fs.open(&path, true).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.write_all_at(b"!", 5).unwrap();
        f.sync_now().unwrap();
        let mut buf = [0u8; 6];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello!");
        f.set_len(2).unwrap();
        assert_eq!(f.len().unwrap(), 2);
        assert!(
            f.read_exact_at(&mut buf, 0).is_err(),
            "short read is an error"
        );
        let state = dir.path().join("state");
        write_atomic(&fs, &state, b"one").unwrap();
        write_atomic(&fs, &state, b"two").unwrap();
        assert_eq!(read_all(&fs, &state).unwrap().unwrap(), b"two");
        assert_eq!(read_all(&fs, &dir.path().join("none")).unwrap(), None);
        let mut names = fs.list(dir.path()).unwrap();
        names.sort();
        assert_eq!(names, vec!["f".to_string(), "state".to_string()]);
        fs.remove_file(&dir.path().join("none")).unwrap();
    }
}
