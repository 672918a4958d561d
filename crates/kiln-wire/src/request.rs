//! Requests: decoded on the server side, encoded on the client side.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::{supported_versions, WireError, FRAME_SIZE_PREFIX_LEN};

/// A request that passed every check: known API, supported version, fully decoded.
#[derive(Debug)]
pub struct DecodedRequest {
    pub api_key: ApiKey,
    pub header: RequestHeader,
    pub body: RequestKind,
}

/// Decodes one request frame (without its size prefix).
///
/// The API key and version are read and checked before the header and body are
/// handed to the codec, so unknown or unsupported requests fail with the
/// correlation id the caller needs to answer them.
pub fn decode_request(frame: Bytes) -> Result<DecodedRequest, WireError> {
    // api_key i16, api_version i16, correlation_id i32: the part every version shares.
    const FIXED_HEADER_LEN: usize = 8;
    let fixed = frame
        .get(..FIXED_HEADER_LEN)
        .ok_or(WireError::ShortHeader { len: frame.len() })?;
    let raw_key = i16::from_be_bytes([fixed[0], fixed[1]]);
    let version = i16::from_be_bytes([fixed[2], fixed[3]]);
    let correlation_id = i32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);

    let api_key = ApiKey::try_from(raw_key).map_err(|_| WireError::UnknownApiKey {
        api_key: raw_key,
        correlation_id,
    })?;
    let (min, max) = supported_versions(api_key).ok_or(WireError::UnsupportedApi {
        api_key,
        version,
        correlation_id,
    })?;
    if version < min || version > max {
        return Err(WireError::UnsupportedVersion {
            api_key,
            version,
            min,
            max,
            correlation_id,
        });
    }

    let malformed = |reason: String| WireError::Malformed {
        api_key,
        version,
        correlation_id,
        reason,
    };
    let mut buf = frame;
    let header = RequestHeader::decode(&mut buf, api_key.request_header_version(version))
        .map_err(|e| malformed(format!("header: {e:#}")))?;
    let body =
        RequestKind::decode(api_key, &mut buf, version).map_err(|e| malformed(format!("{e:#}")))?;
    Ok(DecodedRequest {
        api_key,
        header,
        body,
    })
}

/// Encodes a request as a complete frame, size prefix included.
pub fn encode_request(header: &RequestHeader, body: &RequestKind) -> Result<Bytes, WireError> {
    let api_key = ApiKey::try_from(header.request_api_key).map_err(|_| WireError::Encode {
        what: format!("request with api key {}", header.request_api_key),
        reason: "unknown api key".into(),
    })?;
    let version = header.request_api_version;
    let encode_err = |e: anyhow::Error| WireError::Encode {
        what: format!("{api_key:?} v{version} request"),
        reason: format!("{e:#}"),
    };
    let mut buf = BytesMut::new();
    buf.put_i32(0); // size, patched below
    header
        .encode(&mut buf, api_key.request_header_version(version))
        .map_err(encode_err)?;
    body.encode(&mut buf, version).map_err(encode_err)?;
    patch_size_prefix(&mut buf)?;
    Ok(buf.freeze())
}

/// Writes the frame length into the first four bytes.
pub(crate) fn patch_size_prefix(buf: &mut BytesMut) -> Result<(), WireError> {
    let body_len = buf.len() - FRAME_SIZE_PREFIX_LEN;
    let size = i32::try_from(body_len).map_err(|_| WireError::Encode {
        what: "frame".into(),
        reason: format!("{body_len} bytes does not fit a frame"),
    })?;
    buf[..FRAME_SIZE_PREFIX_LEN].copy_from_slice(&size.to_be_bytes());
    Ok(())
}
