//! Responses: encoded on the server side, decoded on the client side.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::request::patch_size_prefix;
use crate::WireError;

/// Encodes a response as a complete frame, size prefix included.
pub fn encode_response(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<Bytes, WireError> {
    let encode_err = |e: anyhow::Error| WireError::Encode {
        what: format!("{api_key:?} v{version} response"),
        reason: format!("{e:#}"),
    };
    let mut buf = BytesMut::new();
    buf.put_i32(0); // size, patched below
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, api_key.response_header_version(version))
        .map_err(encode_err)?;
    body.encode(&mut buf, version).map_err(encode_err)?;
    patch_size_prefix(&mut buf)?;
    Ok(buf.freeze())
}

/// Decodes a response frame (without its size prefix) for a request of the given API and version.
pub fn decode_response(
    api_key: ApiKey,
    version: i16,
    frame: Bytes,
) -> Result<(i32, ResponseKind), WireError> {
    let mut buf = frame;
    if buf.remaining() < 4 {
        return Err(WireError::MalformedResponse {
            reason: format!(
                "{} bytes is too short for a response header",
                buf.remaining()
            ),
        });
    }
    let header = ResponseHeader::decode(&mut buf, api_key.response_header_version(version))
        .map_err(|e| WireError::MalformedResponse {
            reason: format!("header: {e:#}"),
        })?;
    let body = ResponseKind::decode(api_key, &mut buf, version).map_err(|e| {
        WireError::MalformedResponse {
            reason: format!("{api_key:?} v{version}: {e:#}"),
        }
    })?;
    Ok((header.correlation_id, body))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{decode_request, encode_request, WireError};
    use kafka_protocol::messages::{
        ApiVersionsRequest, ApiVersionsResponse, RequestHeader, RequestKind,
    };
    use kafka_protocol::protocol::StrBytes;
    use proptest::prelude::*;

    fn api_versions_request(version: i16) -> Bytes {
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::ApiVersions as i16)
            .with_request_api_version(version)
            .with_correlation_id(42)
            .with_client_id(Some(StrBytes::from_static_str("test")));
        let body = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("kiln-test"))
            .with_client_software_version(StrBytes::from_static_str("1"));
        encode_request(&header, &RequestKind::ApiVersions(body)).unwrap()
    }

    #[test]
    fn request_round_trip_every_supported_api_versions_version() {
        for version in 0..=3 {
            let frame = api_versions_request(version);
            let decoded = decode_request(frame.slice(4..)).unwrap();
            assert_eq!(decoded.api_key, ApiKey::ApiVersions);
            assert_eq!(decoded.header.correlation_id, 42);
            assert_eq!(decoded.header.request_api_version, version);
        }
    }

    #[test]
    fn response_round_trip() {
        let body = ResponseKind::ApiVersions(ApiVersionsResponse::default().with_error_code(35));
        let frame = encode_response(ApiKey::ApiVersions, 3, 7, &body).unwrap();
        let (correlation_id, decoded) =
            decode_response(ApiKey::ApiVersions, 3, frame.slice(4..)).unwrap();
        assert_eq!(correlation_id, 7);
        match decoded {
            ResponseKind::ApiVersions(r) => assert_eq!(r.error_code, 35),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unknown_key_and_unsupported_version_keep_correlation_id() {
        let mut frame = api_versions_request(3).slice(4..).to_vec();
        frame[0..2].copy_from_slice(&999i16.to_be_bytes());
        assert!(matches!(
            decode_request(Bytes::from(frame.clone())),
            Err(WireError::UnknownApiKey {
                api_key: 999,
                correlation_id: 42
            })
        ));
        frame[0..2].copy_from_slice(&(ApiKey::ApiVersions as i16).to_be_bytes());
        frame[2..4].copy_from_slice(&77i16.to_be_bytes());
        assert!(matches!(
            decode_request(Bytes::from(frame)),
            Err(WireError::UnsupportedVersion {
                version: 77,
                correlation_id: 42,
                ..
            })
        ));
    }

    #[test]
    fn truncated_request_is_malformed_not_a_panic() {
        let frame = api_versions_request(3).slice(4..);
        for cut in 0..frame.len() {
            assert!(decode_request(frame.slice(..cut)).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn huge_array_count_in_a_tiny_frame_is_an_error() {
        // Metadata v4: header, then topics array with a length of i32::MAX and nothing after.
        let mut frame = BytesMut::new();
        frame.put_i16(ApiKey::Metadata as i16);
        frame.put_i16(4);
        frame.put_i32(1);
        frame.put_i16(-1); // null client id
        frame.put_i32(i32::MAX);
        assert!(matches!(
            decode_request(frame.freeze()),
            Err(WireError::Malformed { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Arbitrary bytes after a valid-looking prefix never panic the decoder.
        #[test]
        fn arbitrary_bodies_never_panic(key in 0i16..80, version in 0i16..16, body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut frame = BytesMut::new();
            frame.put_i16(key);
            frame.put_i16(version);
            frame.put_i32(1);
            frame.extend_from_slice(&body);
            let _ = decode_request(frame.freeze());
        }
    }
}
