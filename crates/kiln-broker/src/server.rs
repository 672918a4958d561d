//! Startup, the accept loop and shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::cluster::{self, Cluster};
use crate::config::{split_host_port, BrokerConfig};
use crate::groups::{self, Coordinator};
use crate::identity::{self, DataDirLock, Identity};
use crate::listeners::{Listener, SecurityProtocol, MAIN_LISTENER};
use crate::{connection, convert, metrics, retention};

/// State shared by every connection.
pub struct Broker {
    pub config: BrokerConfig,
    /// Consumer groups and their committed offsets.
    pub groups: Coordinator,
    identity: std::sync::Mutex<Identity>,
    pub advertised_host: String,
    pub advertised_port: i32,
    /// The topics, the controller and the Raft groups (a cluster of one without `[cluster]`).
    pub cluster: Arc<Cluster>,
    /// The Kafka listener's TLS settings, when `[tls]` is set.
    pub tls: Option<Arc<kiln_tls::ServerTls>>,
    /// The Kafka listener's SASL settings, when `[sasl]` is set.
    pub sasl: Option<Arc<crate::sasl::SaslListener>>,
    /// How Raft traffic travels (mutual TLS with `[cluster.tls]`).
    pub raft_transport: kiln_raft::net::Transport,
    /// `[authorization]`: the ACLs are enforced.
    pub authorizer: Option<Arc<crate::authorizer::Authorizer>>,
    _lock: DataDirLock,
}

/// A broker whose data is recovered and whose socket is bound, ready to serve.
pub struct BoundBroker {
    broker: Arc<Broker>,
    listener: TcpListener,
    /// `[[listeners]]`, bound, each with what its connections know of it.
    extra_listeners: Vec<(Arc<Listener>, TcpListener)>,
    /// The metrics endpoint's socket; `None` when metrics are off or the port was taken.
    metrics_listener: Option<TcpListener>,
}

