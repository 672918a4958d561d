//! Kiln's Kafka-compatible broker: one of a replicated cluster (`cluster`), or a cluster of
//! one, on the same path.
//!
//! `server` accepts connections, `connection` reads frames and keeps responses in request
//! order, `handlers` answer one API each, `cluster` owns the topics and their replicas (Raft
//! groups from `kiln-raft` on `kiln-log`), `retention` proposes log starts, `groups` coordinates
//! consumer groups and keeps their committed offsets, `metrics` serves `GET /metrics` (per-topic
//! counters in `traffic`, fsync timing from `kiln_log::stats`), `convert` takes in a data
//! directory of the older standalone layout. `sasl` authenticates a connection, `authorizer`
//! and `handlers::authorize` check each request against the cluster's ACLs.

mod authorizer;
pub mod cluster;
pub mod config;
mod connection;
pub mod convert;
mod errors;
pub mod groups;
mod handlers;
mod identity;
pub mod listeners;
mod login_failures;
mod metrics;
mod retention;
pub mod runtime;
mod sasl;
mod server;
mod time;
pub mod topic_config;
pub mod traffic;

pub use config::{BrokerConfig, ClusterSettings, LogSettings, PeerSettings};
pub use server::{BoundBroker, Broker};
