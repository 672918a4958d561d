//! Redfish: a small client for a node's BMC and the checks that use it.
//!
//! Client: reqwest over rustls (ring provider). Every request has a connect and a total
//! timeout and is retried with back-off on connection errors, timeouts, 429 and 5xx.
//! Authentication is none, HTTP basic, or a Redfish session (`X-Auth-Token`, logged in on
//! first use and again once on a 401). TLS trusts the system roots, a given CA bundle, or
//! (explicit opt-out, for BMCs with self-signed certificates) anything.
//!
//! The checks that use it are in `checks`.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Mutex;

mod checks;

pub use checks::{BmcCheck, BmcSpec, FIRMWARE_COMPONENTS};

/// Largest response body read from a BMC.
pub const BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Most members read from one collection (across `@odata.nextLink` pages).
pub const MEMBERS_MAX: usize = 10_000;
/// Most pages followed in one collection.
pub const PAGES_MAX: usize = 100;

/// How to authenticate to a BMC. Its `Debug` leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Basic {
        user: String,
        password: String,
    },
    /// POST `/redfish/v1/SessionService/Sessions`, then `X-Auth-Token` on every request.
    Session {
        user: String,
        password: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Basic { user, .. } => f
                .debug_struct("Basic")
                .field("user", user)
                .field("password", &"[redacted]")
                .finish(),
            Auth::Session { user, .. } => f
                .debug_struct("Session")
                .field("user", user)
                .field("password", &"[redacted]")
                .finish(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// The operating system's trust store.
    SystemRoots,
    /// Only these CA certificates (PEM bundle), e.g. the site's BMC CA.
    CaPem(Vec<u8>),
    /// Accept any certificate and host name. An explicit opt-out for self-signed BMCs:
    /// the connection is encrypted but the BMC is not authenticated.
    InsecureAcceptAny,
}

#[derive(Debug, Clone)]
pub struct RedfishConfig {
    /// `https://10.0.0.11` (or `http://127.0.0.1:8000` for an emulator).
    pub base_url: String,
    pub auth: Auth,
    pub tls: TlsTrust,
    pub connect_timeout: Duration,
    /// Whole request, body included.
    pub request_timeout: Duration,
    /// Extra attempts after the first, for retryable failures.
    pub retries: u32,
    /// Wait before the first retry; doubles each time.
    pub retry_backoff: Duration,
}

impl RedfishConfig {
    /// Defaults for a BMC at `address` (`host` or `host:port`) over HTTPS.
    pub fn for_address(address: &str, auth: Auth, tls: TlsTrust) -> RedfishConfig {
        RedfishConfig {
            base_url: format!("https://{address}"),
            auth,
            tls,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            retries: 2,
            retry_backoff: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedfishError {
    #[error("invalid Redfish client settings: {0}")]
    Config(String),
    #[error("GET {path}: cannot connect to the BMC: {reason}")]
    Connect { path: String, reason: String },
    #[error("GET {path}: timed out after {:.1} s", after.as_secs_f64())]
    Timeout { path: String, after: Duration },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Http {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("GET {path}: {reason}")]
    Body { path: String, reason: String },
    #[error("session login failed: {0}")]
    Login(String),
}

impl RedfishError {
    fn retryable(&self) -> bool {
        match self {
            RedfishError::Connect { .. } | RedfishError::Timeout { .. } => true,
            // 501 Not Implemented is an answer, not a passing trouble.
            RedfishError::Http { status, .. } => {
                *status == 429 || (*status >= 500 && *status != 501)
            }
            _ => false,
        }
    }
}

/// A Redfish session; its `Debug` leaves the token out.
#[derive(Clone)]
struct Session {
    token: String,
    location: Option<String>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("token", &"[redacted]")
            .field("location", &self.location)
            .finish()
    }
}

pub struct RedfishClient {
    http: reqwest::Client,
    base: String,
    auth: Auth,
    retries: u32,
    retry_backoff: Duration,
    request_timeout: Duration,
    session: Mutex<Option<Session>>,
    /// Whether the service root says `$expand=.($levels=1)` works (read once).
    expand_levels: tokio::sync::OnceCell<bool>,
    /// Set when a service that claims `$expand` refused it: asked no more.
    expand_refused: std::sync::atomic::AtomicBool,
}

impl RedfishClient {
    pub fn new(cfg: RedfishConfig) -> Result<RedfishClient, RedfishError> {
        // reqwest is built without a default crypto provider (no aws-lc build); use ring.
        // Fails harmlessly when a provider is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = cfg.base_url.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(RedfishError::Config(format!(
                "base_url {base:?} must start with https:// or http://"
            )));
        }
        let mut b = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .timeout(cfg.request_timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .user_agent(concat!("kiln-checks/", env!("CARGO_PKG_VERSION")));
        match &cfg.tls {
            TlsTrust::SystemRoots => {}
            TlsTrust::CaPem(pem) => {
                let certs = reqwest::Certificate::from_pem_bundle(pem)
                    .map_err(|e| RedfishError::Config(format!("CA bundle: {e}")))?;
                if certs.is_empty() {
                    return Err(RedfishError::Config(
                        "CA bundle holds no certificate".into(),
                    ));
                }
                b = b.tls_certs_only(certs);
            }
            TlsTrust::InsecureAcceptAny => {
                b = b
                    .tls_danger_accept_invalid_certs(true)
                    .tls_danger_accept_invalid_hostnames(true);
            }
        }
        let http = b
            .build()
            .map_err(|e| RedfishError::Config(format!("HTTP client: {e}")))?;
        Ok(RedfishClient {
            http,
            base,
            auth: cfg.auth,
            retries: cfg.retries,
            retry_backoff: cfg.retry_backoff,
            request_timeout: cfg.request_timeout,
            session: Mutex::new(None),
            expand_levels: tokio::sync::OnceCell::new(),
            expand_refused: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!("{}{}", self.base, path)
        }
    }

    /// GETs a Redfish resource as JSON, with retries and authentication.
    pub async fn get(&self, path: &str) -> Result<Value, RedfishError> {
        let mut relogged = false;
        let mut attempt = 0u32;
        let mut backoff = self.retry_backoff;
        loop {
            match self.get_once(path).await {
                Ok(v) => return Ok(v),
                Err(RedfishError::Http { status: 401, .. })
                    if matches!(self.auth, Auth::Session { .. }) && !relogged =>
                {
                    relogged = true;
                    *self.session.lock().await = None;
                }
                Err(e) if e.retryable() && attempt < self.retries => {
                    attempt += 1;
                    tracing::debug!(path, attempt, error = %e, "retrying Redfish GET");
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn get_once(&self, path: &str) -> Result<Value, RedfishError> {
        let mut req = self
            .http
            .get(self.url(path))
            .header("Accept", "application/json")
            .header("OData-Version", "4.0");
        match &self.auth {
            Auth::None => {}
            Auth::Basic { user, password } => req = req.basic_auth(user, Some(password)),
            Auth::Session { .. } => {
                let token = self.session_token().await?;
                req = req.header("X-Auth-Token", token);
            }
        }
        let resp = req.send().await.map_err(|e| self.send_error(path, e))?;
        read_json("GET", path, resp, self.request_timeout).await
    }

    fn send_error(&self, path: &str, e: reqwest::Error) -> RedfishError {
        if e.is_timeout() {
            RedfishError::Timeout {
                path: path.to_string(),
                after: self.request_timeout,
            }
        } else {
            RedfishError::Connect {
                path: path.to_string(),
                reason: error_chain(&e),
            }
        }
    }

    async fn session_token(&self) -> Result<String, RedfishError> {
        let mut guard = self.session.lock().await;
        if let Some(s) = guard.as_ref() {
            return Ok(s.token.clone());
        }
        let Auth::Session { user, password } = &self.auth else {
            return Err(RedfishError::Login("not using session auth".into()));
        };
        let path = "/redfish/v1/SessionService/Sessions";
        let resp = self
            .http
            .post(self.url(path))
            .header("Accept", "application/json")
            .json(&json!({ "UserName": user, "Password": password }))
            .send()
            .await
            .map_err(|e| RedfishError::Login(error_chain(&e)))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(RedfishError::Login(format!("POST {path}: HTTP {status}")));
        }
        let token = resp
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| RedfishError::Login("no X-Auth-Token in the response".into()))?;
        let location = resp
            .headers()
            .get("Location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        *guard = Some(Session {
            token: token.clone(),
            location,
        });
        Ok(token)
    }

    /// Deletes the Redfish session, if one was opened (BMCs have few session slots).
    pub async fn logout(&self) {
        let session = self.session.lock().await.take();
        if let Some(Session {
            token,
            location: Some(loc),
        }) = session
        {
            let _ = self
                .http
                .delete(self.url(&loc))
                .header("X-Auth-Token", token)
                .send()
                .await;
        }
    }

    /// Whether the service supports `$expand` with levels (`ProtocolFeaturesSupported`),
    /// asked once. A service that does not say so is not sent the query (Redfish services
    /// answer unknown query parameters with 501).
    async fn supports_expand(&self) -> bool {
        if self
            .expand_refused
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return false;
        }
        *self
            .expand_levels
            .get_or_init(|| async {
                match self.get("/redfish/v1").await {
                    Ok(root) => {
                        root.pointer("/ProtocolFeaturesSupported/ExpandQuery/Levels")
                            == Some(&Value::Bool(true))
                    }
                    Err(_) => false,
                }
            })
            .await
    }

    /// The members of a collection, following `Members@odata.nextLink`. Members that are
    /// only links are returned as such; `expand` fetches each one, asking the service to
    /// expand the collection in one response first (`$expand=.($levels=1)`) where it says it
    /// can: a BMC's sensors or log entries are otherwise one request each. A service that
    /// ignores the query still answers with links, which are then fetched one by one.
    /// `Members@odata.count` is never used (BMCs get it wrong).
    pub async fn members(
        &self,
        collection: &str,
        expand: bool,
    ) -> Result<Vec<Value>, RedfishError> {
        let mut out = Vec::new();
        let expanded = expand && !collection.contains('?') && self.supports_expand().await;
        let mut next = Some(if expanded {
            format!("{collection}?$expand=.($levels=1)")
        } else {
            collection.to_string()
        });
        let mut pages = 0;
        while let Some(path) = next.take() {
            pages += 1;
            let doc = match self.get(&path).await {
                // Some services claim `$expand` and answer it with an error (sushy-static
                // with a 404): ask the plain collection, and stop asking.
                Err(RedfishError::Http { status, .. })
                    if expanded && pages == 1 && (400..600).contains(&status) && status != 401 =>
                {
                    self.expand_refused
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    self.get(collection).await?
                }
                other => other?,
            };
            for m in doc
                .get("Members")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if out.len() >= MEMBERS_MAX {
                    return Ok(out);
                }
                out.push(m.clone());
            }
            if pages < PAGES_MAX {
                next = doc
                    .get("Members@odata.nextLink")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
        }
        if expand {
            let mut full = Vec::with_capacity(out.len());
            for m in out {
                full.push(self.resolve(&m).await?);
            }
            out = full;
        }
        Ok(out)
    }

    /// A member or link: `{"@odata.id": ...}` alone is fetched; a full object is kept.
    pub async fn resolve(&self, v: &Value) -> Result<Value, RedfishError> {
        match v.as_object() {
            Some(o) if o.len() == 1 => match o.get("@odata.id").and_then(Value::as_str) {
                Some(id) => self.get(id).await,
                None => Ok(v.clone()),
            },
            _ => Ok(v.clone()),
        }
    }
}

async fn read_json(
    method: &str,
    path: &str,
    mut resp: reqwest::Response,
    timeout: Duration,
) -> Result<Value, RedfishError> {
    let status = resp.status().as_u16();
    // HTTP/1.0 servers (some BMCs, sushy-static) end a body by closing the connection, and
    // over TLS some close without close_notify, which rustls reports as an unexpected EOF.
    // Such a body is accepted only if it then parses as a whole JSON object (a cut one
    // does not), so truncation is still caught.
    let close_delimited = resp.content_length().is_none();
    let mut eof_without_close_notify = false;
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > BODY_BYTES_MAX {
                    return Err(RedfishError::Body {
                        path: path.to_string(),
                        reason: format!("response larger than {BODY_BYTES_MAX} bytes"),
                    });
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) if e.is_timeout() => {
                return Err(RedfishError::Timeout {
                    path: path.to_string(),
                    after: timeout,
                })
            }
            Err(e) if close_delimited && is_unexpected_eof(&e) => {
                eof_without_close_notify = true;
                break;
            }
            Err(e) => {
                return Err(RedfishError::Connect {
                    path: path.to_string(),
                    reason: error_chain(&e),
                })
            }
        }
    }
    if !(200..300).contains(&status) {
        let text = String::from_utf8_lossy(&body);
        return Err(RedfishError::Http {
            method: method.to_string(),
            path: path.to_string(),
            status,
            body: text.chars().take(300).collect(),
        });
    }
    let value: Value = serde_json::from_slice(&body).map_err(|e| RedfishError::Body {
        path: path.to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    if eof_without_close_notify && !value.is_object() {
        return Err(RedfishError::Body {
            path: path.to_string(),
            reason: "connection closed without TLS close_notify and the body is not a JSON object"
                .into(),
        });
    }
    Ok(value)
}

fn is_unexpected_eof(e: &reqwest::Error) -> bool {
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(inner) = src {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return true;
            }
        }
        src = inner.source();
    }
    false
}

/// An error with its sources: reqwest's top-level message alone hides the TLS reason.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

pub(crate) fn text(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
}

pub(crate) fn odata_id(v: &Value) -> Option<String> {
    text(v, "/@odata.id")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_leaves_passwords_and_tokens_out() {
        let auth = Auth::Session {
            user: "admin".into(),
            password: "bmc-pass-42".into(),
        };
        let session = Session {
            token: "tok-9f3a".into(),
            location: None,
        };
        let shown = format!("{auth:?} {session:?}");
        assert!(
            !shown.contains("bmc-pass-42") && !shown.contains("tok-9f3a"),
            "{shown}"
        );
        assert!(shown.contains("admin"), "{shown}");
    }
}
