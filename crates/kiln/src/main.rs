//! `kiln`: one binary, one subcommand per service or tool.

mod acls_cmd;
mod agent_cmd;
mod broker_address;
mod broker_cmd;
mod certs_cmd;
mod cluster_cmd;
mod cluster_moves;
mod dashboard_cmd;
mod dashboard_settings;
mod deadletter_cmd;
mod demo_cmd;
mod demo_security;
mod groups_cmd;
mod intake_cmd;
mod intake_settings;
mod nodes_cmd;
mod platform_args;
mod playbook_cmd;
mod probe_cmd;
mod settings;
mod sim_cmd;
mod status_cmd;
mod tokens_cmd;
mod topic_configs_cmd;
mod topics_cmd;
mod users_cmd;
mod web_args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: GPU burn-in orchestration on its own replicated log"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax); RUST_LOG is used when this is not given.
    #[arg(long, global = true, env = "KILN_LOG_LEVEL")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole job in one process on embedded defaults: broker, store, simulated fleet with
    /// injected faults, intake, agents, dead-letter email (to a file) and the dashboard.
    Demo(demo_cmd::DemoArgs),
    /// Run a broker.
    Broker(broker_cmd::BrokerArgs),
    /// Create, list, describe and delete topics.
    Topics(topics_cmd::TopicsArgs),
    /// Consumer groups: list, describe (members, lag), reset offsets, delete.
    Groups(groups_cmd::GroupsArgs),
    /// Replicated cluster operations: elect each partition's preferred leader now.
    Cluster(cluster_cmd::ClusterArgs),
    /// Register rack manifests: validate, queue each node on kiln.nodes, record it.
    Intake(intake_cmd::IntakeArgs),
    /// Run a burn-in agent: consume kiln.nodes in group burnin, run the playbook, record, commit.
    Agent(agent_cmd::AgentArgs),
    /// Burn-in nodes in the store: show one's state, runs and events.
    Nodes(nodes_cmd::NodesArgs),
    /// Dead-lettered nodes: requeue one (after repair) as its next cycle.
    Dlq(nodes_cmd::DlqArgs),
    /// Dead-letter triage: consume kiln.nodes.dlq, record triage, send the daily report email.
    Deadletter(deadletter_cmd::DeadletterArgs),
    /// Each rack's nodes by state with progress bars and totals (--watch to follow).
    Status(status_cmd::StatusArgs),
    /// Serve the operators' web dashboard: racks, nodes, checks, dead letters, consumer lag.
    Dashboard(dashboard_settings::DashboardArgs),
    /// Validate playbooks, or run one's checks on this machine (local shell).
    Playbook(playbook_cmd::PlaybookArgs),
    /// On a GPU node: read NVML and the kernel log, print one JSON document.
    Probe(probe_cmd::ProbeArgs),
    /// Serve a simulated fleet on loopback (SSH + Redfish per node, injected faults).
    Sim(sim_cmd::SimArgs),
    /// Make a cluster CA and issue broker and client certificates for TLS.
    Certs(certs_cmd::CertsArgs),
    /// Create, delete and list SCRAM users of a broker's [sasl] listener.
    Users(users_cmd::UsersArgs),
    /// Create, delete and list the ACLs a broker with [authorization] enforces.
    Acls(acls_cmd::AclsArgs),
    /// Create, list and revoke the bearer tokens of intake and the dashboard.
    Tokens(tokens_cmd::TokensArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo draws live progress and ends with a summary; service logs would scroll it
    // away, so only errors show unless a filter is asked for.
    let default_filter = match cli.command {
        Command::Demo(_) => "error",
        // openraft narrates every election and vote at info; its warnings are what operators need.
        _ => "info,openraft=warn",
    };
    init_logging(cli.log.as_deref(), default_filter);
    // The probe is synchronous and prints its own exit code; no runtime needed.
    if let Command::Probe(args) = &cli.command {
        return probe_cmd::run(args);
    }

    let runtime = match kiln_broker::runtime::builder().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => demo_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Broker(args) => broker_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Topics(args) => topics_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Groups(args) => groups_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Cluster(args) => cluster_cmd::run(args).await.map(|all_ok| {
                if all_ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }),
            Command::Intake(args) => intake_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Agent(args) => agent_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Nodes(args) => nodes_cmd::run_nodes(args).await.map(|()| ExitCode::SUCCESS),
            Command::Dlq(args) => nodes_cmd::run_dlq(args).await.map(|()| ExitCode::SUCCESS),
            Command::Deadletter(args) => {
                deadletter_cmd::run(args).await.map(|()| ExitCode::SUCCESS)
            }
            Command::Status(args) => status_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Dashboard(args) => dashboard_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Sim(args) => sim_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Certs(args) => certs_cmd::run(args).map(|()| ExitCode::SUCCESS),
            Command::Users(args) => users_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Acls(args) => acls_cmd::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Tokens(args) => tokens_cmd::run(args).map(|()| ExitCode::SUCCESS),
            // Its exit status tells pass, fail and could-not-measure apart.
            Command::Playbook(args) => playbook_cmd::run(args).await,
            Command::Probe(_) => unreachable_probe().map(|()| ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: Option<&str>, default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = filter
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only help a person at a terminal; in files they are noise.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// `kiln probe` returns before the runtime starts (see `main`).
fn unreachable_probe() -> anyhow::Result<()> {
    anyhow::bail!("kiln probe runs without the async runtime")
}
