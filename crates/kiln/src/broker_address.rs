//! The `--bootstrap`, `--timeout-s`, TLS and SASL flags every admin command shares.

use std::time::Duration;

use clap::Args;

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
    pub tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a listener that requires one; needs --tls-key.
    #[arg(long, global = true, env = "KILN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "KILN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
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
    pub sasl_password_file: Option<std::path::PathBuf>,
}

impl BrokerAddress {
    /// The TLS settings the flags ask for; `None` for plain TCP.
    pub fn tls(&self) -> anyhow::Result<Option<kiln_tls::TlsConnector>> {
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        match &self.tls_ca {
            None if identity.is_some() => {
                anyhow::bail!(
                    "--tls-cert needs --tls-ca (the CA that signed the broker's certificate)"
                )
            }
            None => Ok(None),
            Some(ca) => Ok(Some(kiln_tls::client_connector(ca, identity)?)),
        }
    }

    /// TLS and SASL as the flags ask for.
    pub fn security(&self) -> anyhow::Result<kiln_client::Security> {
        Ok(kiln_client::Security {
            tls: self.tls()?,
            sasl: self.sasl()?,
        })
    }

    fn sasl(&self) -> anyhow::Result<Option<kiln_client::SaslLogin>> {
        let Some(user) = &self.sasl_user else {
            if self.sasl_password_file.is_some() {
                anyhow::bail!("--sasl-password-file needs --sasl-user");
            }
            return Ok(None);
        };
        let password = match (&self.sasl_password_file, std::env::var("KILN_SASL_PASSWORD")) {
            (Some(file), _) => kiln_settings::read_secret_file("--sasl-password-file", file)?,
            (None, Ok(p)) => p,
            (None, Err(_)) => anyhow::bail!(
                "--sasl-user {user} needs a password: --sasl-password-file FILE or KILN_SASL_PASSWORD"
            ),
        };
        if password.is_empty() {
            anyhow::bail!("the SASL password for {user} is empty");
        }
        Ok(Some(kiln_client::SaslLogin {
            mechanism: self.sasl_mechanism.clone(),
            user: user.clone(),
            password,
        }))
    }

    /// The wait for any one broker exchange (at least one second).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s.max(1))
    }
}
