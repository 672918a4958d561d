//! Recovery after `kill -9`: a child process appends to a partition with fsync; once the
//! partition holds the target size the parent kills it mid-write and times the reopen.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use std::sync::Arc;

use kiln_log::fs::RealFs;
use kiln_log::{EntryBody, Log, LogConfig, NewEntry, RecoveryReport};

#[derive(Args, Debug, Clone)]
pub struct RecoveryArgs {
    /// Partition size to reach before the kill, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub partition_mib: u64,
}

#[derive(Args, Debug, Clone)]
pub struct FillArgs {
    #[arg(long)]
    pub partition_dir: PathBuf,
    #[arg(long)]
    pub partition_mib: u64,
}

pub struct RecoveryFigures {
    pub partition_bytes: u64,
    pub after_kill: RecoveryReport,
    pub full_rescan: RecoveryReport,
}

/// Child: append 1 MiB batches with fsync until the target, say READY, keep writing until killed.
pub fn fill(args: &FillArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (log, _) = Log::open(Arc::new(RealFs), &args.partition_dir, LogConfig::default())?;
    let batch = crate::produce_batch(1024, 1024)?;
    let target = args.partition_mib << 20;
    let mut announced = false;
    loop {
        let index = log.tail().next_index;
        log.append(
            &mut [NewEntry {
                index,
                term: 1,
                body: EntryBody::Records(batch.clone()),
            }],
            0,
        )?;
        runtime.block_on(log.sync())?;
        if !announced && log.size_bytes() >= target {
            println!("READY {}", log.size_bytes());
            announced = true;
        }
    }
}

pub fn run(dir: &Path, args: &RecoveryArgs) -> anyhow::Result<RecoveryFigures> {
    let tmp = tempfile::tempdir_in(dir)?;
    let partition_dir = tmp.path().join("partition");
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["recovery-fill", "--partition-dir"])
        .arg(&partition_dir)
        .args(["--partition-mib", &args.partition_mib.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the fill process")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if !line.starts_with("READY") {
        let _ = child.kill();
        bail!("fill process ended before reaching the target size");
    }
    // Let it get a few more appends in, so the kill lands mid-write.
    std::thread::sleep(Duration::from_millis(50));
    child.kill().context("kill -9")?; // SIGKILL on Unix
    child.wait()?;

    let partition_bytes = crate::disk::dir_bytes(&partition_dir)?;
    let started = Instant::now();
    let (log, mut after_kill) = Log::open(Arc::new(RealFs), &partition_dir, LogConfig::default())?;
    after_kill.elapsed = started.elapsed();
    verify_contiguous(&log)?;
    drop(log);

    // The same partition checked whole: what a full rescan costs.
    let started = Instant::now();
    let config = LogConfig {
        verify_all_on_open: true,
        ..LogConfig::default()
    };
    let (_log, mut full_rescan) = Log::open(Arc::new(RealFs), &partition_dir, config)?;
    full_rescan.elapsed = started.elapsed();
    Ok(RecoveryFigures {
        partition_bytes,
        after_kill,
        full_rescan,
    })
}

/// Reads the recovered partition end to end: every batch whole, CRC-valid, offsets contiguous.
fn verify_contiguous(log: &Log) -> anyhow::Result<()> {
    let end = log.log_end_offset();
    let mut next = log.log_start_offset();
    while next < end {
        let read = log.read(next, 8 << 20, end)?;
        for batch in kiln_log::batch::batches(&read.records) {
            let header = batch?.header;
            if header.base_offset != next {
                bail!(
                    "recovered log has offset {} where {next} was expected",
                    header.base_offset
                );
            }
            next = header.base_offset + i64::from(header.last_offset_delta) + 1;
        }
    }
    if next != end {
        bail!("recovered log ends at {next}, expected {end}");
    }
    Ok(())
}

pub fn print(r: &RecoveryFigures) {
    println!(
        "recovery  {:.0} MiB partition after kill -9: {:.3} s (scanned {:.1} MiB past the checkpoint, cut {} bytes of torn tail)",
        r.partition_bytes as f64 / (1 << 20) as f64,
        r.after_kill.elapsed.as_secs_f64(),
        r.after_kill.scanned_bytes as f64 / (1 << 20) as f64,
        r.after_kill.cut_bytes
    );
    println!(
        "recovery  same partition checked whole (every segment CRC-scanned, warm page cache): {:.3} s ({:.1} MiB scanned)",
        r.full_rescan.elapsed.as_secs_f64(),
        r.full_rescan.scanned_bytes as f64 / (1 << 20) as f64
    );
}
