//! The agent's `GET /metrics` (Prometheus text, on `metrics_listen`, default 127.0.0.1:9645):
//! what this agent has seen since it started. Node outcomes and check results are counters,
//! runs in flight and playbooks running are gauges, and the committed offset per partition is
//! the last commit this agent sent for a partition it still owns. Commits are asynchronous and
//! librdkafka reports no result for them through the event API rdkafka uses, so a failed one
//! shows only in the log (and is covered by the next); the broker's `kiln_group_committed_offset`
//! is the confirmed value.
//!
//! Updates are per node or per check (seconds apart), so one mutex is plenty; the two gauges
//! that tasks move on every start and end are atomics behind drop guards, so an aborted task
//! (revoked partition, shutdown) still takes itself off them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kiln_checks::Verdict;
use kiln_prom::{Exposition, Histogram, Kind};
use kiln_store::NodeState;
use tokio::net::TcpListener;

/// Check duration buckets, seconds: a sysfs read takes milliseconds, a DCGM level-3 diag an hour.
pub const CHECK_DURATION_BUCKETS_SECONDS: [f64; 14] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// The outcomes a finished run can leave a node in, as label values.
const OUTCOMES: [&str; 3] = ["passed", "retrying", "dead_lettered"];

/// `metrics_listen`: `host:port` (an IP address), or "off" / empty for no endpoint.
pub fn listen_address(value: &str) -> anyhow::Result<Option<SocketAddr>> {
    let value = value.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        anyhow::anyhow!("metrics_listen {value:?} is not host:port (an IP address) or \"off\"")
    })
}

#[derive(Default)]
struct Counts {
    outcomes: BTreeMap<&'static str, u64>,
    durations: BTreeMap<String, Histogram>,
    /// (check, verdict) -> checks that did not pass.
    failures: BTreeMap<(String, &'static str), u64>,
    /// (topic, partition) -> committed offset.
    committed: BTreeMap<(String, i32), i64>,
}

pub struct AgentMetrics {
    agent_id: String,
    group: String,
    counts: Mutex<Counts>,
    in_flight: AtomicI64,
    running: AtomicI64,
}

/// Holds one unit of a gauge; gives it back when dropped.
pub struct GaugeGuard<'a>(&'a AtomicI64);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AgentMetrics {
    pub fn new(agent_id: &str, group: &str) -> AgentMetrics {
        let mut counts = Counts::default();
        // Outcomes are exported from the start, so `increase()` sees the first one.
        for o in OUTCOMES {
            counts.outcomes.insert(o, 0);
        }
        AgentMetrics {
            agent_id: agent_id.to_string(),
            group: group.to_string(),
            counts: Mutex::new(counts),
            in_flight: AtomicI64::new(0),
            running: AtomicI64::new(0),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A node task holds a slot (waiting out back-off, running, recording, following up).
    pub fn task_started(&self) -> GaugeGuard<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(&self.in_flight)
    }

    /// A node's playbook is running.
    pub fn playbook_started(&self) -> GaugeGuard<'_> {
        self.running.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(&self.running)
    }

    /// A run this agent finished left the node in `state`.
    pub fn record_outcome(&self, state: NodeState) {
        let outcome = match state {
            NodeState::Passed => "passed",
            NodeState::Retrying => "retrying",
            NodeState::DeadLettered => "dead_lettered",
            // A finished run never leaves a node queued or running.
            NodeState::Queued | NodeState::Running => return,
        };
        *self.counts().outcomes.entry(outcome).or_default() += 1;
    }

    /// One check's result: its duration, and a failure unless it passed.
    pub fn record_check(&self, name: &str, verdict: Verdict, took: Duration) {
        let mut c = self.counts();
        c.durations
            .entry(name.to_string())
            .or_insert_with(|| Histogram::new(&CHECK_DURATION_BUCKETS_SECONDS))
            .observe(took.as_secs_f64());
        let verdict = match verdict {
            Verdict::Pass => return,
            Verdict::Fail => "fail",
            Verdict::Error => "error",
        };
        *c.failures.entry((name.to_string(), verdict)).or_default() += 1;
    }

