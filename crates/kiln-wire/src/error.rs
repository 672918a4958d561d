use kafka_protocol::messages::ApiKey;

/// Why a frame or message could not be used. Every variant carries enough to
/// write one log line that tells an operator what the peer sent.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("frame size {size} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge { size: u64, limit: usize },
    #[error("frame size {size} is not a valid length")]
    InvalidFrameSize { size: i32 },
    #[error("connection closed in the middle of a frame ({received} of {expected} bytes)")]
    TruncatedFrame { received: usize, expected: usize },
    #[error("request of {len} bytes is too short for a request header")]
    ShortHeader { len: usize },
    #[error("unknown API key {api_key} (correlation id {correlation_id})")]
    UnknownApiKey { api_key: i16, correlation_id: i32 },
    #[error(
        "{api_key:?} is not served by Kiln (request v{version}, correlation id {correlation_id})"
    )]
    UnsupportedApi {
        api_key: ApiKey,
        version: i16,
        correlation_id: i32,
    },
    #[error("{api_key:?} v{version} is not supported (supported: v{min} to v{max}; correlation id {correlation_id})")]
    UnsupportedVersion {
        api_key: ApiKey,
        version: i16,
        min: i16,
        max: i16,
        correlation_id: i32,
    },
    #[error(
        "malformed {api_key:?} v{version} request (correlation id {correlation_id}): {reason}"
    )]
    Malformed {
        api_key: ApiKey,
        version: i16,
        correlation_id: i32,
        reason: String,
    },
    #[error("malformed response: {reason}")]
    MalformedResponse { reason: String },
    #[error("cannot encode {what}: {reason}")]
    Encode { what: String, reason: String },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}
