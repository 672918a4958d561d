//! `GET /metrics`: Prometheus text exposition (format 0.0.4). Values are computed when scraped,
//! so they are never older than the scrape. `groups` renders lag and retention risk per group,
//! `topics` the per-topic traffic counters, partition and log-size gauges, fsync latency and the
//! replication families. Every family name starts with `kiln_`; the alert rules in
//! `deploy/prometheus/kiln-alerts.yml` use them, and a test checks that every name they use is
//! one this module or the agent's exports.

mod groups;
mod topics;

use std::sync::Arc;

use kiln_prom::Exposition;
use tokio::net::TcpListener;

use crate::groups::lag;
use crate::server::Broker;

/// Rendering reads record timestamps from disk (lag) and the size of every segment;
/// `kiln_prom::serve` runs it on the blocking pool, off the async workers.
pub async fn serve(listener: TcpListener, broker: Arc<Broker>) {
    kiln_prom::serve(listener, move || render(&broker)).await;
}

fn render(broker: &Broker) -> String {
    let mut out = Exposition::new();
    groups::render(&mut out, broker, &lag::compute(broker));
    topics::render(&mut out, &broker.cluster);
    out.finish()
}
