//! Taking in a data directory written by the older layout, on the broker's first start.
//!
//! The older standalone layout kept each topic as `topics/<name>/topic.json` and
//! `topics/<name>/<partition>/<base offset>.log` (RecordBatch v2 bytes, one batch after another)
//! and the committed offsets as `internal/consumer-offsets/log-N/`. They become single-replica
//! Raft groups of the current layout: every topic a creation in the metadata log (same id,
//! same overrides), every partition a log of its batches (same offsets: the new log starts at
//! the old one's first offset), the committed offsets
//! one entry of the offsets group. The new groups are written under `replicas.converting/` and
//! renamed to `replicas/` in one step; only then are `topics/` and `internal/` moved, whole and
//! untouched, into `legacy-layout/` (removing them is the operator's choice, once satisfied).
//! A crash at any point leaves either the old layout (converted again) or the new one.
//!
//! The older cluster layout (`replicas/<group>/raft.log`) is refused with a message: its entries
//! have no offline conversion (docs/operations.md, "Upgrading").

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use kiln_log::fs::RealFs;
use kiln_log::LogConfig;
use kiln_raft::Payload;
use serde::Deserialize;
use uuid::Uuid;

use crate::cluster::metadata::{self, Command};
use crate::groups::offsets;

/// Old batches joined into one entry of the new log, up to this many bytes.
const ENTRY_BYTES_MAX: usize = 1 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OldTopic {
    id: Uuid,
    partitions: u32,
    overrides: BTreeMap<String, String>,
}

/// Converts the older standalone layout under `data_dir`, if there is one. Returns the cluster
/// id the converted metadata log names (to record in `broker.json`), `None` when there was
/// nothing to convert.
pub fn run(
    data_dir: &Path,
    node_id: i32,
    known_cluster_id: Option<String>,
) -> anyhow::Result<Option<String>> {
    let replicas = data_dir.join("replicas");
    refuse_old_cluster_layout(&replicas)?;
    let topics_dir = data_dir.join("topics");
    let internal = data_dir.join("internal");
    let legacy = data_dir.join("legacy-layout");
    if !topics_dir.exists() && !internal.exists() {
        return Ok(None);
    }
    if replicas.join("__cluster_metadata").exists() {
        // Converted before; a crash came before the old directories were moved.
        move_aside(&topics_dir, &internal, &legacy)?;
        return Ok(None);
    }
    let node = u64::try_from(node_id).context("negative node id")?;
    let converting = data_dir.join("replicas.converting");
    if converting.exists() {
        fs::remove_dir_all(&converting).with_context(|| {
            format!(
                "removing an interrupted conversion in {}",
                converting.display()
            )
        })?;
    }
    fs::create_dir_all(&converting)?;
    let cluster_id =
        known_cluster_id.unwrap_or_else(|| format!("kiln-{}", Uuid::new_v4().simple()));
    tracing::warn!(dir = %data_dir.display(), "converting a data directory of the older standalone layout");

    let mut commands = vec![Command::InitCluster {
        cluster_id: cluster_id.clone(),
    }];
    let mut names: Vec<String> = match fs::read_dir(&topics_dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    let fs_real: Arc<dyn kiln_log::fs::Fs> = Arc::new(RealFs);
    for name in names {
        let dir = topics_dir.join(&name);
        let meta = dir.join("topic.json");
        let text =
            fs::read_to_string(&meta).with_context(|| format!("reading {}", meta.display()))?;
        let old: OldTopic = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a topic description of the older layout",
                meta.display()
            )
        })?;
        for p in 0..old.partitions {
            let OldLog {
                batches,
                first_offset,
            } = old_batches(&dir.join(p.to_string()))?;
            let count = batches.len();
            let target = converting.join(old.id.to_string()).join(p.to_string());
            let written = kiln_raft::bootstrap::write_single_replica_group(
                fs_real.clone(),
                &target,
                node,
                LogConfig::default(),
                first_offset,
                false,
                join_entries(batches),
            )?;
            tracing::info!(topic = %name, partition = p, batches = count, entries = written, first_offset, "partition converted");
        }
        let overrides = accepted_overrides(&name, old.overrides);
        commands.push(Command::CreateTopic {
            name: name.clone(),
            id: old.id,
            overrides,
            assignments: (0..old.partitions).map(|_| vec![node_id]).collect(),
        });
    }
    let now = crate::time::now_ms();
    let mut meta_payloads = Vec::with_capacity(commands.len());
    for c in &commands {
        let batch = metadata::encode(c, now).map_err(anyhow::Error::msg)?;
        meta_payloads.push(Payload::records(batch, 1));
    }
    kiln_raft::bootstrap::write_single_replica_group(
        fs_real.clone(),
        &converting.join("__cluster_metadata"),
        node,
        LogConfig::default(),
        0,
        true,
        meta_payloads,
    )?;
    let offsets_dir = internal.join("consumer-offsets");
    let committed = old_offsets(&offsets_dir)?;
    let commits = committed.len();
    let mut offset_payloads = Vec::new();
    for chunk in committed.chunks(1000) {
        let batch = offsets::encode_changes(chunk, now).map_err(|e| anyhow::anyhow!("{e}"))?;
        let records = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        offset_payloads.push(Payload::records(batch, records));
    }
    kiln_raft::bootstrap::write_single_replica_group(
        fs_real,
        &converting.join("__consumer_offsets"),
        node,
        LogConfig::default(),
        0,
        true,
        offset_payloads,
    )?;
    sync_dir(&converting)?;
    if replicas.exists() {
        // An empty `replicas/` left by an earlier failed start: nothing in it to keep.
        fs::remove_dir_all(&replicas)?;
    }
    fs::rename(&converting, &replicas).context("switching to the converted layout")?;
    sync_dir(data_dir)?;
    move_aside(&topics_dir, &internal, &legacy)?;
    tracing::warn!(topics = commands.len() - 1, committed_offsets = commits, legacy = %legacy.display(), "conversion done: the old files are kept in the legacy directory; remove it once satisfied");
    Ok(Some(cluster_id))
}

