//! `kiln probe`: run on a GPU node; reads NVML and the kernel log and prints one JSON document.
//! `--sample` reads NVML only (what `gpu_telemetry` samples every few seconds under load).
//! Exit 0: complete; 1: some readings failed (named in the JSON); 2: NVML is unavailable.

use std::process::ExitCode;

use clap::Args;
use kiln_checks::nvml::NvmlGpus;
use kiln_checks::probe::{run_probe_mode, ProbeMode};

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Indent the JSON for people rather than machines.
    #[arg(long)]
    pretty: bool,
    /// NVML readings only, without the kernel log: a sample taken under load.
    #[arg(long)]
    sample: bool,
}

pub fn run(args: &ProbeArgs) -> ExitCode {
    let mode = if args.sample {
        ProbeMode::Sample
    } else {
        ProbeMode::Full
    };
    let (report, code) = run_probe_mode(&NvmlGpus::new(), mode);
    let json = if args.pretty {
        serde_json::to_string_pretty(&report)
    } else {
        serde_json::to_string(&report)
    };
    match json {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("error: cannot encode the probe report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if code == kiln_checks::probe::EXIT_NVML_UNAVAILABLE {
        eprintln!("error: NVML is not available on this machine (no NVIDIA driver or libnvidia-ml.so); see the \"nvml\" field of the report");
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
