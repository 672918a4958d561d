//! `kiln demo --secure`: the demo with security on every listener it opens, set up as
//! docs/security.md tells an operator to. A throwaway CA and certificates (kiln-tls's `Ca`);
//! the broker's Kafka listener SASL_SSL with SCRAM-SHA-512 and `[authorization]`; one SCRAM
//! user per service (intake, agents, dead-letter triage, the dashboard's lag sampler), each
//! allowed only its role's ACLs; the dashboard over HTTPS behind a token with `read` scope.
//!
//! Every password and the token are drawn here at random and written only to files of mode
//! 0600 under `<dir>/secrets` (so a person can use them with `--stay`); nothing prints them.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kiln_acl::{Binding, Operation, PatternType, Permission, ResourceType};
use kiln_broker::config::{AuthorizationSettings, ListenerTlsSettings, SaslSettings};
use kiln_broker::BrokerConfig;
use kiln_client::{Connection, SaslLogin};
use kiln_queue::KafkaSettings;
use kiln_sasl::Mechanism;

/// The bootstrap user: a super user, who creates the others and the topics.
pub const ADMIN: &str = "admin";
/// One SCRAM user per service; each logs in as its own.
pub const SERVICES: [&str; 4] = ["intake", "agent", "deadletter", "dashboard"];
/// The one mechanism the demo's listener offers.
const MECHANISM: Mechanism = Mechanism::ScramSha512;
/// Host names the demo's certificates carry: every demo listener is on loopback.
const HOSTS: [&str; 2] = ["127.0.0.1", "localhost"];
/// How long the admin may take to log in for the first time: the controller writes the
/// bootstrap user's credential through the metadata log a moment after the listener opens.
const FIRST_LOGIN_WAIT: Duration = Duration::from_secs(20);
/// Wait after a failed login before the next try; the broker's own delay comes on top.
const LOGIN_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Where the demo's topics and groups are, which the roles' ACLs name.
pub struct Resources<'a> {
    pub nodes_topic: &'a str,
    pub dlq_topic: &'a str,
    pub agents_group: &'a str,
    pub triage_group: &'a str,
}

/// The secrets and certificates of one secure demo.
pub struct DemoSecurity {
    secrets: PathBuf,
    ca_file: PathBuf,
    passwords: BTreeMap<&'static str, String>,
    tokens_file: PathBuf,
}

impl DemoSecurity {
    /// Makes the CA, the broker's and the dashboard's certificates, a password per user and
    /// the dashboard's token, all under `<dir>/secrets`.
    pub fn create(dir: &Path) -> anyhow::Result<DemoSecurity> {
        let secrets = dir.join("secrets");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&secrets)
            .with_context(|| format!("creating {}", secrets.display()))?;
        let ca = kiln_tls::Ca::generate("kiln demo CA")?;
        ca.write(&secrets)?;
        let hosts: Vec<String> = HOSTS.iter().map(|h| h.to_string()).collect();
        ca.issue_broker(0, &hosts)?.write(&secrets, "broker")?;
        ca.issue("dashboard", &hosts, kiln_tls::Validity::default())?
            .write(&secrets, "dashboard")?;

