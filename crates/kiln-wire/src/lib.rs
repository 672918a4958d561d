//! Kafka wire framing and request/response codecs for Kiln.
//!
//! The wire format itself comes from the `kafka-protocol` codec crate; this crate
//! adds what a server must decide before trusting a frame: a hard size limit checked
//! before any allocation, the API keys and versions Kiln supports, and errors that
//! say exactly what was wrong so the broker can log them and answer or hang up.

mod error;
mod frame;
mod request;
mod response;
mod versions;

pub use error::WireError;
pub use frame::{read_frame, write_frame, FRAME_SIZE_PREFIX_LEN};
pub use request::{decode_request, encode_request, DecodedRequest};
pub use response::{decode_response, encode_response};
pub use versions::{supported_versions, SUPPORTED_APIS};

pub use kafka_protocol;
