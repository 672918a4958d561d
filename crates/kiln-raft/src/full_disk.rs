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

use kiln_log::fs::FsFile;

use crate::guard::ReplicaHealth;

const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

pub use kiln_log::fs::is_disk_full;

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
    fn new(what: &str, health: &'a ReplicaHealth) -> SpaceWait<'a> {
        SpaceWait {
            what: what.to_string(),
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

/// Writes `bytes` at `start` of `file` (its end) and syncs, waiting out a full disk: on ENOSPC
/// the file is cut back to `start` and the bytes written again.
pub(crate) async fn append_durably(
    file: &Arc<dyn FsFile>,
    start: u64,
    bytes: &[u8],
    health: &ReplicaHealth,
) -> io::Result<()> {
    let _writing = health.writing();
    let mut wait = SpaceWait::new(&file.describe(), health);
    loop {
        let attempt = match file.write_all_at(bytes, start) {
            Ok(()) => file.sync().await,
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
                file.set_len(start)?;
                wait.after(e).await?;
            }
        }
    }
}

/// Cuts `file` to `len` bytes and syncs, waiting out a full disk (a sync can need space for
/// metadata).
pub(crate) async fn truncate_durably(
    file: &Arc<dyn FsFile>,
    len: u64,
    health: &ReplicaHealth,
) -> io::Result<()> {
    let mut wait = SpaceWait::new(&file.describe(), health);
    loop {
        let attempt = match file.set_len(len) {
            Ok(()) => file.sync().await,
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

/// Runs `attempt` until it succeeds or fails with anything but a full disk, waiting with the
/// same backoff and logging (the log store's appends go through this).
pub(crate) async fn retry_when_full<T, F, Fut>(
    what: &str,
    health: &ReplicaHealth,
    mut attempt: F,
) -> Result<T, kiln_log::LogError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kiln_log::LogError>>,
{
    let mut wait = SpaceWait::new(what, health);
    loop {
        match attempt().await {
            Ok(v) => {
                wait.recovered = true;
                return Ok(v);
            }
            Err(kiln_log::LogError::DiskFull { path }) => {
                let e = io::Error::new(io::ErrorKind::StorageFull, path.display().to_string());
                if wait.after(e).await.is_err() {
                    return Err(kiln_log::LogError::DiskFull { path });
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;
    use std::sync::Mutex;

    use kiln_log::faulty_fs::{Faults, FaultyFile};
    use kiln_log::fs::Fs;
    use kiln_log::sim_fs::{SimFs, SyncBehaviour};

    use super::*;

    /// Linux's ENOSPC and EDQUOT.
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;

    /// A file holding "synced:" and the simulated file system behind it.
    fn failing(
        error: i32,
        appends: usize,
        syncs: usize,
    ) -> (Arc<dyn FsFile>, Arc<dyn FsFile>, SimFs) {
        let fs = SimFs::new(Duration::from_millis(1), SyncBehaviour::Honest);
        fs.create_dir_all(Path::new("/data/orders-0")).unwrap();
        let inner = fs.open(Path::new("/data/orders-0/vote"), true).unwrap();
        inner.write_all_at(b"synced:", 0).unwrap();
        inner.sync_now().unwrap();
        let faults = Faults::new(error);
        faults.fail_writes(appends);
        faults.fail_syncs(syncs);
        (Arc::new(FaultyFile::new(inner.clone(), faults)), inner, fs)
    }

    fn contents(f: &Arc<dyn FsFile>) -> Vec<u8> {
        let mut buf = vec![0u8; f.len().unwrap() as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
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
        let (disk, file, _fs) = failing(ENOSPC, 6, 0);
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
        assert_eq!(contents(&file), b"synced:entry");
        let lines = lines.0.lock().unwrap();
        let errors: Vec<_> = lines
            .iter()
            .filter(|l| l.0 == tracing::Level::ERROR)
            .collect();
        assert_eq!(errors.len(), 1, "{lines:?}");
        assert_eq!(
            errors[0].1,
            "disk full writing /data/orders-0/vote (simulated): waiting for space"
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
        let (disk, file, fs) = failing(EDQUOT, 0, 2);
        let health = ReplicaHealth::default();
        run(&lines, append_durably(&disk, 7, b"entry", &health)).unwrap();
        // Cut back and written again after each failed fsync: once in the file.
        assert_eq!(contents(&file), b"synced:entry");
        assert_eq!(fs.unsynced_bytes(), 0);
    }

    #[test]
    fn other_errors_stay_fatal() {
        let lines = Lines::default();
        let (disk, file, _fs) = failing(5, 1, 0);
        let health = ReplicaHealth::default();
        let e = run(&lines, append_durably(&disk, 7, b"entry", &health)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(5));
        assert!(!health.disk_full());
        assert_eq!(contents(&file), b"synced:");
        assert!(lines.0.lock().unwrap().is_empty());
    }
}