impl Broker {
    /// Locks the data directory, converts an older layout, binds the listener, opens every
    /// replica and starts the Raft groups.
    pub async fn bind(config: BrokerConfig) -> anyhow::Result<BoundBroker> {
        config
            .validate()
            .map_err(anyhow::Error::msg)
            .context("invalid broker configuration")?;
        kiln_log::fds::set_open_files_max(config.open_files_max);
        let lock = identity::lock_data_dir(&config.data_dir)?;
        let (identity, fresh) = identity::load_or_create(&config.data_dir, config.node_id)?;
        let data_dir = config.data_dir.clone();
        let node_id = config.node_id;
        let known_id = identity.cluster_id.clone();
        let converted =
            tokio::task::spawn_blocking(move || convert::run(&data_dir, node_id, known_id))
                .await
                .context("data directory conversion task")?
                .context("converting the data directory")?;
        let mut identity = identity;
        // A directory holding an older layout is not new, whatever broker.json says.
        let fresh = fresh && converted.is_none();
        if let Some(id) = converted {
            identity.cluster_id = Some(id);
            identity::save(&config.data_dir, &identity)?;
        }
        let tls = match &config.tls {
            None => None,
            Some(settings) => {
                let files = settings
                    .files()
                    .map_err(anyhow::Error::msg)
                    .context("[tls]")?;
                Some(Arc::new(kiln_tls::ServerTls::load(files).context("[tls]")?))
            }
        };
        let sasl = match &config.sasl {
            None => None,
            Some(settings) => {
                let listener = crate::sasl::SaslListener::new(settings)
                    .map_err(anyhow::Error::msg)
                    .context("[sasl]")?;
                if listener.offers_plain()
                    && config.main_security() == SecurityProtocol::SaslPlaintext
                {
                    tracing::warn!("[sasl] offers PLAIN without [tls]: passwords cross the network in the clear");
                }
                Some(Arc::new(listener))
            }
        };
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
        let mut extra_listeners = Vec::new();
        let mut extra_advertised = std::collections::BTreeMap::new();
        for l in &config.listeners {
            let tcp = TcpListener::bind(l.listen)
                .await
                .with_context(|| format!("binding listener {:?} on {}", l.name, l.listen))?;
            let bound = tcp.local_addr()?;
            let shown = match &l.advertised_address {
                Some(a) => a.clone(),
                None => bound.to_string(),
            };
            if l.security_protocol == SecurityProtocol::SaslPlaintext
                && sasl.as_ref().is_some_and(|s| s.offers_plain())
            {
                tracing::warn!(listener = %l.name, "SASL_PLAINTEXT with PLAIN: passwords cross the network in the clear");
            }
            extra_advertised.insert(l.name.clone(), shown);
            let listener = Listener {
                name: l.name.clone(),
                security: l.security_protocol,
            };
            extra_listeners.push((Arc::new(listener), tcp));
        }
        let mut settings = config.cluster_settings();
        let raft_transport = settings
            .transport(config.node_id)
            .map_err(anyhow::Error::msg)?;
        let raft_listener = match &config.cluster {
            None => {
                for peer in &mut settings.peers {
                    peer.kafka = advertised.clone();
                    peer.listeners = extra_advertised.clone();
                }
                None
            }
            Some(c) => Some(
                crate::cluster::join::bind_raft_listener(
                    c.raft_listen,
                    &settings,
                    &raft_transport,
                    config.node_id,
                    fresh.then_some(identity.incarnation),
                )
                .await?,
            ),
        };
        if fresh {
            identity::save(&config.data_dir, &identity)?;
        }
        let groups = groups::open(config.group_config(), config.offsets_store_config());
        let persist_dir = config.data_dir.clone();
        let persisted = std::sync::Arc::new(std::sync::Mutex::new(identity.clone()));
        let persisted_for_cluster = persisted.clone();
        let cluster = Cluster::start(cluster::StartParams {
            node_id: config.node_id,
            settings,
            raft_listener,
            raft_transport: raft_transport.clone(),
            data_dir: config.data_dir.clone(),
            log_defaults: config.log.clone(),
            default_max_batch_bytes: config.max_batch_bytes,
            offsets_table: groups.store().table(),
            offsets_snapshot_every: config.offsets_compact_min_records,
            incarnation: identity.incarnation,
            on_cluster_id: Box::new(move |id: &str| {
                let mut identity = persisted_for_cluster.lock().unwrap_or_else(|e| e.into_inner());
                if identity.cluster_id.as_deref() == Some(id) {
                    return;
                }
                if let Some(old) = &identity.cluster_id {
                    tracing::error!(recorded = %old, replicated = %id, "the cluster id in broker.json differs from the replicated one; recording the replicated one");
                }
                identity.cluster_id = Some(id.to_string());
                if let Err(e) = identity::save(&persist_dir, &identity) {
                    tracing::error!(error = %e, "could not record the cluster id in broker.json");
                }
            }),
        })
        .await
        .context("starting the Raft groups")?;
        groups.store().set_replica(cluster.offsets.clone());
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
        let identity = persisted.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let authorizer = crate::authorizer::Authorizer::new(&config);
        let broker = Arc::new(Broker {
            authorizer,
            config,
            groups,
            identity: std::sync::Mutex::new(identity),
            advertised_host,
            advertised_port,
            cluster,
            tls,
            sasl,
            raft_transport,
            _lock: lock,
        });
        Ok(BoundBroker {
            broker,
            listener,
            extra_listeners,
            metrics_listener,
        })
    }
}

impl Broker {
    /// The bound a committed offset is checked against: the partition's high watermark where
    /// this broker leads it; where it only follows (its high watermark can trail the leader's),
    /// no bound beyond the partition existing. `None`: no such partition.
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        let t = self.cluster.topic(topic)?;
        if partition < 0 || partition >= t.partition_count() {
            return None;
        }
        match self.cluster.partition(&t, partition) {
            Some(r) if r.is_leader() => Some(r.partition.high_watermark()),
            _ => Some(i64::MAX),
        }
    }

    /// The cluster id clients see: the replicated one, which every broker records in
    /// `broker.json` once learnt. `None` only before a new cluster has named itself.
    pub fn cluster_id(&self) -> Option<String> {
        if let Some(id) = self.cluster.cluster_id() {
            return Some(id);
        }
        self.identity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cluster_id
            .clone()
    }
}

/// Longest wait, in a broker of one, for its groups to lead before it accepts connections.
const READY_ALONE_WAIT: Duration = Duration::from_secs(10);

