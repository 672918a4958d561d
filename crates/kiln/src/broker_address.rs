//! The `--bootstrap` and `--timeout-s` flags every admin command shares.

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

    /// The wait for any one broker exchange (at least one second).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s.max(1))
    }
}
