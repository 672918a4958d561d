//! A server's side of a client's TLS handshake, shared by the Kafka listener and the HTTP
//! services: bounded in time, logged with the peer's address, and the principal of the
//! client's certificate read back. The caller owns the socket and the connection slot.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

/// Refused handshakes, logged within a budget (`left_out`: lines not logged since the last).
static REFUSALS: crate::LogBudget = crate::LogBudget::new();

/// Longest a client's TLS handshake may take; its connection slot is held meanwhile.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finishes a client's TLS handshake, with the principal its certificate names (none without
/// one); `None` (logged) when it fails or takes longer than [`HANDSHAKE_TIMEOUT`].
pub async fn accept_client<IO>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: IO,
    peer: SocketAddr,
) -> Option<(tokio_rustls::server::TlsStream<IO>, Option<String>)>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            let principal = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(crate::principal_of);
            let principal = match principal {
                Some(Ok(principal)) => {
                    tracing::debug!(%peer, %principal, "TLS client connected");
                    Some(principal)
                }
                // The CA signed it, so the connection stands; it names nobody.
                Some(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "TLS client's subject unreadable; it has no principal");
                    None
                }
                None => {
                    tracing::debug!(%peer, "TLS client connected without a certificate");
                    None
                }
            };
            Some((tls, principal))
        }
        // Closed before a ClientHello: a port check (load balancer, monitoring), not a client.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(%peer, error = %e, "connection closed before its TLS handshake");
            None
        }
        Ok(Err(e)) => {
            if let Some(left_out) = REFUSALS.allow() {
                tracing::warn!(%peer, error = %e, left_out, "refused a client: TLS handshake failed");
            }
            None
        }
        Err(_) => {
            if let Some(left_out) = REFUSALS.allow() {
                tracing::warn!(%peer, timeout = ?HANDSHAKE_TIMEOUT, left_out, "refused a client: TLS handshake timed out");
            }
            None
        }
    }
}