        let mut passwords = BTreeMap::new();
        for user in std::iter::once(ADMIN).chain(SERVICES) {
            // 256 random bits, drawn as kiln-web draws tokens.
            let password = kiln_web::tokens::generate()?;
            write_secret(&secrets.join(format!("{user}.password")), &password)?;
            passwords.insert(user, password);
        }
        let tokens_file = secrets.join("dashboard.tokens");
        let scopes = kiln_web::Scopes::parse("read").map_err(anyhow::Error::msg)?;
        let token = kiln_web::tokens::add(&tokens_file, "demo", scopes)?;
        write_secret(&secrets.join("dashboard.token"), &token)?;
        Ok(DemoSecurity {
            ca_file: secrets.join("ca.crt"),
            secrets,
            passwords,
            tokens_file,
        })
    }

    /// The directory holding the CA, the certificates, the passwords and the token.
    pub fn secrets_dir(&self) -> &Path {
        &self.secrets
    }

    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The file holding `user`'s password.
    pub fn password_file(&self, user: &str) -> PathBuf {
        self.secrets.join(format!("{user}.password"))
    }

    /// The file holding the dashboard's token.
    pub fn token_file(&self) -> PathBuf {
        self.secrets.join("dashboard.token")
    }

    fn password(&self, user: &str) -> anyhow::Result<&str> {
        self.passwords
            .get(user)
            .map(String::as_str)
            .with_context(|| format!("the demo has no user {user:?}"))
    }

    /// `[tls]`, `[sasl]` (SCRAM-SHA-512, `admin` the bootstrap user) and `[authorization]`
    /// (nothing allowed that no ACL allows) on the broker's one listener.
    pub fn secure_broker(&self, config: &mut BrokerConfig) {
        config.tls = Some(ListenerTlsSettings {
            cert_file: self.secrets.join("broker.crt"),
            key_file: self.secrets.join("broker.key"),
            client_ca_file: None,
            client_auth: None,
        });
        config.sasl = Some(SaslSettings {
            mechanisms: vec![MECHANISM.name().to_string()],
            // The admin's first logins may come before its credential is written (see
            // FIRST_LOGIN_WAIT); a short refusal delay keeps those retries quick.
            failed_authentication_delay_ms: 100,
            bootstrap_user: Some(ADMIN.to_string()),
            bootstrap_password_file: Some(self.password_file(ADMIN)),
            ..SaslSettings::default()
        });
        config.authorization = Some(AuthorizationSettings::default());
    }

    /// librdkafka's settings to log in as `user` over SASL_SSL.
    pub fn librdkafka(&self, user: &str) -> anyhow::Result<KafkaSettings> {
        let mut settings = KafkaSettings::default();
        for (k, v) in [
            ("security.protocol", "SASL_SSL"),
            ("ssl.ca.location", &self.ca_file.display().to_string()),
            ("sasl.mechanism", MECHANISM.name()),
            ("sasl.username", user),
            (kiln_queue::SASL_PASSWORD, self.password(user)?),
        ] {
            settings.0.insert(k.to_string(), v.to_string());
        }
        Ok(settings)
    }

    /// kiln-client's settings to log in as `user` (the dashboard's lag sampler, the admin).
    pub fn client(&self, user: &str) -> anyhow::Result<kiln_client::Security> {
        Ok(kiln_client::Security {
            tls: Some(kiln_tls::client_connector(&self.ca_file, None)?),
            sasl: Some(SaslLogin {
                mechanism: MECHANISM.name().to_string(),
                user: user.to_string(),
                password: self.password(user)?.to_string(),
            }),
        })
    }

    /// HTTPS with the dashboard's certificate, and its token file.
    pub fn dashboard_web(&self) -> anyhow::Result<kiln_web::WebSecurity> {
        let files = kiln_tls::ServerTlsFiles {
            cert_file: self.secrets.join("dashboard.crt"),
            key_file: self.secrets.join("dashboard.key"),
            client_ca_file: None,
            client_auth: kiln_tls::ClientAuth::None,
        };
        Ok(kiln_web::WebSecurity {
            tls: Some(Arc::new(kiln_tls::ServerTls::load(files)?)),
            tokens: Some(Arc::new(kiln_web::TokenFile::open(&self.tokens_file)?)),
        })
    }

    /// Logs in as the admin (waiting for its credential), creates every service's user and
    /// gives each its role's ACLs and nothing more.
    pub async fn create_users_and_acls(
        &self,
        bootstrap: &str,
        resources: &Resources<'_>,
    ) -> anyhow::Result<()> {
        let timeout = Duration::from_secs(10);
        let admin = self.client(ADMIN)?;
        let deadline = Instant::now() + FIRST_LOGIN_WAIT;
        let conn = loop {
            match Connection::open(bootstrap, timeout, &admin).await {
                Ok(conn) => break conn,
                Err(e) if Instant::now() >= deadline => {
                    bail!(
                        "the demo's admin could not log in to {bootstrap} within {} s: {e}",
                        FIRST_LOGIN_WAIT.as_secs()
                    )
                }
                Err(_) => tokio::time::sleep(LOGIN_RETRY_PAUSE).await,
            }
        };
        let mut conn = crate::topics_cmd::connect_controller(conn, timeout, &admin).await?;
        for user in SERVICES {
            crate::users_cmd::create_user(
                &mut conn,
                timeout,
                user,
                self.password(user)?,
                &[MECHANISM],
                kiln_sasl::ITERATIONS_DEFAULT,
            )
            .await
            .with_context(|| format!("creating the demo's user {user}"))?;
        }
        crate::acls_cmd::create_bindings(&mut conn, timeout, &role_bindings(resources))
            .await
            .context("creating the demo's ACLs")
    }
}

