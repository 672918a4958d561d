//! `kiln dashboard`: the operators' web dashboard (kiln-dashboard) over the results store,
//! with consumer lag sampled from the broker. Settings: `dashboard_settings`.

use std::time::Duration;

use anyhow::Context;
use kiln_dashboard::{serve, DashboardConfig};
use kiln_store::Store;

use crate::dashboard_settings::{DashboardArgs, DashboardSettings};
use crate::web_args::web_security;

pub async fn run(args: DashboardArgs) -> anyhow::Result<()> {
    let settings = DashboardSettings::load(&args, std::env::vars())?;
    tracing::debug!(?settings, "effective settings");
    let web = web_security(
        "kiln dashboard",
        settings.listen,
        &settings.https,
        settings.tokens_file.as_deref(),
        settings.insecure_no_auth,
    )?;
    let kafka = if settings.lag {
        settings.broker.security()?
    } else {
        kiln_client::Security::default()
    };
    let store = Store::connect_with_password_file(
        &settings.database_url,
        settings.database_password_file.as_deref(),
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let local = listener.local_addr().context("listening address")?;
    let mut config = DashboardConfig::new(settings.lag.then(|| settings.bootstrap.clone()));
    config.lag_interval = Duration::from_secs_f64(settings.lag_interval_s);
    config.broker_timeout = settings.broker.timeout();
    config.refresh_secs = settings.refresh_s;
    config.kafka = kafka;
    let scheme = web.scheme();
    config.web = web;
    tracing::info!(
        tokens = config.web.tokens.is_some(),
        "dashboard on {scheme}://{local}/ (store {}, lag from {})",
        kiln_store::redact_url(&settings.database_url),
        config
            .bootstrap
            .as_deref()
            .unwrap_or("nowhere: lag = false (--no-lag)")
    );
    // Scripts and tests read this line to learn the port when --listen ends in :0.
    println!("kiln dashboard listening on {scheme}://{local}/");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("dashboard shutting down");
    };
    let result = serve(listener, store.clone(), config, shutdown).await;
    store.close().await;
    result
}
