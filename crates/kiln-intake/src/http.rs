//! The intake HTTP API.
//!
//! - `POST /v1/racks/{rack}/manifest` with `Content-Type: text/csv`, `application/json` or
//!   `application/yaml`: 200 and the [`Registration`] as JSON; 422 with every
//!   `{line, item, field, reason}` when the manifest is refused (nothing is queued); 415 for
//!   another content type; 400 for a bad rack name in the path; 413 over [`BODY_BYTES_MAX`];
//!   502 when some nodes could not be delivered to the queue (the body lists them);
//!   503 when the store or the Kafka cluster cannot be reached.
//! - `GET /healthz`: 200 `{"status": "ok"}` when the store answers, else 503.
//!
//! [`serve`] puts kiln-web's guard in front: with a token file every request but `/healthz`
//! needs a token with `write` scope (401 without, 403 with another scope), and a write that
//! looks like a browser's (an `Origin`, a form's content type) is refused with 403.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_manifest::{FieldError, Format};
use kiln_web::{Caller, Challenge, Guard, Scope, WebSecurity};
use serde::Serialize;

use crate::{Intake, IntakeError, NoProgress};

/// Largest manifest body accepted (a 100,000-node manifest is about 15 MB of CSV).
pub const BODY_BYTES_MAX: usize = 64 << 20;

#[derive(Serialize)]
struct ErrorBody {
    error: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    errors: Vec<FieldError>,
    #[serde(skip_serializing_if = "is_zero")]
    omitted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(ErrorBody {
            error: message.into(),
            errors: Vec::new(),
            omitted: 0,
        }),
    )
        .into_response()
}

pub fn router(intake: Arc<Intake>) -> Router {
    Router::new()
        .route("/v1/racks/{rack}/manifest", post(register_manifest))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(intake)
}

/// Connections the API serves at once.
pub const CONNECTIONS_MAX: usize = kiln_web::CONNECTIONS_MAX_DEFAULT;

/// Serves the API on `listener`, secured as `security` says, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    intake: Arc<Intake>,
    security: &WebSecurity,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let guard = Guard::new(
        "kiln intake",
        Scope::Write,
        Challenge::Bearer,
        security.tokens.clone(),
        &["/healthz"],
    );
    kiln_web::serve(
        listener,
        router(intake),
        guard,
        security,
        CONNECTIONS_MAX,
        shutdown,
    )
    .await
}

async fn healthz(State(intake): State<Arc<Intake>>) -> Response {
    match intake.store().ping().await {
        Ok(()) => Json(serde_json::json!({"status": "ok"})).into_response(),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable: {e}"),
        ),
    }
}

async fn register_manifest(
    State(intake): State<Arc<Intake>>,
    Path(rack): Path<String>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let by = caller.map_or_else(|| Caller::Anonymous.to_string(), |c| c.0.to_string());
    if let Err(reason) = kiln_manifest::validate_rack(&rack) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("bad rack in the URL: {reason}"),
        );
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(format) = Format::from_content_type(content_type) else {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type {content_type:?} not accepted: send text/csv, application/json or application/yaml"
            ),
        );
    };
    // Parsing a large manifest is CPU work: keep it off the async workers.
    let parse_rack = rack.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        kiln_manifest::parse_bytes(&body, format, Some(&parse_rack))
    })
    .await;
    let manifest = match parsed {
        Ok(Ok(m)) => m,
        Ok(Err(errs)) => {
            tracing::info!(rack, %by, errors = errs.count(), "manifest refused");
            let body = ErrorBody {
                error: format!(
                    "manifest refused: {} error(s), nothing was queued",
                    errs.count()
                ),
                errors: errs.errors,
                omitted: errs.omitted,
            };
            return (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response();
        }
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("manifest parser failed: {e}"),
            )
        }
    };
    match intake.register(&manifest, &NoProgress).await {
        Ok(reg) => {
            tracing::info!(
                rack,
                %by,
                nodes = reg.nodes,
                queued = reg.queued.len(),
                already_in_progress = reg.already_in_progress.len(),
                failed = reg.failed.len(),
                "manifest registered"
            );
            let status = if reg.failed.is_empty() {
                StatusCode::OK
            } else {
                StatusCode::BAD_GATEWAY
            };
            (status, Json(reg)).into_response()
        }
        Err(IntakeError::Rejected(errs)) => {
            let body = ErrorBody {
                error: errs.to_string(),
                errors: errs.errors,
                omitted: errs.omitted,
            };
            (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
        }
        Err(e @ (IntakeError::Store(_) | IntakeError::Queue(_))) => {
            tracing::warn!(rack, error = %e, "registration failed");
            error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}
