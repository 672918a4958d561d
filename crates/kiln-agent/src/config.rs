//! Agent settings: a TOML file (`kiln agent --config FILE`), then `KILN_AGENT__<SECTION>__<KEY>`
//! environment variables (`KILN_AGENT__AGENT_ID=bastion-3`, `KILN_AGENT__SSH__USER=burnin`),
//! through `kiln_settings::load`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::access::{RedfishSettings, SshSettings};
use crate::decide::{FailFastSettings, RemediationSettings};

/// `Debug` shows `database_url` without its password, and `[kafka]` without its secrets.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// The results store (`sqlite://PATH` or `postgres://...`).
    pub database_url: String,
    /// A file whose first line is PostgreSQL's password, kept out of `database_url`.
    pub database_password_file: Option<PathBuf>,
    /// This agent's name in the store's runs (default: `agent-<pid>`).
    pub agent_id: String,
    /// The playbook every node runs (or use `playbooks`).
    pub playbook: Option<PathBuf>,
    /// Playbooks chosen per node by its manifest `gpu_model` (each playbook's `gpu_models`;
    /// `gpu_models: []` is for nodes without GPUs). Give this or `playbook`.
    pub playbooks: Vec<PathBuf>,
    /// How the agent opens a shell on a node (SSH); see `access::SshSettings`.
    pub ssh: SshSettings,
    /// How the agent talks to a node's BMC (Redfish); see `access::RedfishSettings`.
    pub redfish: RedfishSettings,
    /// Consumer group (`burnin`).
    pub group: String,
    /// Topic of nodes to burn in (`kiln.nodes`).
    pub topic: String,
    /// Topic of dead-lettered nodes (`kiln.nodes.dlq`).
    pub dlq_topic: String,
    /// Nodes of one partition worked on at once; later ones wait in a bounded local queue.
    /// A node waiting out its back-off holds one of these slots.
    pub max_in_flight_per_partition: usize,
    /// Back-off before attempt n+1: `retry_backoff_ms * 2^(n-1)`, at most `retry_backoff_max_ms`.
    pub retry_backoff_ms: u64,
    pub retry_backoff_max_ms: u64,
    /// Failed attempts after which a node is dead-lettered. The store's state machine decides
    /// (`kiln_store::MAX_ATTEMPTS`, 10); any other value is refused rather than ignored.
    pub max_attempts: u32,
    /// Timeout of each store operation and each produce, ms.
    pub step_timeout_ms: u64,
    /// Extra time over the playbook's own `timeout_s` before a run is abandoned, ms.
    pub run_grace_ms: u64,
    /// Consumer session timeout, ms.
    pub session_timeout_ms: u64,
    /// Extra librdkafka settings for consumer and producer (e.g. `security.protocol`).
    pub kafka: kiln_queue::KafkaSettings,
    /// File whose first line is librdkafka's `sasl.password` (instead of `[kafka]`).
    pub kafka_password_file: Option<PathBuf>,
    /// librdkafka's `sasl.password` as a setting of its own, so it can come from the
    /// environment (`KILN_AGENT__KAFKA_PASSWORD`).
    pub kafka_password: Option<String>,
    /// `host:port` of the Prometheus text endpoint (`GET /metrics`); "off" disables it. Agents
    /// sharing a host need one port each.
    pub metrics_listen: String,
    /// When a failed attempt dead-letters its node at once (an RMA candidate, a repeated
    /// fault) instead of after `max_attempts`.
    pub fail_fast: FailFastSettings,
    /// Commands run on the node before the next attempt for `reset_gpu` / `reboot` findings
    /// (none by default).
    pub remediation: RemediationSettings,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, so a new one cannot slip past this without a decision here.
        let AgentConfig {
            bootstrap,
            database_url,
            database_password_file,
            agent_id,
            playbook,
            playbooks,
            ssh,
            redfish,
            group,
            topic,
            dlq_topic,
            max_in_flight_per_partition,
            retry_backoff_ms,
            retry_backoff_max_ms,
            max_attempts,
            step_timeout_ms,
            run_grace_ms,
            session_timeout_ms,
            kafka,
            kafka_password_file,
            kafka_password,
            metrics_listen,
            fail_fast,
            remediation,
        } = self;
        f.debug_struct("AgentConfig")
            .field("bootstrap", bootstrap)
            .field("database_url", &kiln_store::redact_url(database_url))
            .field("database_password_file", database_password_file)
            .field("agent_id", agent_id)
            .field("playbook", playbook)
            .field("playbooks", playbooks)
            .field("ssh", ssh)
            .field("redfish", redfish)
            .field("group", group)
            .field("topic", topic)
            .field("dlq_topic", dlq_topic)
            .field("max_in_flight_per_partition", max_in_flight_per_partition)
            .field("retry_backoff_ms", retry_backoff_ms)
            .field("retry_backoff_max_ms", retry_backoff_max_ms)
            .field("max_attempts", max_attempts)
            .field("step_timeout_ms", step_timeout_ms)
            .field("run_grace_ms", run_grace_ms)
            .field("session_timeout_ms", session_timeout_ms)
            .field("kafka", kafka)
            .field("kafka_password_file", kafka_password_file)
            .field(
                "kafka_password",
                &kafka_password.as_ref().map(|_| "[redacted]"),
            )
            .field("metrics_listen", metrics_listen)
            .field("fail_fast", fail_fast)
            .field("remediation", remediation)
            .finish()
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            bootstrap: "127.0.0.1:9092".into(),
            database_url: "sqlite://kiln.db".into(),
            database_password_file: None,
            agent_id: format!("agent-{}", std::process::id()),
            playbook: None,
            playbooks: Vec::new(),
            ssh: SshSettings::default(),
            redfish: RedfishSettings::default(),
            group: "burnin".into(),
            topic: kiln_queue::NODES_TOPIC.into(),
            dlq_topic: format!("{}.dlq", kiln_queue::NODES_TOPIC),
            max_in_flight_per_partition: 4,
            retry_backoff_ms: 30_000,
            retry_backoff_max_ms: 30 * 60_000,
            max_attempts: kiln_store::MAX_ATTEMPTS,
            step_timeout_ms: 30_000,
            run_grace_ms: 30_000,
            session_timeout_ms: 10_000,
            kafka: Default::default(),
            kafka_password_file: None,
            kafka_password: None,
            metrics_listen: "127.0.0.1:9645".into(),
            fail_fast: FailFastSettings::default(),
            remediation: RemediationSettings::default(),
        }
    }
}

