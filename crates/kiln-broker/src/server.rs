//! Startup, the accept loop and shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::catalog::Catalog;
use crate::cluster::{self, Cluster};
use crate::config::{split_host_port, BrokerConfig};
use crate::groups::{self, Coordinator};
use crate::identity::{self, DataDirLock, Identity};
use crate::{connection, metrics, retention};

/// State shared by every connection.
pub struct Broker {
    pub config: BrokerConfig,
    pub catalog: Catalog,
    /// Consumer groups and their committed offsets.
    pub groups: Coordinator,
    pub identity: Identity,
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Present in cluster mode: replicated topics, the controller and the Raft groups.
    pub cluster: Option<Arc<Cluster>>,
    _lock: DataDirLock,
}

/// A broker whose data is recovered and whose socket is bound, ready to serve.
pub struct BoundBroker {
    broker: Arc<Broker>,
    listener: TcpListener,
    /// The metrics endpoint's socket; `None` when metrics are off or the port was taken.
    metrics_listener: Option<TcpListener>,
}

impl Broker {
    /// Locks the data directory, recovers every partition and binds the listener.
    pub async fn bind(config: BrokerConfig) -> anyhow::Result<BoundBroker> {
        config
            .validate()
            .map_err(anyhow::Error::msg)
            .context("invalid broker configuration")?;
        let lock = identity::lock_data_dir(&config.data_dir)?;
        let identity = identity::load_or_create(&config.data_dir, config.node_id)?;
        let data_dir = config.data_dir.clone();
        let log_defaults = config.log.clone();
        let max_batch_bytes = config.max_batch_bytes;
        let catalog = tokio::task::spawn_blocking(move || {
            Catalog::open(&data_dir, log_defaults, max_batch_bytes)
        })
        .await
        .context("catalog recovery task")?
        .context("opening the topic catalog")?;
        let cluster = match &config.cluster {
            None => None,
            Some(settings) => Some(
                Cluster::start(cluster::StartParams {
                    node_id: config.node_id,
                    settings: settings.clone(),
                    data_dir: config.data_dir.clone(),
                    log_defaults: config.log.clone(),
                    default_max_batch_bytes: config.max_batch_bytes,
                })
                .await
                .context("joining the cluster")?,
            ),
        };
        let data_dir = config.data_dir.clone();
        let replicated_offsets = cluster.as_ref().map(|c| c.offsets.clone());
        let (group_config, store_config) = (config.group_config(), config.offsets_store_config());
        let groups = tokio::task::spawn_blocking(move || {
            groups::open(&data_dir, group_config, store_config, replicated_offsets)
        })
        .await
        .context("offsets store recovery task")?
        .context("opening the committed-offsets store")?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let local = listener.local_addr()?;
        // With port 0 the advertised port must be the one the OS picked.
        let advertised = match &config.advertised_address {
            Some(a) => a.clone(),
            None => local.to_string(),
        };
        let (advertised_host, advertised_port) =
            split_host_port(&advertised).map_err(anyhow::Error::msg)?;
        let metrics_listener = match config.metrics_address().map_err(anyhow::Error::msg)? {
            None => None,
            // Metrics are for operators; a taken port must not stop the broker from serving.
            Some(address) => match TcpListener::bind(address).await {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::error!(%address, error = %e, "cannot bind the metrics endpoint; running without /metrics");
                    None
                }
            },
        };
        let broker = Arc::new(Broker {
            config,
            catalog,
            groups,
            identity,
            advertised_host,
            advertised_port,
            cluster,
            _lock: lock,
        });
        Ok(BoundBroker {
            broker,
            listener,
            metrics_listener,
        })
    }
}

impl Broker {
    /// The bound a committed offset is checked against: the partition's high watermark, or in
    /// cluster mode, where this broker may only follow the partition (its high watermark can
    /// trail the leader's), no bound beyond the partition existing. `None`: no such partition.
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        match &self.cluster {
            None => self
                .catalog
                .get(topic)
                .and_then(|t| t.partition(partition).map(|log| log.durable_offset())),
            Some(cluster) => {
                let t = cluster.topic(topic)?;
                if partition < 0 || partition >= t.partition_count() {
                    return None;
                }
                match cluster.partition(&t, partition) {
                    Some(r) if r.is_leader() => Some(r.partition.high_watermark()),
                    _ => Some(i64::MAX),
                }
            }
        }
    }

    /// The cluster id clients see: the replicated one in cluster mode once the controller has
    /// written it, otherwise this broker's own.
    pub fn cluster_id(&self) -> String {
        self.cluster
            .as_ref()
            .and_then(|c| c.cluster_id())
            .unwrap_or_else(|| self.identity.cluster_id.clone())
    }
}

impl BoundBroker {
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn broker(&self) -> Arc<Broker> {
        self.broker.clone()
    }

    /// Where `GET /metrics` is served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then closes every partition cleanly.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Self {
            broker,
            listener,
            metrics_listener,
        } = self;
        tracing::info!(
            address = %listener.local_addr()?,
            node_id = broker.config.node_id,
            cluster_id = %broker.identity.cluster_id,
            data_dir = %broker.config.data_dir.display(),
            "listening on {}",
            listener.local_addr()?
        );
        let retention_task = tokio::spawn(retention::run(
            broker.clone(),
            Duration::from_millis(broker.config.retention_check_interval_ms.max(1)),
        ));
        let group_timers = tokio::spawn(groups::run_timers(
            broker.clone(),
            Duration::from_millis(broker.config.group_check_interval_ms.max(1)),
        ));
        let lag_alerts = tokio::spawn(groups::lag::run_alerts(
            broker.clone(),
            Duration::from_millis(broker.config.group_lag_check_interval_ms.max(1)),
            broker.config.group_retention_warn_fraction,
            Duration::from_millis(broker.config.group_retention_warn_repeat_ms.max(1)),
        ));
        let coordinator_task = broker.cluster.as_ref().map(|c| {
            tokio::spawn(groups::follow_coordinator_leadership(
                broker.clone(),
                c.offsets.clone(),
            ))
        });
        let metrics_task =
            metrics_listener.map(|l| tokio::spawn(metrics::serve(l, broker.clone())));
        let permits = Arc::new(Semaphore::new(broker.config.max_connections));
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                permit = permits.clone().acquire_owned() => permit.context("connection limiter closed")?,
            };
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, peer)) => {
                    let broker = broker.clone();
                    tokio::spawn(async move {
                        connection::serve(broker, stream, peer).await;
                        drop(permit);
                    });
                }
                // Running out of file descriptors must not end the broker: wait and retry.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tracing::info!("shutting down");
        retention_task.abort();
        group_timers.abort();
        lag_alerts.abort();
        if let Some(t) = metrics_task {
            t.abort();
        }
        if let Some(t) = coordinator_task {
            t.abort();
        }
        if let Some(cluster) = &broker.cluster {
            cluster.shutdown().await;
        }
        let closing = broker.clone();
        tokio::task::spawn_blocking(move || {
            closing.groups.store().close();
            closing.catalog.close_all()
        })
        .await
        .context("closing partitions")?;
        Ok(())
    }
}
