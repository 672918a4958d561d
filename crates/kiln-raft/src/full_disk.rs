//! A full disk is waited out, not fatal. A write or fsync that fails with ENOSPC or EDQUOT is
//! cut back to where it started and tried again, with a backoff from 50 ms to 1 s, until it
//! succeeds; [`ReplicaHealth::disk_full`] says so meanwhile. Any other I/O error is returned
//! (openraft then stops the node, as before). docs/replication.md, "Damage and full disks".
//!
//! Why the bytes are written again rather than only the fsync retried: after a failed fsync
//! Linux may drop the dirty pages it could not write and report the next fsync as clean, so a
//! retried fsync alone could report data durable that is not.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::disk::Disk;
use crate::guard::ReplicaHealth;

const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Linux's ENOSPC and EDQUOT.
const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// True for "no space left on device" and "disk quota exceeded".
pub fn is_disk_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
}

/// One write's wait for space: logs once when it starts and once when it ends, and keeps the
/// replica's disk-full flag up meanwhile (also if the write is abandoned, e.g. at shutdown).
struct SpaceWait<'a> {
    what: String,
    health: &'a ReplicaHealth,
    delay: Duration,
    since: Option<Instant>,
    retries: u32,
    recovered: bool,
}

impl<'a> SpaceWait<'a> {
    fn new(disk: &dyn Disk, health: &'a ReplicaHealth) -> SpaceWait<'a> {
        SpaceWait {
            what: disk.describe(),
            health,
            delay: BACKOFF_FIRST,
            since: None,
            retries: 0,
            recovered: false,
        }
    }

    /// After a failed attempt: gives `e` back unless the disk is full, else waits a while.
    async fn after(&mut self, e: io::Error) -> io::Result<()> {
        if !is_disk_full(&e) {
            return Err(e);
        }
        if self.since.is_none() {
            self.since = Some(Instant::now());
            self.health.full_wait_began();
            tracing::error!(error = %e, "disk full writing {}: waiting for space", self.what);
        }
        self.retries += 1;
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        Ok(())
    }
}

impl Drop for SpaceWait<'_> {
    fn drop(&mut self) {
        let Some(since) = self.since else {
            return;
        };
        self.health.full_wait_ended();
        if self.recovered {
            tracing::info!(
                retries = self.retries,
                waited_ms = since.elapsed().as_millis() as u64,
                "disk space available again: wrote {}",
                self.what
            );
        }
    }
}

/// Appends `bytes` to `disk`, which is `start` bytes long, and syncs, waiting out a full disk.
pub(crate) async fn append_durably(
    disk: &Arc<dyn Disk>,
    start: u64,
    bytes: &[u8],
    health: &ReplicaHealth,
) -> io::Result<()> {
    let mut wait = SpaceWait::new(disk.as_ref(), health);
    loop {
        let attempt = match disk.append(bytes) {
            Ok(()) => disk.sync().await,
            Err(e) => Err(e),
        };
        match attempt {
            Ok(()) => {
                wait.recovered = true;
                return Ok(());
            }
            Err(e) => {
                if !is_disk_full(&e) {
                    return Err(e);
                }
                disk.truncate(start)?;
                wait.after(e).await?;
            }
        }
    }
}

