//! A connection's SASL state (KIP-43, KIP-152): SaslHandshake names a mechanism, then
//! SaslAuthenticate carries its messages until the client is authenticated.
//!
//! On a listener with `[sasl]`, nothing but ApiVersions, SaslHandshake and SaslAuthenticate is
//! served before that: any other request closes the connection unanswered, as Kafka does (a
//! client that skips authentication is misconfigured, and no error response would be read as
//! "authenticate first"). A failed authentication is answered with SASL_AUTHENTICATION_FAILED
//! after `failed_authentication_delay_ms`, doubled for each recent failure of the client's
//! address (`login_failures.rs`), then the connection closes, so every guess costs a
//! connection and that delay. Without `[sasl]`, SaslHandshake is answered
//! UNSUPPORTED_SASL_MECHANISM with no mechanisms, and the connection stays as it was.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_sasl::{Mechanism, SaslError, ScramServer, ServerStep};

use crate::cluster::Cluster;
use crate::config::{SaslMechanism, SaslSettings};

/// The listener's SASL settings, parsed once.
pub struct SaslListener {
    mechanisms: Vec<SaslMechanism>,
    /// Per client address: how long each failed login waits (`login_failures.rs`).
    failures: crate::login_failures::LoginFailures,
    pub authentication_timeout: Duration,
    /// Who may manage SCRAM users: `super_users` and the bootstrap user.
    super_users: Vec<String>,
    /// Seeds unknown users' decoy salts (`kiln_sasl::ScramServer`) until the cluster's own
    /// secret is in the metadata log (`Cluster::scram_decoy_secret`); drawn at start.
    decoy_secret: Vec<u8>,
}

impl SaslListener {
    pub fn new(settings: &SaslSettings) -> Result<SaslListener, String> {
        let mut decoy_secret = vec![0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut decoy_secret)
            .map_err(|_| "the system's random source failed".to_string())?;
        Ok(SaslListener {
            mechanisms: settings.parsed_mechanisms()?,
            super_users: settings
                .super_users
                .iter()
                .chain(settings.bootstrap_user.iter())
                .cloned()
                .collect(),
            failures: crate::login_failures::LoginFailures::new(Duration::from_millis(
                settings.failed_authentication_delay_ms,
            )),
            authentication_timeout: Duration::from_millis(settings.authentication_timeout_ms),
            decoy_secret,
        })
    }

    pub fn offers_plain(&self) -> bool {
        self.mechanisms.contains(&SaslMechanism::Plain)
    }

    fn names(&self) -> Vec<StrBytes> {
        self.mechanisms
            .iter()
            .map(|m| StrBytes::from_static_str(m.name()))
            .collect()
    }
}

enum State {
    /// No `[sasl]`: every request is served.
    Open,
    AwaitingHandshake,
    Plain,
    Scram(Box<ScramServer>),
    /// Authenticated as this principal (`User:<name>`).
    Authenticated(String),
}

/// What the connection does after a SASL request.
pub enum Next {
    /// Answer and read on.
    Answer(SaslAnswer),
    /// Answer, wait out the failed-authentication delay first, then close.
    AnswerAndClose(SaslAnswer, Duration),
}

pub enum SaslAnswer {
    Handshake(SaslHandshakeResponse),
    Authenticate(SaslAuthenticateResponse),
}

/// One connection's SASL session.
pub struct Session {
    listener: Option<Arc<SaslListener>>,
    state: State,
}

impl Session {
    pub fn new(listener: Option<Arc<SaslListener>>) -> Session {
        let state = if listener.is_some() {
            State::AwaitingHandshake
        } else {
            State::Open
        };
        Session { listener, state }
    }

    /// The authenticated principal (`User:<name>`), once there is one.
    pub fn principal(&self) -> Option<&str> {
        match &self.state {
            State::Authenticated(p) => Some(p),
            _ => None,
        }
    }

    /// Whether this connection may manage SCRAM users: any connection of a listener without
    /// `[sasl]` (nobody is authenticated there), else a super user's.
    pub fn may_manage_users(&self) -> bool {
        match (&self.listener, &self.state) {
            (None, _) => true,
            (Some(l), State::Authenticated(principal)) => principal
                .strip_prefix("User:")
                .is_some_and(|user| l.super_users.iter().any(|s| s == user)),
            (Some(_), _) => false,
        }
    }

    /// Whether requests other than the SASL ones may be served.
    pub fn may_serve(&self) -> bool {
        matches!(self.state, State::Open | State::Authenticated(_))
    }

    /// How long the client has left to authenticate: `None` once it may be served.
    pub fn authentication_timeout(&self) -> Option<Duration> {
        match (&self.listener, self.may_serve()) {
            (Some(l), false) => Some(l.authentication_timeout),
            _ => None,
        }
    }

