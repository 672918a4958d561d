//! SCRAM exchanges (RFC 5802 §5, §7), both ends.
//!
//! ```text
//! client-first   gs2-header client-first-bare     "n,," "n=user,r=<cnonce>"
//! server-first   "r=<cnonce><snonce>,s=<base64 salt>,i=<iterations>"
//! client-final   "c=<base64 gs2-header>,r=<nonce>" ",p=<base64 ClientProof>"
//! server-final   "v=<base64 ServerSignature>"
//!
//! AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
//! ClientSignature = HMAC(StoredKey, AuthMessage)
//! ClientProof     = ClientKey XOR ClientSignature     (the server recovers ClientKey,
//! ServerSignature = HMAC(ServerKey, AuthMessage)       checks H(ClientKey) = StoredKey)
//! ```
//!
//! Not offered: channel binding (`p=` in the gs2 header; Kafka clients do not use it) and
//! Kafka's delegation tokens (the `tokenauth=true` extension).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::credential::{check_iterations, constant_time_eq, SALT_BYTES};
use crate::{
    check_user_name, Mechanism, SaslError, ScramCredential, ITERATIONS_DEFAULT, MESSAGE_BYTES_MAX,
};

/// Random bytes in a server's (and `ScramClient`'s) nonce, before base64.
const NONCE_BYTES: usize = 24;

/// What the server sends after a step.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerStep {
    /// server-first: the client answers with client-final.
    Continue(Vec<u8>),
    /// server-final: `user` is authenticated.
    Done { user: String, message: Vec<u8> },
}

enum State {
    Initial,
    SentFirst(Box<Pending>),
    Finished,
}

struct Pending {
    user: String,
    /// `None`: the user is unknown; the exchange runs on a decoy and fails at the proof.
    credential: Option<ScramCredential>,
    decoy: ScramCredential,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// One server side of one SCRAM exchange.
pub struct ScramServer {
    mechanism: Mechanism,
    /// Seeds the decoy salt of unknown users, so the same unknown name always gets the same
    /// salt from this broker, as a known one does.
    decoy_secret: Vec<u8>,
    server_nonce: String,
    state: State,
}

impl ScramServer {
    pub fn new(mechanism: Mechanism, decoy_secret: &[u8]) -> ScramServer {
        ScramServer::with_nonce(mechanism, decoy_secret, random_nonce())
    }

    fn with_nonce(mechanism: Mechanism, decoy_secret: &[u8], server_nonce: String) -> ScramServer {
        ScramServer {
            mechanism,
            decoy_secret: decoy_secret.to_vec(),
            server_nonce,
            state: State::Initial,
        }
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// Takes the client's next message. `lookup` finds the user's credential for this
    /// mechanism (called once, on client-first). Any error ends the exchange.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<ServerStep, SaslError> {
        if message.len() > MESSAGE_BYTES_MAX {
            self.state = State::Finished;
            return Err(SaslError::Malformed(format!(
                "SCRAM message of {} bytes (at most {MESSAGE_BYTES_MAX})",
                message.len()
            )));
        }
        let text = std::str::from_utf8(message)
            .map_err(|_| SaslError::Malformed("SCRAM messages are UTF-8".into()));
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Initial => {
                let pending = self.client_first(text?, lookup)?;
                let reply = pending.server_first.clone().into_bytes();
                self.state = State::SentFirst(Box::new(pending));
                Ok(ServerStep::Continue(reply))
            }
            State::SentFirst(pending) => self.client_final(text?, &pending),
            State::Finished => Err(SaslError::OutOfOrder("the exchange is over")),
        }
    }

