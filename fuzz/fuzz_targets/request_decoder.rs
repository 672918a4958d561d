//! Any bytes handed to the request decoder must produce a request or an error, never a panic
//! or an abort (allocation sized by the input).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kiln_wire::decode_request(bytes::Bytes::copy_from_slice(data));
});
