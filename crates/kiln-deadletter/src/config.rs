//! Settings: built-in defaults, then a TOML file (`kiln deadletter --config FILE`, see
//! `deploy/deadletter.example.toml`), then `KILN_DEADLETTER__*` environment variables
//! (`KILN_DEADLETTER__SMTP__PASSWORD=...`). Empty strings mean "not set": the `config` crate
//! layers plain values more predictably than options.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::schedule::Schedule;

/// `Debug` shows `database_url` without its password, `[kafka]` without its secrets and
/// `[smtp]` without its password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadletterConfig {
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// The results store (`sqlite://PATH` or `postgres://...`).
    pub database_url: String,
    /// A file whose first line is PostgreSQL's password, kept out of `database_url`.
    pub database_password_file: Option<PathBuf>,
    /// Consumer group (`deadletter`): its own, so the triage service's offsets are independent
    /// of anyone else reading the dead-letter topic.
    pub group: String,
    /// The dead-letter topic (`kiln.nodes.dlq`).
    pub topic: String,
    /// This instance's name, recorded with the report day it claims.
    pub instance_id: String,
    /// Consumer session timeout, ms.
    pub session_timeout_ms: u64,
    /// At start, how long a due report waits for the consumer to catch up with the topic, ms.
    pub catch_up_timeout_ms: u64,
    /// Timeout of each store operation, ms.
    pub step_timeout_ms: u64,
    /// Extra librdkafka settings for the consumer (e.g. `security.protocol`).
    pub kafka: kiln_queue::KafkaSettings,
    /// File whose first line is librdkafka's `sasl.password` (instead of `[kafka]`).
    pub kafka_password_file: Option<PathBuf>,
    /// librdkafka's `sasl.password` as a setting of its own, so it can come from the
    /// environment (`KILN_DEADLETTER__KAFKA_PASSWORD`).
    pub kafka_password: Option<String>,
    pub report: ReportConfig,
    /// `smtp` or `file`.
    pub transport: TransportKind,
    pub smtp: SmtpConfig,
    pub file: FileConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// Local time of day the report is sent, `HH:MM`.
    pub time: String,
    /// IANA time zone of `time` and of the report's day and timestamps.
    pub timezone: String,
    /// Sender address, e.g. `Kiln <kiln@example.com>`.
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
    /// Subject prefix; the day and counts follow.
    pub subject: String,
    /// Send a report even when no node is dead-lettered (a daily "all clear").
    pub send_when_empty: bool,
    /// The dashboard's address (`https://kiln.example.com`): the report links each node to
    /// its page there, where evidence the email leaves out is shown whole. Empty: no links.
    pub dashboard_url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Smtp,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// Plain connection upgraded with STARTTLS, which is required (port 587).
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No TLS at all: only to a loopback address (a local relay or a test server).
    Plain,
}

/// `[smtp]`. Its `Debug` leaves the password out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SmtpConfig {
    pub host: String,
    /// 0: the usual port of `security` (587, 465, 25).
    pub port: u16,
    pub security: Security,
    /// Authentication is used when `username` is set.
    pub username: String,
    pub password: String,
    /// A file holding the password (one line), instead of `password`.
    pub password_file: PathBuf,
    /// Limit on one whole SMTP exchange (connect, TLS, authentication, the message), ms.
    pub timeout_ms: u64,
    /// Extra PEM root certificate(s) to trust (a private CA); the system roots stay trusted.
    pub ca_file: PathBuf,
    /// Name sent in EHLO; empty: this machine's hostname.
    pub hello_name: String,
}

impl std::fmt::Debug for SmtpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("security", &self.security)
            .field("username", &self.username)
            .field(
                "password",
                &if self.password.is_empty() {
                    ""
                } else {
                    "[redacted]"
                },
            )
            .field("password_file", &self.password_file)
            .field("timeout_ms", &self.timeout_ms)
            .field("ca_file", &self.ca_file)
            .field("hello_name", &self.hello_name)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// Directory the file transport writes each email to (`<id>.eml`); created if missing.
    pub dir: PathBuf,
}