    /// A commit was sent.
    pub fn committed(&self, topic: &str, partition: i32, offset: i64) {
        let mut c = self.counts();
        let slot = c
            .committed
            .entry((topic.to_string(), partition))
            .or_insert(offset);
        // The watermark only moves up; keep the highest in case calls ever race.
        *slot = (*slot).max(offset);
    }

    /// Partitions revoked from this agent: their offsets are no longer its to report.
    pub fn forget(&self, topic: &str, partitions: &[i32]) {
        let mut c = self.counts();
        for p in partitions {
            c.committed.remove(&(topic.to_string(), *p));
        }
    }

    pub fn render(&self) -> String {
        let mut out = Exposition::new();
        out.family(
            "kiln_agent_info",
            Kind::Gauge,
            "Always 1; labels name this agent and its consumer group.",
        )
        .sample(
            "kiln_agent_info",
            &[("agent", &self.agent_id), ("group", &self.group)],
            1u64,
        );
        out.single(
            "kiln_agent_runs_in_flight",
            Kind::Gauge,
            "Node tasks this agent holds: waiting out back-off, running the playbook, recording or producing the follow-up.",
            self.in_flight.load(Ordering::Relaxed),
        );
        out.single(
            "kiln_agent_nodes_running",
            Kind::Gauge,
            "Nodes whose playbook is running on this agent now.",
            self.running.load(Ordering::Relaxed),
        );
        let c = self.counts();
        out.family(
            "kiln_agent_node_outcomes_total",
            Kind::Counter,
            "Runs this agent finished, by the state they left the node in (passed, retrying: failed and re-enqueued, dead_lettered).",
        );
        for (outcome, n) in &c.outcomes {
            out.sample(
                "kiln_agent_node_outcomes_total",
                &[("outcome", outcome)],
                *n,
            );
        }
        out.family(
            "kiln_agent_check_duration_seconds",
            Kind::Histogram,
            "Time each check step took, by check name.",
        );
        for (name, h) in &c.durations {
            h.write(
                &mut out,
                "kiln_agent_check_duration_seconds",
                &[("check", name)],
            );
        }
        out.family(
            "kiln_agent_check_failures_total",
            Kind::Counter,
            "Check steps that did not pass, by check name and verdict (fail: a reading outside a threshold; error: nothing could be measured).",
        );
        for ((name, verdict), n) in &c.failures {
            out.sample(
                "kiln_agent_check_failures_total",
                &[("check", name), ("verdict", verdict)],
                *n,
            );
        }
        out.family(
            "kiln_agent_committed_offset",
            Kind::Gauge,
            "Last offset this agent committed (sent asynchronously), per partition it owns: the next offset to read. The broker's kiln_group_committed_offset is the confirmed value.",
        );
        for ((topic, partition), offset) in &c.committed {
            let p = partition.to_string();
            out.sample(
                "kiln_agent_committed_offset",
                &[("topic", topic), ("partition", &p)],
                *offset,
            );
        }
        drop(c);
        out.finish()
    }
}

/// Binds `metrics_listen`. A taken port is logged and the agent runs without `/metrics`: the
/// metrics are for operators and must not stop burn-in (the broker does the same).
pub async fn bind(value: &str) -> anyhow::Result<Option<TcpListener>> {
    let Some(address) = listen_address(value)? else {
        return Ok(None);
    };
    match TcpListener::bind(address).await {
        Ok(l) => Ok(Some(l)),
        Err(e) => {
            tracing::error!(%address, error = %e, "cannot bind the metrics endpoint; running without /metrics");
            Ok(None)
        }
    }
}

