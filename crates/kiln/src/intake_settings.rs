//! `kiln intake serve`'s settings: built-in defaults (today's flag defaults), then
//! `--config FILE` (deploy/intake.example.toml), then `KILN_INTAKE__<SECTION>__<KEY>`
//! variables (`kiln_settings::load`), then the flags. The producer flags `kiln intake
//! register` shares (`--topic`, `--kafka-config`, `--kafka-config-file`) are here too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use kiln_queue::{KafkaSettings, ProducerConfig};
use kiln_settings::Service;
use serde::{Deserialize, Serialize};

use crate::settings::over;
use crate::web_args::{HttpsSettings, WebArgs};

/// `Debug` shows `database_url` without its password and no Kafka password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntakeSettings {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// The results store (`sqlite://PATH` or `postgres://...`).
    pub database_url: String,
    /// A file whose first line is PostgreSQL's password, kept out of `database_url`.
    pub database_password_file: Option<PathBuf>,
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// Topic nodes are queued on.
    pub topic: String,
    /// Extra librdkafka producer settings (`security.protocol`, `sasl.username`, ...).
    pub kafka: KafkaSettings,
    /// librdkafka's `sasl.password` as a setting of its own, so it can come from the
    /// environment (`KILN_INTAKE__KAFKA_PASSWORD`), or ...
    pub kafka_password: Option<String>,
    /// ... from a file's first line.
    pub kafka_password_file: Option<PathBuf>,
    /// Bearer tokens (kiln tokens create); every request but /healthz needs a `write` one.
    pub tokens_file: Option<PathBuf>,
    /// Serve without authentication on an address other than loopback.
    pub insecure_no_auth: bool,
    pub https: HttpsSettings,
}

impl Default for IntakeSettings {
    fn default() -> Self {
        IntakeSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: "sqlite://kiln.db".into(),
            database_password_file: None,
            bootstrap: "127.0.0.1:9092".into(),
            topic: kiln_queue::NODES_TOPIC.into(),
            kafka: KafkaSettings::default(),
            kafka_password: None,
            kafka_password_file: None,
            tokens_file: None,
            insecure_no_auth: false,
            https: HttpsSettings::default(),
        }
    }
}

impl std::fmt::Debug for IntakeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, so a new one cannot slip past this without a decision here.
        let IntakeSettings {
            listen,
            database_url,
            database_password_file,
            bootstrap,
            topic,
            kafka,
            kafka_password,
            kafka_password_file,
            tokens_file,
            insecure_no_auth,
            https,
        } = self;
        f.debug_struct("IntakeSettings")
            .field("listen", listen)
            .field("database_url", &kiln_store::redact_url(database_url))
            .field("database_password_file", database_password_file)
            .field("bootstrap", bootstrap)
            .field("topic", topic)
            .field("kafka", kafka)
            .field(
                "kafka_password",
                &kafka_password.as_ref().map(|_| "[redacted]"),
            )
            .field("kafka_password_file", kafka_password_file)
            .field("tokens_file", tokens_file)
            .field("insecure_no_auth", insecure_no_auth)
            .field("https", https)
            .finish()
    }
}

/// The producer flags of `kiln intake register` and `kiln intake serve`.
#[derive(Args, Debug, Default)]
pub struct ProducerArgs {
    /// Topic nodes are queued on [default: kiln.nodes]. Setting: topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Extra librdkafka producer setting (repeatable), e.g. linger.ms=20 or sasl.username=U;
    /// secrets (sasl.password, ...) only in --kafka-config-file or the settings.
    #[arg(long = "kafka-config", value_name = "KEY=VALUE")]
    pub kafka_config: Vec<String>,
    /// File of librdkafka producer settings, one KEY=VALUE per line (`#` starts a comment),
    /// applied before --kafka-config: a place for sasl.password, which must not be a flag.
    #[arg(long = "kafka-config-file", value_name = "FILE")]
    pub kafka_config_file: Option<PathBuf>,
}

