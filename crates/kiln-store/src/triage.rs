//! Dead-letter triage records and the daily report's once-per-day bookkeeping (migration
//! 0002). Written by `kiln deadletter` (crates/kiln-deadletter); the store only keeps what it
//! is given: the action class is a plain string here, decided by the triage service.
//!
//! A record is open while the node's current row is still dead-lettered in the record's cycle
//! (or the node row is gone); `kiln dlq requeue` or `kiln dlq resolve` moves the node to the
//! next cycle, which closes it (`resolve` also records who did what, for the report).
//!
//! The report day is claimed before the email is sent and marked sent after (see
//! [`Store::claim_report_day`]): a claim is never taken twice, so a day's report goes out at
//! most once, even when the sender crashed between sending and recording.

use std::collections::BTreeMap;

use kiln_findings::analysis::ANALYSIS_VERSION;
use kiln_findings::Analysis;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::{u32_of, Result, Store, StoreError};

/// One failing check of a dead-lettered node's last attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailingCheck {
    pub name: String,
    /// `fail` or `error`.
    pub verdict: String,
    pub message: String,
    pub measured: serde_json::Value,
    /// Attempts of the cycle in which this check failed: measured out of bounds.
    pub failed_attempts: u32,
    /// Attempts of the cycle in which this check could not run (counted apart from failures).
    #[serde(default)]
    pub error_attempts: u32,
    /// The action the triage service gave this check (kiln-findings' `Action`, e.g. `rma`).
    pub action: String,
}

/// A dead-lettered node (one cycle) as the triage service recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriageRecord {
    pub hostname: String,
    pub cycle: u32,
    pub rack: String,
    pub bmc_address: String,
    pub attempts: u32,
    pub first_failure_at_ms: i64,
    pub last_failure_at_ms: i64,
    pub dead_lettered_at_ms: i64,
    /// The node's action (kiln-findings' `Action`: `rma`, `reset_gpu`, ...), its most severe.
    pub action: String,
    pub last_error: String,
    pub failing_checks: Vec<FailingCheck>,
    /// The node's manifest labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub recorded_at_ms: i64,
    /// The report day (`YYYY-MM-DD`) that first listed this record, if any.
    pub first_reported_day: Option<String>,
    /// The per-component view of the cycle (kiln-findings' `Analysis`) as the triage service
    /// made it; `None` for records from before it existed or of another analysis version.
    #[serde(default)]
    pub analysis: Option<Analysis>,
    /// Who resolved it (`kiln dlq resolve`), if anyone.
    #[serde(default)]
    pub resolution: Option<Resolution>,
}

/// A person's resolution of a dead-lettered node: what they did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    pub by: String,
    pub note: String,
    pub at_ms: i64,
}

/// What [`Store::claim_report_day`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportClaim {
    /// This caller owns the day: send, then [`Store::finish_report_day`] (or
    /// [`Store::release_report_day`] when the send failed).
    Claimed,
    /// The day's report was sent.
    AlreadySent { sent_at_ms: i64 },
    /// Someone claimed the day and never recorded the outcome (a sender still at work, or
    /// one that crashed after or during sending): not sent again.
    InFlight { by: String, at_ms: i64 },
}

/// A report day's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportDay {
    pub day: String,
    pub status: String,
    pub claimed_at_ms: i64,
    pub claimed_by: String,
    pub sent_at_ms: Option<i64>,
    pub message_id: Option<String>,
    pub nodes_new: Option<i64>,
    pub nodes_open: Option<i64>,
}

/// A report day must look like `YYYY-MM-DD`: it is a key compared as text.
fn check_day(day: &str) -> Result<()> {
    let b = day.as_bytes();
    let ok = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!(
            "report day {day:?} is not YYYY-MM-DD"
        )))
    }
}

/// A stored analysis: `{}` (older records) and analyses of another version are `None` (the
/// report then shows the failing checks alone); one of this version that does not parse is a
/// defect, reported.
fn analysis_of(text: &str) -> std::result::Result<Option<Analysis>, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_str(text)?;
    let version = v.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(ANALYSIS_VERSION)) {
        return Ok(None);
    }
    serde_json::from_value(v).map(Some)
}

