use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::settings;

#[derive(Args, Debug, Default)]
pub struct BrokerArgs {
    /// TOML settings file (see deploy/broker.example.toml); KILN_CONFIG also names one.
    #[arg(long, env = "KILN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:9092].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// host:port that clients are told to connect to [default: the listen address].
    #[arg(long)]
    pub advertised_address: Option<String>,
    /// Data directory [default: ./kiln-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// This broker's node id [default: 0].
    #[arg(long)]
    pub node_id: Option<i32>,
    /// Create topics on first use (off by default).
    #[arg(long)]
    pub auto_create_topics: bool,
}

pub async fn run(args: BrokerArgs) -> anyhow::Result<()> {
    let config = settings::broker_config(&args)?;
    tracing::debug!(?config, "effective configuration");
    let bound = kiln_broker::Broker::bind(config).await?;
    bound
        .run(shutdown_signal())
        .await
        .context("broker stopped with an error")
}

/// Resolves on SIGINT or SIGTERM, so a clean stop writes recovery checkpoints.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
