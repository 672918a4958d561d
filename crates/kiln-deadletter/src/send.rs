//! Sending a day's report at most once.
//!
//! The order is: check the day is not taken, build the report and its email, check the mail
//! server answers, **claim the day in the store**, send, then mark the day sent and the listed
//! records reported (one transaction). The claim is the once-per-day rule: the day is the
//! primary key of `triage_reports`, so only one sender, in one process or many, ever holds it.
//!
//! A crash (or a lost connection) after the claim and before the mark leaves the claim in
//! place, and the day's report is not sent again: the email is **at most once**. We chose this
//! over at-least-once because a duplicate report cannot be told apart from a new one by the
//! people reading it, while a lost one is harmless: its nodes stay open and unreported, so the
//! next day's report lists them as new, and `kiln deadletter report --dry-run` shows the
//! current report at any time. When the server certainly did not take the message (a negative
//! SMTP reply, a TLS or client error, a failed file write) the claim is released and a later
//! try sends the report.

use jiff::civil::Date;
use kiln_queue::now_ms;
use kiln_store::triage::ReportClaim;
use kiln_store::Store;

use crate::config::DeadletterConfig;
use crate::mail::{build_message, Mailer};
use crate::report::build_report;
use crate::schedule::Schedule;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    Sent {
        day: String,
        message_id: String,
        new: usize,
        still_open: usize,
    },
    /// The day's report went out earlier.
    AlreadySent { day: String, sent_at_ms: i64 },
    /// The day was claimed and never marked sent (a sender crashed or lost its connection
    /// mid-send, or is sending right now): not sent again.
    Unfinished {
        day: String,
        by: String,
        claimed_at_ms: i64,
    },
    /// Nothing to report and `report.send_when_empty` is off.
    Empty { day: String },
}

/// Why a send failed, and whether a later try may send the day's report.
#[derive(Debug)]
pub struct SendFailure {
    /// The claim was released (or never taken): retrying is safe.
    pub retryable: bool,
    pub error: anyhow::Error,
}

impl From<anyhow::Error> for SendFailure {
    fn from(error: anyhow::Error) -> Self {
        SendFailure {
            retryable: true,
            error,
        }
    }
}

fn taken(day: &str, claim: ReportClaim) -> Option<SendOutcome> {
    match claim {
        ReportClaim::Claimed => None,
        ReportClaim::AlreadySent { sent_at_ms } => Some(SendOutcome::AlreadySent {
            day: day.to_string(),
            sent_at_ms,
        }),
        ReportClaim::InFlight { by, at_ms } => Some(SendOutcome::Unfinished {
            day: day.to_string(),
            by,
            claimed_at_ms: at_ms,
        }),
    }
}

/// Sends the report of `day` unless that day's report was already sent or claimed. With
/// `even_if_empty`, an empty report is sent too (`--send-now`).
pub async fn send_report(
    store: &Store,
    mailer: &Mailer,
    config: &DeadletterConfig,
    schedule: &Schedule,
    day: Date,
    even_if_empty: bool,
) -> Result<SendOutcome, SendFailure> {
    let day_s = day.to_string();
    if let Some(row) = store
        .report_day(&day_s)
        .await
        .map_err(anyhow::Error::from)?
    {
        let claim = match row.sent_at_ms {
            Some(sent_at_ms) => ReportClaim::AlreadySent { sent_at_ms },
            None => ReportClaim::InFlight {
                by: row.claimed_by,
                at_ms: row.claimed_at_ms,
            },
        };
        return Ok(taken(&day_s, claim).unwrap_or(SendOutcome::Empty { day: day_s }));
    }
    let report = build_report(store, day, schedule, &config.report)
        .await
        .map_err(anyhow::Error::from)?;
    if report.is_empty() && !even_if_empty && !config.report.send_when_empty {
        return Ok(SendOutcome::Empty { day: day_s });
    }
    let now = now_ms();
    let (message, message_id) = build_message(config, &report, schedule, now)?;
    mailer.check().await?;
    let claim = store
        .claim_report_day(&day_s, &config.instance_id, now)
        .await
        .map_err(anyhow::Error::from)?;
    if let Some(outcome) = taken(&day_s, claim) {
        return Ok(outcome);
    }
    if let Err(e) = mailer.send(&message).await {
        let released = e.not_sent
            && store
                .release_report_day(&day_s, &config.instance_id)
                .await
                .unwrap_or(false);
        let note = if released {
            "not sent; the day is free for another try"
        } else {
            "the server may or may not have taken it; the day stays claimed, so the report is \
             not sent again (at most once)"
        };
        return Err(SendFailure {
            retryable: released,
            error: e
                .error
                .context(format!("sending the report of {day_s}: {note}")),
        });
    }
    store
        .finish_report_day(
            &day_s,
            &report.listed(),
            i64::try_from(report.count_new()).unwrap_or(i64::MAX),
            &message_id,
            now_ms(),
        )
        .await
        .map_err(|e| SendFailure {
            retryable: false,
            error: anyhow::Error::from(e).context(format!(
                "the report of {day_s} was sent but recording it failed; the day stays claimed"
            )),
        })?;
    Ok(SendOutcome::Sent {
        day: day_s,
        message_id,
        new: report.count_new(),
        still_open: report.count_still_open(),
    })
}
