//! rustls settings from files, swappable at run time.
//!
//! A reload reads every file again and builds new settings; only if that succeeds do new
//! handshakes use them. Connections already made keep the settings they were made with, so a
//! certificate rotated with a reload (SIGHUP) drops no connection, and a bad file on reload
//! leaves the old settings serving (the error says which file).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use rustls::pki_types::ServerName;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::identity::{node_name, node_of};
use crate::pem::{load_cert_chain, load_private_key, load_roots};
use crate::{provider, TlsError};

/// A broker's files for mutual TLS between brokers: the cluster CA, and its own certificate
/// (naming `kiln-node-<id>`) and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Mutual TLS between brokers: both ends present a certificate signed by the cluster CA, and
/// each end learns the other's node id from it.
pub struct PeerTls {
    node: u64,
    files: PeerTlsFiles,
    current: RwLock<(TlsAcceptor, TlsConnector)>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("node", &self.node)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn settings_error(e: impl std::fmt::Display) -> TlsError {
    TlsError::Settings(e.to_string())
}

fn build_peer(files: &PeerTlsFiles, node: u64) -> Result<(TlsAcceptor, TlsConnector), TlsError> {
    let chain = load_cert_chain(&files.cert_file)?;
    let named = chain.first().and_then(node_of);
    if named != Some(node) {
        return Err(TlsError::Invalid {
            path: files.cert_file.display().to_string(),
            error: match named {
                Some(other) => format!(
                    "the certificate is node {other}'s ({}), but this broker is node {node}",
                    node_name(other)
                ),
                None => format!(
                    "the certificate names no broker: it needs the DNS name {} among its subject alternative names",
                    node_name(node)
                ),
            },
        });
    }
    let key = load_private_key(&files.key_file)?;
    let roots = Arc::new(load_roots(&files.ca_file)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(settings_error)?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(settings_error)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| TlsError::Invalid {
            path: files.key_file.display().to_string(),
            error: format!("does not match {}: {e}", files.cert_file.display()),
        })?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(settings_error)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(settings_error)?;
    Ok((
        TlsAcceptor::from(Arc::new(server)),
        TlsConnector::from(Arc::new(client)),
    ))
}

impl PeerTls {
    /// Loads `files` for node `node`; its certificate must name that node.
    pub fn load(files: PeerTlsFiles, node: u64) -> Result<PeerTls, TlsError> {
        let current = build_peer(&files, node)?;
        Ok(PeerTls {
            node,
            files,
            current: RwLock::new(current),
        })
    }

    pub fn node(&self) -> u64 {
        self.node
    }

    /// Reads the files again (see the module docs).
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = build_peer(&self.files, self.node)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    pub fn connector(&self) -> TlsConnector {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// The name a connection to node `target` must be certified for.
    pub fn server_name(target: u64) -> ServerName<'static> {
        // "kiln-node-<digits>" is always a valid DNS name.
        ServerName::try_from(node_name(target)).unwrap_or_else(|_| {
            unreachable!("{} is a valid DNS name", node_name(target));
        })
    }
}

/// A TLS client's settings: the CA that signs the server's certificate, and optionally a client
/// certificate and key (for a listener that asks for one).
pub fn client_connector(
    ca_file: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<TlsConnector, TlsError> {
    let roots = load_roots(ca_file)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(settings_error)?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert_file, key_file)) => builder
            .with_client_auth_cert(load_cert_chain(cert_file)?, load_private_key(key_file)?)
            .map_err(|e| TlsError::Invalid {
                path: key_file.display().to_string(),
                error: format!("does not match {}: {e}", cert_file.display()),
            })?,
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// How a Kafka listener treats client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// None asked for.
    None,
    /// Asked for; a client without one may connect (its principal is then not from TLS).
    Requested,
    /// A client without a certificate signed by the client CA is refused in the handshake.
    Required,
}

/// A TLS listener's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA that signs client certificates; `None` with [`ClientAuth::None`] only.
    pub client_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
}

/// A TLS listener's settings, reloadable.
pub struct ServerTls {
    files: ServerTlsFiles,
    current: RwLock<TlsAcceptor>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn build_server(files: &ServerTlsFiles) -> Result<TlsAcceptor, TlsError> {
    let chain = load_cert_chain(&files.cert_file)?;
    let key = load_private_key(&files.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(settings_error)?;
    let builder = match (&files.client_ca_file, files.client_auth) {
        (_, ClientAuth::None) => builder.with_no_client_auth(),
        (None, _) => {
            return Err(TlsError::Settings(
                "client certificates are asked for but no client CA file is set".into(),
            ))
        }
        (Some(ca), auth) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca)?), provider());
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(settings_error)?)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Invalid {
            path: files.key_file.display().to_string(),
            error: format!("does not match {}: {e}", files.cert_file.display()),
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl ServerTls {
    pub fn load(files: ServerTlsFiles) -> Result<ServerTls, TlsError> {
        let current = build_server(&files)?;
        Ok(ServerTls {
            files,
            current: RwLock::new(current),
        })
    }

    pub fn files(&self) -> &ServerTlsFiles {
        &self.files
    }

    /// Reads the files again (see the module docs).
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = build_server(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// The settings a new handshake uses.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Ca;

    fn peer_files(dir: &std::path::Path, ca: &Ca, node: u64) -> PeerTlsFiles {
        ca.issue_node(node)
            .unwrap()
            .write(dir, &format!("node-{node}"))
            .unwrap();
        PeerTlsFiles {
            ca_file: dir.join("ca.crt"),
            cert_file: dir.join(format!("node-{node}.crt")),
            key_file: dir.join(format!("node-{node}.key")),
        }
    }

    #[test]
    fn a_broker_refuses_a_certificate_for_another_node() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("cluster").unwrap();
        ca.write(dir.path()).unwrap();
        let files = peer_files(dir.path(), &ca, 2);
        let err = PeerTls::load(files.clone(), 3).unwrap_err().to_string();
        assert!(
            err.contains("node 2's") && err.contains("this broker is node 3"),
            "{err}"
        );
        PeerTls::load(files, 2).unwrap();
    }

    #[test]
    fn a_bad_file_on_reload_keeps_the_old_settings() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("cluster").unwrap();
        ca.write(dir.path()).unwrap();
        ca.issue_broker(1, &["localhost".into()])
            .unwrap()
            .write(dir.path(), "kafka")
            .unwrap();
        let tls = ServerTls::load(ServerTlsFiles {
            cert_file: dir.path().join("kafka.crt"),
            key_file: dir.path().join("kafka.key"),
            client_ca_file: None,
            client_auth: ClientAuth::None,
        })
        .unwrap();
        std::fs::write(dir.path().join("kafka.key"), "garbage").unwrap();
        let err = tls.reload().unwrap_err().to_string();
        assert!(err.contains("kafka.key"), "{err}");
        let _still = tls.acceptor();
    }

    #[test]
    fn required_client_certificates_need_a_client_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("cluster").unwrap();
        ca.issue_broker(1, &["localhost".into()])
            .unwrap()
            .write(dir.path(), "kafka")
            .unwrap();
        let err = ServerTls::load(ServerTlsFiles {
            cert_file: dir.path().join("kafka.crt"),
            key_file: dir.path().join("kafka.key"),
            client_ca_file: None,
            client_auth: ClientAuth::Required,
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("no client CA file"), "{err}");
    }
}
