//! SCRAM credentials (RFC 5802 §3): what a broker stores for a user and mechanism.
//!
//! ```text
//! SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)     never stored
//! ClientKey      = HMAC(SaltedPassword, "Client Key")             never stored
//! StoredKey      = H(ClientKey)                                   stored
//! ServerKey      = HMAC(SaltedPassword, "Server Key")             stored
//! ```
//!
//! StoredKey lets the broker check a client's proof without being able to produce one;
//! ServerKey lets it prove to the client that it holds the credential. Kafka's
//! AlterUserScramCredentials carries SaltedPassword (the client salts and hashes), so
//! `from_salted_password` is the entry point the broker uses; `derive` is for PLAIN and tools.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::{digest, hmac, pbkdf2};
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// Kafka's floor for SCRAM iterations (`ScramMechanism.minIterations`).
pub const ITERATIONS_MIN: u32 = 4096;
/// Kafka's ceiling (`ScramMechanism.maxIterations` is 16384): more only slows logins.
pub const ITERATIONS_MAX: u32 = 16384;
/// What `kiln users create` uses unless told otherwise.
pub const ITERATIONS_DEFAULT: u32 = 4096;
/// Bytes of salt `kiln users create` draws.
pub const SALT_BYTES: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::ScramSha256, Mechanism::ScramSha512];

    /// The name clients send in SaslHandshake.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The code AlterUserScramCredentials and DescribeUserScramCredentials use (KIP-554).
    pub fn kafka_type(self) -> i8 {
        match self {
            Mechanism::ScramSha256 => 1,
            Mechanism::ScramSha512 => 2,
        }
    }

    pub fn from_kafka_type(code: i8) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.kafka_type() == code)
    }

    /// Bytes of H's output (and so of SaltedPassword, StoredKey, ServerKey).
    pub fn key_bytes(self) -> usize {
        self.digest().output_len()
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::ScramSha256 => &digest::SHA256,
            Mechanism::ScramSha512 => &digest::SHA512,
        }
    }

    fn hmac_algorithm(self) -> hmac::Algorithm {
        match self {
            Mechanism::ScramSha256 => hmac::HMAC_SHA256,
            Mechanism::ScramSha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2_algorithm(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::ScramSha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::ScramSha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    pub(crate) fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        let key = hmac::Key::new(self.hmac_algorithm(), key);
        hmac::sign(&key, data).as_ref().to_vec()
    }

    pub(crate) fn hash(self, data: &[u8]) -> Vec<u8> {
        digest::digest(self.digest(), data).as_ref().to_vec()
    }

    /// SaltedPassword. `iterations` must be in range (checked by the callers that take it
    /// from input; asserted here).
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let rounds = NonZeroU32::new(iterations).expect("iterations are checked before use");
        let mut out = vec![0u8; self.key_bytes()];
        pbkdf2::derive(self.pbkdf2_algorithm(), rounds, salt, password, &mut out);
        out
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What is stored per user and mechanism. `Debug` shows the salt and iteration count only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScramCredential {
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    pub iterations: u32,
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("salt_bytes", &self.salt.len())
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential for `salted_password` (AlterUserScramCredentials' upsertion). Refuses
    /// iteration counts outside Kafka's range, an empty salt and a SaltedPassword of the wrong
    /// length for the mechanism.
    pub fn from_salted_password(
        mechanism: Mechanism,
        salt: &[u8],
        iterations: u32,
        salted_password: &[u8],
    ) -> Result<ScramCredential, String> {
        check_iterations(iterations)?;
        if salt.is_empty() || salt.len() > 1024 {
            return Err(format!("a salt is 1 to 1024 bytes (got {})", salt.len()));
        }
        if salted_password.len() != mechanism.key_bytes() {
            return Err(format!(
                "a {mechanism} salted password is {} bytes (got {})",
                mechanism.key_bytes(),
                salted_password.len()
            ));
        }
        let client_key = mechanism.hmac(salted_password, b"Client Key");
        Ok(ScramCredential {
            salt: salt.to_vec(),
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
        })
    }

    /// The credential for a password (tools and tests; the broker never sees a password
    /// except through PLAIN).
    pub fn derive(
        mechanism: Mechanism,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> Result<ScramCredential, String> {
        check_iterations(iterations)?;
        let salted = mechanism.salted_password(password, salt, iterations);
        ScramCredential::from_salted_password(mechanism, salt, iterations, &salted)
    }

    /// A fresh random salt of `SALT_BYTES`.
    pub fn random_salt() -> Vec<u8> {
        let mut salt = vec![0u8; SALT_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
            .expect("the system's random source works");
        salt
    }

    /// PLAIN's check: the password, salted and hashed with this credential's salt and count,
    /// gives its StoredKey (compared in constant time).
    pub fn verify_password(&self, mechanism: Mechanism, password: &[u8]) -> bool {
        if check_iterations(self.iterations).is_err() {
            return false;
        }
        let salted = mechanism.salted_password(password, &self.salt, self.iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        let stored = mechanism.hash(&client_key);
        constant_time_eq(&stored, &self.stored_key)
    }
}

/// Kafka's range for SCRAM iteration counts, or why `iterations` is outside it.
pub fn check_iterations(iterations: u32) -> Result<(), String> {
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
        return Err(format!(
            "SCRAM iterations must be {ITERATIONS_MIN} to {ITERATIONS_MAX} (got {iterations})"
        ));
    }
    Ok(())
}

/// Equal length and bytes, in time that depends on the length only.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

mod b64 {
    use super::{Engine, STANDARD};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_credential_checks_its_own_password_and_no_other() {
        for m in Mechanism::ALL {
            let c = ScramCredential::derive(m, b"pencil", b"salt-salt", 4096).unwrap();
            assert_eq!(c.stored_key.len(), m.key_bytes());
            assert!(c.verify_password(m, b"pencil"));
            assert!(!c.verify_password(m, b"pencil "));
            // Debug never prints key material.
            let shown = format!("{c:?}");
            assert!(
                !shown.contains("stored_key") && !shown.contains("server_key"),
                "{shown}"
            );
            // Round trip through the metadata log's JSON.
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<ScramCredential>(&json).unwrap(), c);
        }
    }

    #[test]
    fn out_of_range_inputs_are_refused_with_their_values() {
        let m = Mechanism::ScramSha256;
        let e = ScramCredential::derive(m, b"x", b"s", 4095).unwrap_err();
        assert!(e.contains("4095"), "{e}");
        let e = ScramCredential::from_salted_password(m, b"s", 4096, &[0; 64]).unwrap_err();
        assert!(e.contains("32 bytes (got 64)"), "{e}");
        let e = ScramCredential::from_salted_password(m, b"", 4096, &[0; 32]).unwrap_err();
        assert!(e.contains("salt"), "{e}");
        assert_eq!(Mechanism::from_kafka_type(3), None);
        assert_eq!(Mechanism::from_name("SCRAM-SHA-1"), None);
    }
}
