//! Broker settings. Every field has a default, so a broker starts with no file at all.

use std::net::SocketAddr;
use std::path::PathBuf;

use kiln_log::LogConfig;
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
    /// The main listener's PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; default: TLS with
    /// `[tls]`, SASL with `[sasl]`. Set, `[tls]` and `[sasl]` may serve only `[[listeners]]`.
    pub security_protocol: Option<crate::listeners::SecurityProtocol>,
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
    /// Log files (segments, indexes, vote files) holding an open descriptor at once, over
    /// every partition: the rest are opened again when used (kiln-log `fds.rs`).
    pub open_files_max: usize,
    /// Upper bound on a fetch's long-poll wait, whatever the client asks for.
    pub fetch_max_wait_ms_cap: u64,
    /// How often retention runs over every partition.
    pub retention_check_interval_ms: u64,
    /// Defaults for every partition's log; topics may override segment and retention settings.
    pub log: LogSettings,
    /// `host:port` of the Prometheus text endpoint (`GET /metrics`); "off" disables it. A port
    /// that cannot be bound is logged as an error and the broker runs without metrics.
    pub metrics_listen: String,
    /// Session timeouts a group member may ask for (Kafka's group.min/max.session.timeout.ms).
    pub group_min_session_timeout_ms: i32,
    pub group_max_session_timeout_ms: i32,
    /// How long the first rebalance of an empty group waits for more members to arrive.
    pub group_initial_rebalance_delay_ms: u64,
    /// Members one group may have.
    pub group_max_size: usize,
    /// How often session timeouts and rebalance deadlines are checked.
    pub group_check_interval_ms: u64,
    /// Longest metadata string stored with a committed offset (Kafka's offset.metadata.max.bytes).
    pub offset_metadata_max_bytes: usize,
    /// The offsets group snapshots its table of committed offsets, and drops its log behind
    /// the snapshot, after this many commit requests: a new coordinator's rebuild then costs
    /// what the table holds, not every commit ever made.
    pub offsets_compact_min_records: u64,
    /// How often group lag and retention risk are computed (and warnings logged).
    pub group_lag_check_interval_ms: u64,
    /// Warn when a group's first unconsumed record is this far through its topic's retention window.
    pub group_retention_warn_fraction: f64,
    /// While a warning lasts, it is logged again this often.
    pub group_retention_warn_repeat_ms: u64,
    /// Replication: present, the broker is one of a cluster (see docs/replication.md); absent,
    /// it is a cluster of one: every partition is a Raft group with a single replica, on the
    /// same path.
    pub cluster: Option<ClusterSettings>,
    /// `[tls]`: the Kafka listener takes TLS only (docs/security.md); absent, plain TCP.
    pub tls: Option<ListenerTlsSettings>,
    /// `[sasl]`: every client authenticates (SASL_PLAINTEXT, or SASL_SSL with `[tls]`) before
    /// any request but ApiVersions is served (docs/security.md); absent, none does.
    pub sasl: Option<SaslSettings>,
    /// `[authorization]`: every request is checked against the cluster's ACLs (docs/security.md);
    /// absent, every client may do everything, and the ACL APIs answer SECURITY_DISABLED.
    pub authorization: Option<AuthorizationSettings>,
    /// `[[listeners]]`: more Kafka listeners beside `listen`, each with its own address,
    /// advertised address and security protocol (`crate::listeners`).
    pub listeners: Vec<crate::listeners::ListenerSettings>,
}

/// `[authorization]`: who is above the ACLs, and what happens where none is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthorizationSettings {
    /// Principals that may do anything, ACLs or not: `User:<name>` for a SASL user,
    /// `User:<subject DN>` for a client certificate (Kafka's `super.users`). `[sasl]
    /// super_users` and the bootstrap user are super users too.
    pub super_users: Vec<String>,
    /// Allow a request on a resource that no ACL names (Kafka's
    /// `allow.everyone.if.no.acl.found`). Off: what is not allowed is refused.
    pub allow_everyone_if_no_acl_found: bool,
}

impl AuthorizationSettings {
    pub fn validate(&self) -> Result<(), String> {
        for p in &self.super_users {
            match p.split_once(':') {
                Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
                _ => {
                    return Err(format!(
                    "[authorization] super_users: {p:?} is not a principal of the form User:<name>"
                ))
                }
            }
        }
        Ok(())
    }
}

