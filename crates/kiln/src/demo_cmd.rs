//! `kiln demo`: the whole burn-in job in one process on embedded defaults. A broker, a
//! SQLite store, a simulated fleet with injected faults, intake, several agents, the
//! dead-letter service (its email written to a file) and the dashboard, all on loopback
//! in a fresh work directory. It shows live progress per rack and ends with a summary of
//! what passed, what was dead-lettered and why, next to the faults that were injected.
//! Plaintext by default; `--secure` runs the same job with security on every listener
//! (`demo_security`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_agent::AgentConfig;
use kiln_deadletter::config::{FileConfig, TransportKind};
use kiln_deadletter::{DeadletterConfig, Mailer, SendOutcome};
use kiln_intake::{Intake, NoProgress};
use kiln_manifest::Manifest;
use kiln_queue::{NodeProducer, ProducerConfig, NODES_TOPIC};
use kiln_sim::{Fault, Fleet, FleetSpec};
use kiln_store::dashboard::{totals, RackSummary};
use kiln_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::broker_cmd::BrokerArgs;
use crate::demo_security::{DemoSecurity, Resources, ADMIN};
use crate::status_cmd::{self, Style};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Racks in the simulated fleet.
    #[arg(long, default_value_t = 3)]
    racks: usize,
    /// Nodes per rack.
    #[arg(long, default_value_t = 8)]
    nodes_per_rack: usize,
    /// Burn-in agents sharing the work (one consumer group).
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Inject HOST=KIND (repeatable) instead of the default set of faults; KIND is one of
    /// the faults of `kiln sim --fault` (ecc, row-remap, stuck-ib, dcgm-fail, psu-fail, ...).
    #[arg(long = "fault", value_name = "HOST=KIND")]
    faults: Vec<String>,
    /// Work directory (broker data, store, fleet keys, the email); must be empty or absent.
    /// Default: a new directory under the system's temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Dashboard address; if it is taken, a free port is used instead.
    #[arg(long, default_value = "127.0.0.1:8080")]
    dashboard: SocketAddr,
    /// Give up if the fleet has not finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Keep the broker and the dashboard running after the summary, until Ctrl-C.
    #[arg(long)]
    stay: bool,
    /// Security on: a throwaway CA and certificates, the broker's listener SASL_SSL
    /// (SCRAM-SHA-512) with ACLs, each service logging in as its own user with only its
    /// role's ACLs, the dashboard over HTTPS behind a token. Passwords and the token are
    /// written to files under DIR/secrets, never printed.
    #[arg(long)]
    secure: bool,
}

/// Faults of the default demo, by node index: one of each permanent kind (dead-lettered after
/// one attempt for an RMA candidate, two for the same fault twice, ten when nothing answers)
/// and one that heals after a failed run (passes on its retry; failing the same way twice
/// would dead-letter it).
/// `hang` is left out: each of its attempts waits out the stress steps' timeouts.
const DEFAULT_FAULTS: [(usize, &str); 7] = [
    (2, "ecc"),
    (6, "stuck-ib"),
    (9, "firmware-drift"),
    (12, "sel-critical"),
    (15, "unreachable"),
    (17, "row-remap"),
    (20, "flaky:1"),
];

/// Failing checks named per node in the summary (an unreachable node fails all of them).
const SUMMARY_CHECKS_SHOWN: usize = 3;

/// Back-off between a node's attempts in the demo: short, so ten attempts fit in seconds.
const DEMO_RETRY_BACKOFF_MS: u64 = 200;
const DEMO_RETRY_BACKOFF_MAX_MS: u64 = 1_000;

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.agents == 0 || args.agents > 16 {
        bail!("--agents {}: give 1 to 16 agents", args.agents);
    }
    let started = Instant::now();
    let dir = work_dir(args.dir.as_deref())?;
    println!("kiln demo: working in {}", dir.display());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut demo = Demo::start(&args, &dir, stop_rx).await?;
    let outcome = tokio::select! {
        r = demo.wait_until_finished(Duration::from_secs(args.timeout_s)) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let result = match outcome {
        Ok(()) => demo.finish(started, args.stay).await,
        Err(e) => Err(e),
    };
    let _ = stop_tx.send(true);
    demo.shut_down().await;
    result
}

