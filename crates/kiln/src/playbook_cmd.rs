//! `kiln playbook check FILE...`: load and validate playbooks as agents do (every error with
//! its line, field and reason). `kiln playbook run FILE`: run a playbook's checks on this
//! machine, through a local shell instead of SSH — on a GPU node the GPU steps read NVML
//! through `kiln probe`, so an operator (or `scripts/gpu-smoke`) can burn in the node in hand
//! without a queue or a store. `--bmc URL` points the Redfish steps at a BMC (or an emulator),
//! `--sysfs-root DIR` the NIC steps at a saved sysfs snapshot. Exit status: 0 every check
//! passed, 1 bad input (no run), 2 a check failed, 3 no check failed but one could not measure
//! (Error).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kiln_checks::playbook::Spec;
use kiln_checks::redfish::{Auth, RedfishClient, RedfishConfig, TlsTrust};
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
    /// Run a playbook's checks on this machine (local shell; Redfish steps against --bmc).
    Run(Box<RunArgs>),
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
    /// The BMC the Redfish steps talk to, e.g. https://10.0.0.11 or http://127.0.0.1:8000
    /// (an emulator). Without it the Redfish steps report an error.
    #[arg(long, value_name = "URL")]
    bmc: Option<String>,
    /// Redfish user (with --bmc-password-file); none: no authentication.
    #[arg(long, requires = "bmc")]
    bmc_user: Option<String>,
    /// File holding the Redfish password (first line).
    #[arg(long, requires = "bmc_user")]
    bmc_password_file: Option<PathBuf>,
    /// HTTP basic authentication instead of a Redfish session.
    #[arg(long, requires = "bmc_user")]
    bmc_basic: bool,
    /// CA certificate (PEM) the BMC's TLS certificate must chain to [default: system roots].
    #[arg(long, requires = "bmc", conflicts_with = "bmc_insecure")]
    bmc_ca: Option<PathBuf>,
    /// Accept any BMC certificate (self-signed BMCs): encrypted, but the BMC is not
    /// authenticated.
    #[arg(long, requires = "bmc")]
    bmc_insecure: bool,
    /// Expected BMC firmware version (baseline of `bmc_firmware`).
    #[arg(long)]
    firmware_bmc: Option<String>,
    /// Expected BIOS version (baseline of `bmc_firmware`).
    #[arg(long)]
    firmware_bios: Option<String>,
    /// BMC log entries before this time (RFC 3339) are history [default: every entry counts].
    #[arg(long, value_name = "TIME")]
    log_since: Option<String>,
    /// Read the NIC steps' sysfs under this directory (a saved snapshot) instead of the
    /// playbook's `sysfs_root`.
    #[arg(long, value_name = "DIR")]
    sysfs_root: Option<PathBuf>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: PlaybookArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PlaybookCommand::Check { files } => check(&files),
        PlaybookCommand::Run(r) => run_local(*r).await,
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
    if let Some(c) = r.probe_command.clone() {
        if c.trim().is_empty() {
            bail!("--probe-command is empty");
        }
        pb.probe.command = c;
    }
    if let Some(root) = &r.sysfs_root {
        if !root.is_dir() {
            bail!("--sysfs-root {}: not a directory", root.display());
        }
        let root = root.display().to_string();
        for s in &mut pb.steps {
            match &mut s.spec {
                Spec::Infiniband(t) => t.sysfs_root = root.clone(),
                Spec::Ethernet(t) => t.sysfs_root = root.clone(),
                _ => {}
            }
        }
    }
    let registered_at = match &r.log_since {
        Some(t) => time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .with_context(|| format!("--log-since {t:?}: expected an RFC 3339 time"))?,
        None => time::OffsetDateTime::UNIX_EPOCH,
    };
    let bmc = bmc_client(&r)?;
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
            bmc: r.firmware_bmc,
            bios: r.firmware_bios,
            nic: None,
        },
        registered_at,
        labels: Default::default(),
    };
    let mut ctx = CheckContext::new(node, Instant::now() + pb.timeout)
        .with_shell(Arc::new(LocalShell::default()));
    if let Some(bmc) = &bmc {
        ctx = ctx.with_bmc(bmc.clone());
    }
    eprintln!(
        "running {} step(s) of playbook {} on this machine (budget {} s)",
        pb.steps.len(),
        pb.name,
        pb.timeout.as_secs()
    );
    let run = pb.run(&ctx).await;
    drop(ctx);
    if let Some(bmc) = bmc {
        bmc.logout().await;
    }
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

/// The Redfish client `--bmc` and its options describe, if given.
fn bmc_client(r: &RunArgs) -> anyhow::Result<Option<Arc<RedfishClient>>> {
    let Some(url) = &r.bmc else {
        return Ok(None);
    };
    let auth = match &r.bmc_user {
        None => Auth::None,
        Some(user) => {
            let file = r
                .bmc_password_file
                .as_ref()
                .context("--bmc-user needs --bmc-password-file")?;
            let password = std::fs::read_to_string(file)
                .with_context(|| format!("--bmc-password-file {}", file.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            if r.bmc_basic {
                Auth::Basic {
                    user: user.clone(),
                    password,
                }
            } else {
                Auth::Session {
                    user: user.clone(),
                    password,
                }
            }
        }
    };
    let tls = match (&r.bmc_ca, r.bmc_insecure) {
        (Some(ca), _) => TlsTrust::CaPem(
            std::fs::read(ca).with_context(|| format!("--bmc-ca {}", ca.display()))?,
        ),
        (None, true) => TlsTrust::InsecureAcceptAny,
        (None, false) => TlsTrust::SystemRoots,
    };
    let mut cfg = RedfishConfig::for_address("unused", auth, tls);
    cfg.base_url = url.clone();
    let client = RedfishClient::new(cfg).map_err(|e| anyhow::anyhow!("--bmc {url}: {e}"))?;
    Ok(Some(Arc::new(client)))
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
