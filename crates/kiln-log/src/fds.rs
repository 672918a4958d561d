//! The real file system's descriptor bound: at most [`open_files_max`] of its files hold a
//! descriptor at once, process-wide.
//!
//! A broker with thousands of replicas has four files per replica (the active segment, its two
//! indexes, the vote file) and would keep them all open while idle: tens of thousands of
//! descriptors held for nothing. A [`Slot`] opens its file when it is used and keeps the
//! descriptor while it is used; once more than the bound are open, one not used since the
//! clock hand last passed it is closed (a clock sweep over the open ones), and its file is
//! opened again by path when next used. An operation in flight holds its own reference to the
//! descriptor, so a close takes effect when it ends.
//!
//! What that costs: an `open` (microseconds) when a file closed for being idle is used again;
//! a broker busy on more files than the bound reopens them in turn. What it changes: a file
//! removed by path while its descriptor is closed cannot be opened again, where an open one
//! would still read the unlinked file. The log removes a segment's files only after taking it
//! out of its segment list, so only a read already under way can meet that; it gets an I/O
//! error naming the file, never wrong bytes. An `fdatasync` through a reopened descriptor
//! flushes the same inode, and Linux (4.16 on) reports a writeback error that nobody has seen
//! to the next `fsync` even through a descriptor opened after it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// Default for [`set_open_files_max`]: with a broker's sockets and a few more it stays under
/// 300 descriptors however many partitions it holds.
pub const OPEN_FILES_MAX_DEFAULT: usize = 200;

static OPEN_FILES_MAX: AtomicUsize = AtomicUsize::new(OPEN_FILES_MAX_DEFAULT);
/// Files holding a descriptor now (in [`OPEN`] or about to be).
static OPEN_COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// The files holding a descriptor, by id, and the clock hand: the id the last sweep stopped at.
static OPEN: Mutex<Open> = Mutex::new(Open {
    files: BTreeMap::new(),
    hand: 0,
});

struct Open {
    files: BTreeMap<u64, Weak<Slot>>,
    hand: u64,
}

fn open_table() -> MutexGuard<'static, Open> {
    // Inserts and removes only: a panic elsewhere leaves the table whole.
    OPEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the bound (at least 1). The broker sets it from its settings at start.
pub fn set_open_files_max(max: usize) {
    assert!(max >= 1, "at least one file must be open to be used");
    OPEN_FILES_MAX.store(max, Ordering::Relaxed);
}

pub fn open_files_max() -> usize {
    OPEN_FILES_MAX.load(Ordering::Relaxed)
}

/// Files of the real file system holding a descriptor now.
pub fn open_files() -> usize {
    OPEN_COUNT.load(Ordering::Relaxed)
}

/// One file of the real file system, its descriptor opened on demand.
pub(crate) struct Slot {
    id: u64,
    path: PathBuf,
    file: Mutex<Option<Arc<File>>>,
    /// Used since the clock hand last passed it.
    used: AtomicBool,
}

impl Slot {
    /// Opens `path` for reading and writing (creating it with `create`), now: a missing file
    /// or a permission problem is reported here, not at first use.
    pub(crate) fn open(path: &Path, create: bool) -> io::Result<Arc<Slot>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        let slot = Arc::new(Slot {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            file: Mutex::new(None),
            used: AtomicBool::new(true),
        });
        slot.install(Arc::new(file));
        Ok(slot)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<File>>> {
        self.file.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open descriptor, opened again by path if it was closed.
    pub(crate) fn get(self: &Arc<Self>) -> io::Result<Arc<File>> {
        if let Some(file) = self.lock().as_ref() {
            self.used.store(true, Ordering::Relaxed);
            return Ok(Arc::clone(file));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("reopening {} (closed while idle): {e}", self.path.display()),
                )
            })?;
        Ok(self.install(Arc::new(file)))
    }

    /// Makes `file` this slot's descriptor (unless another call got there first: then that
    /// one), counts and registers it, and closes another file if that puts the count over the
    /// bound.
    fn install(self: &Arc<Self>, file: Arc<File>) -> Arc<File> {
        {
            let mut slot = self.lock();
            if let Some(existing) = slot.as_ref() {
                return Arc::clone(existing);
            }
            *slot = Some(Arc::clone(&file));
        }
        self.used.store(true, Ordering::Relaxed);
        OPEN_COUNT.fetch_add(1, Ordering::Relaxed);
        let mut open = open_table();
        open.files.insert(self.id, Arc::downgrade(self));
        evict(&mut open, self.id);
        file
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let held = self
            .file
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if held.is_some() {
            OPEN_COUNT.fetch_sub(1, Ordering::Relaxed);
            open_table().files.remove(&self.id);
        }
    }
}

/// Closes files until the count is within the bound: a clock sweep from the hand, passing
/// (and clearing) files used since it last passed them, never `keep` (the file being opened)
/// nor one busy in its own lock. Stops after two turns, over the bound if everything is busy:
/// the bound is on idle descriptors, and a burst of use past it is let through.
fn evict(open: &mut Open, keep: u64) {
    let max = open_files_max();
    let mut visited = 0;
    let turn = open.files.len();
    while OPEN_COUNT.load(Ordering::Relaxed) > max && visited < 2 * turn {
        let next = open
            .files
            .range(open.hand + 1..)
            .next()
            .or_else(|| open.files.iter().next())
            .map(|(id, weak)| (*id, weak.clone()));
        let Some((id, weak)) = next else { return };
        open.hand = id;
        visited += 1;
        let Some(slot) = weak.upgrade() else {
            // Dropped: its drop has uncounted it and is about to take it out.
            continue;
        };
        if id == keep || slot.used.swap(false, Ordering::Relaxed) {
            continue;
        }
        let Ok(mut held) = slot.file.try_lock() else {
            continue;
        };
        if held.take().is_some() {
            OPEN_COUNT.fetch_sub(1, Ordering::Relaxed);
        }
        drop(held);
        open.files.remove(&id);
    }
}