impl AgentConfig {
    /// Defaults, then `path`, then `KILN_AGENT__<SECTION>__<KEY>` variables
    /// (`kiln_settings::load`).
    pub fn load(path: &Path) -> anyhow::Result<AgentConfig> {
        Self::load_from(path, std::env::vars())
    }

    /// [`AgentConfig::load`] with the environment given.
    pub fn load_from(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<AgentConfig> {
        let config: AgentConfig =
            kiln_settings::load(kiln_settings::Service::Agent, Some(path), env)
                .with_context(|| format!("reading agent settings {}", path.display()))?;
        let mut config = config;
        config.validate()?;
        match (
            config.kafka_password.clone(),
            config.kafka_password_file.clone(),
        ) {
            (Some(_), Some(_)) => {
                anyhow::bail!("set kafka_password or kafka_password_file, not both")
            }
            (Some(password), None) => config.kafka.add_password("kafka_password", &password)?,
            (None, Some(file)) => config
                .kafka
                .add_password_file("kafka_password_file", &file)?,
            (None, None) => {}
        }
        Ok(config)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_in_flight_per_partition == 0 || self.max_in_flight_per_partition > 10_000 {
            anyhow::bail!("max_in_flight_per_partition must be 1..=10000");
        }
        if self.max_attempts != kiln_store::MAX_ATTEMPTS {
            anyhow::bail!(
                "max_attempts must be {}: the store's node state machine dead-letters after \
                 attempt {} (kiln_store::MAX_ATTEMPTS), and the agent follows the store",
                kiln_store::MAX_ATTEMPTS,
                kiln_store::MAX_ATTEMPTS
            );
        }
        if self.agent_id.trim().is_empty() {
            anyhow::bail!("agent_id must not be empty");
        }
        if self.step_timeout_ms == 0 {
            anyhow::bail!("step_timeout_ms must be > 0");
        }
        match (&self.playbook, self.playbooks.is_empty()) {
            (Some(_), false) => anyhow::bail!("give either playbook or playbooks, not both"),
            (None, true) => {
                anyhow::bail!("no playbook: set playbook = FILE or playbooks = [FILES]")
            }
            _ => {}
        }
        crate::metrics::listen_address(&self.metrics_listen)?;
        if self.remediation.timeout_ms == 0 {
            anyhow::bail!("remediation.timeout_ms must be > 0");
        }
        Ok(())
    }

    /// Back-off before attempt `failed + 1`, after `failed` failed attempts (1-based).
    pub fn backoff_ms(&self, failed: u32) -> u64 {
        let shift = failed.saturating_sub(1).min(30);
        self.retry_backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.retry_backoff_max_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_every_password_out() {
        let mut c = AgentConfig {
            database_url: "postgres://kiln:hunter2-db@db/kiln".into(),
            ..AgentConfig::default()
        };
        c.kafka
            .0
            .insert("sasl.password".into(), "hunter2-kafka".into());
        c.redfish.password = Some("hunter2-bmc".into());
        c.kafka_password = Some("hunter2-kafka-env".into());
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://kiln:***@db/kiln"), "{shown}");
    }

    #[test]
    fn loads_toml_and_validates() {
        let dir = std::env::temp_dir().join(format!("kiln-agent-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("agent.toml");
        std::fs::write(
            &p,
            "bootstrap = \"h:1\"\nagent_id = \"a1\"\nplaybook = \"pb.yaml\"\n\
             max_in_flight_per_partition = 3\nretry_backoff_ms = 10\nretry_backoff_max_ms = 35\n",
        )
        .expect("write");
        let c = AgentConfig::load(&p).expect("load");
        assert_eq!(c.bootstrap, "h:1");
        assert_eq!(c.max_in_flight_per_partition, 3);
        assert_eq!(c.max_attempts, 10);
        assert_eq!(c.group, "burnin");
        assert_eq!(
            [c.backoff_ms(1), c.backoff_ms(2), c.backoff_ms(3)],
            [10, 20, 35]
        );
        for bad in [
            "max_attempts = 11\n",
            "max_attempts = 3\n",
            "max_in_flight_per_partition = 0\n",
        ] {
            std::fs::write(&p, bad).expect("write");
            assert!(AgentConfig::load(&p).is_err(), "{bad}");
        }
        std::fs::write(&p, "no_such_key = 1\n").expect("write");
        assert!(AgentConfig::load(&p).is_err());
        assert!(AgentConfig::load(&dir.join("missing.toml")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_kafka_password_comes_from_the_environment_or_a_file_not_both() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("agent.toml");
        let pw = dir.path().join("kafka.pw");
        std::fs::write(&pw, "hunter2-file\n").expect("write");
        std::fs::write(&p, "playbook = \"a.yaml\"\n").expect("write");
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = AgentConfig::load_from(&p, env(&[("KILN_AGENT__KAFKA_PASSWORD", "007-env")]))
            .expect("load");
        assert_eq!(c.kafka.0[kiln_queue::SASL_PASSWORD], "007-env");
        assert!(!format!("{c:?}").contains("007-env"));
        let both = env(&[
            ("KILN_AGENT__KAFKA_PASSWORD", "007-env"),
            (
                "KILN_AGENT__KAFKA_PASSWORD_FILE",
                pw.to_str().expect("path"),
            ),
        ]);
        let err = AgentConfig::load_from(&p, both).expect_err("two sources");
        assert!(err.to_string().contains("not both"), "{err}");
    }

    #[test]
    fn reads_playbook_set_ssh_and_redfish_tables() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("agent.toml");
        std::fs::write(
            &p,
            "playbooks = [\"a.yaml\", \"b.yaml\"]\n\
             [ssh]\nuser = \"kiln\"\nkey_path = \"k\"\nknown_hosts = \"kh\"\nport = 2222\n\
             max_sessions = 8\naddresses_file = \"addr.json\"\n\
             [ssh.addresses]\n\"gpu-1\" = \"10.0.0.1:22\"\n\
             [redfish]\nauth = \"session\"\nuser = \"u\"\npassword = \"p\"\nca_file = \"ca.pem\"\nretries = 1\n",
        )
        .expect("write");
        let c = AgentConfig::load(&p).expect("load");
        assert_eq!(c.playbook, None);
        assert_eq!(c.playbooks.len(), 2);
        assert_eq!(c.ssh.user, "kiln");
        assert_eq!(c.ssh.port, 2222);
        assert_eq!(c.ssh.max_sessions, 8);
        assert_eq!(c.ssh.sessions_per_node, 4, "default kept");
        assert_eq!(c.ssh.addresses["gpu-1"], "10.0.0.1:22");
        assert_eq!(c.redfish.auth, crate::access::RedfishAuthKind::Session);
        assert_eq!(c.redfish.retries, 1);
        assert_eq!(c.redfish.request_timeout_ms, 30_000, "default kept");
        std::fs::write(&p, "playbook = \"a.yaml\"\nplaybooks = [\"b.yaml\"]\n").expect("write");
        let err = AgentConfig::load(&p).expect_err("both refused");
        assert!(err.to_string().contains("not both"), "{err}");
        std::fs::write(&p, "playbook = \"a.yaml\"\n[ssh]\nusr = \"x\"\n").expect("write");
        assert!(AgentConfig::load(&p).is_err(), "unknown ssh field refused");
        std::fs::write(
            &p,
            "playbook = \"a.yaml\"\n[fail_fast]\nrma = false\n[remediation]\nreset_gpu = \"nvidia-smi -r -i {gpus}\"\n",
        )
        .expect("write");
        let c = AgentConfig::load(&p).expect("load");
        assert!(!c.fail_fast.rma && c.fail_fast.repeated);
        assert_eq!(c.remediation.reset_gpu, "nvidia-smi -r -i {gpus}");
        assert!(c.remediation.reboot.is_empty());
    }

    #[test]
    fn environment_variables_reach_keys_inside_sections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("agent.toml");
        std::fs::write(&p, "playbook = \"a.yaml\"\n[ssh]\nuser = \"kiln\"\n").expect("write");
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = AgentConfig::load_from(
            &p,
            env(&[
                ("KILN_AGENT__SSH__USER", "burnin"),
                ("KILN_AGENT__REDFISH__PASSWORD", "s3cret"),
                ("KILN_AGENT__AGENT_ID", "bastion-3"),
            ]),
        )
        .expect("load");
        assert_eq!(c.ssh.user, "burnin");
        assert_eq!(c.redfish.password.as_deref(), Some("s3cret"));
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the password is in Debug"
        );
        assert_eq!(c.agent_id, "bastion-3");
        let err = AgentConfig::load_from(&p, env(&[("KILN_AGENT__SSH__USR", "x")]))
            .expect_err("unknown key refused");
        assert!(format!("{err:#}").contains("usr"), "{err:#}");
    }
}