/// `[sasl]`: the mechanisms offered and the first user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SaslSettings {
    /// Offered in SaslHandshake, in this order: any of "SCRAM-SHA-512", "SCRAM-SHA-256",
    /// "PLAIN". PLAIN sends the password itself: offer it only with `[tls]`.
    pub mechanisms: Vec<String>,
    /// A failed authentication is answered after this long, doubled for each recent failure
    /// of the same client address up to 30 s, then the connection is closed (Kafka's
    /// connection.failed.authentication.delay.ms, which does not grow). At most 30,000.
    pub failed_authentication_delay_ms: u64,
    /// Longest a client may take from its first request to the end of authentication; its
    /// connection slot is held meanwhile.
    pub authentication_timeout_ms: u64,
    /// A user whose credential the controller creates when the cluster has none for it, so the
    /// first `kiln users create` has someone to log in as.
    pub bootstrap_user: Option<String>,
    /// The bootstrap user's password: the file's first line.
    pub bootstrap_password_file: Option<PathBuf>,
    /// Users who may create, change, delete and list SCRAM users (Describe- and
    /// AlterUserScramCredentials); the bootstrap user always may. Everyone else is answered
    /// CLUSTER_AUTHORIZATION_FAILED, so an agent's account cannot make accounts or change an
    /// operator's password.
    pub super_users: Vec<String>,
}

impl Default for SaslSettings {
    fn default() -> Self {
        SaslSettings {
            mechanisms: vec!["SCRAM-SHA-512".into(), "SCRAM-SHA-256".into()],
            failed_authentication_delay_ms: 1000,
            authentication_timeout_ms: 10_000,
            bootstrap_user: None,
            bootstrap_password_file: None,
            super_users: Vec::new(),
        }
    }
}

/// A password file that users other than its owner may read is logged (not refused: the
/// site's deployment tooling decides modes, and a refusal would stop a broker on upgrade).
fn warn_if_others_may_read(file: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(file) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(file = %file.display(), mode = format!("{:o}", mode & 0o777), "the SASL bootstrap password file is readable by other users; chmod 600 it");
        }
    }
}

/// A mechanism `[sasl] mechanisms` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Scram(kiln_sasl::Mechanism),
    Plain,
}

impl SaslMechanism {
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Scram(m) => m.name(),
            SaslMechanism::Plain => "PLAIN",
        }
    }
}

impl SaslSettings {
    /// The offered mechanisms, or which name is not one.
    pub fn parsed_mechanisms(&self) -> Result<Vec<SaslMechanism>, String> {
        if self.mechanisms.is_empty() {
            return Err("sasl.mechanisms is empty: name at least one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN".into());
        }
        self.mechanisms
            .iter()
            .map(|name| match name.as_str() {
                "PLAIN" => Ok(SaslMechanism::Plain),
                other => kiln_sasl::Mechanism::from_name(other)
                    .map(SaslMechanism::Scram)
                    .ok_or_else(|| {
                        format!("sasl.mechanisms: {other:?} is not one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN")
                    }),
            })
            .collect()
    }

    /// The bootstrap user and password, when both are set; an error when only one is, or the
    /// file cannot be read.
    pub fn bootstrap(&self) -> Result<Option<(String, Vec<u8>)>, String> {
        match (&self.bootstrap_user, &self.bootstrap_password_file) {
            (None, None) => Ok(None),
            (Some(user), Some(file)) => {
                kiln_sasl::check_user_name(user)
                    .map_err(|e| format!("sasl.bootstrap_user: {e}"))?;
                let password =
                    kiln_settings::read_secret_file("sasl.bootstrap_password_file", file)
                        .map_err(|e| e.to_string())?;
                warn_if_others_may_read(file);
                if password.len() > kiln_sasl::PASSWORD_BYTES_MAX {
                    return Err(format!(
                        "sasl.bootstrap_password_file {}: the first line must hold a password of 1 to {} bytes",
                        file.display(),
                        kiln_sasl::PASSWORD_BYTES_MAX
                    ));
                }
                Ok(Some((user.clone(), password.as_bytes().to_vec())))
            }
            _ => Err("sasl.bootstrap_user and sasl.bootstrap_password_file go together".into()),
        }
    }
}

