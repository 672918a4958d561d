//! Read-only queries for the operators' views (`kiln dashboard`, `kiln status`): per-rack
//! counts by state, a rack's nodes, and the dead-letter list with each node's last failing
//! checks. Each view is one or two aggregate or indexed queries, so a page over 10,000 nodes
//! stays cheap (indexes: `nodes_by_rack_state` from 0001, `nodes_by_state_updated` from 0003).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use crate::{u32_of, CheckVerdict, NodeState, Result, Store};

/// One rack's nodes counted by state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RackSummary {
    pub rack: String,
    /// Every state present (zero when no node is in it).
    pub counts: BTreeMap<NodeState, u64>,
}

impl RackSummary {
    pub fn new(rack: impl Into<String>) -> RackSummary {
        RackSummary {
            rack: rack.into(),
            counts: NodeState::ALL.into_iter().map(|s| (s, 0)).collect(),
        }
    }

    pub fn count(&self, state: NodeState) -> u64 {
        self.counts.get(&state).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Nodes whose burn-in is over for this cycle: passed or dead-lettered.
    pub fn finished(&self) -> u64 {
        self.count(NodeState::Passed) + self.count(NodeState::DeadLettered)
    }
}

/// Counts over all racks.
pub fn totals(racks: &[RackSummary]) -> RackSummary {
    let mut all = RackSummary::new("all racks");
    for r in racks {
        for (state, n) in &r.counts {
            *all.counts.entry(*state).or_default() += n;
        }
    }
    all
}

/// A node as a rack listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSummary {
    pub hostname: String,
    pub state: NodeState,
    pub state_reason: String,
    pub cycle: u32,
    pub attempt: u32,
    pub gpu_model: String,
    pub gpu_count: u32,
    pub updated_at_ms: i64,
}

/// A failing check of a dead-lettered node's last run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedCheck {
    pub name: String,
    pub verdict: CheckVerdict,
    pub message: String,
    pub findings: Vec<kiln_findings::Finding>,
}

impl DeadLetter {
    /// The per-component analysis of the node's last attempt (its failed checks): the action
    /// and headline the dead-letter list shows and filters by.
    pub fn last_attempt_analysis(&self) -> kiln_findings::Analysis {
        let checks = self
            .failed_checks
            .iter()
            .map(|c| kiln_findings::CheckInput {
                name: &c.name,
                outcome: match c.verdict {
                    CheckVerdict::Fail => kiln_findings::Outcome::Fail,
                    CheckVerdict::Error => kiln_findings::Outcome::Error,
                    _ => kiln_findings::Outcome::Other,
                },
                message: &c.message,
                findings: &c.findings,
            })
            .collect();
        kiln_findings::analyze(
            kiln_findings::NodeInput {
                hostname: &self.hostname,
                bmc_address: &self.bmc_address,
            },
            &[kiln_findings::AttemptInput {
                attempt: self.attempt,
                checks,
            }],
        )
    }
}

/// A dead-lettered node and the failing checks (fail or error) of its last attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    pub hostname: String,
    pub rack: String,
    pub bmc_address: String,
    pub cycle: u32,
    pub attempt: u32,
    pub state_reason: String,
    pub updated_at_ms: i64,
    pub failed_checks: Vec<FailedCheck>,
}

impl Store {
    /// Every rack (including ones with no nodes) with its nodes counted by state, by name.
    pub async fn rack_summaries(&self) -> Result<Vec<RackSummary>> {
        let mut out: Vec<RackSummary> = Vec::new();
        on_backend!(self, pool => {
            // One grouped scan of the (rack, state) index; the LEFT JOIN keeps empty racks.
            let rows = sqlx::query(
                "SELECT r.name AS rack, n.state AS state, COUNT(n.hostname) AS n \
                 FROM racks r LEFT JOIN nodes n ON n.rack = r.name \
                 GROUP BY r.name, n.state ORDER BY r.name",
            )
            .fetch_all(pool)
            .await?;
            for row in rows {
                let rack: String = row.try_get("rack")?;
                if out.last().map(|r| r.rack != rack).unwrap_or(true) {
                    out.push(RackSummary::new(rack));
                }
                let state: Option<String> = row.try_get("state")?;
                let n: i64 = row.try_get("n")?;
                if let (Some(state), Some(last)) = (state, out.last_mut()) {
                    let n = u64::try_from(n)
                        .map_err(|_| crate::StoreError::Corrupt(format!("node count {n}")))?;
                    *last.counts.entry(state.parse()?).or_default() += n;
                }
            }
        });
        Ok(out)
    }

