//! Kiln's Kafka-compatible broker: standalone, or one of a replicated cluster (`cluster`).
//!
//! `server` accepts connections, `connection` reads frames and keeps responses in
//! request order, `handlers` answer one API each, `catalog` owns the topics and
//! their partition logs (from `kiln-log`), `retention` ages data out, `groups` coordinates
//! consumer groups and stores their committed offsets, `metrics` serves `GET /metrics`
//! (per-topic counters in `traffic`, fsync timing from `kiln_log::stats`).

mod catalog;
pub mod cluster;
pub mod config;
mod connection;
mod errors;
pub mod groups;
mod handlers;
mod identity;
mod metrics;
mod retention;
mod server;
mod time;
pub mod topic_config;
pub mod traffic;

pub use catalog::{Catalog, CatalogError, Topic};
pub use config::{BrokerConfig, ClusterSettings, LogSettings, PeerSettings};
pub use server::{BoundBroker, Broker};
