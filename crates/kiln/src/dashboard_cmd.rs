//! `kiln dashboard`: the operators' web dashboard (kiln-dashboard) over the results store,
//! with consumer lag sampled from the broker.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kiln_dashboard::{serve, DashboardConfig};
use kiln_store::Store;

use crate::broker_address::BrokerAddress;
use crate::platform_args::StoreArgs;
use crate::web_args::WebArgs;

#[derive(Args, Debug)]
pub struct DashboardArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// The broker consumer lag is sampled from (Kiln, Apache Kafka or Redpanda), with its
    /// TLS and SASL settings.
    #[command(flatten)]
    broker: BrokerAddress,
    #[command(flatten)]
    web: WebArgs,
    /// Do not sample consumer lag (no broker needed).
    #[arg(long)]
    no_lag: bool,
    /// Seconds between lag samples.
    #[arg(long, default_value_t = 5.0)]
    lag_interval_s: f64,
    /// Seconds between automatic page reloads in the browser (0: never).
    #[arg(long, default_value_t = 10)]
    refresh_s: u64,
}

pub async fn run(args: DashboardArgs) -> anyhow::Result<()> {
    if !(args.lag_interval_s.is_finite() && (0.1..=3600.0).contains(&args.lag_interval_s)) {
        bail!(
            "--lag-interval-s {} is out of range: give 0.1 to 3600 seconds",
            args.lag_interval_s
        );
    }
    let web = args.web.security("kiln dashboard", args.listen)?;
    let kafka = if args.no_lag {
        kiln_client::Security::default()
    } else {
        args.broker.security()?
    };
    let store = Store::connect(&args.store.database_url).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr().context("listening address")?;
    let mut config = DashboardConfig::new((!args.no_lag).then(|| args.broker.bootstrap.clone()));
    config.lag_interval = Duration::from_secs_f64(args.lag_interval_s);
    config.broker_timeout = args.broker.timeout();
    config.refresh_secs = args.refresh_s;
    config.kafka = kafka;
    let scheme = web.scheme();
    config.web = web;
    tracing::info!(
        tokens = config.web.tokens.is_some(),
        "dashboard on {scheme}://{local}/ (store {}, lag from {})",
        kiln_store::redact_url(&args.store.database_url),
        config.bootstrap.as_deref().unwrap_or("nowhere: --no-lag")
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