/// `[tls]`: the Kafka listener's certificate, and whether clients must present one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsSettings {
    /// PEM certificate chain, leaf first, naming the advertised host.
    pub cert_file: PathBuf,
    /// Its PEM private key.
    pub key_file: PathBuf,
    /// PEM CA bundle that signs client certificates. Set, clients must present a certificate
    /// it signed (mutual TLS) unless `client_auth` says otherwise; a client's principal is then
    /// its certificate's subject (`User:CN=...`).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// "none", "requested" or "required"; default "required" with a `client_ca_file`, else
    /// "none".
    #[serde(default)]
    pub client_auth: Option<String>,
}

impl ListenerTlsSettings {
    /// The files and client-certificate policy, or why they do not fit together.
    pub fn files(&self) -> Result<kiln_tls::ServerTlsFiles, String> {
        use kiln_tls::ClientAuth;
        let client_auth = match (self.client_auth.as_deref(), &self.client_ca_file) {
            (None, Some(_)) | (Some("required"), Some(_)) => ClientAuth::Required,
            (Some("requested"), Some(_)) => ClientAuth::Requested,
            (None, None) | (Some("none"), _) => ClientAuth::None,
            (Some("required" | "requested"), None) => return Err(
                "tls.client_auth asks for client certificates but tls.client_ca_file is not set"
                    .into(),
            ),
            (Some(other), _) => {
                return Err(format!(
                    "tls.client_auth must be \"none\", \"requested\" or \"required\", got {other:?}"
                ))
            }
        };
        Ok(kiln_tls::ServerTlsFiles {
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            client_ca_file: self.client_ca_file.clone(),
            client_auth,
        })
    }
}

/// `[cluster.tls]`: mutual TLS between brokers with the cluster CA (docs/security.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerTlsSettings {
    /// PEM bundle of the cluster CA: peers' certificates must be signed by it.
    pub ca_file: PathBuf,
    /// This broker's PEM certificate; it must carry the DNS name `kiln-node-<node_id>`.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `[cluster]`: who the peers are and how Raft is timed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Address this broker's Raft listener binds (peers connect to it).
    pub raft_listen: SocketAddr,
    /// Every broker of the cluster, this one included, with the same list on every broker.
    /// With `join`, this broker's own entry and the brokers it asks to let it in (seeds).
    pub peers: Vec<PeerSettings>,
    /// This broker joins a running cluster (docs/operations.md, "Adding a broker"): it
    /// registers its addresses with the controller through the other `peers`, starts no
    /// group of its own, and is filled by the groups' leaders. The founding brokers leave it
    /// false.
    pub join: bool,
    /// Replicas per partition for topics created without one; more than the cluster has is
    /// refused when a topic is created.
    pub default_replication_factor: u16,
    /// Leader heartbeat interval: the broker's pulse makes every leader heard by its followers
    /// every 1.5 heartbeats, in one beat per peer for all its groups (kiln-raft `pulse.rs`).
    /// Shorter means a dead leader is noticed sooner and more traffic while idle.
    pub heartbeat_ms: u64,
    /// A follower that hears nothing from its leader for `election_timeout_max_ms` (openraft's
    /// leader lease) and 1.5 heartbeats starts an election after its own slice of this range
    /// (one slice per follower, in an order the group agrees on): with the defaults a dead
    /// leader's first follower stands 0.75-0.9 s after it stopped answering. A candidate whose
    /// try failed stands again after a time in this range or more. Keep the lower bound
    /// several heartbeats long. A leader serves clients only while a quorum acknowledged it
    /// within `election_timeout_max_ms` less 1.5 heartbeats (its lease), so the upper bound
    /// must be at least 2.5 heartbeats. openraft gives every AppendEntries just under
    /// `election_timeout_min_ms` to complete, the follower's fsync included.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Longest wait for one Raft message to a peer before it counts as unreachable.
    pub rpc_timeout_ms: u64,
    /// Largest Raft entry the produce path builds by joining queued producer batches.
    pub max_entry_bytes: usize,
    /// A test hook, never read from a file: cuts this broker's Raft links on demand
    /// (`kiln_raft::net::LinkCuts`) while its Kafka listener stays up.
    #[serde(skip)]
    pub link_cuts: Option<std::sync::Arc<kiln_raft::net::LinkCuts>>,
    /// Mutual TLS between brokers; absent, the Raft listener takes plain TCP from anyone.
    pub tls: Option<PeerTlsSettings>,
    /// Raft connections one peer may hold open at once (about one per partition the two
    /// brokers share); more are refused and logged.
    pub raft_connections_per_peer_max: usize,
    /// Hand leadership back to each partition's preferred replica (its first) once that
    /// broker is back and in sync (Kafka's `auto.leader.rebalance.enable`). Each handover
    /// pauses the partition's writes for about a second (`cluster/rebalance.rs`).
    pub auto_leader_rebalance: bool,
    /// How often each broker looks for partitions to hand back.
    pub leader_rebalance_interval_ms: u64,
    /// Handovers one broker runs at once.
    pub leader_handovers_max: usize,
}

