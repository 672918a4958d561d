//! The front door of Kiln's HTTP services, intake and the dashboard (docs/security.md):
//!
//! - `listener`: [`WebListener`], plain TCP or TLS (kiln-tls's reloadable [`ServerTls`],
//!   client certificates optional or required), with a bounded number of connections;
//! - `tokens`: bearer tokens with scopes, stored as SHA-256 hashes in a token file that is
//!   read again when it changes, and the edits `kiln tokens` makes to it;
//! - `auth`: [`Guard`], the check before every handler (token and scope, browser writes).
//!
//! [`serve`] runs a router behind all three. Boundary: no service logic; the services say
//! which scope they need and which paths stay open.

pub mod auth;
pub mod listener;
pub mod tokens;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use auth::{Caller, Challenge, Guard};
pub use kiln_tls::ServerTls;
pub use listener::{Peer, WebListener, CONNECTIONS_MAX_DEFAULT};
pub use tokens::{Scope, Scopes, TokenError, TokenFile};

/// How a service's listener is secured.
#[derive(Debug, Clone, Default)]
pub struct WebSecurity {
    /// TLS, with client certificates if its files ask for them.
    pub tls: Option<Arc<ServerTls>>,
    /// Tokens every request but the open paths must present.
    pub tokens: Option<Arc<TokenFile>>,
}

impl WebSecurity {
    /// `https` or `http`, for the address a service prints.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Whether clients must prove who they are (a token, or a client certificate).
    pub fn authenticates(&self) -> bool {
        self.tokens.is_some()
            || self
                .tls
                .as_ref()
                .is_some_and(|t| t.files().client_auth == kiln_tls::ClientAuth::Required)
    }

    /// Refuses to serve anyone who can reach a non-loopback address without authentication,
    /// unless the operator said so (`open_anyway`): the error says what to set.
    pub fn check_exposure(
        &self,
        service: &str,
        listen: SocketAddr,
        open_anyway: bool,
    ) -> Result<(), String> {
        if self.authenticates() || open_anyway || listen.ip().is_loopback() {
            return Ok(());
        }
        Err(format!(
            "{service} would answer anyone who can reach {listen}: give --tokens-file FILE \
             (tokens_file; kiln tokens create) or --https-client-ca FILE ([https] \
             client_ca_file), or --insecure-no-auth (insecure_no_auth = true) to serve it open \
             anyway"
        ))
    }
}

/// Serves `router` on `tcp` behind `guard` and `security` until `shutdown` resolves; SIGHUP
/// reads the TLS certificate files again (new connections use them; open ones stay).
pub async fn serve(
    tcp: tokio::net::TcpListener,
    router: axum::Router,
    guard: Guard,
    security: &WebSecurity,
    connections_max: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = WebListener::new(tcp, security.tls.clone(), connections_max)?;
    let reload = security
        .tls
        .clone()
        .map(|tls| tokio::spawn(reload_on_sighup(tls)));
    let app = guard
        .protect(router)
        .into_make_service_with_connect_info::<Peer>();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    if let Some(task) = reload {
        task.abort();
    }
    result
}

async fn reload_on_sighup(tls: Arc<ServerTls>) {
    kiln_tls::on_sighup(|| kiln_tls::log_reload("the HTTPS listener", tls.reload())).await
}