    fn client_first(
        &self,
        text: &str,
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Pending, SaslError> {
        let (gs2_header, bare) = split_gs2_header(text)?;
        let mut attributes = bare.split(',');
        let user = match attributes.next() {
            Some(a) if a.starts_with("m=") => {
                return Err(SaslError::Unsupported("mandatory SCRAM extensions"))
            }
            Some(a) => decode_sasl_name(attr(a, 'n')?)?,
            None => return Err(SaslError::Malformed("client-first has no user".into())),
        };
        check_user_name(&user).map_err(SaslError::Malformed)?;
        let client_nonce = attr(attributes.next().unwrap_or(""), 'r')?;
        check_nonce(client_nonce)?;
        for extension in attributes {
            if extension == "tokenauth=true" {
                return Err(SaslError::Unsupported("delegation tokens"));
            }
        }
        if let Some(authzid) = gs2_header
            .strip_suffix(',')
            .and_then(|h| h.split_once(",a="))
        {
            if decode_sasl_name(authzid.1)? != user {
                return Err(SaslError::Unsupported(
                    "an authorization id other than the user itself",
                ));
            }
        }
        let decoy = self.decoy(&user);
        let credential = lookup(&user);
        let shown = credential.as_ref().unwrap_or(&decoy);
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&shown.salt),
            shown.iterations
        );
        Ok(Pending {
            user,
            credential,
            decoy,
            gs2_header: gs2_header.to_string(),
            client_first_bare: bare.to_string(),
            server_first,
            nonce,
        })
    }

    fn client_final(&self, text: &str, p: &Pending) -> Result<ServerStep, SaslError> {
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| SaslError::Malformed("client-final has no proof".into()))?;
        let mut attributes = without_proof.split(',');
        let binding = attr(attributes.next().unwrap_or(""), 'c')?;
        let binding = STANDARD
            .decode(binding)
            .map_err(|_| SaslError::Malformed("channel binding is not base64".into()))?;
        if binding != p.gs2_header.as_bytes() {
            return Err(SaslError::Malformed(
                "channel binding does not repeat the gs2 header".into(),
            ));
        }
        if attr(attributes.next().unwrap_or(""), 'r')? != p.nonce {
            return Err(SaslError::Malformed(
                "client-final's nonce is not the server's".into(),
            ));
        }
        let proof = STANDARD
            .decode(proof)
            .map_err(|_| SaslError::Malformed("proof is not base64".into()))?;
        let auth_message = format!("{},{},{without_proof}", p.client_first_bare, p.server_first);
        // An unknown user is checked against the decoy too, so both take the same time.
        let credential = p.credential.as_ref().unwrap_or(&p.decoy);
        let signature = self
            .mechanism
            .hmac(&credential.stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(SaslError::Failed);
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let matches = constant_time_eq(&self.mechanism.hash(&client_key), &credential.stored_key);
        if !matches || p.credential.is_none() {
            return Err(SaslError::Failed);
        }
        let server_signature = self
            .mechanism
            .hmac(&credential.server_key, auth_message.as_bytes());
        Ok(ServerStep::Done {
            user: p.user.clone(),
            message: format!("v={}", STANDARD.encode(server_signature)).into_bytes(),
        })
    }

    /// A credential no password matches (its keys are HMACs of the secret, not of a password).
    fn decoy(&self, user: &str) -> ScramCredential {
        let m = self.mechanism;
        let mut salt = m.hmac(&self.decoy_secret, user.as_bytes());
        salt.truncate(SALT_BYTES);
        ScramCredential {
            stored_key: m.hmac(&self.decoy_secret, &salt),
            server_key: m.hmac(&self.decoy_secret, b"server"),
            salt,
            iterations: ITERATIONS_DEFAULT,
        }
    }
}

/// The client side, for Kiln's own tools and tests.
pub struct ScramClient {
    mechanism: Mechanism,
    password: Vec<u8>,
    client_first_bare: String,
    client_nonce: String,
    server_signature: Option<Vec<u8>>,
}

impl ScramClient {
    pub fn new(mechanism: Mechanism, user: &str, password: &[u8]) -> ScramClient {
        ScramClient::with_nonce(mechanism, user, password, random_nonce())
    }

