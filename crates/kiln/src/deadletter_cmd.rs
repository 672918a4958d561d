//! `kiln deadletter [--config FILE]`: the dead-letter triage service (crates/kiln-deadletter);
//! `kiln deadletter report --dry-run [--html] [--day YYYY-MM-DD]` prints a report without
//! sending or recording anything; `kiln deadletter report --send-now` sends today's report
//! at once, under the same once-per-day rule as the service.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use jiff::civil::Date;
use jiff::Timestamp;
use kiln_deadletter::{
    build_report, render_html, render_text, send_report, DeadletterConfig, Mailer, SendOutcome,
};
use kiln_store::Store;

#[derive(Args, Debug)]
pub struct DeadletterArgs {
    /// TOML settings (see deploy/deadletter.example.toml); `KILN_DEADLETTER__<KEY>` variables
    /// override it. Without a file: built-in defaults and the variables.
    #[arg(long, global = true, env = "KILN_DEADLETTER_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<DeadletterCommand>,
}

#[derive(Subcommand, Debug)]
enum DeadletterCommand {
    /// Print today's report (--dry-run) or send it now (--send-now).
    Report(ReportArgs),
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Print the report (plain text) without sending or recording anything.
    #[arg(
        long,
        conflicts_with = "send_now",
        required_unless_present = "send_now"
    )]
    dry_run: bool,
    /// With --dry-run: print the HTML part instead of the text.
    #[arg(long, requires = "dry_run")]
    html: bool,
    /// With --dry-run: the report of this day (YYYY-MM-DD) instead of today's.
    #[arg(long, requires = "dry_run")]
    day: Option<String>,
    /// Send today's report now and record it (never a second time the same day).
    #[arg(long)]
    send_now: bool,
}

pub async fn run(args: DeadletterArgs) -> anyhow::Result<()> {
    let config = DeadletterConfig::load(args.config.as_deref())?;
    match args.command {
        None => kiln_deadletter::run(config, shutdown_signal()).await,
        Some(DeadletterCommand::Report(r)) if r.dry_run => dry_run(&config, &r).await,
        Some(DeadletterCommand::Report(_)) => send_now(&config).await,
    }
}

async fn dry_run(config: &DeadletterConfig, r: &ReportArgs) -> anyhow::Result<()> {
    let schedule = config.schedule()?;
    let day = match &r.day {
        Some(d) => d
            .parse::<Date>()
            .with_context(|| format!("--day {d:?} is not a date (YYYY-MM-DD)"))?,
        None => schedule.day_of(Timestamp::now()),
    };
    let store = Store::connect_with_password_file(
        &config.database_url,
        config.database_password_file.as_deref(),
    )
    .await?;
    let report = build_report(&store, day, &schedule, &config.report).await;
    store.close().await;
    let report = report?;
    if r.html {
        print!("{}", render_html(&report, &schedule));
    } else {
        print!("{}", render_text(&report, &schedule));
    }
    Ok(())
}

async fn send_now(config: &DeadletterConfig) -> anyhow::Result<()> {
    let schedule = config.schedule()?;
    let mailer = Mailer::new(config)?;
    let store = Store::connect_with_password_file(
        &config.database_url,
        config.database_password_file.as_deref(),
    )
    .await?;
    let day = schedule.day_of(Timestamp::now());
    let outcome = send_report(&store, &mailer, config, &schedule, day, true).await;
    store.close().await;
    match outcome.map_err(|f| f.error)? {
        SendOutcome::Sent {
            day,
            message_id,
            new,
            still_open,
        } => println!(
            "sent the report of {day} ({new} new, {still_open} still open), Message-ID {message_id}"
        ),
        SendOutcome::AlreadySent { day, sent_at_ms } => println!(
            "not sent: the report of {day} was already sent at {}",
            schedule.local(sent_at_ms)
        ),
        SendOutcome::Unfinished {
            day,
            by,
            claimed_at_ms,
        } => println!(
            "not sent: the report of {day} was claimed by {by} at {} and never recorded as sent \
             (a crash mid-send?); a day's report is sent at most once",
            schedule.local(claimed_at_ms)
        ),
        SendOutcome::Empty { day } => println!("nothing to send for {day}"),
    }
    Ok(())
}

/// Ctrl-C or SIGTERM. Stopping mid-send leaves the day claimed (at most once, see
/// docs/deadletter.md); stopping mid-record leaves the offset uncommitted (redelivered).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
