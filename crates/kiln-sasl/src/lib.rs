//! SASL for Kiln's Kafka listener (KIP-43, KIP-84): the mechanisms a client names in
//! SaslHandshake, and the exchanges SaslAuthenticate carries.
//!
//! - `PLAIN` (RFC 4616): `[authzid] NUL user NUL password`, checked against the user's SCRAM
//!   credential (the password is salted and hashed like a SCRAM client would, then compared
//!   with the stored key), so PLAIN needs no second, reversible store.
//! - `SCRAM-SHA-256` and `SCRAM-SHA-512` (RFC 5802, RFC 7677): two round trips; the broker
//!   holds only the salt, the iteration count, StoredKey and ServerKey (`credential.rs`), never
//!   the password or anything a client could log in with.
//!
//! Every message is bounded before it is parsed (`MESSAGE_BYTES_MAX`, `USER_BYTES_MAX`), and a
//! failed exchange says no more to the client than "authentication failed": an unknown user
//! goes through the same steps as a wrong password, with a salt derived from a secret the
//! caller keeps (Kiln: one per cluster) so the salt does not tell the two apart either.

mod credential;
mod plain;
mod scram;

pub use credential::{
    check_iterations, Mechanism, ScramCredential, ITERATIONS_DEFAULT, ITERATIONS_MAX,
    ITERATIONS_MIN,
};
pub use plain::parse_plain;
pub use scram::{ScramClient, ScramServer, ServerStep};

/// Longest SASL message accepted from a client, in bytes: SCRAM's are under 300 bytes for a
/// 64-byte user name; PLAIN's carry the password.
pub const MESSAGE_BYTES_MAX: usize = 4096;
/// Longest user name, in bytes (UTF-8).
pub const USER_BYTES_MAX: usize = 256;
/// Longest password `kiln users` and PLAIN accept, in bytes.
pub const PASSWORD_BYTES_MAX: usize = 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SaslError {
    /// The message does not follow the mechanism's grammar; the text says where.
    #[error("malformed SASL message: {0}")]
    Malformed(String),
    /// A feature of the mechanism Kiln does not offer (channel binding, delegation tokens).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// Wrong password, unknown user, or a proof that does not verify: one answer for all.
    #[error("authentication failed: invalid credentials")]
    Failed,
    /// A step arrived in the wrong order (a bug in the caller, or a client replaying).
    #[error("SASL exchange out of order: {0}")]
    OutOfOrder(&'static str),
}

/// A user name as a credential store keys it: non-empty, at most `USER_BYTES_MAX` bytes, no
/// control characters.
pub fn check_user_name(user: &str) -> Result<(), String> {
    if user.is_empty() {
        return Err("a user name cannot be empty".into());
    }
    if user.len() > USER_BYTES_MAX {
        return Err(format!(
            "a user name is at most {USER_BYTES_MAX} bytes (got {})",
            user.len()
        ));
    }
    if user.chars().any(char::is_control) {
        return Err("a user name cannot hold control characters".into());
    }
    Ok(())
}