/// Everything the demo started, to be stopped in reverse order.
struct Demo {
    /// `--secure`'s certificates and secrets.
    security: Option<DemoSecurity>,
    bootstrap: String,
    broker: JoinHandle<anyhow::Result<()>>,
    broker_stop: watch::Sender<bool>,
    fleet: Option<Fleet>,
    store: Store,
    agents: Vec<JoinHandle<anyhow::Result<()>>>,
    triage: JoinHandle<()>,
    dashboard: JoinHandle<anyhow::Result<()>>,
    /// `http://` or `https://`, the address and `/`.
    dashboard_url: String,
    deadletter: DeadletterConfig,
    mail_dir: PathBuf,
    nodes: usize,
}

impl Demo {
    async fn start(
        args: &DemoArgs,
        dir: &Path,
        stop: watch::Receiver<bool>,
    ) -> anyhow::Result<Demo> {
        let security = if args.secure {
            let security = DemoSecurity::create(dir)?;
            println!(
                "  security      SASL_SSL (SCRAM-SHA-512) and ACLs, one user per service; CA, certificates, passwords and the dashboard token in {}",
                security.secrets_dir().display()
            );
            Some(security)
        } else {
            None
        };
        // Each service's librdkafka settings: its own user's login with --secure.
        let kafka_as = |user: &str| -> anyhow::Result<kiln_queue::KafkaSettings> {
            match &security {
                Some(s) => s.librdkafka(user),
                None => Ok(kiln_queue::KafkaSettings::default()),
            }
        };

        // The broker: in this process, on a free loopback port.
        let mut broker_config = crate::settings::broker_config(&BrokerArgs {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            data_dir: Some(dir.join("broker")),
            ..BrokerArgs::default()
        })?;
        broker_config.metrics_listen = "127.0.0.1:0".into();
        if let Some(s) = &security {
            s.secure_broker(&mut broker_config);
        }
        let bound = kiln_broker::Broker::bind(broker_config).await?;
        let bootstrap = bound.local_addr()?.to_string();
        let metrics = bound.metrics_addr();
        // The broker has its own stop flag: it must outlive the clients, so that their
        // LeaveGroup and last commits are answered.
        let (broker_stop, broker_stop_rx) = watch::channel(false);
        let broker = tokio::spawn(bound.run(stopped(broker_stop_rx)));
        let agent_defaults = AgentConfig::default();
        let triage_defaults = DeadletterConfig::default();
        if let Some(s) = &security {
            let resources = Resources {
                nodes_topic: NODES_TOPIC,
                dlq_topic: &agent_defaults.dlq_topic,
                agents_group: &agent_defaults.group,
                triage_group: &triage_defaults.group,
            };
            s.create_users_and_acls(&bootstrap, &resources).await?;
        }
        let partitions = i32::try_from(args.racks.clamp(1, 8)).unwrap_or(1);
        let admin = kafka_as(ADMIN)?;
        kiln_queue::create_topic_with(&bootstrap, NODES_TOPIC, partitions, 1, &admin).await?;
        kiln_queue::create_topic_with(&bootstrap, &agent_defaults.dlq_topic, 1, 1, &admin).await?;
        let protocol = if security.is_some() {
            "SASL_SSL"
        } else {
            "PLAINTEXT"
        };
        println!(
            "  broker        {bootstrap} ({protocol}; metrics: {})",
            show(metrics)
        );

        let fleet = Fleet::start(fleet_spec(args, dir)?).await?;
        let injected = fleet.faults().iter().filter(|(_, f)| !f.is_empty()).count();
        println!(
            "  fleet         {} racks x {} nodes, {injected} with injected faults (keys and manifest in {})",
            args.racks,
            args.nodes_per_rack,
            fleet.out_dir().display()
        );

        let database_url = format!("sqlite://{}", dir.join("kiln.db").display());
        let store = Store::connect(&database_url).await?;
        println!("  store         {database_url}");

        let listener = match tokio::net::TcpListener::bind(args.dashboard).await {
            Ok(l) => l,
            Err(e) => {
                println!(
                    "  (dashboard address {} unavailable: {e}; using a free port)",
                    args.dashboard
                );
                tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?
            }
        };
        let dashboard_addr = listener.local_addr()?;
        let mut dashboard_config = kiln_dashboard::DashboardConfig::new(Some(bootstrap.clone()));
        if let Some(s) = &security {
            dashboard_config.kafka = s.client("dashboard")?;
            dashboard_config.web = s.dashboard_web()?;
        }
        let dashboard_url = format!("{}://{dashboard_addr}/", dashboard_config.web.scheme());
        let dashboard = tokio::spawn(kiln_dashboard::serve(
            listener,
            store.clone(),
            dashboard_config,
            stopped(stop.clone()),
        ));
        match &security {
            Some(s) => println!(
                "  dashboard     {dashboard_url} (any user name; the password is the token in {})",
                s.token_file().display()
            ),
            None => println!("  dashboard     {dashboard_url}"),
        }

        let mail_dir = dir.join("mail");
        let deadletter = DeadletterConfig {
            bootstrap: bootstrap.clone(),
            database_url: database_url.clone(),
            instance_id: "demo-deadletter".into(),
            session_timeout_ms: 6_000,
            transport: TransportKind::File,
            file: FileConfig {
                dir: mail_dir.clone(),
            },
            report: kiln_deadletter::config::ReportConfig {
                to: vec!["hardware-team@localhost".into()],
                ..Default::default()
            },
            kafka: kafka_as("deadletter")?,
            ..triage_defaults
        };
        deadletter.validate()?;
        let triage = {
            let (config, store, stop) = (deadletter.clone(), store.clone(), stop.clone());
            tokio::spawn(async move {
                let (caught_up, _) = watch::channel(false);
                tokio::select! {
                    r = kiln_deadletter::consume::run_consumer(&config, &store, caught_up) => {
                        if let Err(e) = r {
                            eprintln!("dead-letter consumer stopped: {e:#}");
                        }
                    }
                    () = stopped(stop) => {}
                }
            })
        };

        let mut agents = Vec::new();
        for i in 0..args.agents {
            let config = fleet.agent_config(AgentConfig {
                bootstrap: bootstrap.clone(),
                database_url: database_url.clone(),
                agent_id: format!("demo-agent-{}", i + 1),
                max_in_flight_per_partition: 8,
                retry_backoff_ms: DEMO_RETRY_BACKOFF_MS,
                retry_backoff_max_ms: DEMO_RETRY_BACKOFF_MAX_MS,
                session_timeout_ms: 6_000,
                metrics_listen: "off".into(),
                kafka: kafka_as("agent")?,
                ..agent_defaults.clone()
            });
            agents.push(tokio::spawn(kiln_agent::run_agent(
                config,
                stopped(stop.clone()),
            )));
        }
        println!("  agents        {} in group burnin", args.agents);

        let manifest = Manifest {
            nodes: fleet.manifest(),
        };
        let nodes = manifest.nodes.len();
        let mut producer_config = ProducerConfig::new(bootstrap.clone());
        producer_config.extra = kafka_as("intake")?.0.into_iter().collect();
        let producer = NodeProducer::new(producer_config)?;
        let intake = Intake::new(store.clone(), producer);
        let registration = intake.register(&manifest, &NoProgress).await?;
        if !registration.failed.is_empty() {
            bail!(
                "intake could not queue {} of {nodes} nodes",
                registration.failed.len()
            );
        }
        println!(
            "  intake        queued {} nodes of {} racks on {NODES_TOPIC}\n",
            registration.queued.len(),
            registration.racks.len()
        );
        Ok(Demo {
            security,
            bootstrap,
            broker,
            broker_stop,
            fleet: Some(fleet),
            store,
            agents,
            triage,
            dashboard,
            dashboard_url,
            deadletter,
            mail_dir,
            nodes,
        })
    }