impl ProducerArgs {
    /// The librdkafka settings the flags give: the file's, then each `--kafka-config`.
    pub fn extra(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut extra = match &self.kafka_config_file {
            Some(file) => read_kafka_config_file(file)?,
            None => Vec::new(),
        };
        for (i, kv) in self.kafka_config.iter().enumerate() {
            let Some((k, v)) = kv.split_once('=') else {
                // Its text is not shown: a mistyped `sasl.password:...` would be a password.
                bail!(
                    "--kafka-config number {} has no '=': expected KEY=VALUE",
                    i + 1
                );
            };
            // A flag shows in `ps` and shell history: secrets come from a file or settings.
            if kiln_queue::is_secret_setting(k) {
                bail!(
                    "--kafka-config {}: a secret is not taken from the command line; put it in \
                     --kafka-config-file or the settings (kafka_password_file, kafka_password)",
                    k.trim()
                );
            }
            extra.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(extra)
    }
}

/// Longest `--kafka-config-file` read, in bytes: librdkafka settings, not data.
const KAFKA_CONFIG_FILE_BYTES_MAX: u64 = 64 * 1024;

/// `KEY=VALUE` lines; blank lines and `#` comments are skipped, anything else is refused with
/// its line number (never its text: the line may hold a password).
fn read_kafka_config_file(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("--kafka-config-file {shown}"))?;
    if meta.len() > KAFKA_CONFIG_FILE_BYTES_MAX {
        bail!("--kafka-config-file {shown} is over {KAFKA_CONFIG_FILE_BYTES_MAX} bytes");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--kafka-config-file {shown}"))?;
    let mut settings = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                settings.push((k.trim().to_string(), v.trim().to_string()))
            }
            _ => bail!(
                "--kafka-config-file {shown} line {}: expected KEY=VALUE",
                i + 1
            ),
        }
    }
    Ok(settings)
}

/// `kiln intake serve`'s flags: each overrides its setting.
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// Settings file (TOML; deploy/intake.example.toml). KILN_INTAKE__<SECTION>__<KEY>
    /// variables override it (KILN_INTAKE__HTTPS__CERT_FILE), flags override both.
    #[arg(long, env = "KILN_INTAKE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080]. Setting: listen.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Results store: sqlite://PATH or postgres://USER@HOST:PORT/DB [default:
    /// sqlite://kiln.db]. Setting: database_url (a password is better kept there, or in
    /// database_password_file, than on a command line).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Kafka bootstrap servers [default: 127.0.0.1:9092]. Setting: bootstrap.
    #[arg(long)]
    pub bootstrap: Option<String>,
    #[command(flatten)]
    pub producer: ProducerArgs,
    #[command(flatten)]
    pub web: WebArgs,
}

