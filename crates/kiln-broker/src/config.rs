//! Broker settings. Every field has a default, so a broker starts with no file at all.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kiln_log::{FlushPolicy, LogConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// This broker's id; it is recorded in the data directory and checked on every start.
    pub node_id: i32,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// `host:port` clients are told to connect to; defaults to `listen`.
    pub advertised_address: Option<String>,
    /// Directory holding the broker's metadata and every partition's segments.
    pub data_dir: PathBuf,
    /// Create a topic when a client asks for one that does not exist (off: typos should fail loudly).
    pub auto_create_topics: bool,
    /// Partitions for topics created without a count.
    pub default_partitions: u32,
    /// Largest request frame accepted; bigger ones are refused before any allocation.
    pub max_frame_bytes: usize,
    /// Largest single record batch accepted in a produce request (Kafka's `message.max.bytes`).
    pub max_batch_bytes: usize,
    /// Connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// Requests one connection may have in flight before the broker stops reading from it.
    pub max_in_flight_per_connection: usize,
    /// Upper bound on a fetch's long-poll wait, whatever the client asks for.
    pub fetch_max_wait_ms_cap: u64,
    /// How often retention runs over every partition.
    pub retention_check_interval_ms: u64,
    /// Defaults for every partition's log; topics may override segment and retention settings.
    pub log: LogSettings,
}

/// The log settings an operator may set in the broker file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    pub segment_bytes: u64,
    pub segment_ms: u64,
    /// Delete closed segments older than this; -1 keeps data forever (Kafka's convention).
    pub retention_ms: i64,
    /// Delete the oldest closed segments while a partition is larger; -1 for no limit.
    pub retention_bytes: i64,
    pub index_interval_bytes: u32,
    /// `0` (the default): acknowledge a produce only after its batch is fsynced (group commit).
    /// `N > 0`: fsync every N milliseconds and acknowledge at once; a crash may lose up to N ms
    /// of acknowledged records. Consumers never see data that is not yet fsynced either way.
    pub flush_interval_ms: u64,
    pub checkpoint_interval_bytes: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            node_id: 0,
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised_address: None,
            data_dir: PathBuf::from("kiln-data"),
            auto_create_topics: false,
            default_partitions: 1,
            max_frame_bytes: 100 * 1024 * 1024,
            max_batch_bytes: 1024 * 1024 + 12,
            max_connections: 1024,
            max_in_flight_per_connection: 64,
            fetch_max_wait_ms_cap: 30_000,
            retention_check_interval_ms: 30_000,
            log: LogSettings::default(),
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        let log = LogConfig::default();
        Self {
            segment_bytes: log.segment_bytes,
            segment_ms: log.segment_ms,
            retention_ms: log
                .retention_ms
                .map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX)),
            retention_bytes: log
                .retention_bytes
                .map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX)),
            index_interval_bytes: log.index_interval_bytes,
            flush_interval_ms: 0,
            checkpoint_interval_bytes: log.checkpoint_interval_bytes,
        }
    }
}

impl LogSettings {
    pub fn to_log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            retention_ms: u64::try_from(self.retention_ms).ok(),
            retention_bytes: u64::try_from(self.retention_bytes).ok(),
            index_interval_bytes: self.index_interval_bytes,
            flush: if self.flush_interval_ms == 0 {
                FlushPolicy::EveryBatch
            } else {
                FlushPolicy::Interval(Duration::from_millis(self.flush_interval_ms))
            },
            checkpoint_interval_bytes: self.checkpoint_interval_bytes,
        }
    }
}

impl BrokerConfig {
    /// The address put in Metadata responses.
    pub fn advertised(&self) -> String {
        self.advertised_address
            .clone()
            .unwrap_or_else(|| self.listen.to_string())
    }

    /// Checks relations between settings that serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_id < 0 {
            return Err(format!("node_id must be >= 0, got {}", self.node_id));
        }
        if self.default_partitions == 0 {
            return Err("default_partitions must be at least 1".into());
        }
        if self.max_batch_bytes > self.max_frame_bytes {
            return Err(format!(
                "max_batch_bytes ({}) cannot exceed max_frame_bytes ({})",
                self.max_batch_bytes, self.max_frame_bytes
            ));
        }
        if self.max_connections == 0 || self.max_in_flight_per_connection == 0 {
            return Err(
                "max_connections and max_in_flight_per_connection must be at least 1".into(),
            );
        }
        if self.log.segment_bytes < 1024 {
            return Err(format!(
                "log.segment_bytes must be at least 1024, got {}",
                self.log.segment_bytes
            ));
        }
        if self.log.segment_bytes > u32::MAX as u64 {
            return Err(
                "log.segment_bytes must fit the index's 32-bit positions (<= 4 GiB)".into(),
            );
        }
        for (name, value) in [
            ("log.retention_ms", self.log.retention_ms),
            ("log.retention_bytes", self.log.retention_bytes),
        ] {
            if value == 0 || value < -1 {
                return Err(format!(
                    "{name} must be -1 (no limit) or greater than 0, got {value}"
                ));
            }
        }
        split_host_port(&self.advertised()).map(|_| ())
    }
}

/// Splits `host:port`, with a message that names the bad value.
pub fn split_host_port(address: &str) -> Result<(String, i32), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("address {address:?} is not host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address {address:?} has an invalid port"))?;
    Ok((host.trim_matches(['[', ']']).to_string(), i32::from(port)))
}
