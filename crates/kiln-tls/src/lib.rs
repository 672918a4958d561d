//! TLS for Kiln's listeners and for the links between brokers.
//!
//! - `pem`: certificate chains, private keys and CA bundles read from PEM files, each error
//!   naming the file.
//! - `identity`: who a certificate names. A broker's certificate for the Raft transport carries
//!   the DNS name `kiln-node-<id>` ([`node_name`]), so a peer's node id is proven by the cluster
//!   CA's signature rather than claimed in a message; a client certificate's subject becomes
//!   its principal (`User:CN=...`, as Kafka names it).
//! - `settings`: rustls settings built from those files: [`PeerTls`] for mutual TLS between
//!   brokers, [`ServerTls`] for a Kafka listener (client certificates optional or required),
//!   reloadable without dropping connections (a reload swaps the settings new handshakes use).
//! - `accept`: the server side of a client's handshake ([`accept_client`]), with its timeout,
//!   its log lines and the client certificate's principal; the callers own the sockets.
//! - `budget`: [`LogBudget`], at most 20 refusal log lines a second, the rest counted.
//! - `reload`: SIGHUP reads the files again ([`on_sighup`], [`log_reload`]).
//! - `ca`: a small certificate authority (rcgen) for `kiln certs` and the tests.
//!
//! Every configuration uses rustls's ring provider (the one the rest of Kiln uses) and its safe
//! default protocol versions (TLS 1.2 and 1.3).

mod accept;
mod budget;
mod ca;
mod identity;
mod pem;
mod reload;
mod settings;

pub use accept::{accept_client, HANDSHAKE_TIMEOUT};
pub use budget::{LogBudget, REFUSAL_LINES_PER_SECOND};
pub use ca::{Ca, Issued, Validity};
pub use identity::{node_name, node_of, principal_of, subject_dn, NODE_NAME_PREFIX};
pub use pem::{load_cert_chain, load_private_key, load_roots};
pub use reload::{log_reload, on_sighup};
pub use settings::{
    client_connector, ClientAuth, PeerTls, PeerTlsFiles, ServerTls, ServerTlsFiles,
};
pub use tokio_rustls::{client::TlsStream as ClientStream, server::TlsStream as ServerStream};
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Why TLS settings could not be made. Each names the file at fault, or the setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {error}")]
    Read { path: String, error: String },
    #[error("{path} holds no {what}")]
    Empty { path: String, what: &'static str },
    #[error("{path}: {error}")]
    Invalid { path: String, error: String },
    #[error("TLS settings: {0}")]
    Settings(String),
    #[error("issuing a certificate: {0}")]
    Issue(String),
}

/// The crypto provider every Kiln TLS setting uses.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