fn refuse_old_cluster_layout(replicas: &Path) -> anyhow::Result<()> {
    let Ok(entries) = fs::read_dir(replicas) else {
        return Ok(());
    };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        let mut candidates = vec![p.join("raft.log")];
        if let Ok(inner) = fs::read_dir(&p) {
            candidates.extend(
                inner
                    .filter_map(Result::ok)
                    .map(|i| i.path().join("raft.log")),
            );
        }
        if let Some(found) = candidates.iter().find(|c| c.exists()) {
            bail!(
                "{} holds a replica in the older cluster layout (raft.log), which this version \
                 cannot read. To move to this version, run the older version, export the topics' \
                 records with a Kafka client (kcat -C), start this version on an empty data \
                 directory on every broker, create the topics and produce the records again \
                 (docs/operations.md, \"Upgrading\")",
                found.display()
            );
        }
    }
    Ok(())
}

/// The old topic's overrides that this version accepts. One it refuses (the older layout
/// allowed 1 KiB segments, which no longer hold a segment header and a batch) is left out with
/// a warning, so the topic takes the broker default for it and keeps the others (its
/// retention above all).
fn accepted_overrides(
    topic: &str,
    overrides: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let defaults = crate::LogSettings::default();
    overrides
        .into_iter()
        .filter(|(key, value)| {
            let one = BTreeMap::from([(key.clone(), value.clone())]);
            match crate::topic_config::resolve(&defaults, usize::MAX, &one) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(%topic, %key, %value, error = %e, "an override of the older layout is no longer accepted; the topic takes the broker's setting for it");
                    false
                }
            }
        })
        .collect()
}