/// Each service's ACLs, as docs/security.md ("ACLs") lists them: intake writes nodes; agents
/// read nodes in their group and write retries and dead letters; triage reads dead letters
/// in its group; the dashboard's lag sampler describes both groups and topics.
pub fn role_bindings(r: &Resources<'_>) -> Vec<Binding> {
    use Operation::{Create, Describe, Read, Write};
    use ResourceType::{Group, Topic};
    let roles: [(&str, ResourceType, &str, &[Operation]); 10] = [
        ("intake", Topic, r.nodes_topic, &[Write, Create]),
        ("agent", Group, r.agents_group, &[Read]),
        ("agent", Topic, r.nodes_topic, &[Read, Write]),
        ("agent", Topic, r.dlq_topic, &[Write]),
        ("deadletter", Group, r.triage_group, &[Read]),
        ("deadletter", Topic, r.dlq_topic, &[Read]),
        ("dashboard", Group, r.agents_group, &[Describe]),
        ("dashboard", Topic, r.nodes_topic, &[Describe]),
        ("dashboard", Group, r.triage_group, &[Describe]),
        ("dashboard", Topic, r.dlq_topic, &[Describe]),
    ];
    roles
        .iter()
        .flat_map(|(user, resource_type, name, operations)| {
            operations.iter().map(move |operation| Binding {
                resource_type: *resource_type,
                pattern: PatternType::Literal,
                name: name.to_string(),
                principal: format!("User:{user}"),
                host: kiln_acl::WILDCARD.to_string(),
                operation: *operation,
                permission: Permission::Allow,
            })
        })
        .collect()
}

/// Writes `text` (and a newline) to a new file only its owner may read.
fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{text}").with_context(|| format!("writing {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn secrets_are_files_only_their_owner_reads_and_debug_never_shows_them() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let security = DemoSecurity::create(dir.path()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(security.secrets_dir()), 0o700);
        for user in std::iter::once(ADMIN).chain(SERVICES) {
            let file = security.password_file(user);
            assert_eq!(mode(&file), 0o600, "{}", file.display());
            let written = std::fs::read_to_string(&file).unwrap();
            assert_eq!(written.trim_end(), security.password(user).unwrap());
            let settings = security.librdkafka(user).unwrap();
            assert!(!format!("{settings:?}").contains(written.trim_end()));
            let client = security.client(user).unwrap();
            assert!(!format!("{client:?}").contains(written.trim_end()));
        }
        assert_eq!(mode(&security.token_file()), 0o600);
        assert_eq!(mode(&security.secrets_dir().join("ca.key")), 0o600);
        // Two users never share a password.
        let distinct: std::collections::BTreeSet<&String> = security.passwords.values().collect();
        assert_eq!(distinct.len(), SERVICES.len() + 1);
    }

    #[test]
    fn each_role_is_allowed_only_on_its_own_topics_and_groups() {
        let r = Resources {
            nodes_topic: "kiln.nodes",
            dlq_topic: "kiln.nodes.dlq",
            agents_group: "burnin",
            triage_group: "deadletter",
        };
        let bindings = role_bindings(&r);
        for b in &bindings {
            b.validate().unwrap();
            assert_eq!(b.permission, Permission::Allow);
        }
        let has = |user: &str, t: ResourceType, name: &str, op: Operation| {
            bindings.iter().any(|b| {
                b.principal == format!("User:{user}")
                    && b.resource_type == t
                    && b.name == name
                    && b.operation == op
            })
        };
        assert!(has(
            "intake",
            ResourceType::Topic,
            "kiln.nodes",
            Operation::Write
        ));
        assert!(!has(
            "intake",
            ResourceType::Topic,
            "kiln.nodes",
            Operation::Read
        ));
        assert!(has(
            "agent",
            ResourceType::Topic,
            "kiln.nodes.dlq",
            Operation::Write
        ));
        assert!(!has(
            "agent",
            ResourceType::Topic,
            "kiln.nodes.dlq",
            Operation::Read
        ));
        assert!(has(
            "deadletter",
            ResourceType::Group,
            "deadletter",
            Operation::Read
        ));
        assert!(!has(
            "deadletter",
            ResourceType::Group,
            "burnin",
            Operation::Read
        ));
        assert!(bindings
            .iter()
            .filter(|b| b.principal == "User:dashboard")
            .all(|b| b.operation == Operation::Describe));
    }
}
