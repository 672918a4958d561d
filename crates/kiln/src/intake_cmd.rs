//! `kiln intake register MANIFEST` and `kiln intake serve`: queue a rack's nodes for burn-in.

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

use crate::platform_args::PlatformArgs;
use crate::web_args::WebArgs;

#[derive(Args, Debug)]
pub struct IntakeArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// Topic nodes are queued on.
    #[arg(long, global = true, default_value = kiln_queue::NODES_TOPIC)]
    topic: String,
    /// Extra librdkafka producer setting (repeatable), e.g. linger.ms=20 or sasl.username=U;
    /// secrets (sasl.password, ...) only in --kafka-config-file.
    #[arg(long = "kafka-config", global = true, value_name = "KEY=VALUE")]
    kafka_config: Vec<String>,
    /// File of librdkafka producer settings, one KEY=VALUE per line (`#` starts a comment),
    /// applied before --kafka-config: the place for sasl.password, which must not be a flag.
    #[arg(long = "kafka-config-file", global = true, value_name = "FILE")]
    kafka_config_file: Option<PathBuf>,
    #[command(subcommand)]
    command: IntakeCommand,
}

#[derive(Subcommand, Debug)]
enum IntakeCommand {
    /// Validate a manifest (CSV, JSON or YAML) and queue every node in it.
    Register {
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
    },
    /// Serve the HTTP API: POST /v1/racks/{rack}/manifest, GET /healthz.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        #[command(flatten)]
        web: WebArgs,
    },
}

pub async fn run(args: IntakeArgs) -> anyhow::Result<()> {
    match &args.command {
        IntakeCommand::Register {
            manifest,
            format,
            rack,
            json,
        } => register(&args, manifest, *format, rack.as_deref(), *json).await,
        IntakeCommand::Serve { listen, web } => serve(&args, *listen, web).await,
    }
}

async fn connect(args: &IntakeArgs) -> anyhow::Result<Intake> {
    let store = Store::connect(&args.platform.store.database_url).await?;
    let mut config = ProducerConfig::new(&args.platform.bootstrap);
    config.topic = args.topic.clone();
    if let Some(file) = &args.kafka_config_file {
        config.extra.extend(read_kafka_config_file(file)?);
    }
    for (i, kv) in args.kafka_config.iter().enumerate() {
        let Some((k, v)) = kv.split_once('=') else {
            // Its text is not shown: a mistyped `sasl.password:...` would be a password.
            bail!(
                "--kafka-config number {} has no '=': expected KEY=VALUE",
                i + 1
            );
        };
        // A flag shows in `ps` and shell history: secrets come from the file only.
        if kiln_queue::is_secret_setting(k) {
            bail!(
                "--kafka-config {}: a secret is not taken from the command line; put it in --kafka-config-file",
                k.trim()
            );
        }
        config
            .extra
            .push((k.trim().to_string(), v.trim().to_string()));
    }
    let producer = NodeProducer::new(config)?;
    Ok(Intake::new(store, producer))
}

/// Longest `--kafka-config-file` read, in bytes: librdkafka settings, not data.
const KAFKA_CONFIG_FILE_BYTES_MAX: u64 = 64 * 1024;

/// `KEY=VALUE` lines; blank lines and `#` comments are skipped, anything else is refused with
/// its line number (never its text: the line may hold a password).
fn read_kafka_config_file(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("--kafka-config-file {shown}"))?;
    if meta.len() > KAFKA_CONFIG_FILE_BYTES_MAX {
        bail!("--kafka-config-file {shown} is over {KAFKA_CONFIG_FILE_BYTES_MAX} bytes");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--kafka-config-file {shown}"))?;
    let mut settings = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                settings.push((k.trim().to_string(), v.trim().to_string()))
            }
            _ => bail!(
                "--kafka-config-file {shown} line {}: expected KEY=VALUE",
                i + 1
            ),
        }
    }
    Ok(settings)
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

async fn register(
    args: &IntakeArgs,
    path: &Path,
    format: Option<Format>,
    rack: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let format = match format.or_else(|| Format::from_path(path)) {
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
    let intake = connect(args).await?;
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

async fn serve(args: &IntakeArgs, listen: SocketAddr, web: &WebArgs) -> anyhow::Result<()> {
    let security = web.security("kiln intake", listen)?;
    let intake = connect(args).await?;
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
        kiln_store::redact_url(&args.platform.store.database_url),
        args.platform.bootstrap,
        args.topic
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