impl std::fmt::Debug for DeadletterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, so a new one cannot slip past this without a decision here.
        let DeadletterConfig {
            bootstrap,
            database_url,
            database_password_file,
            group,
            topic,
            instance_id,
            session_timeout_ms,
            catch_up_timeout_ms,
            step_timeout_ms,
            kafka,
            kafka_password_file,
            kafka_password,
            report,
            transport,
            smtp,
            file,
        } = self;
        f.debug_struct("DeadletterConfig")
            .field("bootstrap", bootstrap)
            .field("database_url", &kiln_store::redact_url(database_url))
            .field("database_password_file", database_password_file)
            .field("group", group)
            .field("topic", topic)
            .field("instance_id", instance_id)
            .field("session_timeout_ms", session_timeout_ms)
            .field("catch_up_timeout_ms", catch_up_timeout_ms)
            .field("step_timeout_ms", step_timeout_ms)
            .field("kafka", kafka)
            .field("kafka_password_file", kafka_password_file)
            .field(
                "kafka_password",
                &kafka_password.as_ref().map(|_| "[redacted]"),
            )
            .field("report", report)
            .field("transport", transport)
            .field("smtp", smtp)
            .field("file", file)
            .finish()
    }
}

impl Default for DeadletterConfig {
    fn default() -> Self {
        DeadletterConfig {
            bootstrap: "127.0.0.1:9092".into(),
            database_url: "sqlite://kiln.db".into(),
            database_password_file: None,
            group: "deadletter".into(),
            topic: format!("{}.dlq", kiln_queue::NODES_TOPIC),
            instance_id: format!("deadletter-{}", std::process::id()),
            session_timeout_ms: 10_000,
            catch_up_timeout_ms: 30_000,
            step_timeout_ms: 30_000,
            kafka: kiln_queue::KafkaSettings::default(),
            kafka_password_file: None,
            kafka_password: None,
            report: ReportConfig::default(),
            transport: TransportKind::Smtp,
            smtp: SmtpConfig::default(),
            file: FileConfig::default(),
        }
    }
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            time: "08:00".into(),
            timezone: "UTC".into(),
            from: "Kiln <kiln@localhost>".into(),
            to: Vec::new(),
            subject: "Kiln dead-lettered nodes".into(),
            send_when_empty: false,
            dashboard_url: String::new(),
        }
    }
}

impl Default for SmtpConfig {
    fn default() -> Self {
        SmtpConfig {
            host: "localhost".into(),
            port: 0,
            security: Security::Starttls,
            username: String::new(),
            password: String::new(),
            password_file: PathBuf::new(),
            timeout_ms: 30_000,
            ca_file: PathBuf::new(),
            hello_name: String::new(),
        }
    }
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            dir: PathBuf::from("deadletter-mail"),
        }
    }
}

impl SmtpConfig {
    pub fn port_or_default(&self) -> u16 {
        match (self.port, self.security) {
            (0, Security::Starttls) => 587,
            (0, Security::Tls) => 465,
            (0, Security::Plain) => 25,
            (p, _) => p,
        }
    }
}

impl DeadletterConfig {
    /// Defaults, then `path` (if given), then `KILN_DEADLETTER__<SECTION>__<KEY>` variables
    /// (`kiln_settings::load`); validated.
    pub fn load(path: Option<&Path>) -> anyhow::Result<DeadletterConfig> {
        let shown = path.map_or("(no file)".to_string(), |p| p.display().to_string());
        let mut config: DeadletterConfig =
            kiln_settings::load(kiln_settings::Service::Deadletter, path, std::env::vars())
                .with_context(|| format!("reading deadletter settings {shown}"))?;
        config
            .validate()
            .with_context(|| format!("deadletter settings {shown}"))?;
        match (
            config.kafka_password.clone(),
            config.kafka_password_file.clone(),
        ) {
            (Some(_), Some(_)) => bail!("set kafka_password or kafka_password_file, not both"),
            (Some(password), None) => config.kafka.add_password("kafka_password", &password)?,
            (None, Some(file)) => config
                .kafka
                .add_password_file("kafka_password_file", &file)?,
            (None, None) => {}
        }
        Ok(config)
    }

