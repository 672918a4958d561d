//! `GET /metrics`: Prometheus text exposition (format 0.0.4). Values are computed when scraped,
//! so they are never older than the scrape. `groups` renders lag and retention risk per group,
//! `topics` the per-topic traffic counters, partition and log-size gauges, fsync latency and the
//! replication families. Every family name starts with `kiln_`; the alert rules in
//! `deploy/prometheus/kiln-alerts.yml` use them, and a test checks that every name they use is
//! one this module or the agent's exports.

mod groups;
mod topics;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use kiln_prom::{Exposition, CONTENT_TYPE};
use tokio::net::TcpListener;

use crate::groups::lag;
use crate::server::Broker;

pub async fn serve(listener: TcpListener, broker: Arc<Broker>) {
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(%address, "serving metrics on http://{address}/metrics");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(broker);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics endpoint stopped");
    }
}

async fn metrics(State(broker): State<Arc<Broker>>) -> impl IntoResponse {
    // Lag reads record timestamps from disk and sizes come from every segment: off the workers.
    match tokio::task::spawn_blocking(move || render(&broker)).await {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body),
        Err(e) => {
            tracing::error!(error = %e, "computing metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, CONTENT_TYPE)],
                "metrics computation failed\n".to_string(),
            )
        }
    }
}

fn render(broker: &Broker) -> String {
    let mut out = Exposition::new();
    groups::render(&mut out, broker, &lag::compute(broker));
    topics::render(&mut out, broker);
    out.finish()
}
