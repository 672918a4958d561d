//! The `--bootstrap`, `--timeout-s`, TLS and SASL flags every admin command shares, and
//! `BrokerLogin`: the same choices as settings (the dashboard's `[broker]`), and the one place
//! either becomes a kiln-client `Security`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use serde::{Deserialize, Serialize};

#[derive(Args, Debug)]
pub struct BrokerAddress {
    /// Broker to talk to.
    #[arg(
        long,
        global = true,
        env = "KILN_BOOTSTRAP",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap: String,
    /// How long to wait for the broker, in seconds.
    #[arg(long, global = true, default_value_t = 10)]
    pub timeout_s: u64,
    /// Connect over TLS, trusting this CA file (PEM) for the broker's certificate.
    #[arg(long, global = true, env = "KILN_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a listener that requires one; needs --tls-key.
    #[arg(long, global = true, env = "KILN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "KILN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Log in to a `[sasl]` listener as this user; the password comes from
    /// --sasl-password-file or the KILN_SASL_PASSWORD variable (never a flag).
    #[arg(long, global = true, env = "KILN_SASL_USER")]
    pub sasl_user: Option<String>,
    /// SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN.
    #[arg(
        long,
        global = true,
        env = "KILN_SASL_MECHANISM",
        default_value = "SCRAM-SHA-512"
    )]
    pub sasl_mechanism: String,
    /// File whose first line is the SASL password.
    #[arg(long, global = true, env = "KILN_SASL_PASSWORD_FILE")]
    pub sasl_password_file: Option<PathBuf>,
}

impl BrokerAddress {
    /// TLS and SASL as the flags ask for.
    pub fn security(&self) -> anyhow::Result<kiln_client::Security> {
        self.login().security()
    }

    /// The flags as settings; with a user and no password file, the password from
    /// KILN_SASL_PASSWORD (an operator's shell may export it for every command).
    fn login(&self) -> BrokerLogin {
        let sasl_password = match (&self.sasl_user, &self.sasl_password_file) {
            (Some(_), None) => std::env::var("KILN_SASL_PASSWORD").ok(),
            _ => None,
        };
        BrokerLogin {
            timeout_s: self.timeout_s,
            tls_ca_file: self.tls_ca.clone(),
            tls_cert_file: self.tls_cert.clone(),
            tls_key_file: self.tls_key.clone(),
            sasl_user: self.sasl_user.clone(),
            sasl_mechanism: self.sasl_mechanism.clone(),
            sasl_password,
            sasl_password_file: self.sasl_password_file.clone(),
        }
    }

    /// The wait for any one broker exchange (at least one second).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s.max(1))
    }

    /// A connection to `--bootstrap` with the flags' TLS and SASL, within `timeout`.
    pub async fn connect(&self) -> anyhow::Result<kiln_client::Connection> {
        let security = self.security()?;
        kiln_client::Connection::open(&self.bootstrap, self.timeout(), &security)
            .await
            .with_context(|| format!("connecting to {}", self.bootstrap))
    }
}

/// How a Kiln tool reaches a broker beyond its address: the timeout, TLS and SASL. Errors
/// name the flag and, in brackets, the setting. `Debug` leaves the password out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerLogin {
    /// How long to wait for the broker, in seconds (at least one).
    pub timeout_s: u64,
    /// Connect over TLS, trusting this CA file (PEM) for the broker's certificate.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for a listener that requires one; needs `tls_key_file`.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Log in to a `[sasl]` listener as this user.
    pub sasl_user: Option<String>,
    /// SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN.
    pub sasl_mechanism: String,
    /// The password itself (from the environment, say), or ...
    pub sasl_password: Option<String>,
    /// ... a file whose first line is the password.
    pub sasl_password_file: Option<PathBuf>,
}

impl Default for BrokerLogin {
    fn default() -> Self {
        BrokerLogin {
            timeout_s: 10,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            sasl_user: None,
            sasl_mechanism: "SCRAM-SHA-512".into(),
            sasl_password: None,
            sasl_password_file: None,
        }
    }
}