/// A broker of one has no peers to wait for: its groups elect themselves at once. Accepting
/// connections only once they lead and the committed offsets are loaded spares its first
/// clients a round of NOT_LEADER and COORDINATOR_LOAD_IN_PROGRESS (connections made meanwhile
/// wait in the listen backlog).
async fn wait_until_ready_alone(broker: &Broker) {
    let deadline = tokio::time::Instant::now() + READY_ALONE_WAIT;
    loop {
        let ready = broker.cluster.ready_alone() && broker.groups.store().is_serving();
        if ready {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                "the broker's groups did not all lead within {} s; serving anyway (clients retry)",
                READY_ALONE_WAIT.as_secs()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
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
            extra_listeners,
            metrics_listener,
        } = self;
        tracing::info!(
            address = %listener.local_addr()?,
            node_id = broker.config.node_id,
            cluster_id = ?broker.cluster_id(),
            data_dir = %broker.config.data_dir.display(),
            tls = broker.tls.is_some(),
            sasl = broker.sasl.is_some(),
            raft_tls = broker.raft_transport.is_authenticated(),
            "listening on {}",
            listener.local_addr()?
        );
        for (l, tcp) in &extra_listeners {
            tracing::info!(listener = %l.name, security = %l.security.name(), "listening on {}", tcp.local_addr()?);
        }
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
        let coordinator_task = tokio::spawn(groups::follow_coordinator_leadership(
            broker.clone(),
            broker.cluster.offsets.clone(),
        ));
        let metrics_task =
            metrics_listener.map(|l| tokio::spawn(metrics::serve(l, broker.clone())));
        let reload_task = tokio::spawn(reload_tls_on_sighup(broker.clone()));
        let bootstrap_user = match broker.config.sasl.as_ref().map(|s| s.bootstrap()) {
            Some(Ok(bootstrap)) => {
                let cluster = broker.cluster.clone();
                Some(tokio::spawn(async move {
                    cluster.ensure_scram_decoy_secret().await;
                    if let Some((user, password)) = bootstrap {
                        cluster.bootstrap_user(user, password).await
                    }
                }))
            }
            Some(Err(e)) => anyhow::bail!("[sasl]: {e}"),
            None => None,
        };
        if broker.config.cluster.is_none() {
            wait_until_ready_alone(&broker).await;
        }
        // One connection limit for all listeners: it bounds the broker's sockets.
        let permits = Arc::new(Semaphore::new(broker.config.max_connections));
        let extra_tasks: Vec<_> = extra_listeners
            .into_iter()
            .map(|(l, tcp)| tokio::spawn(accept_loop(broker.clone(), tcp, l, permits.clone())))
            .collect();
        let main = Arc::new(Listener {
            name: MAIN_LISTENER.to_string(),
            security: broker.config.main_security(),
        });
        tokio::select! {
            _ = shutdown => {}
            () = accept_loop(broker.clone(), listener, main, permits) => {}
        }
        for task in extra_tasks {
            task.abort();
        }
        tracing::info!("shutting down");
        retention_task.abort();
        group_timers.abort();
        lag_alerts.abort();
        if let Some(t) = metrics_task {
            t.abort();
        }
        coordinator_task.abort();
        reload_task.abort();
        if let Some(t) = bootstrap_user {
            t.abort();
        }
        broker.cluster.shutdown().await;
        Ok(())
    }
}

/// Accepts `listener`'s connections (each holding one of `permits` while it lives) until the
/// caller drops this future. Running out of file descriptors must not end the broker: a failed
/// accept waits and retries.
async fn accept_loop(
    broker: Arc<Broker>,
    tcp: TcpListener,
    listener: Arc<Listener>,
    permits: Arc<Semaphore>,
) {
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            unreachable!("the connection limiter is never closed");
        };
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(listener = %listener.name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "set_nodelay failed");
        }
        let broker = broker.clone();
        let listener = listener.clone();
        tokio::spawn(async move {
            if listener.security.tls() {
                let Some(tls) = broker.tls.as_ref() else {
                    unreachable!("validate: a TLS listener needs [tls]");
                };
                if let Some((tls, principal)) =
                    kiln_tls::accept_client(tls.acceptor(), stream, peer).await
                {
                    let (read, write) = tokio::io::split(tls);
                    connection::serve(broker, read, write, peer, principal, listener).await;
                }
            } else {
                let (read, write) = stream.into_split();
                connection::serve(broker, read, write, peer, None, listener).await
            }
            drop(permit);
        });
    }
}

/// On every SIGHUP, reads the Kafka listener's and the Raft transport's certificate files
/// again; new handshakes use them, open connections stay. A file that fails to load leaves
/// the old settings serving, and the error names it.
async fn reload_tls_on_sighup(broker: Arc<Broker>) {
    kiln_tls::on_sighup(|| {
        if let Some(tls) = &broker.tls {
            kiln_tls::log_reload("the Kafka listener", tls.reload());
        }
        if let kiln_raft::net::Transport::MutualTls(tls) = &broker.raft_transport {
            kiln_tls::log_reload("the Raft transport", tls.reload());
        }
        if broker.tls.is_none() && !broker.raft_transport.is_authenticated() {
            tracing::info!("SIGHUP: no TLS settings to reload");
        }
    })
    .await
}
