//! Any bytes offered as produced record batches are either accepted whole or refused with an
//! error; validation never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kiln_log::batch::validate_batches(data);
});
