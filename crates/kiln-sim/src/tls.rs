//! HTTPS for the simulated BMCs: a throwaway CA made at fleet start (rcgen), one server
//! certificate for `127.0.0.1` and `localhost` signed by it, and a listener that hands axum
//! connections whose TLS handshake already finished (handshakes run on their own tasks, so
//! a slow client does not hold up the others). The agent trusts the CA through its
//! `[redfish] ca_file`, as it would a site's BMC CA.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for axum to take them.
const READY_MAX: usize = 64;

pub struct FleetTls {
    /// The CA certificate (PEM) the agent must trust.
    pub ca_pem: String,
    pub acceptor: TlsAcceptor,
}

impl FleetTls {
    pub fn generate() -> anyhow::Result<FleetTls> {
        let ca_key = KeyPair::generate().context("CA key")?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kiln sim BMC CA");
        let ca_cert = ca_params.self_signed(&ca_key).context("CA certificate")?;
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate().context("server key")?;
        let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .context("server params")?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kiln sim BMC");
        let cert = params
            .signed_by(&key, &issuer)
            .context("server certificate")?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .context("TLS server settings")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(FleetTls {
            ca_pem: ca_cert.pem(),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// An axum listener yielding TLS streams; fed by [`accept_tls`].
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The acceptor stopped (fleet stopping): no more connections, ever.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts TCP on `listener` until `stop`, handshakes each connection on its own task, and
/// returns the listener axum serves from.
pub fn accept_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<TlsListener> {
    let local = listener.local_addr()?;
    let (tx, ready) = mpsc::channel(READY_MAX);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = stop.changed() => return,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "simulated BMC: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "simulated BMC: TLS handshake failed")
                    }
                    Err(_) => tracing::debug!("simulated BMC: TLS handshake timed out"),
                }
            });
        }
    });
    Ok(TlsListener { ready, local })
}
