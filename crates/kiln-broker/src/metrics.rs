//! `GET /metrics`: Prometheus text exposition (format 0.0.4) of group lag and retention risk.
//! Values are computed when scraped, so they are never older than the scrape.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::groups::lag::{self, PartitionLag};
use crate::server::Broker;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
    let b = broker.clone();
    match tokio::task::spawn_blocking(move || render(&b, &lag::compute(&b))).await {
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

/// A label value with `\`, `"` and newlines escaped as the text format requires.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn render(broker: &Broker, lags: &[PartitionLag]) -> String {
    let mut out = String::new();
    let gauge =
        |out: &mut String, name: &str, help: &str, value: &dyn Fn(&PartitionLag) -> Option<f64>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for l in lags {
                if let Some(v) = value(l) {
                    let _ = writeln!(
                        out,
                        "{name}{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {v}",
                        escape(&l.group),
                        escape(&l.topic),
                        l.partition
                    );
                }
            }
        };
    gauge(
        &mut out,
        "kiln_group_lag_records",
        "Records between the group's committed offset and the high watermark.",
        &|l| Some(l.lag_records as f64),
    );
    gauge(
        &mut out,
        "kiln_group_lag_seconds",
        "Age of the group's first unconsumed record (0 when caught up).",
        &|l| Some(l.lag_seconds),
    );
    gauge(
        &mut out,
        "kiln_group_retention_fraction",
        "How far the first unconsumed record is through the topic's retention window; >= 1 means due for deletion or already deleted.",
        &|l| l.retention_fraction,
    );
    gauge(
        &mut out,
        "kiln_group_committed_offset",
        "The group's committed offset (the next record it will read).",
        &|l| Some(l.committed as f64),
    );
    gauge(
        &mut out,
        "kiln_group_offsets_lost",
        "1 when the committed offset is below the log start (records deleted before the group read them).",
        &|l| Some(if l.lost { 1.0 } else { 0.0 }),
    );
    let _ = writeln!(out, "# HELP kiln_group_members Live members of each group.");
    let _ = writeln!(out, "# TYPE kiln_group_members gauge");
    for (group, members) in broker.groups.member_counts() {
        let _ = writeln!(
            out,
            "kiln_group_members{{group=\"{}\"}} {members}",
            escape(&group)
        );
    }
    let (records, live, generation) = broker.groups.store().stats();
    let _ = writeln!(
        out,
        "# HELP kiln_offsets_log_records Records in the committed-offsets log."
    );
    let _ = writeln!(out, "# TYPE kiln_offsets_log_records gauge");
    let _ = writeln!(out, "kiln_offsets_log_records {records}");
    let _ = writeln!(
        out,
        "# HELP kiln_offsets_live_keys Committed offsets held (group, topic, partition)."
    );
    let _ = writeln!(out, "# TYPE kiln_offsets_live_keys gauge");
    let _ = writeln!(out, "kiln_offsets_live_keys {live}");
    let _ = writeln!(out, "# HELP kiln_offsets_log_generation Times the committed-offsets log was compacted (since it was created).");
    let _ = writeln!(out, "# TYPE kiln_offsets_log_generation gauge");
    let _ = writeln!(out, "kiln_offsets_log_generation {generation}");
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
