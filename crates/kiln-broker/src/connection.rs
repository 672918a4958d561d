//! One client connection.
//!
//! Requests are read and started in order; slow ones (acks=all produce waiting
//! for fsync, fetch long polls) finish in the background while the next ones are
//! read. Responses are written strictly in request order, as Kafka requires, by a
//! writer task fed through a bounded queue, so a connection can have at most
//! `max_in_flight_per_connection` requests outstanding.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use kiln_wire::{decode_request, encode_response, read_frame, WireError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot};

use crate::authorizer::Access;
use crate::handlers::{self, Reply};
use crate::sasl::{Next, SaslAnswer, Session};
use crate::server::Broker;

/// What a finished request leaves for the writer.
enum Outcome {
    Respond(Bytes),
    /// Produce with acks=0: nothing is written back.
    NoResponse,
    /// The response could not be encoded; the client must not wait for it forever.
    Hangup,
}

/// A response slot, filled when its request finishes.
type Slot = oneshot::Receiver<Outcome>;

/// Serves one client over the two halves of its stream: a TCP stream's own halves (no lock
/// between them), or `tokio::io::split` of a TLS stream whose handshake is done, whose client
/// certificate named `tls_principal`, that came in on `listener` (which says whether SASL is
/// required and whose addresses Metadata answers with).
pub async fn serve<R, W>(
    broker: Arc<Broker>,
    read_half: R,
    write_half: W,
    peer: SocketAddr,
    tls_principal: Option<String>,
    listener: Arc<crate::listeners::Listener>,
) where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (slots_tx, slots_rx) = mpsc::channel::<Slot>(broker.config.max_in_flight_per_connection);
    let writer = tokio::spawn(write_responses(write_half, slots_rx, peer));
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let sasl = broker.sasl.clone().filter(|_| listener.security.sasl());
    let mut session = Session::new(sasl);
    // Who the ACLs see: set again once SASL authenticates (`authorizer.rs`).
    let access_as = |session: &Session| {
        let principal = session
            .principal()
            .or(tls_principal.as_deref())
            .unwrap_or(crate::authorizer::ANONYMOUS);
        Access::new(
            principal,
            peer.ip(),
            &listener.name,
            broker.authorizer.as_ref(),
            &broker.cluster,
        )
    };
    let mut access = access_as(&session);
    let authenticate_by = session
        .authentication_timeout()
        .map(|t| tokio::time::Instant::now() + t);

    loop {
        let read = read_frame(&mut reader, broker.config.max_frame_bytes);
        let read = match authenticate_by.filter(|_| !session.may_serve()) {
            None => read.await,
            Some(deadline) => match tokio::time::timeout_at(deadline, read).await {
                Ok(read) => read,
                Err(_) => {
                    tracing::warn!(%peer, "closing connection: not authenticated in time");
                    break;
                }
            },
        };
        let frame = match read {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(WireError::Io(e)) => {
                tracing::debug!(%peer, error = %e, "connection read failed");
                break;
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                break;
            }
        };
        let request = match decode_request(frame) {
            Ok(request) => request,
            Err(WireError::UnsupportedVersion {
                api_key: ApiKey::ApiVersions,
                version,
                correlation_id,
                ..
            }) => {
                // The one case Kafka answers: tell the client which versions exist (v0 format).
                tracing::info!(%peer, version, "ApiVersions version unsupported; answering with the supported list");
                let body =
                    handlers::api_versions::response(ResponseError::UnsupportedVersion.code());
                let outcome = match encode_response(
                    ApiKey::ApiVersions,
                    0,
                    correlation_id,
                    &ResponseKind::ApiVersions(body),
                ) {
                    Ok(frame) => Outcome::Respond(frame),
                    Err(_) => Outcome::Hangup,
                };
                if !send_ready(&slots_tx, outcome).await {
                    break;
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection: request refused");
                break;
            }
        };
        let api_key = request.api_key;
        let version = request.header.request_api_version;
        let correlation_id = request.header.correlation_id;
        let encode = move |body: ResponseKind| -> Outcome {
            match encode_response(api_key, version, correlation_id, &body) {
                Ok(frame) => Outcome::Respond(frame),
                Err(e) => {
                    tracing::error!(%peer, error = %e, "cannot encode response; closing connection");
                    Outcome::Hangup
                }
            }
        };
        let next = match &request.body {
            RequestKind::SaslHandshake(req) => Some(session.handshake(&broker.cluster, req)),
            RequestKind::SaslAuthenticate(req) => {
                Some(session.authenticate(&broker.cluster, req, peer))
            }
            RequestKind::ApiVersions(_) => None,
            RequestKind::DescribeUserScramCredentials(_)
            | RequestKind::AlterUserScramCredentials(_)
                if session.may_serve()
                    && broker.authorizer.is_none()
                    && !session.may_manage_users() =>
            {
                tracing::warn!(%peer, principal = session.principal(), ?api_key, "refused: only a super user may manage SCRAM users");
                if let Some(body) = handlers::users::refuse(
                    &request.body,
                    "only a super user may manage SCRAM users",
                ) {
                    if !send_ready(&slots_tx, encode(body)).await {
                        break;
                    }
                    continue;
                }
                None
            }
            _ if !session.may_serve() => {
                tracing::warn!(%peer, ?api_key, "closing connection: a request before SASL authentication");
                break;
            }
            _ => None,
        };
        if let Some(next) = next {
            let (answer, close_after) = match next {
                Next::Answer(answer) => (answer, None),
                Next::AnswerAndClose(answer, delay) => (answer, Some(delay)),
            };
            if let Some(delay) = close_after {
                tokio::time::sleep(delay).await;
            }
            let body = match answer {
                SaslAnswer::Handshake(r) => ResponseKind::SaslHandshake(r),
                SaslAnswer::Authenticate(r) => ResponseKind::SaslAuthenticate(r),
            };
            if !send_ready(&slots_tx, encode(body)).await || close_after.is_some() {
                break;
            }
            access = access_as(&session);
            continue;
        }
        // A restarted broker's ACLs are those of its disk until it has caught up with the
        // metadata log (`cluster/fence.rs`): one revoked meanwhile would still allow. Requests
        // wait for that here, in order, and a broker that cannot catch up hangs up, which
        // clients retry elsewhere.
        if broker.authorizer.is_some() && !wait_until_current(&broker).await {
            tracing::warn!(%peer, ?api_key, "closing connection: this broker's ACLs are not current (it has not caught up with the metadata log)");
            break;
        }
        let sent = match handlers::dispatch(&broker, request, &access) {
            Reply::Now(body) => send_ready(&slots_tx, encode(*body)).await,
            Reply::Silent => send_ready(&slots_tx, Outcome::NoResponse).await,
            Reply::Later(pending) => {
                let (tx, rx) = oneshot::channel();
                if slots_tx.send(rx).await.is_err() {
                    break;
                }
                tokio::spawn(async move {
                    let body = pending.await;
                    let _ = tx.send(encode(body));
                });
                true
            }
            Reply::Close(reason) => {
                tracing::warn!(%peer, ?api_key, version, correlation_id, reason, "closing connection");
                false
            }
        };
        if !sent {
            break;
        }
    }
    tracing::debug!(%peer, principal = session.principal(), "connection closed");
    drop(slots_tx);
    if let Err(e) = writer.await {
        tracing::debug!(%peer, error = %e, "writer task ended abnormally");
    }
}