const TRIAGE_COLUMNS: &str = "t.hostname, t.cycle, t.rack, t.bmc_address, t.attempts, \
    t.first_failure_at_ms, t.last_failure_at_ms, t.dead_lettered_at_ms, t.action, t.last_error, \
    t.failing_checks, t.recorded_at_ms, t.first_reported_day, t.analysis, t.labels, \
    t.resolved_by, t.resolved_note, t.resolved_at_ms";

fn record_of<R: Row>(row: &R) -> Result<TriageRecord>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
{
    let hostname: String = row.try_get("hostname")?;
    let checks: String = row.try_get("failing_checks")?;
    let failing_checks = serde_json::from_str(&checks)
        .map_err(|e| StoreError::Corrupt(format!("failing checks of {hostname}: {e}")))?;
    let analysis: String = row.try_get("analysis")?;
    let analysis = analysis_of(&analysis)
        .map_err(|e| StoreError::Corrupt(format!("analysis of {hostname}: {e}")))?;
    let labels: String = row.try_get("labels")?;
    let labels = serde_json::from_str(&labels)
        .map_err(|e| StoreError::Corrupt(format!("labels of {hostname}: {e}")))?;
    let resolution = match (
        row.try_get::<Option<String>, _>("resolved_by")?,
        row.try_get::<Option<i64>, _>("resolved_at_ms")?,
    ) {
        (Some(by), Some(at_ms)) => Some(Resolution {
            by,
            note: row
                .try_get::<Option<String>, _>("resolved_note")?
                .unwrap_or_default(),
            at_ms,
        }),
        _ => None,
    };
    Ok(TriageRecord {
        cycle: u32_of(row.try_get("cycle")?, "cycle")?,
        rack: row.try_get("rack")?,
        bmc_address: row.try_get("bmc_address")?,
        attempts: u32_of(row.try_get("attempts")?, "attempts")?,
        first_failure_at_ms: row.try_get("first_failure_at_ms")?,
        last_failure_at_ms: row.try_get("last_failure_at_ms")?,
        dead_lettered_at_ms: row.try_get("dead_lettered_at_ms")?,
        action: row.try_get("action")?,
        last_error: row.try_get("last_error")?,
        failing_checks,
        labels,
        recorded_at_ms: row.try_get("recorded_at_ms")?,
        first_reported_day: row.try_get("first_reported_day")?,
        analysis,
        resolution,
        hostname,
    })
}