impl IntakeSettings {
    /// Defaults, the file, the variables in `env`, then the flags in `args`.
    pub fn load(
        args: &ServeArgs,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<IntakeSettings> {
        let mut s: IntakeSettings =
            kiln_settings::load(Service::Intake, args.config.as_deref(), env)
                .context("reading intake settings")?;
        over(&mut s.listen, &args.listen);
        over(&mut s.database_url, &args.database_url);
        over(&mut s.bootstrap, &args.bootstrap);
        over(&mut s.topic, &args.producer.topic);
        args.web
            .apply(&mut s.https, &mut s.tokens_file, &mut s.insecure_no_auth);
        if s.topic.trim().is_empty() || s.bootstrap.trim().is_empty() {
            bail!("intake settings: topic and bootstrap must not be empty");
        }
        if s.kafka_password.is_some() && s.kafka_password_file.is_some() {
            bail!("intake settings: set kafka_password or kafka_password_file, not both");
        }
        Ok(s)
    }

    /// The producer: `[kafka]`, the Kafka password setting, then the producer flags.
    pub fn producer_config(&self, flags: &ProducerArgs) -> anyhow::Result<ProducerConfig> {
        let mut kafka = self.kafka.clone();
        if let Some(password) = &self.kafka_password {
            kafka.add_password("kafka_password", password)?;
        }
        if let Some(file) = &self.kafka_password_file {
            kafka.add_password_file("kafka_password_file", file)?;
        }
        let mut config = ProducerConfig::new(&self.bootstrap);
        config.topic.clone_from(&self.topic);
        config.extra = kafka.0.into_iter().collect();
        // Flags win: a later entry of the same key is what librdkafka keeps.
        config.extra.extend(flags.extra()?);
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::settings::test_support::{env, file};

    #[test]
    fn defaults_are_the_flags_defaults() {
        let s = IntakeSettings::load(&ServeArgs::default(), env(&[])).unwrap();
        assert_eq!(s, IntakeSettings::default());
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.database_url, "sqlite://kiln.db");
        assert_eq!(s.bootstrap, "127.0.0.1:9092");
        assert_eq!(s.topic, "kiln.nodes");
        assert!(s.tokens_file.is_none() && s.https.cert_file.is_none() && !s.insecure_no_auth);
    }

    #[test]
    fn default_then_file_then_environment_then_flag() {
        let f = file(
            "listen = \"127.0.0.1:1001\"\nbootstrap = \"file:9092\"\ntopic = \"file.topic\"\n\
             tokens_file = \"/file/tokens\"\n[https]\ncert_file = \"/file.crt\"\n\
             key_file = \"/file.key\"\n[kafka]\n\"security.protocol\" = \"SASL_SSL\"\n",
        );
        let args = ServeArgs {
            config: Some(f.path().to_path_buf()),
            listen: Some("127.0.0.1:3003".parse().unwrap()),
            web: WebArgs {
                https_key: Some("/flag.key".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = IntakeSettings::load(
            &args,
            env(&[
                ("KILN_INTAKE__LISTEN", "127.0.0.1:2002"),
                ("KILN_INTAKE__BOOTSTRAP", "env:9092"),
                ("KILN_INTAKE__HTTPS__KEY_FILE", "/env.key"),
                ("KILN_INTAKE__HTTPS__CLIENT_CA_FILE", "/env-ca.crt"),
                ("KILN_INTAKE_CONFIG", "/the/--config/flag/reads/this"),
            ]),
        )
        .unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:3003", "a flag beats all");
        assert_eq!(s.bootstrap, "env:9092", "the environment beats the file");
        assert_eq!(s.topic, "file.topic", "the file beats the default");
        assert_eq!(s.database_url, "sqlite://kiln.db", "the default stays");
        assert_eq!(s.https.cert_file, Some("/file.crt".into()));
        assert_eq!(s.https.key_file, Some("/flag.key".into()));
        assert_eq!(s.https.client_ca_file, Some("/env-ca.crt".into()));
        assert_eq!(s.tokens_file, Some("/file/tokens".into()));
        assert_eq!(s.kafka.0["security.protocol"], "SASL_SSL");
    }

    #[test]
    fn unknown_keys_bad_values_and_missing_files_are_named() {
        let f = file("[https]\ncert = \"/x\"\n");
        let args = ServeArgs {
            config: Some(f.path().to_path_buf()),
            ..Default::default()
        };
        let err = format!("{:#}", IntakeSettings::load(&args, env(&[])).unwrap_err());
        assert!(
            err.contains("cert") && err.contains(&f.path().display().to_string()),
            "{err}"
        );
        for (var, value) in [
            ("KILN_INTAKE__TOKEN_FILE", "/t"),
            ("KILN_INTAKE__LISTEN", "not-an-address"),
            ("KILN_INTAKE__INSECURE_NO_AUTH", "maybe"),
        ] {
            let err = format!(
                "{:#}",
                IntakeSettings::load(&ServeArgs::default(), env(&[(var, value)])).unwrap_err()
            );
            assert!(err.contains(var), "{err}");
        }
        let args = ServeArgs {
            config: Some("/nonexistent/intake.toml".into()),
            ..Default::default()
        };
        let err = format!("{:#}", IntakeSettings::load(&args, env(&[])).unwrap_err());
        assert!(err.contains("/nonexistent/intake.toml") && err.contains("does not exist"));
        let err = format!(
            "{:#}",
            IntakeSettings::load(
                &ServeArgs::default(),
                env(&[("KILN_TOKENS_FILE", "/etc/kiln/tokens")])
            )
            .unwrap_err()
        );
        assert!(err.contains("KILN_INTAKE__TOKENS_FILE"), "{err}");
    }

    #[test]
    fn secrets_come_from_the_environment_or_files_and_never_show_in_debug() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("kafka.pw");
        std::fs::write(&pw, "hunter2-file\n").unwrap();
        let s = IntakeSettings::load(
            &ServeArgs::default(),
            env(&[
                (
                    "KILN_INTAKE__DATABASE_URL",
                    "postgres://kiln:hunter2-db@db/kiln",
                ),
                ("KILN_INTAKE__KAFKA_PASSWORD", "0042-hunter2-env"),
            ]),
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://kiln:***@db/kiln"), "{shown}");
        let producer = s.producer_config(&ProducerArgs::default()).unwrap();
        let password = producer.extra.iter().find(|(k, _)| k == "sasl.password");
        assert_eq!(password.unwrap().1, "0042-hunter2-env");
        assert!(!format!("{producer:?}").contains("hunter2"));

        let f = file(&format!("kafka_password_file = \"{}\"\n", pw.display()));
        let args = ServeArgs {
            config: Some(f.path().to_path_buf()),
            ..Default::default()
        };
        let s = IntakeSettings::load(&args, env(&[])).unwrap();
        let producer = s.producer_config(&ProducerArgs::default()).unwrap();
        assert!(producer
            .extra
            .contains(&("sasl.password".into(), "hunter2-file".into())));
        let err = IntakeSettings::load(&args, env(&[("KILN_INTAKE__KAFKA_PASSWORD", "x")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not both"), "{err}");
    }

    #[test]
    fn a_secret_as_a_kafka_config_flag_is_refused() {
        let flags = ProducerArgs {
            kafka_config: vec!["sasl.password=hunter2".into()],
            ..Default::default()
        };
        let err = IntakeSettings::default()
            .producer_config(&flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not taken from the command line") && !err.contains("hunter2"));
    }

    /// The shipped example loads with the real loader.
    #[test]
    fn the_example_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/intake.example.toml");
        let args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        let s = IntakeSettings::load(&args, env(&[])).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.topic, "kiln.nodes");
        assert!(s.https.cert_file.is_some() && s.tokens_file.is_some());
    }
}