    /// Checks everything that does not need the network. Mail settings are checked further
    /// when the mailer is built (`crate::mail::Mailer::new`).
    pub fn validate(&self) -> anyhow::Result<()> {
        self.schedule()?;
        if self.group.trim().is_empty() || self.topic.trim().is_empty() {
            bail!("group and topic must not be empty");
        }
        if self.instance_id.trim().is_empty() {
            bail!("instance_id must not be empty");
        }
        let url = self.report.dashboard_url.as_str();
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            bail!("report.dashboard_url {url:?} must start with http:// or https://");
        }
        if self.step_timeout_ms == 0 || self.smtp.timeout_ms == 0 {
            bail!("step_timeout_ms and smtp.timeout_ms must be > 0");
        }
        if !self.smtp.password.is_empty() && !self.smtp.password_file.as_os_str().is_empty() {
            bail!("set smtp.password or smtp.password_file, not both");
        }
        Ok(())
    }

    /// The report's schedule (time of day and zone).
    pub fn schedule(&self) -> anyhow::Result<Schedule> {
        Schedule::parse(&self.report.time, &self.report.timezone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_the_smtp_password_out() {
        let mut c = DeadletterConfig::default();
        c.smtp.password = "hunter2-smtp".into();
        c.database_url = "postgres://kiln:hunter2-db@db/kiln".into();
        c.kafka_password = Some("hunter2-kafka-env".into());
        c.kafka
            .0
            .insert("sasl.password".into(), "hunter2-kafka".into());
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
        assert!(shown.contains("postgres://kiln:***@db/kiln"), "{shown}");
    }

    #[test]
    fn defaults_file_and_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("dl.toml");
        std::fs::write(
            &p,
            "bootstrap = \"h:1\"\ntransport = \"file\"\n[report]\ntime = \"06:30\"\n\
             timezone = \"Europe/Berlin\"\nto = [\"ops@example.com\"]\n\
             [smtp]\nsecurity = \"tls\"\n[file]\ndir = \"/tmp/x\"\n",
        )
        .expect("write");
        let c = DeadletterConfig::load(Some(&p)).expect("load");
        assert_eq!(c.bootstrap, "h:1");
        assert_eq!(c.group, "deadletter");
        assert_eq!(c.topic, "kiln.nodes.dlq");
        assert_eq!(c.transport, TransportKind::File);
        assert_eq!(c.report.to, vec!["ops@example.com".to_string()]);
        assert_eq!(c.smtp.port_or_default(), 465);
        assert_eq!(c.file.dir, PathBuf::from("/tmp/x"));
        for bad in [
            "[report]\ntime = \"25:00\"\n",
            "[report]\ntimezone = \"Mars/Olympus\"\n",
            "[smtp]\nsecurity = \"ssl3\"\n",
            "transport = \"pigeon\"\n",
            "no_such_key = 1\n",
            "[smtp]\npassword = \"a\"\npassword_file = \"/p\"\n",
            "[report]\ndashboard_url = \"kiln.example.com\"\n",
        ] {
            std::fs::write(&p, bad).expect("write");
            let err = DeadletterConfig::load(Some(&p)).expect_err(bad);
            assert!(!format!("{err:#}").is_empty());
        }
        assert!(DeadletterConfig::load(Some(&dir.path().join("missing.toml"))).is_err());
    }

    #[test]
    fn the_example_config_loads() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/deadletter.example.toml");
        let c = DeadletterConfig::load(Some(&p)).expect("deploy/deadletter.example.toml loads");
        assert_eq!(c.smtp.security, Security::Starttls);
        assert!(!c.report.to.is_empty());
    }
}