/// Longest a request waits for a restarted broker to catch up with the metadata log before
/// its ACLs are trusted.
const ACLS_CURRENT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const ACLS_CURRENT_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether the broker is (or within `ACLS_CURRENT_WAIT` becomes) current.
async fn wait_until_current(broker: &Broker) -> bool {
    let deadline = tokio::time::Instant::now() + ACLS_CURRENT_WAIT;
    while !broker.cluster.is_current() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(ACLS_CURRENT_POLL).await;
    }
    true
}

async fn send_ready(slots: &mpsc::Sender<Slot>, outcome: Outcome) -> bool {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(outcome);
    slots.send(rx).await.is_ok()
}

async fn write_responses<W: AsyncWrite + Send + Unpin + 'static>(
    write_half: W,
    mut slots: mpsc::Receiver<Slot>,
    peer: SocketAddr,
) {
    let mut writer = BufWriter::with_capacity(64 * 1024, write_half);
    while let Some(slot) = slots.recv().await {
        let frame = match slot.await {
            Ok(Outcome::Respond(frame)) => frame,
            Ok(Outcome::NoResponse) => continue,
            Ok(Outcome::Hangup) => break,
            // The handler task died (a bug); the client would wait forever for this answer.
            Err(_) => {
                tracing::error!(%peer, "a request handler ended without a response; closing connection");
                break;
            }
        };
        if let Err(e) = writer.write_all(&frame).await {
            tracing::debug!(%peer, error = %e, "write failed");
            return;
        }
        // Flush when nothing else is ready, so pipelined responses share a syscall.
        if slots.is_empty() {
            if let Err(e) = writer.flush().await {
                tracing::debug!(%peer, error = %e, "flush failed");
                return;
            }
        }
    }
    let _ = writer.flush().await;
    let _ = writer.into_inner().shutdown().await;
}
