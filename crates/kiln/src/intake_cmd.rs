//! `kiln intake register MANIFEST` and `kiln intake serve`: queue a rack's nodes for burn-in.
//! `register` is a tool (flags, and the `KILN_DATABASE_URL` / `KILN_BOOTSTRAP` variables it
//! shares with `kiln nodes`, `dlq` and `status`); `serve` is a service with settings
//! (`intake_settings`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_intake::{Intake, Progress, Registration};
use kiln_manifest::{Format, ManifestErrors};
use kiln_queue::{NodeProducer, ProducerConfig};
use kiln_store::Store;

use crate::intake_settings::{IntakeSettings, ProducerArgs, ServeArgs};
use crate::platform_args::PlatformArgs;

#[derive(Args, Debug)]
pub struct IntakeArgs {
    #[command(subcommand)]
    command: IntakeCommand,
}

#[derive(Subcommand, Debug)]
enum IntakeCommand {
    /// Validate a manifest (CSV, JSON or YAML) and queue every node in it.
    Register(RegisterArgs),
    /// Serve the HTTP API: POST /v1/racks/{rack}/manifest, GET /healthz. Settings come from
    /// --config FILE, then KILN_INTAKE__<SECTION>__<KEY> variables, then the flags.
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
struct RegisterArgs {
    /// The manifest file.
    manifest: PathBuf,
    /// csv, json or yaml [default: from the file's extension].
    #[arg(long)]
    format: Option<Format>,
    /// Require every row to be in this rack.
    #[arg(long)]
    rack: Option<String>,
    /// Print the registration as JSON on stdout instead of the summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    producer: ProducerArgs,
}

pub async fn run(args: IntakeArgs) -> anyhow::Result<()> {
    match args.command {
        IntakeCommand::Register(r) => register(&r).await,
        IntakeCommand::Serve(s) => {
            let settings = IntakeSettings::load(&s, std::env::vars())?;
            tracing::debug!(?settings, "effective settings");
            serve(&settings, &s.producer).await
        }
    }
}

async fn connect(store: Store, producer: ProducerConfig) -> anyhow::Result<Intake> {
    let producer = NodeProducer::new(producer)?;
    Ok(Intake::new(store, producer))
}

fn read_manifest(path: &Path) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read manifest {}", path.display()))?;
    if meta.len() > kiln_intake::http::BODY_BYTES_MAX as u64 {
        bail!(
            "manifest {} is {} bytes; at most {} are accepted",
            path.display(),
            meta.len(),
            kiln_intake::http::BODY_BYTES_MAX
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read manifest {}", path.display()))
}

fn print_refusal(path: &Path, errs: &ManifestErrors) {
    eprintln!(
        "{}: manifest refused, nothing was queued: {} error(s)",
        path.display(),
        errs.count()
    );
    for e in &errs.errors {
        let at = match (e.line, e.item) {
            (Some(line), Some(item)) => format!("{}:{line}: node {item}", path.display()),
            (Some(line), None) => format!("{}:{line}", path.display()),
            (None, Some(item)) => format!("{}: node {item}", path.display()),
            (None, None) => path.display().to_string(),
        };
        eprintln!("{at}: {}: {}", e.field, e.reason);
    }
    if errs.omitted > 0 {
        eprintln!("... and {} more", errs.omitted);
    }
}

/// An indicatif bar on stderr (drawn only when stderr is a terminal).
struct Bar(ProgressBar);

impl Progress for Bar {
    fn phase(&self, name: &'static str, total: usize) {
        self.0.set_length(total as u64);
        self.0.set_position(0);
        self.0.set_message(name);
    }
    fn advance(&self, done: usize) {
        self.0.set_position(done as u64);
    }
}

async fn register(args: &RegisterArgs) -> anyhow::Result<()> {
    let (path, rack, json) = (args.manifest.as_path(), args.rack.as_deref(), args.json);
    let started = Instant::now();
    let format = match args.format.or_else(|| Format::from_path(path)) {
        Some(f) => f,
        None => bail!(
            "cannot tell the format of {} from its extension: pass --format csv|json|yaml",
            path.display()
        ),
    };
    let bytes = read_manifest(path)?;
    // Validate the whole manifest before touching the store or the queue.
    let manifest = match kiln_manifest::parse_bytes(&bytes, format, rack) {
        Ok(m) => m,
        Err(errs) => {
            print_refusal(path, &errs);
            bail!("manifest refused ({} error(s))", errs.count());
        }
    };
    let mut producer = ProducerConfig::new(&args.platform.bootstrap);
    if let Some(topic) = &args.producer.topic {
        producer.topic.clone_from(topic);
    }
    producer.extra = args.producer.extra()?;
    let store = Store::connect(&args.platform.store.database_url).await?;
    let intake = connect(store, producer).await?;
    let bar = ProgressBar::new(manifest.nodes.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let result = intake.register(&manifest, &Bar(bar.clone())).await;
    bar.finish_and_clear();
    let reg = result?;
    intake.store().close().await;
    if json {
        println!("{}", serde_json::to_string_pretty(&reg)?);
    } else {
        print_summary(path, &reg, started.elapsed().as_secs_f64());
    }
    if !reg.failed.is_empty() {
        bail!(
            "{} node(s) were not delivered to the queue and are not registered; run the same command again to retry them",
            reg.failed.len()
        );
    }
    Ok(())
}

fn print_summary(path: &Path, reg: &Registration, total_s: f64) {
    println!(
        "{}: {} node(s) in {} rack(s)",
        path.display(),
        reg.nodes,
        reg.racks.len()
    );
    let partitions: std::collections::BTreeSet<i32> =
        reg.queued.iter().map(|q| q.partition).collect();
    println!(
        "  queued:              {} (partitions {:?})",
        reg.queued.len(),
        partitions.into_iter().collect::<Vec<_>>()
    );
    println!(
        "  already in progress: {} (not queued again)",
        reg.already_in_progress.len()
    );
    for n in &reg.already_in_progress {
        println!(
            "    {}: {} (cycle {}, attempt {})",
            n.hostname, n.state, n.cycle, n.attempt
        );
    }
    if !reg.failed.is_empty() {
        println!("  NOT delivered:       {}", reg.failed.len());
        for n in &reg.failed {
            println!("    {}: {}", n.hostname, n.reason);
        }
    }
    println!(
        "  time: {:.2} s (store lookup {:.0} ms, queue {:.0} ms, record {:.0} ms)",
        total_s, reg.timings.lookup_ms, reg.timings.produce_ms, reg.timings.record_ms
    );
}

async fn serve(settings: &IntakeSettings, flags: &ProducerArgs) -> anyhow::Result<()> {
    let listen: SocketAddr = settings.listen;
    let security = crate::web_args::web_security(
        "kiln intake",
        listen,
        &settings.https,
        settings.tokens_file.as_deref(),
        settings.insecure_no_auth,
    )?;
    let producer = settings.producer_config(flags)?;
    let store = Store::connect_with_password_file(
        &settings.database_url,
        settings.database_password_file.as_deref(),
    )
    .await?;
    let intake = connect(store, producer).await?;
    if let Err(e) = intake.producer().check_topic().await {
        tracing::warn!(error = %e, "the node topic is not usable yet; registrations will fail until it is");
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;
    let scheme = security.scheme();
    tracing::info!(
        tokens = security.tokens.is_some(),
        authenticated = security.authenticates(),
        "intake listening on {scheme}://{bound} (store {}, bootstrap {}, topic {})",
        kiln_store::redact_url(&settings.database_url),
        settings.bootstrap,
        settings.topic
    );
    let intake = Arc::new(intake);
    kiln_intake::http::serve(listener, intake.clone(), &security, shutdown_signal())
        .await
        .context("intake HTTP server failed")?;
    intake.store().close().await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
