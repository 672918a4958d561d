//! The HTTPS and authentication flags `kiln intake serve` and `kiln dashboard` share
//! (kiln-web; docs/security.md "Intake and dashboard").

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use kiln_web::{TokenFile, WebSecurity};

#[derive(Args, Debug)]
pub struct WebArgs {
    /// Serve HTTPS with this certificate chain (PEM; kiln certs server); needs --https-key.
    /// SIGHUP reads the files again.
    #[arg(long, env = "KILN_HTTPS_CERT", requires = "https_key")]
    https_cert: Option<PathBuf>,
    /// The HTTPS certificate's private key (PEM).
    #[arg(long, env = "KILN_HTTPS_KEY", requires = "https_cert")]
    https_key: Option<PathBuf>,
    /// Require a client certificate signed by this CA (PEM) in the TLS handshake; needs
    /// --https-cert.
    #[arg(long, env = "KILN_HTTPS_CLIENT_CA", requires = "https_cert")]
    https_client_ca: Option<PathBuf>,
    /// Require a bearer token from this file (kiln tokens create) on every request but
    /// /healthz. The file is read again when it changes.
    #[arg(long, env = "KILN_TOKENS_FILE")]
    tokens_file: Option<PathBuf>,
    /// Serve without authentication on an address other than loopback.
    #[arg(long)]
    insecure_no_auth: bool,
}

impl WebArgs {
    /// The security the flags ask for, refused when `listen` would be open to the network.
    pub fn security(&self, service: &str, listen: SocketAddr) -> anyhow::Result<WebSecurity> {
        let tls = match (&self.https_cert, &self.https_key) {
            (Some(cert_file), Some(key_file)) => {
                let files = kiln_tls::ServerTlsFiles {
                    cert_file: cert_file.clone(),
                    key_file: key_file.clone(),
                    client_ca_file: self.https_client_ca.clone(),
                    client_auth: if self.https_client_ca.is_some() {
                        kiln_tls::ClientAuth::Required
                    } else {
                        kiln_tls::ClientAuth::None
                    },
                };
                Some(Arc::new(
                    kiln_tls::ServerTls::load(files).context("--https-cert")?,
                ))
            }
            _ => None,
        };
        let tokens = match &self.tokens_file {
            Some(path) => Some(Arc::new(TokenFile::open(path)?)),
            None => None,
        };
        let security = WebSecurity { tls, tokens };
        security
            .check_exposure(service, listen, self.insecure_no_auth)
            .map_err(anyhow::Error::msg)?;
        Ok(security)
    }
}