    /// The nodes of `rack` by hostname; `None` when the store has no such rack.
    pub async fn rack_nodes(&self, rack: &str) -> Result<Option<Vec<NodeSummary>>> {
        on_backend!(self, pool => {
            let known = sqlx::query("SELECT 1 FROM racks WHERE name = $1")
                .bind(rack)
                .fetch_optional(pool)
                .await?;
            if known.is_none() {
                return Ok(None);
            }
            let rows = sqlx::query(
                "SELECT hostname, state, state_reason, cycle, attempt, gpu_model, gpu_count, \
                 updated_at_ms FROM nodes WHERE rack = $1 ORDER BY hostname",
            )
            .bind(rack)
            .fetch_all(pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let state: String = row.try_get("state")?;
                out.push(NodeSummary {
                    hostname: row.try_get("hostname")?,
                    state: state.parse()?,
                    state_reason: row.try_get("state_reason")?,
                    cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                    attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                    gpu_model: row.try_get("gpu_model")?,
                    gpu_count: u32_of(row.try_get("gpu_count")?, "gpu_count")?,
                    updated_at_ms: row.try_get("updated_at_ms")?,
                });
            }
            Ok(Some(out))
        })
    }

    /// Dead-lettered nodes, most recently dead-lettered first, at most `limit`, each with the
    /// failing checks of the attempt that dead-lettered it. Returns the list and how many
    /// dead-lettered nodes there are in all.
    pub async fn dead_letters(&self, limit: u32) -> Result<(Vec<DeadLetter>, u64)> {
        let mut out: Vec<DeadLetter> = Vec::new();
        let total: i64;
        on_backend!(self, pool => {
            let findings_col = if PG { "c.findings::text AS findings" } else { "c.findings AS findings" };
            total = sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE state = 'dead_lettered'")
                .fetch_one(pool)
                .await?
                .try_get("n")?;
            // The newest `limit` dead letters (nodes_by_state_updated), joined to the run of
            // their current attempt (unique index on runs) and its failing checks.
            let rows = sqlx::query(
                &format!("SELECT d.hostname, d.rack, d.bmc_address, d.cycle, d.attempt, d.state_reason, \
                        d.updated_at_ms, c.check_name, c.verdict AS check_verdict, c.message, \
                        {findings_col} \
                 FROM (SELECT hostname, rack, bmc_address, cycle, attempt, state_reason, updated_at_ms \
                       FROM nodes WHERE state = 'dead_lettered' \
                       ORDER BY updated_at_ms DESC, hostname LIMIT $1) d \
                 LEFT JOIN runs r \
                   ON r.hostname = d.hostname AND r.cycle = d.cycle AND r.attempt = d.attempt \
                 LEFT JOIN check_results c \
                   ON c.run_id = r.id AND c.verdict IN ('fail', 'error') \
                 ORDER BY d.updated_at_ms DESC, d.hostname, c.id"),
            )
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
            for row in rows {
                let hostname: String = row.try_get("hostname")?;
                if out.last().map(|d| d.hostname != hostname).unwrap_or(true) {
                    out.push(DeadLetter {
                        hostname,
                        rack: row.try_get("rack")?,
                        bmc_address: row.try_get("bmc_address")?,
                        cycle: u32_of(row.try_get("cycle")?, "cycle")?,
                        attempt: u32_of(row.try_get("attempt")?, "attempt")?,
                        state_reason: row.try_get("state_reason")?,
                        updated_at_ms: row.try_get("updated_at_ms")?,
                        failed_checks: Vec::new(),
                    });
                }
                let name: Option<String> = row.try_get("check_name")?;
                let verdict: Option<String> = row.try_get("check_verdict")?;
                if let (Some(name), Some(verdict), Some(last)) = (name, verdict, out.last_mut()) {
                    last.failed_checks.push(FailedCheck {
                        name,
                        verdict: CheckVerdict::parse(&verdict)?,
                        message: row.try_get("message")?,
                        findings: match row.try_get::<Option<String>, _>("findings")? {
                            Some(text) => serde_json::from_str(&text).map_err(|e| {
                                crate::StoreError::Corrupt(format!("findings: {e}"))
                            })?,
                            None => Vec::new(),
                        },
                    });
                }
            }
        });
        let total = u64::try_from(total)
            .map_err(|_| crate::StoreError::Corrupt(format!("dead-letter count {total}")))?;
        Ok((out, total))
    }
}