    fn with_nonce(mechanism: Mechanism, user: &str, password: &[u8], nonce: String) -> ScramClient {
        let name = user.replace('=', "=3D").replace(',', "=2C");
        ScramClient {
            mechanism,
            password: password.to_vec(),
            client_first_bare: format!("n={name},r={nonce}"),
            client_nonce: nonce,
            server_signature: None,
        }
    }

    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// client-final for the server's server-first.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, SaslError> {
        let text = std::str::from_utf8(server_first)
            .map_err(|_| SaslError::Malformed("server-first is not UTF-8".into()))?;
        let mut attributes = text.split(',');
        let nonce = attr(attributes.next().unwrap_or(""), 'r')?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(SaslError::Malformed(
                "server nonce does not extend ours".into(),
            ));
        }
        let salt = STANDARD
            .decode(attr(attributes.next().unwrap_or(""), 's')?)
            .map_err(|_| SaslError::Malformed("salt is not base64".into()))?;
        let iterations: u32 = attr(attributes.next().unwrap_or(""), 'i')?
            .parse()
            .map_err(|_| SaslError::Malformed("iteration count is not a number".into()))?;
        check_iterations(iterations).map_err(SaslError::Malformed)?;
        let m = self.mechanism;
        let salted = m.salted_password(&self.password, &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = m.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        self.server_signature = Some(m.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes())
    }

    /// Checks server-final: the server proved it holds the credential.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), SaslError> {
        let expected = self
            .server_signature
            .as_ref()
            .ok_or(SaslError::OutOfOrder("server-final before client-final"))?;
        let text = std::str::from_utf8(server_final)
            .map_err(|_| SaslError::Malformed("server-final is not UTF-8".into()))?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(SaslError::Malformed(format!("server said: {error}")));
        }
        let signature = STANDARD
            .decode(attr(text, 'v')?)
            .map_err(|_| SaslError::Malformed("server signature is not base64".into()))?;
        if !constant_time_eq(&signature, expected) {
            return Err(SaslError::Failed);
        }
        Ok(())
    }
}

/// (gs2-header including its last comma, client-first-bare).
fn split_gs2_header(text: &str) -> Result<(&str, &str), SaslError> {
    let after_flag = match text.as_bytes().first() {
        Some(b'n') | Some(b'y') => 1,
        Some(b'p') => return Err(SaslError::Unsupported("channel binding")),
        _ => {
            return Err(SaslError::Malformed(
                "client-first must start with n, y or p".into(),
            ))
        }
    };
    let rest = &text[after_flag..];
    let rest = rest
        .strip_prefix(',')
        .ok_or_else(|| SaslError::Malformed("gs2 header: a comma after the flag".into()))?;
    let comma = rest
        .find(',')
        .ok_or_else(|| SaslError::Malformed("gs2 header: a comma after the authzid".into()))?;
    let authzid = &rest[..comma];
    if !authzid.is_empty() && !authzid.starts_with("a=") {
        return Err(SaslError::Malformed(
            "gs2 header: authzid must be a=name".into(),
        ));
    }
    let header_len = after_flag + 1 + comma + 1;
    Ok((&text[..header_len], &text[header_len..]))
}

/// The value of attribute `name` in `a` ("name=value").
fn attr(a: &str, name: char) -> Result<&str, SaslError> {
    a.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('='))
        .ok_or_else(|| SaslError::Malformed(format!("expected attribute {name}=")))
}

/// RFC 5802 saslname: "=2C" is ',' and "=3D" is '='; any other '=' is an error.
fn decode_sasl_name(name: &str) -> Result<String, SaslError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3);
        match escape {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(SaslError::Malformed("bad escape in a user name".into())),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn check_nonce(nonce: &str) -> Result<(), SaslError> {
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(SaslError::Malformed(
            "a nonce is one or more printable characters other than ','".into(),
        ));
    }
    Ok(())
}

