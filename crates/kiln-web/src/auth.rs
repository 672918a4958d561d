//! Who may make a request: the check every request to intake and the dashboard passes before
//! its handler ([`Guard`], an axum middleware).
//!
//! A service needs one [`Scope`]: intake `write`, the dashboard `read`.
//! - With a token file, a request carries a token with that scope, as
//!   `Authorization: Bearer TOKEN`, or as the password of HTTP Basic
//!   (`Authorization: Basic base64(NAME:TOKEN)`; the name is not checked) so that a browser
//!   logs in to the dashboard with its own prompt.
//! - With client certificates required, the TLS handshake has already refused every client
//!   the client CA did not sign; the certificate's subject names the caller.
//! - Both may be set: then a request needs both.
//!
//! Answers, as JSON `{"error": ...}` for an API and as text for pages: 401 with
//! `WWW-Authenticate` for no token or an unknown one, 403 for a token without the scope, 503
//! while the token file is broken. Open paths (`/healthz`) pass
//! unchecked. Each refusal is logged at INFO with the peer's address (and a known token's
//! name), at most 20 lines a second (the next line counts those left out); a token itself is
//! never logged or echoed.
//!
//! Browser writes: a request that changes something (any method but GET, HEAD and OPTIONS)
//! is refused with 403 when it carries `Origin`, a `Sec-Fetch-Site` other than `none`, or a
//! form's content type. Scripts and `curl` send none of these; a browser's cross-site form
//! post always sends one. A bearer token never rides along with such a post, but a client
//! certificate the browser holds would, and intake's write must not happen on a page's say.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use crate::listener::Peer;
use crate::tokens::{Lookup, Scope, TokenFile};

/// How a service asks a client to authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    /// `WWW-Authenticate: Bearer` (APIs: intake).
    Bearer,
    /// `WWW-Authenticate: Basic` (pages: a browser shows its login prompt).
    Basic,
}

/// Who made a request, once the guard let it through: handlers read it from the request's
/// extensions for their logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A token, by its name in the token file.
    Token(String),
    /// A client certificate's principal (no token file).
    Certificate(String),
    /// No authentication is configured, or the path is open.
    Anonymous,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Token(name) => write!(f, "token {name}"),
            Caller::Certificate(p) => write!(f, "certificate {p}"),
            Caller::Anonymous => f.write_str("anonymous"),
        }
    }
}

/// Refused requests, logged within a budget (`left_out`: lines not logged since the last).
static REFUSALS: kiln_tls::LogBudget = kiln_tls::LogBudget::new();

struct GuardInner {
    service: &'static str,
    scope: Scope,
    challenge: Challenge,
    tokens: Option<Arc<TokenFile>>,
    open_paths: Vec<&'static str>,
}

/// The check (see the module docs), cheap to clone.
#[derive(Clone)]
pub struct Guard(Arc<GuardInner>);

impl Guard {
    /// `service` names the realm (`kiln intake`); `tokens` `None` checks no tokens.
    pub fn new(
        service: &'static str,
        scope: Scope,
        challenge: Challenge,
        tokens: Option<Arc<TokenFile>>,
        open_paths: &[&'static str],
    ) -> Guard {
        Guard(Arc::new(GuardInner {
            service,
            scope,
            challenge,
            tokens,
            open_paths: open_paths.to_vec(),
        }))
    }

    /// `router` with every request checked.
    pub fn protect(self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(self, check))
    }
}

