//! A small async client for the Kafka protocol, for Kiln's own tools (the admin
//! CLI, the benchmark, tests). Services that consume and produce in production
//! use librdkafka instead, so they also run against Apache Kafka or Redpanda.
//!
//! One [`Connection`] is one TCP connection, or TLS over one ([`Connection::connect_with`]
//! with a connector from `kiln_tls::client_connector`). It negotiates versions with
//! ApiVersions on connect and picks, per API, the highest version both sides
//! support. Requests may be pipelined with [`Connection::into_split`]. [`admin`] holds the
//! group and offset reads that `kiln groups` and the dashboard share.

pub mod admin;
mod sasl;
pub use sasl::{SaslLogin, Security};

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, RequestHeader, RequestKind, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kiln_wire::{decode_response, encode_request, read_frame, WireError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The read and write halves of a connection, whichever transport carries it.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

pub use kafka_protocol;

/// Largest response frame accepted.
const RESPONSE_BYTES_MAX: usize = 256 * 1024 * 1024;
const CLIENT_ID: &str = "kiln";
/// ApiVersions v3 is what current brokers (Kafka 2.4+, Redpanda, Kiln) answer in full.
const API_VERSIONS_VERSION: i16 = 3;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("TLS with {address}: {reason}")]
    Tls { address: String, reason: String },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("the broker closed the connection")]
    Closed,
    #[error("the broker does not support {0:?} in any version this client speaks")]
    Unsupported(ApiKey),
    #[error("response correlation id {got} does not match request {expected}")]
    OutOfOrder { expected: i32, got: i32 },
    #[error("unexpected response type for {0:?}")]
    UnexpectedResponse(ApiKey),
    #[error("the broker answered ApiVersions with error code {0}")]
    Handshake(i16),
    #[error("SASL: {0}")]
    Sasl(String),
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// The version ranges the broker advertised, capped by what this client speaks.
#[derive(Debug, Clone, Default)]
pub struct Versions(HashMap<i16, i16>);

impl Versions {
    /// Highest version both sides support.
    pub fn pick(&self, api_key: ApiKey) -> Result<i16, ClientError> {
        self.0
            .get(&(api_key as i16))
            .copied()
            .ok_or(ClientError::Unsupported(api_key))
    }
}

pub struct Connection {
    writer: RequestWriter,
    reader: ResponseReader,
}

impl Connection {
    /// Connects over plain TCP and negotiates versions, all within `timeout`.
    pub async fn connect(address: &str, timeout: Duration) -> Result<Self, ClientError> {
        Self::connect_with(address, timeout, None).await
    }