fn random_nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// RFC 7677 §3's example exchange, byte for byte.
    #[test]
    fn rfc_7677_example() {
        let m = Mechanism::ScramSha256;
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::derive(m, b"pencil", &salt, 4096).unwrap();
        let mut client =
            ScramClient::with_nonce(m, "user", b"pencil", "rOprNGfwEbeRWgbNEkqO".into());
        let mut server =
            ScramServer::with_nonce(m, b"secret", "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into());
        assert_eq!(client.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let ServerStep::Continue(first) = server
            .step(&client.client_first(), |u| {
                (u == "user").then(|| credential.clone())
            })
            .unwrap()
        else {
            panic!("expected server-first")
        };
        assert_eq!(
            String::from_utf8(first.clone()).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let last = client.client_final(&first).unwrap();
        assert_eq!(
            String::from_utf8(last.clone()).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let done = server.step(&last, |_| unreachable!()).unwrap();
        let ServerStep::Done { user, message } = done else {
            panic!("expected server-final")
        };
        assert_eq!(user, "user");
        assert_eq!(message, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        client.verify_server_final(&message).unwrap();
        assert_eq!(
            server.step(b"again", |_| None),
            Err(SaslError::OutOfOrder("the exchange is over"))
        );
    }

    fn exchange(
        m: Mechanism,
        user: &str,
        stored: &[u8],
        tried: &[u8],
        known: bool,
    ) -> Result<String, SaslError> {
        let credential = ScramCredential::derive(m, stored, b"0123456789abcdef", 4096).unwrap();
        let mut client = ScramClient::new(m, user, tried);
        let mut server = ScramServer::new(m, b"decoy");
        let ServerStep::Continue(first) = server.step(&client.client_first(), |_| {
            known.then(|| credential.clone())
        })?
        else {
            panic!("expected server-first")
        };
        let last = client.client_final(&first)?;
        match server.step(&last, |_| None)? {
            ServerStep::Done { user, message } => {
                client.verify_server_final(&message)?;
                Ok(user)
            }
            ServerStep::Continue(_) => panic!("SCRAM has two steps"),
        }
    }

    #[test]
    fn both_mechanisms_pass_the_right_password_and_fail_the_rest_alike() {
        for m in Mechanism::ALL {
            assert_eq!(exchange(m, "a,b=c", b"pw", b"pw", true).unwrap(), "a,b=c");
            assert_eq!(
                exchange(m, "alice", b"pw", b"pW", true),
                Err(SaslError::Failed)
            );
            assert_eq!(
                exchange(m, "mallory", b"pw", b"pw", false),
                Err(SaslError::Failed)
            );
        }
    }

    #[test]
    fn an_unknown_user_gets_a_salt_like_a_known_one() {
        let m = Mechanism::ScramSha512;
        let first = |user: &str| {
            let mut server = ScramServer::with_nonce(m, b"decoy", "N".into());
            match server
                .step(format!("n,,n={user},r=x").as_bytes(), |_| None)
                .unwrap()
            {
                ServerStep::Continue(f) => String::from_utf8(f).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(first("ghost"), first("ghost"));
        assert_ne!(first("ghost"), first("ghost2"));
        let salt = first("ghost");
        let salt = salt.split(",s=").nth(1).unwrap().split(',').next().unwrap();
        assert_eq!(STANDARD.decode(salt).unwrap().len(), SALT_BYTES);
    }

    #[test]
    fn malformed_and_unsupported_client_messages() {
        let m = Mechanism::ScramSha256;
        let try_first = |msg: &[u8]| ScramServer::new(m, b"d").step(msg, |_| None).unwrap_err();
        assert_eq!(
            try_first(b"p=tls-unique,,n=u,r=x"),
            SaslError::Unsupported("channel binding")
        );
        assert_eq!(
            try_first(b"n,,n=u,r=x,tokenauth=true"),
            SaslError::Unsupported("delegation tokens")
        );
        assert_eq!(
            try_first(b"n,,m=ext,n=u,r=x"),
            SaslError::Unsupported("mandatory SCRAM extensions")
        );
        assert_eq!(
            try_first(b"n,a=bob,n=alice,r=x"),
            SaslError::Unsupported("an authorization id other than the user itself")
        );
        for bad in [
            &b""[..],
            b"x,,n=u,r=x",
            b"n,,n=u",
            b"n,,n=u,r=",
            b"n,,n=u=,r=x",
            b"n,,n=,r=x",
            b"n,,r=x",
            b"\xff",
            &[b'n'; MESSAGE_BYTES_MAX + 1],
        ] {
            assert!(matches!(try_first(bad), SaslError::Malformed(_)), "{bad:?}");
        }
        // client-final that changes the nonce or the header, or drops the proof.
        let credential = ScramCredential::derive(m, b"pw", b"salt", 4096).unwrap();
        for bad in [
            "c=biws,r=xN",
            "c=eSws,r=xNONCE,p=AAAA",
            "c=biws,r=xNONCEz,p=AAAA",
            "c=biws,r=xNONCE,p=!",
        ] {
            let mut server = ScramServer::with_nonce(m, b"d", "NONCE".into());
            server
                .step(b"n,,n=u,r=x", |_| Some(credential.clone()))
                .unwrap();
            let e = server.step(bad.as_bytes(), |_| None).unwrap_err();
            assert!(matches!(e, SaslError::Malformed(_)), "{bad}: {e:?}");
        }
    }
}
