//! How bytes travel between brokers: plain TCP, or mutual TLS with the cluster CA.
//!
//! With mutual TLS both ends present a certificate signed by the cluster CA that names their
//! node (`kiln-node-<id>`, see `kiln_tls::identity`): the client asks for the target's name, so
//! it cannot reach the wrong broker or a stranger; the listener reads the client's node id
//! from its certificate, refuses a node that is not a member, and then refuses any request
//! whose sender (the vote it carries) is not that node. Plain TCP proves nothing, and a broker
//! started with it says so in its log (docs/security.md).

use std::sync::Arc;
use std::time::Duration;

use kiln_tls::PeerTls;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::types::NodeId;

/// A byte stream to or from a peer, whichever transport carries it.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> Stream for T {}

pub type BoxStream = Box<dyn Stream>;

/// The transport of one broker's Raft traffic, both directions.
#[derive(Clone, Default)]
pub enum Transport {
    /// Plain TCP: any host that reaches the port is believed.
    #[default]
    Plain,
    /// Mutual TLS with the cluster CA.
    MutualTls(Arc<PeerTls>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Plain => f.write_str("Plain"),
            Transport::MutualTls(tls) => write!(f, "MutualTls(node {})", tls.node()),
        }
    }
}

impl Transport {
    pub fn is_authenticated(&self) -> bool {
        matches!(self, Transport::MutualTls(_))
    }

    /// Connects to node `target` at `addr`, the TCP connection and the TLS handshake both
    /// within `limit`.
    pub(crate) async fn connect(
        &self,
        addr: &str,
        target: NodeId,
        limit: Duration,
    ) -> Result<BoxStream, String> {
        let exchange = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect to {addr}: {e}"))?;
            // One small frame at a time, each awaited: Nagle's algorithm would only add latency.
            tcp.set_nodelay(true)
                .map_err(|e| format!("set TCP_NODELAY: {e}"))?;
            match self {
                Transport::Plain => Ok(Box::new(tcp) as BoxStream),
                Transport::MutualTls(tls) => {
                    let stream = tls
                        .connector()
                        .connect(PeerTls::server_name(target), tcp)
                        .await
                        .map_err(|e| format!("TLS handshake with node {target} at {addr}: {e}"))?;
                    Ok(Box::new(stream) as BoxStream)
                }
            }
        };
        match tokio::time::timeout(limit, exchange).await {
            Ok(result) => result,
            Err(_) => Err(format!("connect to {addr}: no answer in {limit:?}")),
        }
    }

    /// Completes an accepted connection: with mutual TLS, the handshake, and the node id the
    /// client's certificate names (`None` with plain TCP).
    pub(crate) async fn accept(
        &self,
        tcp: TcpStream,
    ) -> Result<(BoxStream, Option<NodeId>), String> {
        match self {
            Transport::Plain => Ok((Box::new(tcp), None)),
            Transport::MutualTls(tls) => {
                let stream = tls
                    .acceptor()
                    .accept(tcp)
                    .await
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                let node = {
                    let (_, session) = stream.get_ref();
                    let leaf = session
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .ok_or("the client presented no certificate")?;
                    kiln_tls::node_of(leaf).ok_or(
                        "the client's certificate names no broker (no kiln-node-<id> DNS name)",
                    )?
                };
                Ok((Box::new(stream), Some(node)))
            }
        }
    }
}