    /// Shows progress until every node has passed or been dead-lettered.
    async fn wait_until_finished(&mut self, limit: Duration) -> anyhow::Result<()> {
        let tty = std::io::stdout().is_terminal();
        let bar = tty.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
            bar.set_style(
                ProgressStyle::with_template("{msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar
        });
        let deadline = Instant::now() + limit;
        let mut last_line = Instant::now();
        loop {
            let racks = self.store.rack_summaries().await?;
            let all = totals(&racks);
            let done = all.total() == self.nodes as u64 && all.finished() == all.total();
            if let Some(bar) = &bar {
                let style = Style::Bars {
                    width: 30,
                    color: true,
                };
                bar.set_message(status_cmd::render(&racks, style).trim_end().to_string());
            } else if done || last_line.elapsed() >= Duration::from_secs(5) {
                last_line = Instant::now();
                println!("{}", progress_line(&all));
            }
            if done {
                if let Some(bar) = bar {
                    bar.finish();
                }
                return Ok(());
            }
            self.check_services()?;
            if Instant::now() >= deadline {
                bail!(
                    "the fleet had not finished after {} s: {}",
                    limit.as_secs(),
                    progress_line(&all)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A service that stopped on its own is an error: the demo could never finish.
    fn check_services(&self) -> anyhow::Result<()> {
        if self.broker.is_finished() {
            bail!("the broker stopped");
        }
        if self.agents.iter().all(JoinHandle::is_finished) {
            bail!("every agent stopped (run with --log info to see why)");
        }
        Ok(())
    }

    /// Sends the dead-letter report to the mail directory and prints the summary.
    async fn finish(&mut self, started: Instant, stay: bool) -> anyhow::Result<()> {
        let dead = self.wait_for_triage().await?;
        let schedule = self.deadletter.schedule()?;
        let mailer = Mailer::new(&self.deadletter)?;
        let day = schedule.day_of(jiff::Timestamp::now());
        let sent = kiln_deadletter::send_report(
            &self.store,
            &mailer,
            &self.deadletter,
            &schedule,
            day,
            false,
        )
        .await
        .map_err(|f| f.error)?;
        let racks = self.store.rack_summaries().await?;
        print_summary(&racks, self, started.elapsed(), &sent, dead).await?;
        if stay {
            println!(
                "\nThe broker and the dashboard ({}) keep running; Ctrl-C to stop.",
                self.dashboard_url
            );
            if let Some(s) = &self.security {
                println!(
                    "Kiln's tools reach the broker as its admin with: --bootstrap {} --tls-ca {} --sasl-user {ADMIN} --sasl-password-file {}",
                    self.bootstrap,
                    s.ca_file().display(),
                    s.password_file(ADMIN).display()
                );
            }
            let _ = tokio::signal::ctrl_c().await;
        }
        Ok(())
    }

    /// Waits until the triage service has recorded every dead-lettered node.
    async fn wait_for_triage(&self) -> anyhow::Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, dead) = self.store.dead_letters(0).await?;
            let triaged = self.store.open_triage().await?.len() as u64;
            if triaged >= dead {
                return Ok(dead);
            }
            if Instant::now() >= deadline {
                bail!("the dead-letter service recorded {triaged} of {dead} dead-lettered nodes within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn shut_down(mut self) {
        for a in self.agents.drain(..) {
            match tokio::time::timeout(Duration::from_secs(15), a).await {
                Ok(Ok(Err(e))) => eprintln!("agent stopped with an error: {e:#}"),
                Ok(Err(e)) => eprintln!("agent task failed: {e}"),
                Err(_) => eprintln!("an agent did not stop within 15 s"),
                Ok(Ok(Ok(()))) => {}
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.triage).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.dashboard).await;
        if let Some(fleet) = self.fleet.take() {
            fleet.stop().await;
        }
        self.store.close().await;
        let _ = self.broker_stop.send(true);
        match tokio::time::timeout(Duration::from_secs(15), &mut self.broker).await {
            Ok(Ok(Err(e))) => eprintln!("broker stopped with an error: {e:#}"),
            Ok(Err(e)) => eprintln!("broker task failed: {e}"),
            Err(_) => eprintln!("the broker did not stop within 15 s"),
            Ok(Ok(Ok(()))) => {}
        }
    }
}

async fn print_summary(
    racks: &[RackSummary],
    demo: &Demo,
    elapsed: Duration,
    sent: &SendOutcome,
    dead: u64,
) -> anyhow::Result<()> {
    let all = totals(racks);
    println!(
        "\nBurn-in finished in {:.1} s: {} nodes, {} passed, {} dead-lettered.",
        elapsed.as_secs_f64(),
        all.total(),
        all.count(kiln_store::NodeState::Passed),
        all.count(kiln_store::NodeState::DeadLettered)
    );
    let triage: BTreeMap<String, kiln_store::triage::TriageRecord> = demo
        .store
        .open_triage()
        .await?
        .into_iter()
        .map(|t| (t.hostname.clone(), t))
        .collect();
    let faults = demo.fleet.as_ref().map(Fleet::faults).unwrap_or_default();
    println!(
        "\n  {:<12} {:<16} {:<14} {:<9} failing checks",
        "node", "injected", "outcome", "attempts"
    );
    for (host, injected) in faults
        .iter()
        .filter(|(h, f)| !f.is_empty() || triage.contains_key(h))
    {
        let injected: Vec<String> = injected.iter().map(Fault::to_string).collect();
        let status = demo.store.node_states(&[host.as_str()]).await?;
        let (outcome, attempts) = status
            .get(host)
            .map(|s| (s.state.as_str().to_string(), s.attempt))
            .unwrap_or_else(|| ("unknown".into(), 0));
        let checks = triage
            .get(host)
            .map(|t| {
                let names: Vec<&str> = t.failing_checks.iter().map(|c| c.name.as_str()).collect();
                let shown = if names.len() > SUMMARY_CHECKS_SHOWN {
                    format!(
                        "{}, +{} more",
                        names[..SUMMARY_CHECKS_SHOWN].join(", "),
                        names.len() - SUMMARY_CHECKS_SHOWN
                    )
                } else {
                    names.join(", ")
                };
                let action = kiln_findings::Action::parse(&t.action)
                    .map_or_else(|| t.action.clone(), |a| a.label().to_string());
                format!("{shown}  => {action}")
            })
            .unwrap_or_default();
        println!(
            "  {host:<12} {:<16} {outcome:<14} {attempts:<9} {checks}",
            injected.join(",")
        );
    }
    match sent {
        SendOutcome::Sent { .. } => {
            let email = newest_file(&demo.mail_dir)?;
            println!(
                "\nDead-letter report on {dead} nodes (the daily email): {}",
                email.display()
            );
        }
        SendOutcome::Empty { .. } => println!("\nNo node was dead-lettered: no report to send."),
        other => println!("\nDead-letter report not written: {other:?}"),
    }
    println!("Dashboard: {}", demo.dashboard_url);
    println!(
        "A node's history: kiln nodes show HOST --database-url {}",
        demo.deadletter.database_url
    );
    Ok(())
}

fn fleet_spec(args: &DemoArgs, dir: &Path) -> anyhow::Result<FleetSpec> {
    let mut spec = FleetSpec::new(dir.join("fleet"));
    spec.racks = args.racks;
    spec.nodes_per_rack = args.nodes_per_rack;
    let count = spec.node_count();
    if args.faults.is_empty() {
        for (index, kind) in DEFAULT_FAULTS.iter().filter(|(i, _)| *i < count) {
            let fault: Fault = kind.parse().map_err(anyhow::Error::msg)?;
            let host = spec.hostname(*index);
            spec = spec.with_fault(&host, fault);
        }
    } else {
        for flag in &args.faults {
            let (host, fault) = kiln_sim::parse_fault_flag(flag).map_err(anyhow::Error::msg)?;
            spec = spec.with_fault(&host, fault);
        }
    }
    Ok(spec)
}

/// The work directory: `dir` (which must be empty or absent) or a new temporary one.
fn work_dir(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::temp_dir().join(format!(
            "kiln-demo-{}-{}",
            kiln_queue::now_ms(),
            std::process::id()
        )),
    };
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty: the demo starts from nothing; give an empty or new --dir",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    dir.canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))
}

fn newest_file(dir: &Path) -> anyhow::Result<PathBuf> {
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let modified = entry.metadata()?.modified()?;
        if newest.as_ref().is_none_or(|(t, _)| modified > *t) {
            newest = Some((modified, entry.path()));
        }
    }
    newest
        .map(|(_, p)| p)
        .with_context(|| format!("no email in {}", dir.display()))
}

fn progress_line(all: &RackSummary) -> String {
    use kiln_store::NodeState::*;
    format!(
        "{}/{} finished: {} passed, {} dead-lettered, {} running, {} retrying, {} queued",
        all.finished(),
        all.total(),
        all.count(Passed),
        all.count(DeadLettered),
        all.count(Running),
        all.count(Retrying),
        all.count(Queued)
    )
}

fn show(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "off".into(), |a| format!("http://{a}/metrics"))
}

/// Resolves once the demo's stop flag is raised (or its sender is gone).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
