//! Dead-letter triage (`kiln deadletter`): consumes `kiln.nodes.dlq` in group `deadletter`,
//! keeps a triage record per dead-lettered node in the results store, and sends a daily
//! report email at a configured local time. See docs/deadletter.md.
//!
//! - `config`: TOML settings.
//! - `triage`: a dead letter made into a triage record.
//! - `consume`: the consumer loop (store the record, then commit).
//! - `schedule`: the report's local time and zone; DST handling.
//! - `report`: building the report from the store; text and HTML.
//! - `mail`: the email and its transports (SMTP or files).
//! - `send`: the once-per-day rule (claim, send, record; at most once).
//!
//! The in-process API for embedding (`kiln demo`): [`run`] runs the whole service until a
//! shutdown future resolves; [`build_report`], [`render_text`] and [`render_html`] make a
//! report without sending; [`send_report`] sends one day's report under the once-per-day rule.

pub mod config;
pub mod consume;
pub mod mail;
pub mod report;
pub mod schedule;
pub mod send;
pub mod triage;

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use jiff::Timestamp;
use kiln_store::Store;
use tokio::sync::watch;

pub use config::DeadletterConfig;
pub use mail::Mailer;
pub use report::{build_report, render_html, render_text, Report};
pub use schedule::{Next, Schedule};
pub use send::{send_report, SendFailure, SendOutcome};

/// Longest single sleep of the scheduler: it wakes at least this often to re-read the clock,
/// so a clock step or a suspended machine delays a report by at most this much.
const SLEEP_MAX: Duration = Duration::from_secs(60);
/// Back-off after a failed send whose day is still free (the mail server was down).
const RETRY_MIN: Duration = Duration::from_secs(30);
const RETRY_MAX: Duration = Duration::from_secs(30 * 60);

/// Runs the service (consumer and daily report) until `shutdown` resolves or a fatal error.
pub async fn run(
    config: DeadletterConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    config.validate()?;
    let schedule = config.schedule()?;
    let mailer = Mailer::new(&config)?;
    let store = Store::connect_with_password_file(
        &config.database_url,
        config.database_password_file.as_deref(),
    )
    .await
    .context("opening the results store")?;
    let (caught_tx, caught_rx) = watch::channel(false);
    tracing::info!(
        time = %config.report.time, zone = %schedule.zone_name, transport = ?config.transport,
        "dead-letter triage started"
    );
    let result = tokio::select! {
        r = consume::run_consumer(&config, &store, caught_tx) => r,
        r = scheduler(&config, &store, &mailer, &schedule, caught_rx) => r,
        () = shutdown => Ok(()),
    };
    store.close().await;
    result
}

async fn scheduler(
    config: &DeadletterConfig,
    store: &Store,
    mailer: &Mailer,
    schedule: &Schedule,
    mut caught_up: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let wait = Duration::from_millis(config.catch_up_timeout_ms);
    if tokio::time::timeout(wait, caught_up.wait_for(|c| *c))
        .await
        .is_err()
    {
        tracing::warn!(
            waited_ms = config.catch_up_timeout_ms,
            "the consumer has not caught up with the dead-letter topic; reports go on without it"
        );
    }
    // A day whose report was found empty (and not sent) is done too.
    let mut empty_day = None;
    let mut retry = RETRY_MIN;
    let mut announced = None;
    loop {
        let now = Timestamp::now();
        let today = schedule.day_of(now);
        let done =
            empty_day == Some(today) || store.report_day(&today.to_string()).await?.is_some();
        match schedule.next(now, done)? {
            Next::WaitUntil(at) => {
                if announced != Some(at) {
                    announced = Some(at);
                    let today_s = today.to_string();
                    if done && empty_day != Some(today) {
                        tracing::info!(day = today_s, "report already sent (or claimed) today");
                    }
                    tracing::info!(at = schedule.local(at.as_millisecond()), "next report");
                }
                let left = Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO);
                tokio::time::sleep(left.min(SLEEP_MAX)).await;
            }
            Next::SendNow(day) => {
                match send_report(store, mailer, config, schedule, day, false).await {
                    Ok(outcome) => {
                        log_outcome(&outcome);
                        if matches!(outcome, SendOutcome::Empty { .. }) {
                            empty_day = Some(day);
                        }
                        retry = RETRY_MIN;
                    }
                    Err(f) if f.retryable => {
                        tracing::error!(error = %format!("{:#}", f.error), retry_s = retry.as_secs(), "report not sent; will retry");
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                    Err(f) => {
                        // The day stays claimed: nothing more to do for it.
                        tracing::error!(error = %format!("{:#}", f.error), "report of the day");
                    }
                }
            }
        }
    }
}

fn log_outcome(outcome: &SendOutcome) {
    match outcome {
        SendOutcome::Sent {
            day,
            message_id,
            new,
            still_open,
        } => tracing::info!(day, message_id, new, still_open, "report sent"),
        SendOutcome::AlreadySent { day, sent_at_ms } => {
            tracing::info!(day, sent_at_ms, "report already sent")
        }
        SendOutcome::Unfinished {
            day,
            by,
            claimed_at_ms,
        } => tracing::warn!(
            day,
            by,
            claimed_at_ms,
            "the day's report was claimed and never recorded as sent (a crash mid-send?); \
             not sending it again"
        ),
        SendOutcome::Empty { day } => tracing::info!(day, "no dead-lettered node; no report"),
    }
}