pub async fn serve(listener: TcpListener, metrics: Arc<AgentMetrics>) {
    kiln_prom::serve(listener, move || metrics.render()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str, prefix: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn listen_address_parses_or_explains() {
        assert_eq!(listen_address("off").expect("off"), None);
        assert_eq!(listen_address(" ").expect("empty"), None);
        assert_eq!(
            listen_address("127.0.0.1:9645").expect("addr"),
            Some(SocketAddr::from(([127, 0, 0, 1], 9645)))
        );
        let e = listen_address("localhost:9645").expect_err("host name");
        assert!(e.to_string().contains("metrics_listen"), "{e}");
    }

    #[test]
    fn renders_outcomes_checks_and_offsets() {
        let m = AgentMetrics::new("bastion-1", "burnin");
        let task = m.task_started();
        let pb = m.playbook_started();
        m.record_check("nvml", Verdict::Pass, Duration::from_millis(200));
        m.record_check("nvml", Verdict::Fail, Duration::from_secs(2));
        m.record_check("redfish", Verdict::Error, Duration::from_secs(40));
        m.record_outcome(NodeState::Retrying);
        m.record_outcome(NodeState::Retrying);
        m.record_outcome(NodeState::Passed);
        m.record_outcome(NodeState::Running); // not an outcome; ignored
        m.committed("kiln.nodes", 2, 17);
        m.committed("kiln.nodes", 2, 15); // never moves back
        m.committed("kiln.nodes", 0, 3);
        let text = m.render();
        assert_eq!(
            lines(&text, "kiln_agent_runs_in_flight "),
            ["kiln_agent_runs_in_flight 1"]
        );
        assert_eq!(
            lines(&text, "kiln_agent_nodes_running "),
            ["kiln_agent_nodes_running 1"]
        );
        assert_eq!(
            lines(&text, "kiln_agent_node_outcomes_total{"),
            [
                "kiln_agent_node_outcomes_total{outcome=\"dead_lettered\"} 0",
                "kiln_agent_node_outcomes_total{outcome=\"passed\"} 1",
                "kiln_agent_node_outcomes_total{outcome=\"retrying\"} 2",
            ]
        );
        assert_eq!(
            lines(&text, "kiln_agent_check_failures_total{"),
            [
                "kiln_agent_check_failures_total{check=\"nvml\",verdict=\"fail\"} 1",
                "kiln_agent_check_failures_total{check=\"redfish\",verdict=\"error\"} 1",
            ]
        );
        assert!(text
            .contains("kiln_agent_check_duration_seconds_bucket{check=\"nvml\",le=\"0.5\"} 1\n"));
        assert!(text
            .contains("kiln_agent_check_duration_seconds_bucket{check=\"nvml\",le=\"5.0\"} 2\n"));
        assert!(text.contains("kiln_agent_check_duration_seconds_count{check=\"redfish\"} 1\n"));
        assert!(text.contains("kiln_agent_check_duration_seconds_sum{check=\"nvml\"} 2.2\n"));
        assert_eq!(
            lines(&text, "kiln_agent_committed_offset{"),
            [
                "kiln_agent_committed_offset{topic=\"kiln.nodes\",partition=\"0\"} 3",
                "kiln_agent_committed_offset{topic=\"kiln.nodes\",partition=\"2\"} 17",
            ]
        );
        assert!(text.contains("kiln_agent_info{agent=\"bastion-1\",group=\"burnin\"} 1\n"));
        // Every family has HELP and TYPE before its samples.
        for family in [
            "kiln_agent_runs_in_flight",
            "kiln_agent_node_outcomes_total",
            "kiln_agent_check_duration_seconds",
            "kiln_agent_check_failures_total",
            "kiln_agent_committed_offset",
        ] {
            let help = text.find(&format!("# HELP {family} ")).expect("help");
            let sample = text.find(&format!("\n{family}")).expect("sample");
            assert!(help < sample, "{family}");
        }

        drop(pb);
        drop(task);
        m.forget("kiln.nodes", &[2]);
        let text = m.render();
        assert_eq!(
            lines(&text, "kiln_agent_runs_in_flight "),
            ["kiln_agent_runs_in_flight 0"]
        );
        assert_eq!(
            lines(&text, "kiln_agent_nodes_running "),
            ["kiln_agent_nodes_running 0"]
        );
        assert_eq!(lines(&text, "kiln_agent_committed_offset{").len(), 1);
    }
}