    pub fn handshake(&mut self, cluster: &Cluster, request: &SaslHandshakeRequest) -> Next {
        let Some(listener) = self.listener.clone() else {
            return Next::Answer(SaslAnswer::Handshake(
                SaslHandshakeResponse::default()
                    .with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
            ));
        };
        let offered = listener.names();
        if !matches!(self.state, State::AwaitingHandshake) {
            return refuse_handshake(ResponseError::IllegalSaslState, offered);
        }
        let asked = request.mechanism.as_str();
        let chosen = listener
            .mechanisms
            .iter()
            .copied()
            .find(|m| m.name() == asked);
        match chosen {
            Some(SaslMechanism::Plain) => self.state = State::Plain,
            Some(SaslMechanism::Scram(m)) => {
                let secret = cluster
                    .scram_decoy_secret()
                    .unwrap_or_else(|| listener.decoy_secret.clone());
                self.state = State::Scram(Box::new(ScramServer::new(m, &secret)));
            }
            None => {
                // The client's text, quoted and cut: a log line must not be theirs to shape.
                let shown: String = asked.chars().take(64).collect();
                tracing::info!(
                    mechanism = ?shown,
                    "refused a SASL mechanism that is not offered"
                );
                return refuse_handshake(ResponseError::UnsupportedSaslMechanism, offered);
            }
        }
        Next::Answer(SaslAnswer::Handshake(
            SaslHandshakeResponse::default().with_mechanisms(offered),
        ))
    }

    /// One SaslAuthenticate message; `peer` is for the log.
    pub fn authenticate(
        &mut self,
        cluster: &Cluster,
        request: &SaslAuthenticateRequest,
        peer: std::net::SocketAddr,
    ) -> Next {
        let Some(listener) = self.listener.clone() else {
            return Next::Answer(illegal_state("this listener does not use SASL"));
        };
        let bytes = &request.auth_bytes;
        let outcome = match &mut self.state {
            State::Plain => plain(cluster, bytes).map(|user| (user, Bytes::new())),
            State::Scram(server) => {
                let m = server.mechanism();
                match server.step(bytes, |user| cluster.scram_credential(user, m)) {
                    Ok(ServerStep::Continue(reply)) => {
                        return Next::Answer(SaslAnswer::Authenticate(
                            SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(reply)),
                        ))
                    }
                    Ok(ServerStep::Done { user, message }) => Ok((user, Bytes::from(message))),
                    Err(e) => Err(e),
                }
            }
            State::AwaitingHandshake => {
                return Next::AnswerAndClose(illegal_state("SaslHandshake first"), Duration::ZERO)
            }
            State::Open | State::Authenticated(_) => {
                return Next::AnswerAndClose(
                    illegal_state("this connection is already authenticated"),
                    Duration::ZERO,
                )
            }
        };
        let mechanism = match &self.state {
            State::Scram(s) => s.mechanism().name(),
            _ => "PLAIN",
        };
        match outcome {
            Ok((user, reply)) => {
                let principal = format!("User:{user}");
                tracing::debug!(%peer, %principal, mechanism, "SASL client authenticated");
                self.state = State::Authenticated(principal);
                Next::Answer(SaslAnswer::Authenticate(
                    SaslAuthenticateResponse::default().with_auth_bytes(reply),
                ))
            }
            Err(e) => {
                // The user name is not logged: a client that typed its password into the user
                // field would leave it in the log.
                let delay = listener
                    .failures
                    .failed(peer.ip(), std::time::Instant::now());
                tracing::warn!(%peer, mechanism, error = %e, answer_after = ?delay, "refused a client: SASL authentication failed");
                let message = match e {
                    SaslError::Failed => format!(
                        "Authentication failed: invalid credentials with SASL mechanism {mechanism}"
                    ),
                    other => format!("Authentication failed: {other}"),
                };
                self.state = State::AwaitingHandshake;
                Next::AnswerAndClose(
                    SaslAnswer::Authenticate(
                        SaslAuthenticateResponse::default()
                            .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                            .with_error_message(Some(StrBytes::from_string(message))),
                    ),
                    delay,
                )
            }
        }
    }
}

/// A SaslHandshake answered with `error` and the offered mechanisms, then the connection
/// closes.
fn refuse_handshake(error: ResponseError, offered: Vec<StrBytes>) -> Next {
    Next::AnswerAndClose(
        SaslAnswer::Handshake(
            SaslHandshakeResponse::default()
                .with_error_code(error.code())
                .with_mechanisms(offered),
        ),
        Duration::ZERO,
    )
}

fn illegal_state(why: &'static str) -> SaslAnswer {
    SaslAnswer::Authenticate(
        SaslAuthenticateResponse::default()
            .with_error_code(ResponseError::IllegalSaslState.code())
            .with_error_message(Some(StrBytes::from_static_str(why))),
    )
}

/// PLAIN against the user's SCRAM credential (SHA-512's if it has one, else SHA-256's).
fn plain(cluster: &Cluster, message: &[u8]) -> Result<String, SaslError> {
    let (user, password) = kiln_sasl::parse_plain(message)?;
    let found = [Mechanism::ScramSha512, Mechanism::ScramSha256]
        .into_iter()
        .find_map(|m| cluster.scram_credential(&user, m).map(|c| (m, c)));
    match found {
        Some((m, credential)) if credential.verify_password(m, &password) => Ok(user),
        Some(_) => Err(SaslError::Failed),
        None => {
            // The same PBKDF2 work as a known user's check, so the answer's timing does not
            // say whether the user exists.
            let _ = Mechanism::ScramSha512.salted_password(
                &password,
                b"kiln-plain-decoy",
                kiln_sasl::ITERATIONS_DEFAULT,
            );
            Err(SaslError::Failed)
        }
    }
}