/// What an old partition directory holds.
struct OldLog {
    /// Every whole, CRC-valid batch, in offset order.
    batches: Vec<Bytes>,
    /// The offset of the first batch; with none, the base offset of the last segment (what the
    /// next record would have taken). Retention may have moved it above 0.
    first_offset: i64,
}

/// Reads an old partition directory; a torn tail is left out, as the old recovery did.
fn old_batches(dir: &Path) -> anyhow::Result<OldLog> {
    let mut logs: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect(),
        Err(_) => {
            return Ok(OldLog {
                batches: Vec::new(),
                first_offset: 0,
            })
        }
    };
    logs.sort();
    let last_base = match logs.last() {
        None => 0,
        Some(path) => path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<i64>().ok())
            .with_context(|| {
                format!(
                    "{}: an old segment is named by its base offset",
                    path.display()
                )
            })?,
    };
    let mut out = Vec::new();
    let mut next: Option<i64> = None;
    for path in logs {
        let bytes =
            Bytes::from(fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
        let mut at = 0usize;
        while at < bytes.len() {
            let rest = bytes.slice(at..);
            let Ok(h) = kiln_log::BatchHeader::parse(&rest) else {
                break;
            };
            let len = h.total_len();
            if rest.len() < len {
                break;
            }
            let one = rest.slice(..len);
            if kiln_log::batch::verify_crc(&one, 0).is_err() || h.is_control() {
                tracing::warn!(path = %path.display(), position = at, "an old batch fails its checks; the rest of this segment is left out");
                break;
            }
            if let Some(n) = next {
                if h.base_offset != n {
                    bail!(
                        "{}: batch at offset {} after offset {n}: the old log has a gap",
                        path.display(),
                        h.base_offset
                    );
                }
            }
            next = Some(h.next_offset());
            out.push(one);
            at += len;
        }
    }
    let first_offset = match out.first() {
        Some(b) => kiln_log::BatchHeader::parse(b)
            .map(|h| h.base_offset)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?,
        None => last_base,
    };
    Ok(OldLog {
        batches: out,
        first_offset,
    })
}

/// Old batches joined into entries of up to [`ENTRY_BYTES_MAX`].
fn join_entries(batches: Vec<Bytes>) -> Vec<Payload> {
    let mut out = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    let mut records = 0u32;
    for b in batches {
        if !current.is_empty() && current.len() + b.len() > ENTRY_BYTES_MAX {
            out.push(Payload::records(
                Bytes::from(std::mem::take(&mut current)),
                records,
            ));
            records = 0;
        }
        records = records.saturating_add(
            kiln_log::BatchHeader::parse(&b)
                .map_or(0, |h| u32::try_from(h.record_count).unwrap_or(0)),
        );
        current.extend_from_slice(&b);
    }
    if !current.is_empty() {
        out.push(Payload::records(Bytes::from(current), records));
    }
    out
}

/// The latest committed offset per key in the old offsets store (its `CURRENT` generation).
fn old_offsets(
    dir: &Path,
) -> anyhow::Result<
    Vec<(
        crate::groups::records::OffsetKey,
        Option<crate::groups::records::Committed>,
    )>,
> {
    let Ok(current) = fs::read_to_string(dir.join("CURRENT")) else {
        return Ok(Vec::new());
    };
    let generation = current.trim();
    let old = old_batches(&dir.join(format!("log-{generation}")))?;
    let mut latest = BTreeMap::new();
    for b in old.batches {
        offsets::replay_into(b, &mut latest);
    }
    Ok(latest.into_iter().map(|(k, v)| (k, Some(v))).collect())
}

fn move_aside(topics: &Path, internal: &Path, legacy: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(legacy)?;
    for from in [topics, internal] {
        if from.exists() {
            let name = from
                .file_name()
                .map(|n| n.to_os_string())
                .unwrap_or_default();
            let to = legacy.join(name);
            fs::rename(from, &to)
                .with_context(|| format!("moving {} to {}", from.display(), to.display()))?;
        }
    }
    if let Some(parent) = legacy.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}
