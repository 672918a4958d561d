//! A simulated file system for the deterministic simulation (and for tests that need a disk
//! that can lose, tear or rot data on command).
//!
//! Every file has its durable bytes and its page cache (what reads see), plus the list of
//! writes and truncations made since its last sync. A sync takes virtual time
//! (`tokio::time::sleep`, so the simulation's paused clock decides) and then makes the page cache
//! durable. A crash ([`SimFs::crash`]) keeps the durable bytes and, of each file's unsynced
//! operations, a prefix of the caller's choosing, the last one possibly cut short: a torn write.
//! Directory entries follow the same rule: a created, renamed or removed file is durable only
//! once its directory is synced, so a crash can make an unsynced new file vanish or bring back
//! a removed one. Directories themselves (`create_dir_all`, `remove_dir_all`) are durable at
//! once: a simplification, since the log only ever creates a directory before anything in it.
//!
//! After a crash the old handles fail (`BrokenPipe`); [`SimFs::crash`] returns the handle of the
//! next incarnation. [`SimFs::rot`] edits a file's durable bytes in place (damage on the medium).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::fs::{Fs, FsFile, SyncFuture};

/// What a simulated sync does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncBehaviour {
    /// A sync makes everything written before it durable (a correct disk).
    Honest,
    /// An asynchronous sync reports success and makes nothing durable (a volatile write cache
    /// that ignores fsync); only the blocking [`FsFile::sync_now`] of opening and closing
    /// reaches the medium. Only for showing that the checker catches lost acknowledged records;
    /// never a model of a good disk.
    LyingWriteCache,
}

#[derive(Debug, Clone)]
enum Op {
    Write { pos: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default, Clone)]
struct FileState {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// Operations since the last sync, in order.
    pending: Vec<Op>,
}

fn apply(buf: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { pos, bytes } => {
            let pos = usize::try_from(*pos).unwrap_or(usize::MAX);
            let end = pos.saturating_add(bytes.len());
            if buf.len() < end {
                buf.resize(end, 0);
            }
            if let Some(dst) = buf.get_mut(pos..end) {
                dst.copy_from_slice(bytes);
            }
        }
        Op::SetLen(len) => buf.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
    }
}

#[derive(Debug, Default)]
struct State {
    /// File id → contents.
    files: BTreeMap<u64, FileState>,
    /// The namespace reads see, and the one a crash keeps.
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    next_id: u64,
    incarnation: u64,
    syncs: u64,
    /// Extra latency of the next file sync only ([`SimFs::stall_next_sync`]).
    next_sync_stall: Duration,
}

/// A simulated file system shared by every incarnation of one machine (see the module docs).
#[derive(Clone)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
    incarnation: u64,
    sync_delay: Duration,
    behaviour: SyncBehaviour,
}

fn crashed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "simulated machine crashed")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

/// What one crash did, for the simulation's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Bytes written but never synced that did not survive.
    pub dropped_bytes: u64,
    /// Files that had unsynced writes when the crash came.
    pub files_with_unsynced: usize,
}