/// One `[[cluster.peers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSettings {
    pub id: i32,
    /// `host:port` Kafka clients use for this broker (its advertised address).
    pub kafka: String,
    /// `host:port` of its Raft listener.
    pub raft: String,
    /// Its advertised address on each of `[[listeners]]`, by name.
    #[serde(default)]
    pub listeners: std::collections::BTreeMap<String, String>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            raft_listen: SocketAddr::from(([127, 0, 0, 1], 9093)),
            peers: Vec::new(),
            join: false,
            default_replication_factor: 3,
            heartbeat_ms: kiln_raft::partition::HEARTBEAT_MS,
            election_timeout_min_ms: kiln_raft::partition::ELECTION_TIMEOUT_MIN_MS,
            election_timeout_max_ms: kiln_raft::partition::ELECTION_TIMEOUT_MAX_MS,
            rpc_timeout_ms: 2_000,
            max_entry_bytes: kiln_raft::partition::ENTRY_BYTES_MAX,
            link_cuts: None,
            tls: None,
            raft_connections_per_peer_max: kiln_raft::net::CONNECTIONS_PER_PEER_MAX,
            auto_leader_rebalance: true,
            leader_rebalance_interval_ms: 30_000,
            leader_handovers_max: 64,
        }
    }
}

impl ClusterSettings {
    /// The Raft timings, or why they do not work together (checked by [`Self::validate`]).
    pub fn timings(&self) -> Result<kiln_raft::liveness::Timings, String> {
        kiln_raft::liveness::Timings::from_ms(
            self.heartbeat_ms,
            self.election_timeout_min_ms,
            self.election_timeout_max_ms,
        )
    }

