//! The disk's own limits, measured with the same calls the log makes (write + fdatasync).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct DiskArgs {
    /// Bytes per write in the bandwidth test.
    #[arg(long, default_value_t = 1 << 20)]
    pub chunk_bytes: usize,
    /// Seconds the bandwidth test runs.
    #[arg(long, default_value_t = 5.0)]
    pub disk_seconds: f64,
    /// Concurrent writers in the parallel bandwidth test (the broker fsyncs partitions in parallel).
    #[arg(long, default_value_t = 4)]
    pub disk_streams: usize,
}

impl Default for DiskArgs {
    fn default() -> Self {
        Self {
            chunk_bytes: 1 << 20,
            disk_seconds: 5.0,
            disk_streams: 4,
        }
    }
}

pub struct DiskFigures {
    pub chunk_bytes: usize,
    pub bandwidth_mib_s: f64,
    pub streams: usize,
    pub parallel_bandwidth_mib_s: f64,
    pub small_fsync_us_p50: f64,
    pub small_fsyncs_per_s: f64,
}

pub fn measure(dir: &Path, args: &DiskArgs) -> anyhow::Result<DiskFigures> {
    let tmp = tempfile::tempdir_in(dir)?;
    let limit = Duration::from_secs_f64(args.disk_seconds.max(0.5));
    let bandwidth_mib_s = sequential(tmp.path(), args.chunk_bytes, limit, 1)?;
    let streams = args.disk_streams.max(1);
    let parallel_bandwidth_mib_s = sequential(tmp.path(), args.chunk_bytes, limit, streams)?;

    // Small appends: what one fsync costs, i.e. the floor under an acks=all produce.
    let mut small = OpenOptions::new()
        .create(true)
        .append(true)
        .open(tmp.path().join("small-probe"))?;
    let mut samples = Vec::with_capacity(2000);
    let started = Instant::now();
    while samples.len() < 2000 && started.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        small.write_all(&[0u8; 128])?;
        small.sync_data()?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    let small_fsync_us_p50 = samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN);
    let small_fsyncs_per_s = samples.len() as f64 / started.elapsed().as_secs_f64();
    Ok(DiskFigures {
        chunk_bytes: args.chunk_bytes,
        bandwidth_mib_s,
        streams,
        parallel_bandwidth_mib_s,
        small_fsync_us_p50,
        small_fsyncs_per_s,
    })
}

/// MiB/s written by `streams` threads, each appending `chunk_bytes` and fdatasync-ing its own file.
fn sequential(
    dir: &Path,
    chunk_bytes: usize,
    limit: Duration,
    streams: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let written: anyhow::Result<u64> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..streams)
            .map(|i| {
                scope.spawn(move || -> anyhow::Result<u64> {
                    let path = dir.join(format!("disk-probe-{streams}-{i}"));
                    let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
                    let chunk = vec![0x5au8; chunk_bytes.max(1)];
                    let mut written = 0u64;
                    while started.elapsed() < limit {
                        file.write_all(&chunk)?;
                        file.sync_data()?;
                        written += chunk.len() as u64;
                    }
                    std::fs::remove_file(&path)?;
                    Ok(written)
                })
            })
            .collect();
        let mut total = 0;
        for w in workers {
            total += w
                .join()
                .map_err(|_| anyhow::anyhow!("disk probe thread panicked"))??;
        }
        Ok(total)
    });
    Ok(written? as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64())
}

/// Bytes free for an unprivileged user on the file system holding `dir` (POSIX `df -P`).
pub(crate) fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let out = std::process::Command::new("df")
        .args(["-P", "-k"])
        .arg(dir)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run df for {}: {e}", dir.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "df {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // "Filesystem 1024-blocks Used Available Capacity Mounted-on", then one line per file
    // system; the fourth field of the last line is what is available, in KiB.
    let available = text
        .lines()
        .last()
        .and_then(|line| line.split_whitespace().nth(3))
        .and_then(|kib| kib.parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("cannot read df's output for {}: {text}", dir.display()))?;
    Ok(available.saturating_mul(1024))
}

/// Bytes in the files under `dir`, its subdirectories included. A file removed while it is
/// counted (a broker's retention at work) counts as gone.
pub(crate) fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

pub fn print(d: &DiskFigures) {
    println!(
        "disk  sequential write+fdatasync, {} KiB chunks, 1 stream: {:.1} MiB/s",
        d.chunk_bytes / 1024,
        d.bandwidth_mib_s
    );
    println!(
        "disk  sequential write+fdatasync, {} KiB chunks, {} streams in parallel: {:.1} MiB/s",
        d.chunk_bytes / 1024,
        d.streams,
        d.parallel_bandwidth_mib_s
    );
    println!(
        "disk  small append+fdatasync: p50 {:.0} us ({:.0} fsyncs/s)",
        d.small_fsync_us_p50, d.small_fsyncs_per_s
    );
}