impl SimFs {
    pub fn new(sync_delay: Duration, behaviour: SyncBehaviour) -> SimFs {
        SimFs {
            state: Arc::new(Mutex::new(State::default())),
            incarnation: 0,
            sync_delay,
            behaviour,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = self.lock();
        if state.incarnation != self.incarnation {
            return Err(crashed());
        }
        Ok(state)
    }

    /// Power loss: every page cache is gone. For each file with unsynced operations,
    /// `choose(n)` (which must return a value in `0..=n`) picks how many of its `n` operations
    /// reached the disk, and then, for a write cut short, how many of its bytes did. Returns
    /// the handle of the next incarnation (this one fails from now on) and what was lost.
    pub fn crash(&self, mut choose: impl FnMut(u64) -> u64) -> (SimFs, CrashReport) {
        let mut state = self.lock();
        let mut report = CrashReport::default();
        for file in state.files.values_mut() {
            if file.pending.is_empty() {
                file.current = file.durable.clone();
                continue;
            }
            report.files_with_unsynced += 1;
            let before = file.current.clone();
            let n = file.pending.len() as u64;
            let keep = usize::try_from(choose(n).min(n)).unwrap_or(0);
            let mut survived = file.durable.clone();
            for op in file.pending.iter().take(keep) {
                apply(&mut survived, op);
            }
            if let Some(Op::Write { pos, bytes }) = file.pending.get(keep) {
                let part = usize::try_from(choose(bytes.len() as u64)).unwrap_or(0);
                let cut = bytes.get(..part.min(bytes.len())).unwrap_or_default();
                apply(
                    &mut survived,
                    &Op::Write {
                        pos: *pos,
                        bytes: cut.to_vec(),
                    },
                );
            }
            let same = before
                .iter()
                .zip(&survived)
                .take_while(|(a, b)| a == b)
                .count();
            report.dropped_bytes += (before.len().max(survived.len()) - same) as u64;
            file.durable = survived.clone();
            file.current = survived;
            file.pending.clear();
        }
        state.names = state.durable_names.clone();
        let live: BTreeSet<u64> = state.names.values().copied().collect();
        state.files.retain(|id, _| live.contains(id));
        state.incarnation += 1;
        state.next_sync_stall = Duration::ZERO;
        let next = SimFs {
            state: Arc::clone(&self.state),
            incarnation: state.incarnation,
            sync_delay: self.sync_delay,
            behaviour: self.behaviour,
        };
        (next, report)
    }

    /// Edits the durable bytes of `path` in place (damage on the medium), for a machine that
    /// is down: its page cache follows. False if there is no such durable file.
    pub fn rot(&self, path: &Path, edit: impl FnOnce(&mut Vec<u8>)) -> bool {
        let mut state = self.lock();
        let Some(&id) = state.durable_names.get(path) else {
            return false;
        };
        let Some(file) = state.files.get_mut(&id) else {
            return false;
        };
        edit(&mut file.durable);
        file.current = file.durable.clone();
        file.pending.clear();
        true
    }

    /// The durable files under `dir` (recursively), with their durable lengths.
    pub fn durable_files(&self, dir: &Path) -> Vec<(PathBuf, usize)> {
        let state = self.lock();
        state
            .durable_names
            .iter()
            .filter(|(p, _)| p.starts_with(dir))
            .filter_map(|(p, id)| state.files.get(id).map(|f| (p.clone(), f.durable.len())))
            .collect()
    }

    /// The durable bytes of `path`, if it is a durable file.
    pub fn durable_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let id = state.durable_names.get(path)?;
        state.files.get(id).map(|f| f.durable.clone())
    }

    /// Bytes written (or cut) since the last sync, over every file: what a crash now could
    /// take back.
    pub fn unsynced_bytes(&self) -> u64 {
        let state = self.lock();
        state
            .files
            .values()
            .flat_map(|f| f.pending.iter())
            .map(|op| match op {
                Op::Write { bytes, .. } => bytes.len() as u64,
                Op::SetLen(_) => 1,
            })
            .sum()
    }

    /// Makes the next file sync take `extra` longer (a slow flush), so what it covers stays
    /// unsynced for a while; a crash clears it. `Duration::ZERO` disarms it.
    pub fn stall_next_sync(&self, extra: Duration) {
        self.lock().next_sync_stall = extra;
    }

    /// File syncs completed, over all incarnations.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }
}

struct SimFile {
    fs: SimFs,
    id: u64,
    path: PathBuf,
}

impl SimFile {
    fn with<R>(&self, f: impl FnOnce(&mut FileState) -> io::Result<R>) -> io::Result<R> {
        let mut state = self.fs.live()?;
        let file = state
            .files
            .get_mut(&self.id)
            .ok_or_else(|| not_found(&self.path))?;
        f(file)
    }

    fn record(&self, op: Op) -> io::Result<()> {
        self.with(|file| {
            apply(&mut file.current, &op);
            file.pending.push(op);
            Ok(())
        })
    }

    fn complete_sync(&self, honest: bool) -> io::Result<()> {
        let mut state = self.fs.live()?;
        state.syncs += 1;
        let file = state
            .files
            .get_mut(&self.id)
            .ok_or_else(|| not_found(&self.path))?;
        if honest {
            file.durable = file.current.clone();
            file.pending.clear();
        }
        Ok(())
    }
}

