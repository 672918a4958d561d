//! `kiln playbook check FILE...`: load and validate playbooks as agents do (every error with
//! its line, field and reason). `kiln playbook run FILE`: run a playbook's checks on this
//! machine, through a local shell instead of SSH — on a GPU node the GPU steps read NVML
//! through `kiln probe`, so an operator (or `scripts/gpu-smoke`) can burn in the node in hand
//! without a queue or a store. Exit status: 0 every check passed, 1 bad input (no run),
//! 2 a check failed, 3 no check failed but one could not measure (Error).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kiln_checks::{
    CheckContext, FirmwareBaseline, LocalShell, NodeTarget, Playbook, PlaybookRun, Verdict,
};
use tokio::time::Instant;

#[derive(Args, Debug)]
pub struct PlaybookArgs {
    #[command(subcommand)]
    command: PlaybookCommand,
}

#[derive(Subcommand, Debug)]
enum PlaybookCommand {
    /// Validate playbooks; print each one's steps, or every error with its line and field.
    Check {
        /// Playbook files (YAML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Run a playbook's checks on this machine (local shell; Redfish steps need --bmc).
    Run(RunArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The playbook file.
    file: PathBuf,
    /// Run only steps whose name or kind starts with one of these (repeatable), e.g.
    /// `--only gpu` for the NVML checks, `--only infiniband --only ethernet`.
    #[arg(long)]
    only: Vec<String>,
    /// Command that prints the probe report [default: the playbook's `probe.command`].
    #[arg(long)]
    probe_command: Option<String>,
    /// GPUs the node should have [default: what the playbook's inventory step expects].
    #[arg(long)]
    gpu_count: Option<u32>,
    /// Manifest GPU model label [default: the playbook's first `gpu_models` entry].
    #[arg(long)]
    gpu_model: Option<String>,
    /// Expected GPU VBIOS (firmware baseline of the `gpu_firmware` step).
    #[arg(long)]
    gpu_vbios: Option<String>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: PlaybookArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PlaybookCommand::Check { files } => check(&files),
        PlaybookCommand::Run(r) => run_local(r).await,
    }
}

fn check(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut bad = 0;
    for f in files {
        match Playbook::load_file(f) {
            Ok(pb) => {
                let steps: Vec<&str> = pb.steps.iter().map(|s| s.name.as_str()).collect();
                println!(
                    "{}: ok — playbook {} for {}, {} steps: {}",
                    f.display(),
                    pb.name,
                    models(&pb),
                    steps.len(),
                    steps.join(", ")
                );
            }
            Err(e) => {
                bad += 1;
                eprintln!("{e}");
            }
        }
    }
    if bad > 0 {
        bail!("{bad} of {} playbooks refused", files.len());
    }
    Ok(ExitCode::SUCCESS)
}

fn models(pb: &Playbook) -> String {
    if pb.gpu_models.is_empty() {
        "nodes without GPUs".into()
    } else {
        pb.gpu_models.join(", ")
    }
}

async fn run_local(r: RunArgs) -> anyhow::Result<ExitCode> {
    let mut pb = Playbook::load_file(&r.file).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !r.only.is_empty() {
        pb.steps.retain(|s| {
            r.only
                .iter()
                .any(|p| s.name.starts_with(p.as_str()) || s.kind.starts_with(p.as_str()))
        });
        if pb.steps.is_empty() {
            bail!(
                "no step of {} matches --only {}",
                r.file.display(),
                r.only.join(", ")
            );
        }
    }
    if let Some(c) = r.probe_command {
        if c.trim().is_empty() {
            bail!("--probe-command is empty");
        }
        pb.probe.command = c;
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let node = NodeTarget {
        hostname,
        rack: "local".into(),
        bmc_address: String::new(),
        gpu_model: r
            .gpu_model
            .or_else(|| pb.gpu_models.first().cloned())
            .unwrap_or_default(),
        gpu_count: r.gpu_count.unwrap_or(0),
        firmware: FirmwareBaseline {
            gpu_vbios: r.gpu_vbios,
            ..FirmwareBaseline::default()
        },
        registered_at: time::OffsetDateTime::now_utc(),
        labels: Default::default(),
    };
    let ctx = CheckContext::new(node, Instant::now() + pb.timeout)
        .with_shell(Arc::new(LocalShell::default()));
    eprintln!(
        "running {} step(s) of playbook {} on this machine (budget {} s)",
        pb.steps.len(),
        pb.name,
        pb.timeout.as_secs()
    );
    let run = pb.run(&ctx).await;
    if r.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&run).context("encoding the results")?
        );
    } else {
        print!("{}", table(&run));
    }
    Ok(match run.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(2),
        Verdict::Error => ExitCode::from(3),
    })
}

fn table(run: &PlaybookRun) -> String {
    let mut out = String::new();
    for c in &run.results {
        let verdict = match c.verdict {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Error => "ERROR",
        };
        out.push_str(&format!(
            "{verdict:<6} {:<28} {:>7} ms  {}\n",
            c.name,
            c.duration.as_millis(),
            c.message
        ));
    }
    out.push_str(&format!("playbook {}: {:?}\n", run.playbook, run.verdict).to_lowercase());
    out
}