    /// Checks the peer list and timings; `node_id` is this broker's id.
    pub fn validate(&self, node_id: i32) -> Result<(), String> {
        if self.peers.is_empty() {
            return Err("[cluster] needs at least one [[cluster.peers]] entry".into());
        }
        let mut ids = std::collections::BTreeSet::new();
        for peer in &self.peers {
            if peer.id < 0 {
                return Err(format!("cluster peer id must be >= 0, got {}", peer.id));
            }
            if !ids.insert(peer.id) {
                return Err(format!("cluster peer id {} is listed twice", peer.id));
            }
            split_host_port(&peer.kafka)
                .map_err(|e| format!("cluster peer {}: kafka {e}", peer.id))?;
            split_host_port(&peer.raft)
                .map_err(|e| format!("cluster peer {}: raft {e}", peer.id))?;
        }
        if !ids.contains(&node_id) {
            return Err(format!(
                "node_id {node_id} is not among the [[cluster.peers]] ids {ids:?}"
            ));
        }
        if self.join && ids.len() < 2 {
            return Err(format!(
                "[cluster] join = true needs at least one [[cluster.peers]] entry besides node {node_id}: a broker of the running cluster to ask"
            ));
        }
        if self.default_replication_factor == 0 {
            return Err("cluster.default_replication_factor must be at least 1".into());
        }
        // A leader serves clients for a lease within the election timeout (kiln-raft
        // `liveness.rs`); timings that leave none would refuse every partition at start.
        if let Err(e) = self.timings() {
            return Err(format!("cluster timings: {e}"));
        }
        if self.rpc_timeout_ms == 0 {
            return Err("cluster.rpc_timeout_ms must be at least 1".into());
        }
        if self.max_entry_bytes < 1024 {
            return Err("cluster.max_entry_bytes must be at least 1024".into());
        }
        if self.raft_connections_per_peer_max == 0 {
            return Err("cluster.raft_connections_per_peer_max must be at least 1".into());
        }
        if self.leader_rebalance_interval_ms < 100 {
            return Err(format!(
                "cluster.leader_rebalance_interval_ms must be at least 100, got {}",
                self.leader_rebalance_interval_ms
            ));
        }
        if self.leader_handovers_max == 0 {
            return Err(
                "cluster.leader_handovers_max must be at least 1 (turn handovers off with \
                 cluster.auto_leader_rebalance = false)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The Raft transport these settings ask for, its files read and checked (node
    /// `node_id`'s certificate must name it).
    pub fn transport(&self, node_id: i32) -> Result<kiln_raft::net::Transport, String> {
        let Some(tls) = &self.tls else {
            return Ok(kiln_raft::net::Transport::Plain);
        };
        let node = u64::try_from(node_id).map_err(|_| format!("node id {node_id} is negative"))?;
        let files = kiln_tls::PeerTlsFiles {
            ca_file: tls.ca_file.clone(),
            cert_file: tls.cert_file.clone(),
            key_file: tls.key_file.clone(),
        };
        kiln_tls::PeerTls::load(files, node)
            .map(|tls| kiln_raft::net::Transport::MutualTls(std::sync::Arc::new(tls)))
            .map_err(|e| format!("[cluster.tls]: {e}"))
    }
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
    /// Only `0` is accepted: a produce is acknowledged only after its batch is fsynced (on a
    /// majority of replicas). Kept so that an older file saying `0` still loads; any other value
    /// is refused with a message.
    pub flush_interval_ms: u64,
    pub checkpoint_interval_bytes: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            node_id: 0,
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised_address: None,
            security_protocol: None,
            data_dir: PathBuf::from("kiln-data"),
            auto_create_topics: false,
            default_partitions: 1,
            max_frame_bytes: 100 * 1024 * 1024,
            max_batch_bytes: 1024 * 1024 + 12,
            max_connections: 1024,
            max_in_flight_per_connection: 64,
            open_files_max: kiln_log::fds::OPEN_FILES_MAX_DEFAULT,
            fetch_max_wait_ms_cap: 30_000,
            retention_check_interval_ms: 30_000,
            log: LogSettings::default(),
            metrics_listen: "127.0.0.1:9644".to_string(),
            group_min_session_timeout_ms: 6_000,
            group_max_session_timeout_ms: 1_800_000,
            group_initial_rebalance_delay_ms: 0,
            group_max_size: 1_000,
            group_check_interval_ms: 100,
            offset_metadata_max_bytes: 4096,
            offsets_compact_min_records: 10_000,
            group_lag_check_interval_ms: 10_000,
            group_retention_warn_fraction: 0.8,
            group_retention_warn_repeat_ms: 300_000,
            cluster: None,
            tls: None,
            sasl: None,
            authorization: None,
            listeners: Vec::new(),
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
            checkpoint_interval_bytes: self.checkpoint_interval_bytes,
            verify_all_on_open: false,
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

    /// The main listener's security protocol (see `security_protocol`).
    pub fn main_security(&self) -> crate::listeners::SecurityProtocol {
        self.security_protocol.unwrap_or_else(|| {
            crate::listeners::SecurityProtocol::of_main(self.tls.is_some(), self.sasl.is_some())
        })
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
        if let Some(a) = &self.authorization {
            a.validate()?;
        }
        if self.open_files_max == 0 {
            return Err("open_files_max must be at least 1".into());
        }
        if self.max_connections == 0 || self.max_in_flight_per_connection == 0 {
            return Err(
                "max_connections and max_in_flight_per_connection must be at least 1".into(),
            );
        }
        if let Some(tls) = &self.tls {
            tls.files()?;
        }
        if let Some(sasl) = &self.sasl {
            sasl.parsed_mechanisms()?;
            let delay_max_ms = crate::login_failures::DELAY_MAX.as_millis();
            if u128::from(sasl.failed_authentication_delay_ms) > delay_max_ms
                || sasl.authentication_timeout_ms == 0
            {
                return Err(format!("sasl.failed_authentication_delay_ms must be at most {delay_max_ms} and sasl.authentication_timeout_ms above 0"));
            }
            sasl.bootstrap()?;
        }
        if self.log.segment_bytes < crate::topic_config::SEGMENT_BYTES_MIN {
            return Err(format!(
                "log.segment_bytes must be at least {}, got {}",
                crate::topic_config::SEGMENT_BYTES_MIN,
                self.log.segment_bytes
            ));
        }
        if self.log.flush_interval_ms != 0 {
            return Err(format!(
                "log.flush_interval_ms = {} is no longer supported: every acknowledged produce \
                 is fsynced first (on a majority of replicas); remove the setting",
                self.log.flush_interval_ms
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
        self.validate_groups()?;
        if let Some(cluster) = &self.cluster {
            cluster.validate(self.node_id)?;
        }
        crate::listeners::validate(
            &self.listeners,
            self.main_security(),
            self.listen,
            self.tls.is_some(),
            self.sasl.is_some(),
            self.cluster.as_ref().map(|c| c.peers.as_slice()),
        )?;
        split_host_port(&self.advertised()).map(|_| ())
    }

    /// The metrics address, or `None` when metrics are off.
    pub fn metrics_address(&self) -> Result<Option<SocketAddr>, String> {
        let value = self.metrics_listen.trim();
        if value.is_empty() || value.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        value.parse().map(Some).map_err(|_| {
            format!("metrics_listen {value:?} is not host:port (an IP address) or \"off\"")
        })
    }

    fn validate_groups(&self) -> Result<(), String> {
        self.metrics_address()?;
        if self.group_min_session_timeout_ms <= 0
            || self.group_min_session_timeout_ms > self.group_max_session_timeout_ms
        {
            return Err(format!(
                "group_min_session_timeout_ms ({}) must be > 0 and <= group_max_session_timeout_ms ({})",
                self.group_min_session_timeout_ms, self.group_max_session_timeout_ms
            ));
        }
        if self.group_max_size == 0 {
            return Err("group_max_size must be at least 1".into());
        }
        if self.group_check_interval_ms == 0 || self.group_lag_check_interval_ms == 0 {
            return Err(
                "group_check_interval_ms and group_lag_check_interval_ms must be at least 1".into(),
            );
        }
        if !(self.group_retention_warn_fraction > 0.0 && self.group_retention_warn_fraction <= 1.0)
        {
            return Err(format!(
                "group_retention_warn_fraction must be in (0, 1], got {}",
                self.group_retention_warn_fraction
            ));
        }
        if self.offsets_compact_min_records == 0 {
            return Err("offsets_compact_min_records must be at least 1".into());
        }
        Ok(())
    }

    pub fn group_config(&self) -> crate::groups::GroupConfig {
        crate::groups::GroupConfig {
            min_session_timeout_ms: self.group_min_session_timeout_ms,
            max_session_timeout_ms: self.group_max_session_timeout_ms,
            initial_rebalance_delay_ms: self.group_initial_rebalance_delay_ms,
            max_size: self.group_max_size,
            offset_metadata_max_bytes: self.offset_metadata_max_bytes,
        }
    }

    pub fn offsets_store_config(&self) -> crate::groups::StoreConfig {
        crate::groups::StoreConfig {
            snapshot_every: self.offsets_compact_min_records,
        }
    }

    /// The cluster settings this broker runs with: its `[cluster]`, or for a standalone broker
    /// a cluster of one (itself at its advertised address, no Raft listener).
    pub fn cluster_settings(&self) -> ClusterSettings {
        match &self.cluster {
            Some(c) => c.clone(),
            None => ClusterSettings {
                peers: vec![PeerSettings {
                    id: self.node_id,
                    kafka: self.advertised(),
                    raft: String::new(),
                    listeners: self
                        .listeners
                        .iter()
                        .map(|l| (l.name.clone(), l.advertised()))
                        .collect(),
                }],
                default_replication_factor: 1,
                ..ClusterSettings::default()
            },
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn one_peer() -> ClusterSettings {
        ClusterSettings {
            peers: vec![PeerSettings {
                id: 1,
                kafka: "127.0.0.1:9092".into(),
                raft: "127.0.0.1:9093".into(),
                listeners: Default::default(),
            }],
            ..ClusterSettings::default()
        }
    }

    #[test]
    fn leader_balance_settings_are_checked() {
        assert_eq!(one_peer().validate(1), Ok(()));
        let e = ClusterSettings {
            leader_rebalance_interval_ms: 99,
            ..one_peer()
        }
        .validate(1)
        .unwrap_err();
        assert!(
            e.contains("leader_rebalance_interval_ms must be at least 100"),
            "{e}"
        );
        let e = ClusterSettings {
            leader_handovers_max: 0,
            ..one_peer()
        }
        .validate(1)
        .unwrap_err();
        assert!(e.contains("auto_leader_rebalance = false"), "{e}");
    }

    #[test]
    fn bad_sasl_settings_are_refused_with_the_setting_named() {
        let refused = |sasl: SaslSettings| {
            BrokerConfig {
                sasl: Some(sasl),
                ..BrokerConfig::default()
            }
            .validate()
            .unwrap_err()
        };
        let e = refused(SaslSettings {
            mechanisms: vec!["SCRAM-SHA-1".into()],
            ..SaslSettings::default()
        });
        assert!(e.contains("\"SCRAM-SHA-1\" is not one of"), "{e}");
        let e = refused(SaslSettings {
            mechanisms: vec![],
            ..SaslSettings::default()
        });
        assert!(e.contains("sasl.mechanisms is empty"), "{e}");
        let e = refused(SaslSettings {
            failed_authentication_delay_ms: 30_001,
            ..SaslSettings::default()
        });
        assert!(e.contains("at most 30000"), "{e}");
        let e = refused(SaslSettings {
            bootstrap_user: Some("admin".into()),
            ..SaslSettings::default()
        });
        assert!(e.contains("go together"), "{e}");
        let e = refused(SaslSettings {
            bootstrap_user: Some("admin".into()),
            bootstrap_password_file: Some("/nonexistent/admin.password".into()),
            ..SaslSettings::default()
        });
        assert!(e.contains("/nonexistent/admin.password"), "{e}");
        let defaults = SaslSettings::default().parsed_mechanisms().unwrap();
        assert_eq!(
            defaults,
            [
                SaslMechanism::Scram(kiln_sasl::Mechanism::ScramSha512),
                SaslMechanism::Scram(kiln_sasl::Mechanism::ScramSha256)
            ]
        );
    }

    #[test]
    fn listener_tls_client_auth_follows_the_client_ca() {
        use kiln_tls::ClientAuth;
        let mut tls = ListenerTlsSettings {
            cert_file: "b.crt".into(),
            key_file: "b.key".into(),
            client_ca_file: None,
            client_auth: None,
        };
        assert_eq!(tls.files().map(|f| f.client_auth), Ok(ClientAuth::None));
        tls.client_auth = Some("required".into());
        let err = tls.files().unwrap_err();
        assert!(err.contains("client_ca_file is not set"), "{err}");
        tls.client_ca_file = Some("ca.crt".into());
        tls.client_auth = None;
        assert_eq!(tls.files().map(|f| f.client_auth), Ok(ClientAuth::Required));
        tls.client_auth = Some("requested".into());
        assert_eq!(
            tls.files().map(|f| f.client_auth),
            Ok(ClientAuth::Requested)
        );
        tls.client_auth = Some("sometimes".into());
        let err = tls.files().unwrap_err();
        assert!(err.contains("\"sometimes\""), "{err}");
        let config = BrokerConfig {
            tls: Some(tls),
            ..BrokerConfig::default()
        };
        assert!(config.validate().is_err());
    }

    #[test]
    fn a_missing_cluster_certificate_is_named() {
        let mut settings = one_peer();
        settings.tls = Some(PeerTlsSettings {
            ca_file: "/nonexistent/ca.crt".into(),
            cert_file: "/nonexistent/node-1.crt".into(),
            key_file: "/nonexistent/node-1.key".into(),
        });
        let err = settings.transport(1).err().unwrap();
        assert!(
            err.contains("[cluster.tls]") && err.contains("node-1.crt"),
            "{err}"
        );
    }

    #[test]
    fn timings_that_leave_a_leader_no_lease_are_refused() {
        assert_eq!(one_peer().validate(1), Ok(()));
        let tight = ClusterSettings {
            heartbeat_ms: 100,
            election_timeout_min_ms: 120,
            election_timeout_max_ms: 150,
            ..one_peer()
        };
        let err = tight.validate(1).expect_err("no lease left");
        assert!(
            err.contains("election_timeout_max (150 ms) must be at least 2.5 heartbeats"),
            "{err}"
        );
        let backwards = ClusterSettings {
            election_timeout_min_ms: 90,
            ..one_peer()
        };
        let err = backwards
            .validate(1)
            .expect_err("elections shorter than a heartbeat");
        assert!(err.contains("timings must satisfy"), "{err}");
    }
}