    /// Connects, over TLS when `tls` is given (the server's certificate must name the host
    /// part of `address`), and negotiates versions, all within `timeout`.
    pub async fn connect_with(
        address: &str,
        timeout: Duration,
        tls: Option<&tokio_rustls::TlsConnector>,
    ) -> Result<Self, ClientError> {
        tokio::time::timeout(timeout, Self::connect_inner(address, tls))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    async fn connect_inner(
        address: &str,
        tls: Option<&tokio_rustls::TlsConnector>,
    ) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|e| ClientError::Connect {
                address: address.to_string(),
                reason: e.to_string(),
            })?;
        stream.set_nodelay(true).map_err(WireError::Io)?;
        let (read_half, write_half): (ReadHalf, WriteHalf) = match tls {
            None => {
                let (r, w) = stream.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(connector) => {
                let tls_error = |reason: String| ClientError::Tls {
                    address: address.to_string(),
                    reason,
                };
                let host = address
                    .rsplit_once(':')
                    .map_or(address, |(host, _)| host)
                    .trim_matches(['[', ']']);
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| tls_error(format!("{host:?} is not a host name: {e}")))?;
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(|e| tls_error(e.to_string()))?;
                let (r, w) = tokio::io::split(stream);
                (Box::new(r), Box::new(w))
            }
        };
        let mut connection = Self {
            writer: RequestWriter {
                half: write_half,
                next_correlation_id: 1,
                versions: Versions::default(),
            },
            reader: ResponseReader {
                half: BufReader::with_capacity(256 * 1024, read_half),
            },
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("kiln-client"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let sent = connection
            .writer
            .send_version(
                ApiKey::ApiVersions,
                API_VERSIONS_VERSION,
                RequestKind::ApiVersions(request),
            )
            .await?;
        let response = connection.reader.recv(&sent).await?;
        let ResponseKind::ApiVersions(response) = response else {
            return Err(ClientError::UnexpectedResponse(ApiKey::ApiVersions));
        };
        if response.error_code != 0 {
            return Err(ClientError::Handshake(response.error_code));
        }
        let mut versions = HashMap::new();
        for api in response.api_keys {
            let Ok(key) = ApiKey::try_from(api.api_key) else {
                continue;
            };
            let Some((min_ours, max_ours)) = kiln_wire::supported_versions(key) else {
                continue;
            };
            let max = api.max_version.min(max_ours);
            if max >= api.min_version.max(min_ours) {
                versions.insert(api.api_key, max);
            }
        }
        connection.writer.versions = Versions(versions);
        Ok(connection)
    }

    pub fn versions(&self) -> &Versions {
        &self.writer.versions
    }

    /// Sends one request and waits for its response.
    pub async fn call(
        &mut self,
        body: RequestKind,
        timeout: Duration,
    ) -> Result<ResponseKind, ClientError> {
        let sent = self.writer.send(body).await?;
        tokio::time::timeout(timeout, self.reader.recv(&sent))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Sends one request at an explicit version (tests use this to cover every version).
    pub async fn call_at(
        &mut self,
        version: i16,
        body: RequestKind,
        timeout: Duration,
    ) -> Result<ResponseKind, ClientError> {
        let api_key = api_key_of(&body);
        let sent = self.writer.send_version(api_key, version, body).await?;
        tokio::time::timeout(timeout, self.reader.recv(&sent))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Splits into a writer and a reader so requests can be pipelined.
    pub fn into_split(self) -> (RequestWriter, ResponseReader) {
        (self.writer, self.reader)
    }
}

/// What the reader needs to decode the matching response.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub api_key: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
}

pub struct RequestWriter {
    half: WriteHalf,
    next_correlation_id: i32,
    versions: Versions,
}

impl RequestWriter {
    /// Sends a request at the highest common version.
    pub async fn send(&mut self, body: RequestKind) -> Result<Sent, ClientError> {
        let api_key = api_key_of(&body);
        let version = self.versions.pick(api_key)?;
        self.send_version(api_key, version, body).await
    }

    /// Pre-encodes a request so a benchmark can measure the broker, not the encoder.
    pub fn encode(&mut self, body: &RequestKind) -> Result<(Sent, Bytes), ClientError> {
        let api_key = api_key_of(body);
        let version = self.versions.pick(api_key)?;
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let frame = encode_request(&header, body)?;
        Ok((
            Sent {
                api_key,
                version,
                correlation_id,
            },
            frame,
        ))
    }

    pub async fn send_frame(&mut self, frame: &[u8]) -> Result<(), ClientError> {
        self.half.write_all(frame).await.map_err(WireError::Io)?;
        Ok(())
    }

    async fn send_version(
        &mut self,
        api_key: ApiKey,
        version: i16,
        body: RequestKind,
    ) -> Result<Sent, ClientError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let frame = encode_request(&header, &body)?;
        self.send_frame(&frame).await?;
        Ok(Sent {
            api_key,
            version,
            correlation_id,
        })
    }
}

pub struct ResponseReader {
    half: BufReader<ReadHalf>,
}

impl ResponseReader {
    /// Reads the next response, which must answer `sent` (responses come in request order).
    pub async fn recv(&mut self, sent: &Sent) -> Result<ResponseKind, ClientError> {
        let frame = read_frame(&mut self.half, RESPONSE_BYTES_MAX)
            .await?
            .ok_or(ClientError::Closed)?;
        let (correlation_id, body) = decode_response(sent.api_key, sent.version, frame)?;
        if correlation_id != sent.correlation_id {
            return Err(ClientError::OutOfOrder {
                expected: sent.correlation_id,
                got: correlation_id,
            });
        }
        Ok(body)
    }
}

fn api_key_of(body: &RequestKind) -> ApiKey {
    match body {
        RequestKind::Produce(_) => ApiKey::Produce,
        RequestKind::Fetch(_) => ApiKey::Fetch,
        RequestKind::ListOffsets(_) => ApiKey::ListOffsets,
        RequestKind::Metadata(_) => ApiKey::Metadata,
        RequestKind::ApiVersions(_) => ApiKey::ApiVersions,
        RequestKind::CreateTopics(_) => ApiKey::CreateTopics,
        RequestKind::DeleteTopics(_) => ApiKey::DeleteTopics,
        RequestKind::FindCoordinator(_) => ApiKey::FindCoordinator,
        RequestKind::JoinGroup(_) => ApiKey::JoinGroup,
        RequestKind::SyncGroup(_) => ApiKey::SyncGroup,
        RequestKind::Heartbeat(_) => ApiKey::Heartbeat,
        RequestKind::LeaveGroup(_) => ApiKey::LeaveGroup,
        RequestKind::OffsetCommit(_) => ApiKey::OffsetCommit,
        RequestKind::OffsetFetch(_) => ApiKey::OffsetFetch,
        RequestKind::ListGroups(_) => ApiKey::ListGroups,
        RequestKind::DescribeGroups(_) => ApiKey::DescribeGroups,
        RequestKind::DeleteGroups(_) => ApiKey::DeleteGroups,
        RequestKind::InitProducerId(_) => ApiKey::InitProducerId,
        RequestKind::OffsetDelete(_) => ApiKey::OffsetDelete,
        RequestKind::DescribeConfigs(_) => ApiKey::DescribeConfigs,
        RequestKind::AlterConfigs(_) => ApiKey::AlterConfigs,
        RequestKind::IncrementalAlterConfigs(_) => ApiKey::IncrementalAlterConfigs,
        RequestKind::CreatePartitions(_) => ApiKey::CreatePartitions,
        RequestKind::DeleteRecords(_) => ApiKey::DeleteRecords,
        RequestKind::DescribeCluster(_) => ApiKey::DescribeCluster,
        RequestKind::ElectLeaders(_) => ApiKey::ElectLeaders,
        RequestKind::AlterPartitionReassignments(_) => ApiKey::AlterPartitionReassignments,
        RequestKind::ListPartitionReassignments(_) => ApiKey::ListPartitionReassignments,
        RequestKind::UnregisterBroker(_) => ApiKey::UnregisterBroker,
        RequestKind::DescribeLogDirs(_) => ApiKey::DescribeLogDirs,
        RequestKind::SaslHandshake(_) => ApiKey::SaslHandshake,
        RequestKind::SaslAuthenticate(_) => ApiKey::SaslAuthenticate,
        RequestKind::DescribeUserScramCredentials(_) => ApiKey::DescribeUserScramCredentials,
        RequestKind::AlterUserScramCredentials(_) => ApiKey::AlterUserScramCredentials,
        RequestKind::DescribeAcls(_) => ApiKey::DescribeAcls,
        RequestKind::CreateAcls(_) => ApiKey::CreateAcls,
        RequestKind::DeleteAcls(_) => ApiKey::DeleteAcls,
        // Kiln's tools send nothing else; an unknown key fails version negotiation loudly.
        _ => ApiKey::WriteTxnMarkers,
    }
}
