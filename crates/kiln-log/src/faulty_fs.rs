//! A file system that fails on command: writes and syncs of chosen files return an OS error
//! (ENOSPC for a full disk, EDQUOT, EIO), for tests of what the log and its users do then.
//!
//! It wraps any [`Fs`] ([`crate::sim_fs::SimFs`] or [`crate::fs::RealFs`]); everything but the
//! failing calls passes through. What fails is said by a shared [`Faults`]:
//! * the next `n` writes, or the next `n` syncs ([`Faults::fail_writes`], [`Faults::fail_syncs`]):
//!   a sync failing after its bytes were written is how a delayed allocation failure shows up;
//! * every write while the disk is full ([`Faults::set_full`]).
//!
//! [`FaultyFs::segments_only`] limits the faults to log segments (files ending in `.log`), so
//! the vote and state files beside them keep working, as on a disk whose last free blocks went
//! to those small files' earlier writes.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::fs::{Fs, FsFile, SyncFuture};

/// Linux's ENOSPC: no space left on the device.
pub const ENOSPC: i32 = 28;

/// Which calls fail, and with what error; shared by every file opened through one [`FaultyFs`].
#[derive(Debug)]
pub struct Faults {
    /// The raw OS error the failing calls return.
    error: i32,
    writes: AtomicUsize,
    syncs: AtomicUsize,
    full: AtomicBool,
}

impl Faults {
    /// Nothing fails yet; what fails later fails with the raw OS error `error`.
    pub fn new(error: i32) -> Arc<Faults> {
        Arc::new(Faults {
            error,
            writes: AtomicUsize::new(0),
            syncs: AtomicUsize::new(0),
            full: AtomicBool::new(false),
        })
    }

    /// The next `n` writes fail (replacing any count not yet used up).
    pub fn fail_writes(&self, n: usize) {
        self.writes.store(n, Ordering::SeqCst);
    }

    /// The next `n` syncs fail (replacing any count not yet used up).
    pub fn fail_syncs(&self, n: usize) {
        self.syncs.store(n, Ordering::SeqCst);
    }

    /// Every write fails while `full`.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Writes still to fail of those asked for with [`Faults::fail_writes`].
    pub fn writes_left(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// Syncs still to fail of those asked for with [`Faults::fail_syncs`].
    pub fn syncs_left(&self) -> usize {
        self.syncs.load(Ordering::SeqCst)
    }

    fn error(&self) -> io::Error {
        io::Error::from_raw_os_error(self.error)
    }

    fn write_fails(&self) -> bool {
        self.full.load(Ordering::SeqCst) || take(&self.writes)
    }

    fn sync_fails(&self) -> bool {
        take(&self.syncs)
    }
}

/// Takes one from `n` unless it is 0; true if it took one.
fn take(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

/// An [`Fs`] whose files fail as its [`Faults`] say.
pub struct FaultyFs {
    inner: Arc<dyn Fs>,
    faults: Arc<Faults>,
    segments_only: bool,
}

impl FaultyFs {
    /// Every file opened through it can fail.
    pub fn new(inner: Arc<dyn Fs>, faults: Arc<Faults>) -> FaultyFs {
        FaultyFs {
            inner,
            faults,
            segments_only: false,
        }
    }

    /// Only log segments (`.log` files) fail.
    pub fn segments_only(inner: Arc<dyn Fs>, faults: Arc<Faults>) -> FaultyFs {
        FaultyFs {
            inner,
            faults,
            segments_only: true,
        }
    }
}

impl Fs for FaultyFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn FsFile>> {
        let file = self.inner.open(path, create)?;
        let segment = path.extension().is_some_and(|e| e == "log");
        if self.segments_only && !segment {
            return Ok(file);
        }
        Ok(Arc::new(FaultyFile::new(file, self.faults.clone())))
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

/// One file that fails as its [`Faults`] say.
pub struct FaultyFile {
    inner: Arc<dyn FsFile>,
    faults: Arc<Faults>,
}

impl FaultyFile {
    pub fn new(inner: Arc<dyn FsFile>, faults: Arc<Faults>) -> FaultyFile {
        FaultyFile { inner, faults }
    }
}

impl FsFile for FaultyFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        if self.faults.write_fails() {
            return Err(self.faults.error());
        }
        self.inner.write_all_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync(&self) -> SyncFuture {
        if self.faults.sync_fails() {
            let e = self.faults.error();
            return Box::pin(async move { Err(e) });
        }
        self.inner.sync()
    }
    fn sync_now(&self) -> io::Result<()> {
        if self.faults.sync_fails() {
            return Err(self.faults.error());
        }
        self.inner.sync_now()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;
    use crate::sim_fs::{SimFs, SyncBehaviour};

    #[tokio::test]
    async fn counted_faults_are_used_up_and_full_lasts_until_cleared() {
        let sim = SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest);
        sim.create_dir_all(Path::new("/d")).unwrap();
        let faults = Faults::new(ENOSPC);
        let fs = FaultyFs::segments_only(Arc::new(sim), faults.clone());
        let seg = fs.open(Path::new("/d/0.log"), true).unwrap();
        let vote = fs.open(Path::new("/d/vote"), true).unwrap();

        faults.fail_writes(1);
        faults.fail_syncs(1);
        let e = seg.write_all_at(b"a", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(ENOSPC));
        seg.write_all_at(b"a", 0).unwrap();
        assert!(seg.sync().await.is_err());
        seg.sync().await.unwrap();
        assert_eq!((faults.writes_left(), faults.syncs_left()), (0, 0));

        faults.set_full(true);
        assert!(seg.write_all_at(b"b", 1).is_err());
        assert!(seg.write_all_at(b"b", 1).is_err());
        vote.write_all_at(b"v", 0).unwrap();
        faults.set_full(false);
        seg.write_all_at(b"b", 1).unwrap();
        assert_eq!(seg.len().unwrap(), 2);
    }
}