/// Cuts `disk` to `len` bytes and syncs, waiting out a full disk (a sync can need space for
/// metadata).
pub(crate) async fn truncate_durably(
    disk: &Arc<dyn Disk>,
    len: u64,
    health: &ReplicaHealth,
) -> io::Result<()> {
    let mut wait = SpaceWait::new(disk.as_ref(), health);
    loop {
        let attempt = match disk.truncate(len) {
            Ok(()) => disk.sync().await,
            Err(e) => Err(e),
        };
        match attempt {
            Ok(()) => {
                wait.recovered = true;
                return Ok(());
            }
            Err(e) => wait.after(e).await?,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::disk::{SimDisk, SyncBehaviour, SyncFuture};

    /// A simulated file whose first `fail_appends` appends and first `fail_syncs` syncs fail
    /// with `error` (a sync failure after the bytes were written, as a delayed allocation
    /// failure shows up).
    struct Failing {
        inner: SimDisk,
        error: i32,
        fail_appends: AtomicUsize,
        fail_syncs: AtomicUsize,
    }

    fn take(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            .is_ok()
    }

    impl Disk for Failing {
        fn read_all(&self) -> io::Result<Vec<u8>> {
            self.inner.read_all()
        }
        fn append(&self, bytes: &[u8]) -> io::Result<()> {
            if take(&self.fail_appends) {
                return Err(io::Error::from_raw_os_error(self.error));
            }
            self.inner.append(bytes)
        }
        fn truncate(&self, len: u64) -> io::Result<()> {
            self.inner.truncate(len)
        }
        fn sync(&self) -> SyncFuture {
            if take(&self.fail_syncs) {
                let e = self.error;
                return Box::pin(async move { Err(io::Error::from_raw_os_error(e)) });
            }
            self.inner.sync()
        }
        fn describe(&self) -> String {
            "/data/orders-0/raft.log".to_string()
        }
    }

    fn failing(error: i32, appends: usize, syncs: usize) -> (Arc<dyn Disk>, SimDisk) {
        let inner = SimDisk::new(Duration::from_millis(1), SyncBehaviour::Honest);
        inner.append(b"synced:").unwrap();
        let disk = Failing {
            inner: inner.clone(),
            error,
            fail_appends: AtomicUsize::new(appends),
            fail_syncs: AtomicUsize::new(syncs),
        };
        (Arc::new(disk), inner)
    }

    /// Collects (level, message) of every event.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<(tracing::Level, String)>>>);

    struct Message(String);

    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }

    impl tracing::Subscriber for Lines {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut m = Message(String::new());
            event.record(&mut m);
            let mut lines = self.0.lock().unwrap();
            lines.push((*event.metadata().level(), m.0));
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    fn run<F: std::future::Future>(lines: &Lines, f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        tracing::subscriber::with_default(lines.clone(), || rt.block_on(f))
    }

    #[test]
    fn a_full_disk_is_waited_out_with_one_error_and_one_recovery_line() {
        let lines = Lines::default();
        let (disk, file) = failing(ENOSPC, 6, 0);
        let health = ReplicaHealth::default();
        let watched = health.clone();
        let waited = run(&lines, async move {
            let began = Instant::now();
            let writer =
                tokio::spawn(async move { append_durably(&disk, 7, b"entry", &health).await });
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert!(watched.disk_full(), "flagged while waiting");
            writer.await.unwrap().unwrap();
            assert!(!watched.disk_full());
            began.elapsed()
        });
        // 50 + 100 + 200 + 400 + 800 + 1000 ms of backoff, capped at 1 s.
        assert_eq!(
            waited,
            Duration::from_millis(2550) + Duration::from_millis(1)
        );
        assert_eq!(file.read_all().unwrap(), b"synced:entry");
        let lines = lines.0.lock().unwrap();
        let errors: Vec<_> = lines
            .iter()
            .filter(|l| l.0 == tracing::Level::ERROR)
            .collect();
        assert_eq!(errors.len(), 1, "{lines:?}");
        assert_eq!(
            errors[0].1,
            "disk full writing /data/orders-0/raft.log: waiting for space"
        );
        let infos: Vec<_> = lines
            .iter()
            .filter(|l| l.0 == tracing::Level::INFO)
            .collect();
        assert_eq!(infos.len(), 1, "{lines:?}");
        assert!(
            infos[0].1.starts_with("disk space available again"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_failed_fsync_rewrites_the_bytes_and_quota_counts_as_full() {
        let lines = Lines::default();
        let (disk, file) = failing(EDQUOT, 0, 2);
        let health = ReplicaHealth::default();
        run(&lines, append_durably(&disk, 7, b"entry", &health)).unwrap();
        // Cut back and written again after each failed fsync: once in the file.
        assert_eq!(file.read_all().unwrap(), b"synced:entry");
        assert_eq!(file.unsynced_len(), 0);
    }

    #[test]
    fn other_errors_stay_fatal() {
        let lines = Lines::default();
        let (disk, file) = failing(5, 1, 0);
        let health = ReplicaHealth::default();
        let e = run(&lines, append_durably(&disk, 7, b"entry", &health)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(5));
        assert!(!health.disk_full());
        assert_eq!(file.read_all().unwrap(), b"synced:");
        assert!(lines.0.lock().unwrap().is_empty());
    }
}
