//! Logging in to a `[sasl]` listener: SaslHandshake v1, then SaslAuthenticate carrying the
//! mechanism's messages (kiln-sasl builds them).

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    RequestKind, ResponseKind, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use kiln_sasl::{Mechanism, ScramClient};

use crate::{ClientError, Connection};

/// Who a tool logs in as. `Debug` leaves the password out.
#[derive(Clone)]
pub struct SaslLogin {
    /// "SCRAM-SHA-512", "SCRAM-SHA-256" or "PLAIN".
    pub mechanism: String,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for SaslLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslLogin")
            .field("mechanism", &self.mechanism)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// How a tool reaches a broker: TLS (a `[tls]` listener) and a SASL login (a `[sasl]` one).
#[derive(Clone, Default)]
pub struct Security {
    pub tls: Option<tokio_rustls::TlsConnector>,
    pub sasl: Option<SaslLogin>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

impl Connection {
    /// Connects as `security` says: TLS when set, then the SASL login when set.
    pub async fn open(
        address: &str,
        timeout: Duration,
        security: &Security,
    ) -> Result<Connection, ClientError> {
        let mut conn = Connection::connect_with(address, timeout, security.tls.as_ref()).await?;
        if let Some(login) = &security.sasl {
            conn.authenticate(login, timeout).await?;
        }
        Ok(conn)
    }

    /// Authenticates this connection; any refusal is `ClientError::Sasl` with the broker's
    /// message.
    pub async fn authenticate(
        &mut self,
        login: &SaslLogin,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let refused = |reason: String| ClientError::Sasl(reason);
        let handshake = SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_string(login.mechanism.clone()));
        match self
            .call(RequestKind::SaslHandshake(handshake), timeout)
            .await?
        {
            ResponseKind::SaslHandshake(r) if r.error_code == 0 => {}
            ResponseKind::SaslHandshake(r) => {
                let offered: Vec<&str> = r.mechanisms.iter().map(|m| m.as_str()).collect();
                return Err(refused(format!(
                    "the broker does not offer {} (error {}; it offers {offered:?})",
                    login.mechanism, r.error_code
                )));
            }
            _ => {
                return Err(ClientError::UnexpectedResponse(
                    kafka_protocol::messages::ApiKey::SaslHandshake,
                ))
            }
        }
        match Mechanism::from_name(&login.mechanism) {
            Some(m) => {
                let mut scram = ScramClient::new(m, &login.user, login.password.as_bytes());
                let first = self.sasl_step(scram.client_first(), timeout).await?;
                let last = scram
                    .client_final(&first)
                    .map_err(|e| refused(e.to_string()))?;
                let verdict = self.sasl_step(last, timeout).await?;
                scram
                    .verify_server_final(&verdict)
                    .map_err(|e| refused(format!("the broker's proof does not verify: {e}")))
            }
            None if login.mechanism == "PLAIN" => {
                let message = format!("\0{}\0{}", login.user, login.password).into_bytes();
                self.sasl_step(message, timeout).await.map(|_| ())
            }
            None => Err(refused(format!(
                "unknown SASL mechanism {:?}: use SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN",
                login.mechanism
            ))),
        }
    }

    async fn sasl_step(
        &mut self,
        message: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(message));
        match self
            .call(RequestKind::SaslAuthenticate(request), timeout)
            .await?
        {
            ResponseKind::SaslAuthenticate(r) if r.error_code == 0 => Ok(r.auth_bytes.to_vec()),
            ResponseKind::SaslAuthenticate(r) => Err(ClientError::Sasl(
                r.error_message
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| format!("error code {}", r.error_code)),
            )),
            _ => Err(ClientError::UnexpectedResponse(
                kafka_protocol::messages::ApiKey::SaslAuthenticate,
            )),
        }
    }
}
