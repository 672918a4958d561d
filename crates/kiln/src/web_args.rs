//! The web front door of `kiln intake serve` and `kiln dashboard` (kiln-web; docs/security.md
//! "Intake and the dashboard"): its settings (`[https]`, `tokens_file`, `insecure_no_auth`),
//! the flags laid on them, and the `WebSecurity` they make.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use kiln_web::{TokenFile, WebSecurity};
use serde::{Deserialize, Serialize};

/// `[https]`: serve HTTPS with these files (PEM). Without `cert_file`, plain HTTP.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpsSettings {
    /// Certificate chain (`kiln certs server`); needs `key_file`. SIGHUP reads both again.
    pub cert_file: Option<PathBuf>,
    /// The certificate's private key.
    pub key_file: Option<PathBuf>,
    /// Require a client certificate this CA signed, in the TLS handshake.
    pub client_ca_file: Option<PathBuf>,
}

/// The flags over the front door's settings. No environment variables of their own: those
/// are `KILN_<SERVICE>__HTTPS__CERT_FILE` and the like, read by kiln-settings.
#[derive(Args, Debug, Default)]
pub struct WebArgs {
    /// Serve HTTPS with this certificate chain (PEM; kiln certs server); needs a key.
    /// SIGHUP reads the files again. Setting: [https] cert_file.
    #[arg(long)]
    pub https_cert: Option<PathBuf>,
    /// The HTTPS certificate's private key (PEM). Setting: [https] key_file.
    #[arg(long)]
    pub https_key: Option<PathBuf>,
    /// Require a client certificate signed by this CA (PEM) in the TLS handshake; needs a
    /// certificate. Setting: [https] client_ca_file.
    #[arg(long)]
    pub https_client_ca: Option<PathBuf>,
    /// Require a bearer token from this file (kiln tokens create) on every request but
    /// /healthz. The file is read again when it changes. Setting: tokens_file.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Serve without authentication on an address other than loopback. Setting:
    /// insecure_no_auth.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

impl WebArgs {
    /// Lays the flags that were given over a service's settings.
    pub fn apply(
        &self,
        https: &mut HttpsSettings,
        tokens_file: &mut Option<PathBuf>,
        insecure_no_auth: &mut bool,
    ) {
        let over = |setting: &mut Option<PathBuf>, flag: &Option<PathBuf>| {
            if flag.is_some() {
                setting.clone_from(flag);
            }
        };
        over(&mut https.cert_file, &self.https_cert);
        over(&mut https.key_file, &self.https_key);
        over(&mut https.client_ca_file, &self.https_client_ca);
        over(tokens_file, &self.tokens_file);
        *insecure_no_auth |= self.insecure_no_auth;
    }
}

/// The security the settings ask for, refused when `listen` would be open to the network.
pub fn web_security(
    service: &str,
    listen: SocketAddr,
    https: &HttpsSettings,
    tokens_file: Option<&Path>,
    insecure_no_auth: bool,
) -> anyhow::Result<WebSecurity> {
    let tls = match (&https.cert_file, &https.key_file) {
        (Some(cert_file), Some(key_file)) => {
            let files = kiln_tls::ServerTlsFiles {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
                client_ca_file: https.client_ca_file.clone(),
                client_auth: if https.client_ca_file.is_some() {
                    kiln_tls::ClientAuth::Required
                } else {
                    kiln_tls::ClientAuth::None
                },
            };
            Some(Arc::new(
                kiln_tls::ServerTls::load(files).context("--https-cert ([https] cert_file)")?,
            ))
        }
        (Some(_), None) => bail!("--https-cert ([https] cert_file) needs --https-key (key_file)"),
        (None, Some(_)) => bail!("--https-key ([https] key_file) needs --https-cert (cert_file)"),
        (None, None) if https.client_ca_file.is_some() => {
            bail!("--https-client-ca ([https] client_ca_file) needs --https-cert (cert_file)")
        }
        (None, None) => None,
    };
    let tokens = match tokens_file {
        Some(path) => Some(Arc::new(TokenFile::open(path)?)),
        None => None,
    };
    let security = WebSecurity { tls, tokens };
    security
        .check_exposure(service, listen, insecure_no_auth)
        .map_err(anyhow::Error::msg)?;
    Ok(security)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flags_replace_only_what_they_give() {
        let mut https = HttpsSettings {
            cert_file: Some("/file.crt".into()),
            key_file: Some("/file.key".into()),
            client_ca_file: None,
        };
        let mut tokens = Some(PathBuf::from("/file.tokens"));
        let mut open = false;
        let args = WebArgs {
            https_key: Some("/flag.key".into()),
            ..Default::default()
        };
        args.apply(&mut https, &mut tokens, &mut open);
        assert_eq!(https.cert_file, Some("/file.crt".into()));
        assert_eq!(https.key_file, Some("/flag.key".into()));
        assert_eq!(tokens, Some("/file.tokens".into()));
        assert!(!open);
    }

    #[test]
    fn half_an_https_setting_is_refused_by_name() {
        let listen = "127.0.0.1:0".parse().unwrap();
        for (https, want) in [
            (
                HttpsSettings {
                    cert_file: Some("/c".into()),
                    ..Default::default()
                },
                "needs --https-key",
            ),
            (
                HttpsSettings {
                    key_file: Some("/k".into()),
                    ..Default::default()
                },
                "needs --https-cert",
            ),
            (
                HttpsSettings {
                    client_ca_file: Some("/ca".into()),
                    ..Default::default()
                },
                "client_ca_file) needs",
            ),
        ] {
            let err = web_security("kiln test", listen, &https, None, false).unwrap_err();
            assert!(format!("{err:#}").contains(want), "{err:#}");
        }
    }
}
