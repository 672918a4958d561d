//! `kiln agent --config FILE`: a burn-in agent (crates/kiln-agent). Stops on Ctrl-C or
//! SIGTERM; work in flight is abandoned uncommitted and redelivered to another agent.

use std::path::PathBuf;

use clap::Args;
use kiln_agent::AgentConfig;

#[derive(Args)]
pub struct AgentArgs {
    /// The agent's TOML settings (bootstrap, database_url, agent_id, playbook, ...);
    /// `KILN_AGENT__<KEY>` variables override it.
    #[arg(long, env = "KILN_AGENT_CONFIG")]
    pub config: PathBuf,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let config = AgentConfig::load(&args.config)?;
    kiln_agent::run_agent(config, shutdown_signal()).await
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
