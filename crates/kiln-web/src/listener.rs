//! The listener intake and the dashboard serve on: plain TCP or TLS, at most
//! `connections_max` connections at once, and each TLS handshake on its own task (bounded by
//! `kiln_tls::HANDSHAKE_TIMEOUT`), so a client that connects and says nothing holds one slot, never the accept loop.
//!
//! A connection's slot is a semaphore permit carried inside its stream ([`Conn`]): it frees
//! when the HTTP server drops the connection, whatever the reason.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Connections served at once unless the service says otherwise.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Connections accepted (and handshaken) but not yet taken by the HTTP server.
const READY_QUEUE_MAX: usize = 64;
/// Wait after a failed accept (out of file descriptors, usually) before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Who is at the other end of a connection: handed to every request as `ConnectInfo<Peer>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The client certificate's subject as a principal (`User:CN=...`), when the client
    /// presented one the client CA signed.
    pub certificate: Option<String>,
}

impl Connected<IncomingStream<'_, WebListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, WebListener>) -> Peer {
        stream.remote_addr().clone()
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<kiln_tls::ServerStream<TcpStream>>),
}

/// One accepted connection and its slot.
pub struct Conn {
    stream: Stream,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Stops the accept task when the listener goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An axum listener over a bound TCP listener (see the module docs).
pub struct WebListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(Conn, Peer)>,
    _accept: AbortOnDrop,
}

impl WebListener {
    /// Serves `tcp`, over TLS with `tls`, at most `connections_max` connections at once.
    pub fn new(
        tcp: TcpListener,
        tls: Option<Arc<kiln_tls::ServerTls>>,
        connections_max: usize,
    ) -> io::Result<WebListener> {
        assert!(connections_max > 0);
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE_MAX);
        let task = tokio::spawn(accept_loop(tcp, tls, connections_max, tx));
        Ok(WebListener {
            local,
            ready,
            _accept: AbortOnDrop(task),
        })
    }
}

impl axum::serve::Listener for WebListener {
    type Io = Conn;
    type Addr = Peer;

    async fn accept(&mut self) -> (Conn, Peer) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept task only ends when this listener drops it; until then, nothing comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Peer> {
        Ok(Peer {
            addr: self.local,
            certificate: None,
        })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    tls: Option<Arc<kiln_tls::ServerTls>>,
    connections_max: usize,
    ready: mpsc::Sender<(Conn, Peer)>,
) {
    let slots = Arc::new(Semaphore::new(connections_max));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            unreachable!("the semaphore is never closed");
        };
        let (stream, addr) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%addr, error = %e, "set_nodelay failed");
        }
        match &tls {
            None => {
                let conn = Conn {
                    stream: Stream::Plain(stream),
                    _slot: slot,
                };
                let peer = Peer {
                    addr,
                    certificate: None,
                };
                if ready.send((conn, peer)).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                let ready = ready.clone();
                tokio::spawn(async move {
                    if let Some((stream, certificate)) =
                        kiln_tls::accept_client(acceptor, stream, addr).await
                    {
                        let conn = Conn {
                            stream: Stream::Tls(Box::new(stream)),
                            _slot: slot,
                        };
                        let _ = ready.send((conn, Peer { addr, certificate })).await;
                    }
                });
            }
        }
    }
}