/// A refusal in the service's own error shape: `{"error": ...}` for an API, text for pages.
fn refusal(guard: &GuardInner, status: StatusCode, message: String) -> Response {
    match guard.challenge {
        Challenge::Bearer => {
            (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
        }
        Challenge::Basic => (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{message}\n"),
        )
            .into_response(),
    }
}

fn challenge(guard: &GuardInner, message: String) -> Response {
    let value = match guard.challenge {
        Challenge::Bearer => format!("Bearer realm=\"{}\"", guard.service),
        Challenge::Basic => format!("Basic realm=\"{}\", charset=\"UTF-8\"", guard.service),
    };
    let mut response = refusal(guard, StatusCode::UNAUTHORIZED, message);
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// The token a request presents: `Ok(None)` without an Authorization header, `Err` for one
/// that is not Bearer or Basic or does not decode.
fn presented(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not text")?;
    let (scheme, rest) = value
        .split_once(' ')
        .ok_or("the Authorization header has no scheme: send Bearer TOKEN")?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(Some(rest.to_string()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|_| "the Basic credentials are not base64")?;
        let text = String::from_utf8(decoded).map_err(|_| "the Basic credentials are not UTF-8")?;
        let (_, password) = text
            .split_once(':')
            .ok_or("the Basic credentials have no password: give the token as the password")?;
        return Ok(Some(password.to_string()));
    }
    Err("unknown Authorization scheme: send Bearer TOKEN")
}

const FORM_TYPES: [&str; 3] = [
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "text/plain",
];

/// Why a request that changes something looks like a browser's, if it does.
fn browser_write(method: &Method, headers: &HeaderMap) -> Option<&'static str> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    if headers.contains_key(header::ORIGIN) {
        return Some("it carries an Origin header");
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if site.as_bytes() != b"none" {
            return Some("it carries Sec-Fetch-Site");
        }
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    FORM_TYPES
        .contains(&essence.as_str())
        .then_some("its content type is a form's")
}

async fn check(State(guard): State<Guard>, mut request: Request, next: Next) -> Response {
    let guard = &guard.0;
    let peer = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.clone());
    let addr: Option<SocketAddr> = peer.as_ref().map(|p| p.addr);
    let shown = addr.map_or_else(|| "unknown".to_string(), |a| a.to_string());
    let path = request.uri().path().to_string();
    if guard.open_paths.iter().any(|p| *p == path) {
        request.extensions_mut().insert(Caller::Anonymous);
        return next.run(request).await;
    }
    if let Some(why) = browser_write(request.method(), request.headers()) {
        if let Some(left_out) = REFUSALS.allow() {
            tracing::info!(peer = %shown, left_out, %path, "refused a browser write: {why}");
        }
        return refusal(
            guard,
            StatusCode::FORBIDDEN,
            format!(
                "{} refuses writes from browsers ({why}); send the request from a script or kiln",
                guard.service
            ),
        );
    }
    let caller = match &guard.tokens {
        None => match peer.and_then(|p| p.certificate) {
            Some(principal) => Caller::Certificate(principal),
            None => Caller::Anonymous,
        },
        Some(tokens) => {
            let token = match presented(request.headers()) {
                Ok(Some(t)) => t,
                Ok(None) => {
                    if let Some(left_out) = REFUSALS.allow() {
                        tracing::info!(peer = %shown, left_out, %path, "refused a request without a token");
                    }
                    return challenge(
                        guard,
                        format!(
                            "{} needs a token with {} scope",
                            guard.service,
                            guard.scope.name()
                        ),
                    );
                }
                Err(why) => {
                    if let Some(left_out) = REFUSALS.allow() {
                        tracing::info!(peer = %shown, left_out, %path, "refused a request: {why}");
                    }
                    return challenge(guard, why.to_string());
                }
            };
            match tokens.lookup(&token) {
                Lookup::Found { name, scopes } if scopes.contains(guard.scope) => {
                    Caller::Token(name)
                }
                Lookup::Found { name, scopes } => {
                    if let Some(left_out) = REFUSALS.allow() {
                        tracing::info!(peer = %shown, left_out, %path, token = %name, "refused a token without {} scope", guard.scope.name());
                    }
                    return refusal(
                        guard,
                        StatusCode::FORBIDDEN,
                        format!(
                            "token {name} has scope {scopes}; {} needs {}",
                            guard.service,
                            guard.scope.name()
                        ),
                    );
                }
                Lookup::Unknown => {
                    if let Some(left_out) = REFUSALS.allow() {
                        tracing::info!(peer = %shown, left_out, %path, "refused an unknown token");
                    }
                    return challenge(guard, "the token is not known here".into());
                }
                Lookup::FileBroken => {
                    return refusal(
                        guard,
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "{} cannot read its token file; its log says why",
                            guard.service
                        ),
                    );
                }
            }
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tokens::{add, Scopes};
    use axum::body::Body;
    use axum::routing::{get, post};
    use tower::ServiceExt;

    async fn whoami(request: Request) -> String {
        request.extensions().get::<Caller>().unwrap().to_string()
    }

    fn app(tokens: Option<Arc<TokenFile>>, scope: Scope, challenge: Challenge) -> axum::Router {
        let router = axum::Router::new()
            .route("/", get(whoami))
            .route("/submit", post(whoami))
            .route("/healthz", get(|| async { "ok" }));
        Guard::new("kiln test", scope, challenge, tokens, &["/healthz"]).protect(router)
    }

    async fn send(
        app: &axum::Router,
        request: axum::http::Request<Body>,
    ) -> (StatusCode, HeaderMap, String) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    fn get_with(path: &str, auth: Option<&str>) -> axum::http::Request<Body> {
        let mut b = axum::http::Request::get(path);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn tokens_are_checked_for_their_scope_and_never_echoed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let reader = add(&path, "reader", Scopes::parse("read").unwrap()).unwrap();
        let writer = add(&path, "writer", Scopes::parse("write").unwrap()).unwrap();
        let file = Arc::new(TokenFile::open(&path).unwrap());
        let app = app(Some(file), Scope::Read, Challenge::Basic);

        let (status, headers, _) = send(&app, get_with("/", None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let challenge = headers
            .get(header::WWW_AUTHENTICATE)
            .unwrap()
            .to_str()
            .unwrap();
        assert!(
            challenge.starts_with("Basic realm=\"kiln test\""),
            "{challenge}"
        );

        let (status, _, body) = send(&app, get_with("/", Some(&format!("Bearer {reader}")))).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "token reader"));

        let basic = base64::engine::general_purpose::STANDARD.encode(format!("anyone:{reader}"));
        let (status, _, body) = send(&app, get_with("/", Some(&format!("Basic {basic}")))).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "token reader"));

        let (status, _, body) = send(&app, get_with("/", Some(&format!("Bearer {writer}")))).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(
            body.contains("token writer has scope write") && !body.contains(&writer),
            "{body}"
        );

        // The last hex digit changed (to one it is not: a token ending in 0 stays itself if
        // the replacement is always 0, one run in sixteen).
        let last = if reader.ends_with('0') { '1' } else { '0' };
        let wrong = format!("{}{last}", &reader[..reader.len() - 1]);
        assert_ne!(wrong, reader);
        let (status, _, body) = send(&app, get_with("/", Some(&format!("Bearer {wrong}")))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(!body.contains(&wrong));

        for bad in ["Token abc", "Basic !!!", "Bearer"] {
            let (status, _, _) = send(&app, get_with("/", Some(bad))).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}");
        }
        let (status, _, body) = send(&app, get_with("/healthz", None)).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }

    #[tokio::test]
    async fn browser_writes_are_refused_before_any_token_is_looked_at() {
        let app = app(None, Scope::Write, Challenge::Bearer);
        let post = |headers: &[(&str, &str)]| {
            let mut b = axum::http::Request::post("/submit");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            b.body(Body::empty()).unwrap()
        };
        let (status, _, body) = send(&app, post(&[("content-type", "text/csv")])).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "anonymous"));
        for headers in [
            &[
                ("content-type", "text/csv"),
                ("origin", "https://evil.example"),
            ][..],
            &[
                ("content-type", "text/csv"),
                ("sec-fetch-site", "cross-site"),
            ][..],
            &[("content-type", "application/x-www-form-urlencoded")][..],
            &[("content-type", "multipart/form-data; boundary=x")][..],
            &[("content-type", "Text/Plain")][..],
        ] {
            let (status, _, body) = send(&app, post(headers)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}");
            assert!(body.contains("refuses writes from browsers"), "{body}");
        }
        // A page's GET is no write: the dashboard's pages load in a browser.
        let get = axum::http::Request::get("/")
            .header("sec-fetch-site", "same-origin")
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, get).await.0, StatusCode::OK);
    }
}