impl Store {
    /// Records a dead-lettered node. Idempotent on (hostname, cycle): a redelivered dead
    /// letter changes nothing (returns false), so the first report day is kept.
    pub async fn record_triage(&self, r: &TriageRecord) -> Result<bool> {
        let checks = serde_json::to_string(&r.failing_checks)
            .map_err(|e| StoreError::Corrupt(format!("failing checks: {e}")))?;
        let analysis = match &r.analysis {
            None => "{}".to_string(),
            Some(a) => serde_json::to_string(a)
                .map_err(|e| StoreError::Corrupt(format!("analysis: {e}")))?,
        };
        let labels = serde_json::to_string(&r.labels)
            .map_err(|e| StoreError::Corrupt(format!("labels: {e}")))?;
        on_backend!(self, pool => {
            let done = sqlx::query(
                "INSERT INTO triage (hostname, cycle, rack, bmc_address, attempts, \
                 first_failure_at_ms, last_failure_at_ms, dead_lettered_at_ms, action, last_error, \
                 failing_checks, recorded_at_ms, first_reported_day, analysis, labels) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, NULL, $13, $14) \
                 ON CONFLICT (hostname, cycle) DO NOTHING",
            )
            .bind(r.hostname.as_str())
            .bind(i64::from(r.cycle))
            .bind(r.rack.as_str())
            .bind(r.bmc_address.as_str())
            .bind(i64::from(r.attempts))
            .bind(r.first_failure_at_ms)
            .bind(r.last_failure_at_ms)
            .bind(r.dead_lettered_at_ms)
            .bind(r.action.as_str())
            .bind(r.last_error.as_str())
            .bind(checks.as_str())
            .bind(r.recorded_at_ms)
            .bind(analysis.as_str())
            .bind(labels.as_str())
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    /// Open records whose node action is `action` (all open ones for `None`), newest first.
    pub async fn open_triage_by_action(&self, action: Option<&str>) -> Result<Vec<TriageRecord>> {
        let mut all = self.open_triage().await?;
        if let Some(a) = action {
            all.retain(|r| r.action == a);
        }
        all.sort_by(|a, b| {
            b.dead_lettered_at_ms
                .cmp(&a.dead_lettered_at_ms)
                .then_with(|| a.hostname.cmp(&b.hostname))
        });
        Ok(all)
    }

    /// Records `by`'s resolution of `hostname`'s open record (its latest cycle) and returns
    /// the record; `None` when the node has no open record. The caller then queues the node's
    /// next cycle (which closes the record).
    pub async fn resolve_triage(
        &self,
        hostname: &str,
        by: &str,
        note: &str,
        now_ms: i64,
    ) -> Result<Option<TriageRecord>> {
        let Some(mut open) = self
            .open_triage()
            .await?
            .into_iter()
            .filter(|r| r.hostname == hostname)
            .max_by_key(|r| r.cycle)
        else {
            return Ok(None);
        };
        on_backend!(self, pool => {
            sqlx::query(
                "UPDATE triage SET resolved_by = $1, resolved_note = $2, resolved_at_ms = $3 \
                 WHERE hostname = $4 AND cycle = $5",
            )
            .bind(by)
            .bind(note)
            .bind(now_ms)
            .bind(hostname)
            .bind(i64::from(open.cycle))
            .execute(pool)
            .await?;
        });
        open.resolution = Some(Resolution {
            by: by.to_string(),
            note: note.to_string(),
            at_ms: now_ms,
        });
        Ok(Some(open))
    }

    /// Records resolved at or after `since_ms`, oldest first (the report's "resolved" list).
    pub async fn resolved_since(&self, since_ms: i64) -> Result<Vec<TriageRecord>> {
        on_backend!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {TRIAGE_COLUMNS} FROM triage t \
                 WHERE t.resolved_at_ms IS NOT NULL AND t.resolved_at_ms >= $1 \
                 ORDER BY t.resolved_at_ms, t.hostname"
            ))
            .bind(since_ms)
            .fetch_all(pool)
            .await?;
            rows.iter().map(record_of).collect()
        })
    }

    /// Open triage records (the node is still dead-lettered in that cycle, or no longer in the
    /// store), by rack and hostname.
    pub async fn open_triage(&self) -> Result<Vec<TriageRecord>> {
        on_backend!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {TRIAGE_COLUMNS} FROM triage t LEFT JOIN nodes n ON n.hostname = t.hostname \
                 WHERE n.hostname IS NULL OR (n.cycle = t.cycle AND n.state = 'dead_lettered') \
                 ORDER BY t.rack, t.hostname, t.cycle"
            ))
            .fetch_all(pool)
            .await?;
            rows.iter().map(record_of).collect()
        })
    }

    /// Every triage record of `hostname`, oldest cycle first.
    pub async fn triage_of(&self, hostname: &str) -> Result<Vec<TriageRecord>> {
        on_backend!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {TRIAGE_COLUMNS} FROM triage t WHERE t.hostname = $1 ORDER BY t.cycle"
            ))
            .bind(hostname)
            .fetch_all(pool)
            .await?;
            rows.iter().map(record_of).collect()
        })
    }

    /// Claims report day `day` for `by`. Exactly one caller ever gets
    /// [`ReportClaim::Claimed`] for a day (the day is the primary key).
    pub async fn claim_report_day(&self, day: &str, by: &str, now_ms: i64) -> Result<ReportClaim> {
        check_day(day)?;
        on_backend!(self, pool => {
            let inserted = sqlx::query(
                "INSERT INTO triage_reports (day, status, claimed_at_ms, claimed_by) \
                 VALUES ($1, 'sending', $2, $3) ON CONFLICT (day) DO NOTHING",
            )
            .bind(day)
            .bind(now_ms)
            .bind(by)
            .execute(pool)
            .await?;
            if inserted.rows_affected() == 1 {
                return Ok(ReportClaim::Claimed);
            }
        });
        match self.report_day(day).await? {
            Some(r) => match r.sent_at_ms {
                Some(sent_at_ms) => Ok(ReportClaim::AlreadySent { sent_at_ms }),
                None => Ok(ReportClaim::InFlight {
                    by: r.claimed_by,
                    at_ms: r.claimed_at_ms,
                }),
            },
            // Released between the insert and the read: claim again.
            None => Box::pin(self.claim_report_day(day, by, now_ms)).await,
        }
    }

    /// Gives up a claim whose send failed for certain (nothing went out), so a later try may
    /// send the day's report. Only an unsent claim by `by` is removed.
    pub async fn release_report_day(&self, day: &str, by: &str) -> Result<bool> {
        on_backend!(self, pool => {
            let done = sqlx::query(
                "DELETE FROM triage_reports WHERE day = $1 AND claimed_by = $2 AND status = 'sending'",
            )
            .bind(day)
            .bind(by)
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    /// Marks `day` sent and the listed records (hostname, cycle) as first reported on `day`
    /// (those reported earlier keep their day), in one transaction.
    pub async fn finish_report_day(
        &self,
        day: &str,
        listed: &[(String, u32)],
        nodes_new: i64,
        message_id: &str,
        now_ms: i64,
    ) -> Result<()> {
        check_day(day)?;
        let nodes_open = i64::try_from(listed.len()).unwrap_or(i64::MAX);
        on_backend!(self, pool => {
            let mut tx = begin_write!(pool);
            let done = sqlx::query(
                "UPDATE triage_reports SET status = 'sent', sent_at_ms = $1, message_id = $2, \
                 nodes_new = $3, nodes_open = $4 WHERE day = $5 AND status = 'sending'",
            )
            .bind(now_ms)
            .bind(message_id)
            .bind(nodes_new)
            .bind(nodes_open)
            .bind(day)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                tx.rollback().await?;
                return Err(StoreError::Corrupt(format!(
                    "report day {day} was not claimed (or was already sent) when its send finished"
                )));
            }
            for (hostname, cycle) in listed {
                sqlx::query(
                    "UPDATE triage SET first_reported_day = $1 \
                     WHERE hostname = $2 AND cycle = $3 AND first_reported_day IS NULL",
                )
                .bind(day)
                .bind(hostname.as_str())
                .bind(i64::from(*cycle))
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// The row of report day `day`, if it was ever claimed.
    pub async fn report_day(&self, day: &str) -> Result<Option<ReportDay>> {
        on_backend!(self, pool => {
            let row = sqlx::query(
                "SELECT day, status, claimed_at_ms, claimed_by, sent_at_ms, message_id, nodes_new, \
                 nodes_open FROM triage_reports WHERE day = $1",
            )
            .bind(day)
            .fetch_optional(pool)
            .await?;
            let Some(row) = row else { return Ok(None) };
            Ok(Some(ReportDay {
                day: row.try_get("day")?,
                status: row.try_get("status")?,
                claimed_at_ms: row.try_get("claimed_at_ms")?,
                claimed_by: row.try_get("claimed_by")?,
                sent_at_ms: row.try_get("sent_at_ms")?,
                message_id: row.try_get("message_id")?,
                nodes_new: row.try_get("nodes_new")?,
                nodes_open: row.try_get("nodes_open")?,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_days_are_dates() {
        assert!(check_day("2025-03-30").is_ok());
        for bad in ["2025-3-30", "20250330", "2025-03-3x", "", "2025/03/30"] {
            assert!(check_day(bad).is_err(), "{bad}");
        }
    }
}