impl std::fmt::Debug for BrokerLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, so a new one cannot slip past this without a decision here.
        let BrokerLogin {
            timeout_s,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
            sasl_user,
            sasl_mechanism,
            sasl_password,
            sasl_password_file,
        } = self;
        f.debug_struct("BrokerLogin")
            .field("timeout_s", timeout_s)
            .field("tls_ca_file", tls_ca_file)
            .field("tls_cert_file", tls_cert_file)
            .field("tls_key_file", tls_key_file)
            .field("sasl_user", sasl_user)
            .field("sasl_mechanism", sasl_mechanism)
            .field(
                "sasl_password",
                &sasl_password.as_ref().map(|_| "[redacted]"),
            )
            .field("sasl_password_file", sasl_password_file)
            .finish()
    }
}

impl BrokerLogin {
    /// TLS and SASL as the settings ask for.
    pub fn security(&self) -> anyhow::Result<kiln_client::Security> {
        Ok(kiln_client::Security {
            tls: self.tls()?,
            sasl: self.sasl()?,
        })
    }

    /// The wait for any one broker exchange (at least one second).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s.max(1))
    }

    /// The TLS settings; `None` for plain TCP.
    fn tls(&self) -> anyhow::Result<Option<kiln_tls::TlsConnector>> {
        let identity = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (Some(_), None) => bail!("--tls-cert (tls_cert_file) needs --tls-key (tls_key_file)"),
            (None, Some(_)) => bail!("--tls-key (tls_key_file) needs --tls-cert (tls_cert_file)"),
            (None, None) => None,
        };
        match &self.tls_ca_file {
            None if identity.is_some() => bail!(
                "--tls-cert (tls_cert_file) needs --tls-ca (tls_ca_file): the CA that signed \
                 the broker's certificate"
            ),
            None => Ok(None),
            Some(ca) => Ok(Some(kiln_tls::client_connector(ca, identity)?)),
        }
    }

    fn sasl(&self) -> anyhow::Result<Option<kiln_client::SaslLogin>> {
        let Some(user) = &self.sasl_user else {
            if self.sasl_password_file.is_some() || self.sasl_password.is_some() {
                bail!("a SASL password needs a user: --sasl-user (sasl_user)");
            }
            return Ok(None);
        };
        let password = match (&self.sasl_password, &self.sasl_password_file) {
            (Some(_), Some(_)) => {
                bail!("set sasl_password or sasl_password_file, not both")
            }
            (None, Some(file)) => {
                kiln_settings::read_secret_file("--sasl-password-file (sasl_password_file)", file)?
            }
            (Some(p), None) => p.clone(),
            (None, None) => bail!(
                "--sasl-user {user} needs a password: --sasl-password-file FILE or \
                 KILN_SASL_PASSWORD (settings: sasl_password_file or sasl_password)"
            ),
        };
        if password.is_empty() {
            bail!("the SASL password for {user} is empty");
        }
        Ok(Some(kiln_client::SaslLogin {
            mechanism: self.sasl_mechanism.clone(),
            user: user.clone(),
            password,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn debug_leaves_the_password_out_and_two_passwords_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "hunter2-file\n").unwrap();
        let mut login = BrokerLogin {
            sasl_user: Some("dashboard".into()),
            sasl_password: Some("hunter2-env".into()),
            ..Default::default()
        };
        let shown = format!("{login:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("[redacted]"),
            "{shown}"
        );
        let sasl = login.security().unwrap().sasl.unwrap();
        assert_eq!(sasl.password, "hunter2-env");
        login.sasl_password_file = Some(file.clone());
        let err = login.security().unwrap_err().to_string();
        assert!(
            err.contains("not both") && !err.contains("hunter2"),
            "{err}"
        );
        login.sasl_password = None;
        assert_eq!(
            login.security().unwrap().sasl.unwrap().password,
            "hunter2-file"
        );
        login.sasl_user = None;
        let err = login.security().unwrap_err().to_string();
        assert!(err.contains("needs a user"), "{err}");
    }
}