impl FsFile for SimFile {
    fn len(&self) -> io::Result<u64> {
        self.with(|f| Ok(f.current.len() as u64))
    }

    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.with(|f| {
            let start = usize::try_from(pos).map_err(io::Error::other)?;
            let src = start
                .checked_add(buf.len())
                .and_then(|end| f.current.get(start..end))
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        })
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.record(Op::Write {
            pos,
            bytes: buf.to_vec(),
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.record(Op::SetLen(len))
    }

    fn sync(&self) -> SyncFuture {
        let file = SimFile {
            fs: self.fs.clone(),
            id: self.id,
            path: self.path.clone(),
        };
        Box::pin(async move {
            let stall = std::mem::take(&mut file.fs.live()?.next_sync_stall);
            tokio::time::sleep(file.fs.sync_delay + stall).await;
            file.complete_sync(file.fs.behaviour == SyncBehaviour::Honest)
        })
    }

    fn sync_now(&self) -> io::Result<()> {
        self.complete_sync(true)
    }

    fn describe(&self) -> String {
        format!("{} (simulated)", self.path.display())
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        for a in dir.ancestors() {
            if !a.as_os_str().is_empty() {
                state.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.live()?;
        if !state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let child = |p: &PathBuf| -> Option<String> {
            (p.parent() == Some(dir))
                .then(|| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .flatten()
        };
        let mut names: BTreeSet<String> = state.names.keys().filter_map(child).collect();
        names.extend(state.dirs.iter().filter_map(child));
        Ok(names.into_iter().collect())
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn FsFile>> {
        let mut state = self.live()?;
        let id = match state.names.get(path) {
            Some(&id) => id,
            None if create => {
                let parent = path.parent().ok_or_else(|| not_found(path))?;
                if !state.dirs.contains(parent) {
                    return Err(not_found(parent));
                }
                state.next_id += 1;
                let id = state.next_id;
                state.files.insert(id, FileState::default());
                state.names.insert(path.to_path_buf(), id);
                id
            }
            None => return Err(not_found(path)),
        };
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            id,
            path: path.to_path_buf(),
        }))
    }

    fn exists(&self, path: &Path) -> bool {
        self.live()
            .is_ok_and(|s| s.names.contains_key(path) || s.dirs.contains(path))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.live()?.names.remove(path);
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        state.names.retain(|p, _| !p.starts_with(dir));
        state.durable_names.retain(|p, _| !p.starts_with(dir));
        state.dirs.retain(|p| !p.starts_with(dir));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        let id = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        let current: Vec<(PathBuf, u64)> = state
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        state.durable_names.retain(|p, _| !in_dir(p));
        state.durable_names.extend(current);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fs::write_atomic;

    fn fs() -> SimFs {
        SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest)
    }

    #[tokio::test(start_paused = true)]
    async fn unsynced_writes_and_names_are_lost_or_torn_on_crash() {
        let fs = fs();
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let f = fs.open(&dir.join("a"), true).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.sync().await.unwrap();
        // Content synced but the name is not: a crash loses the file.
        let (fs2, _) = fs.crash(|n| n);
        assert!(!fs2.exists(&dir.join("a")));
        assert!(f.write_all_at(b"x", 0).is_err(), "old handles fail");

        let f = fs2.open(&dir.join("a"), true).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.sync_now().unwrap();
        fs2.sync_dir(dir).unwrap();
        f.write_all_at(b" world", 5).unwrap();
        f.write_all_at(b"!!", 11).unwrap();
        // Keep the first unsynced write, torn after 2 of its bytes... no: keep 0 whole ops and
        // 3 bytes of the first.
        let mut answers = vec![0u64, 3].into_iter();
        let (fs3, report) = fs2.crash(|_| answers.next().unwrap_or(0));
        assert_eq!(report.files_with_unsynced, 1);
        assert_eq!(report.dropped_bytes, 5);
        let f = fs3.open(&dir.join("a"), false).unwrap();
        let mut buf = vec![0u8; f.len().unwrap() as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf, b"hello wo");
    }

    #[tokio::test(start_paused = true)]
    async fn rename_and_remove_are_durable_only_after_a_directory_sync() {
        let fs = fs();
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        write_atomic(&fs, &dir.join("state"), b"v1").unwrap();
        let f = fs.open(&dir.join("gone"), true).unwrap();
        f.sync_now().unwrap();
        fs.sync_dir(dir).unwrap();
        fs.remove_file(&dir.join("gone")).unwrap();
        let (fs2, _) = fs.crash(|_| 0);
        assert!(
            fs2.exists(&dir.join("gone")),
            "an unsynced removal comes back"
        );
        assert_eq!(fs2.durable_bytes(&dir.join("state")).unwrap(), b"v1");
        assert_eq!(fs2.list(dir).unwrap(), vec!["gone", "state"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lying_disk_loses_what_its_fsyncs_acknowledged() {
        let fs = SimFs::new(Duration::from_millis(1), SyncBehaviour::LyingWriteCache);
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let f = fs.open(&dir.join("a"), true).unwrap();
        fs.sync_dir(dir).unwrap();
        f.write_all_at(b"a", 0).unwrap();
        f.sync_now().unwrap();
        f.write_all_at(b"b", 1).unwrap();
        f.sync().await.unwrap();
        let (fs2, _) = fs.crash(|_| 0);
        assert_eq!(fs2.durable_bytes(&dir.join("a")).unwrap(), b"a");
        assert!(fs2.rot(&dir.join("a"), |b| b[0] = b'z'));
        assert_eq!(fs2.durable_bytes(&dir.join("a")).unwrap(), b"z");
    }
}
