//! The topic catalog: which topics exist, their settings and their partition logs.
//!
//! Layout under the data directory:
//! `topics/<name>/topic.json` (id, partition count, overrides) and
//! `topics/<name>/<partition>/` (the partition's segments). A topic is built in
//! `tmp/` and renamed into place, and deleted by renaming it back into `tmp/`
//! first, so a crash never leaves a half-made topic visible.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use kiln_log::{LogError, PartitionLog};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::LogSettings;
use crate::topic_config::{self, TopicSettings};
use crate::traffic::TopicTraffic;

/// Partitions one topic may have; a bound on what one request can make the broker open.
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("topic {0:?} already exists")]
    AlreadyExists(String),
    #[error("topic {0:?} does not exist")]
    NotFound(String),
    #[error("{0}")]
    InvalidName(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("partition log: {0}")]
    Log(#[from] LogError),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadMetadata { path: PathBuf, reason: String },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CatalogError + 'a {
    move |source| CatalogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What `topic.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicRecord {
    id: Uuid,
    partitions: u32,
    overrides: BTreeMap<String, String>,
}

pub struct Topic {
    pub name: String,
    pub id: Uuid,
    pub overrides: BTreeMap<String, String>,
    pub settings: TopicSettings,
    pub partitions: Vec<PartitionLog>,
    /// Produce and fetch counters for `/metrics`.
    pub traffic: TopicTraffic,
}

impl Topic {
    pub fn partition(&self, index: i32) -> Option<&PartitionLog> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partitions.get(i))
    }
}

pub struct Catalog {
    topics_dir: PathBuf,
    tmp_dir: PathBuf,
    defaults: LogSettings,
    default_max_batch_bytes: usize,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
}

impl Catalog {
    /// Opens every topic under `data_dir/topics`, recovering each partition.
    pub fn open(
        data_dir: &Path,
        defaults: LogSettings,
        default_max_batch_bytes: usize,
    ) -> Result<Self, CatalogError> {
        let topics_dir = data_dir.join("topics");
        let tmp_dir = data_dir.join("tmp");
        fs::create_dir_all(&topics_dir).map_err(io("create", &topics_dir))?;
        // Leftovers of a create or delete that a crash interrupted.
        if tmp_dir.exists() {
            fs::remove_dir_all(&tmp_dir).map_err(io("clean", &tmp_dir))?;
        }
        fs::create_dir_all(&tmp_dir).map_err(io("create", &tmp_dir))?;

        let catalog = Self {
            topics_dir,
            tmp_dir,
            defaults,
            default_max_batch_bytes,
            topics: RwLock::new(HashMap::new()),
        };
        let mut loaded = HashMap::new();
        for entry in fs::read_dir(&catalog.topics_dir).map_err(io("list", &catalog.topics_dir))? {
            let entry = entry.map_err(io("list", &catalog.topics_dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let topic = catalog.load_topic(&name, &entry.path())?;
            loaded.insert(name, Arc::new(topic));
        }
        tracing::info!(topics = loaded.len(), "topic catalog loaded");
        *catalog.write() = loaded;
        Ok(catalog)
    }

    fn load_topic(&self, name: &str, dir: &Path) -> Result<Topic, CatalogError> {
        let meta_path = dir.join("topic.json");
        let bad = |reason: String| CatalogError::BadMetadata {
            path: meta_path.clone(),
            reason,
        };
        topic_config::validate_topic_name(name).map_err(bad)?;
        let text = fs::read_to_string(&meta_path).map_err(io("read", &meta_path))?;
        let record: TopicRecord = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let settings = topic_config::resolve(
            &self.defaults,
            self.default_max_batch_bytes,
            &record.overrides,
        )
        .map_err(bad)?;
        let mut partitions = Vec::with_capacity(record.partitions as usize);
        for index in 0..record.partitions {
            let (log, report) =
                PartitionLog::open(&dir.join(index.to_string()), settings.log.to_log_config())?;
            tracing::info!(
                topic = name,
                partition = index,
                next_offset = report.next_offset,
                segments = report.segments,
                scanned_bytes = report.scanned_bytes,
                truncated_bytes = report.truncated_bytes,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "partition recovered"
            );
            partitions.push(log);
        }
        Ok(Topic {
            name: name.to_string(),
            id: record.id,
            overrides: record.overrides,
            settings,
            partitions,
            traffic: TopicTraffic::default(),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Topic>>> {
        // A poisoned lock only means a panic elsewhere; the map itself is always consistent
        // because it is only ever replaced or edited by single insert/remove calls.
        self.topics.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Topic>>> {
        self.topics.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.read().get(name).cloned()
    }

    /// All topics, sorted by name.
    pub fn list(&self) -> Vec<Arc<Topic>> {
        let mut topics: Vec<_> = self.read().values().cloned().collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        topics
    }

    /// Checks a create request without changing anything.
    pub fn validate_create(
        &self,
        name: &str,
        partitions: u32,
        overrides: &BTreeMap<String, String>,
    ) -> Result<TopicSettings, CatalogError> {
        topic_config::validate_topic_name(name).map_err(CatalogError::InvalidName)?;
        if partitions == 0 || partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(CatalogError::InvalidPartitions(format!(
                "partition count {partitions} must be between 1 and {PARTITIONS_PER_TOPIC_MAX}"
            )));
        }
        if self.read().contains_key(name) {
            return Err(CatalogError::AlreadyExists(name.to_string()));
        }
        topic_config::resolve(&self.defaults, self.default_max_batch_bytes, overrides)
            .map_err(CatalogError::InvalidConfig)
    }

    /// Creates a topic durably: built in `tmp/`, fsynced, then renamed into place.
    pub fn create(
        &self,
        name: &str,
        partitions: u32,
        overrides: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>, CatalogError> {
        self.validate_create(name, partitions, &overrides)?;
        // Serialise creates so two requests for one name cannot both pass the check above.
        let mut topics = self.write();
        if topics.contains_key(name) {
            return Err(CatalogError::AlreadyExists(name.to_string()));
        }
        let record = TopicRecord {
            id: Uuid::new_v4(),
            partitions,
            overrides,
        };
        let staging = self.tmp_dir.join(format!("{name}.creating-{}", record.id));
        fs::create_dir_all(&staging).map_err(io("create", &staging))?;
        let meta_path = staging.join("topic.json");
        let text = serde_json::to_vec_pretty(&record).map_err(|e| CatalogError::BadMetadata {
            path: meta_path.clone(),
            reason: e.to_string(),
        })?;
        let mut file = fs::File::create(&meta_path).map_err(io("create", &meta_path))?;
        file.write_all(&text).map_err(io("write", &meta_path))?;
        file.sync_all().map_err(io("fsync", &meta_path))?;
        sync_dir(&staging)?;
        let final_dir = self.topics_dir.join(name);
        fs::rename(&staging, &final_dir).map_err(io("rename into place", &final_dir))?;
        sync_dir(&self.topics_dir)?;
        let topic = Arc::new(self.load_topic(name, &final_dir)?);
        topics.insert(name.to_string(), topic.clone());
        tracing::info!(topic = name, partitions, id = %record.id, "topic created");
        Ok(topic)
    }

    /// Deletes a topic: out of the catalog at once, its files removed after.
    pub fn delete(&self, name: &str) -> Result<(), CatalogError> {
        let topic = self
            .write()
            .remove(name)
            .ok_or_else(|| CatalogError::NotFound(name.to_string()))?;
        for log in &topic.partitions {
            if let Err(e) = log.close() {
                tracing::warn!(topic = name, error = %e, "closing a deleted topic's partition failed");
            }
        }
        let from = self.topics_dir.join(name);
        let doomed = self.tmp_dir.join(format!("{name}.deleting-{}", topic.id));
        fs::rename(&from, &doomed).map_err(io("rename out", &from))?;
        sync_dir(&self.topics_dir)?;
        fs::remove_dir_all(&doomed).map_err(io("remove", &doomed))?;
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    /// Flushes and closes every partition (clean shutdown writes recovery checkpoints).
    pub fn close_all(&self) {
        for topic in self.list() {
            for (index, log) in topic.partitions.iter().enumerate() {
                if let Err(e) = log.close() {
                    tracing::warn!(topic = %topic.name, partition = index, error = %e, "close failed");
                }
            }
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), CatalogError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))
}
