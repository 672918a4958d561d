//! Disks: SMART health from `smartctl --json` (`disk_health`) and a write/verify pass with fio
//! (`fio_verify`).
//!
//! `disk_health` reads every device `smartctl --scan` lists, one JSON document each
//! (smartmontools 7 `--json` layout: `device`, `serial_number`, `smart_status.passed`, and for
//! NVMe `nvme_smart_health_information_log`, for ATA `ata_smart_attributes.table`). It fails on
//! what the NVMe specification (Base Specification, "SMART / Health Information" log page 02h)
//! and SMART define as wear-out or imminent failure: a critical warning bit, media errors,
//! available spare below its threshold, percentage used past a limit, SMART status failed,
//! reallocated or pending sectors. A device without SMART data is unknown (Error).
//!
//! `fio_verify` runs fio with `--verify` and `--output-format=json`: any job error (fio reports
//! a verify mismatch as errno 84, EILSEQ) fails the disk the job wrote to.

use std::time::Duration;

use serde_json::{json, Value};

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::finding::{Action, Component, ComponentKind, Finding};
use crate::gpu::tail;
use crate::yaml::{Fields, LoadError};

/// Largest smartctl/fio output parsed (a few KiB per device; far above 64 devices).
const OUTPUT_BYTES_MAX: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum DiskSpec {
    Smart {
        command: String,
        /// Devices that must report (fewer: a disk missing from the bus).
        devices_min: Option<u64>,
        percentage_used_max: u64,
        media_errors_max: u64,
        /// Reallocated + pending + offline-uncorrectable sectors allowed on ATA drives.
        bad_sectors_max: u64,
    },
    Fio {
        command: String,
    },
}

impl DiskSpec {
    pub const KINDS: [&'static str; 2] = ["disk_health", "fio_verify"];

    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "disk_health" => &[
                "command",
                "devices_min",
                "percentage_used_max",
                "media_errors_max",
                "bad_sectors_max",
            ],
            "fio_verify" => &["command"],
            _ => &[],
        }
    }

    pub(crate) fn parse(
        kind: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<DiskSpec> {
        Some(match kind {
            "disk_health" => DiskSpec::Smart {
                command: f.opt_str("command", errors).unwrap_or_else(|| {
                    "for d in $(smartctl --scan | cut -d' ' -f1); do smartctl -x --json \"$d\"; done"
                        .into()
                }),
                devices_min: f.opt_u64("devices_min", 0..=256, errors),
                // NVMe's "Percentage Used" is the vendor's estimate of life used; 100 is the
                // rated endurance. A burn-in node should start far from it.
                percentage_used_max: f
                    .opt_u64("percentage_used_max", 0..=255, errors)
                    .unwrap_or(80),
                media_errors_max: f
                    .opt_u64("media_errors_max", 0..=1_000_000, errors)
                    .unwrap_or(0),
                bad_sectors_max: f
                    .opt_u64("bad_sectors_max", 0..=1_000_000, errors)
                    .unwrap_or(0),
            },
            "fio_verify" => DiskSpec::Fio {
                command: f.req_str("command", errors)?,
            },
            _ => return None,
        })
    }

    pub(crate) fn command_mut(&mut self) -> &mut String {
        match self {
            DiskSpec::Smart { command, .. } | DiskSpec::Fio { command } => command,
        }
    }
}

/// Every JSON document in `text` (smartctl prints one per device, back to back).
fn json_documents(text: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .collect()
}

fn u64_at(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer).and_then(Value::as_u64)
}

/// The SMART verdict over smartctl's documents.
pub fn evaluate_smart(name: &str, spec: &DiskSpec, output: &str) -> CheckResult {
    let DiskSpec::Smart {
        devices_min,
        percentage_used_max,
        media_errors_max,
        bad_sectors_max,
        ..
    } = spec
    else {
        return CheckResult::error(name, "not a disk_health step");
    };
    let docs = json_documents(output);
    let mut findings = Vec::new();
    let mut unknown = Vec::new();
    let mut measured = Vec::new();
    for d in &docs {
        let dev = d
            .pointer("/device/name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let serial = d
            .get("serial_number")
            .and_then(Value::as_str)
            .map(str::to_string);
        let model = d.get("model_name").and_then(Value::as_str).unwrap_or("");
        let component = Component::new(ComponentKind::Disk)
            .name(dev.clone())
            .serial(serial.clone());
        let mut fault = |code: &str, action: Action, what: String, evidence: String| {
            findings.push(
                Finding::new(
                    component.clone(),
                    code,
                    action,
                    format!("{dev} ({model}): {what}"),
                )
                .with_evidence(evidence),
            );
        };
        // smartctl's exit status bits 0-2: the command line, opening the device or a command
        // to it failed; then nothing in the document is a reading.
        let exit = u64_at(d, "/smartctl/exit_status").unwrap_or(0);
        if exit & 0b11 != 0 {
            unknown.push(format!(
                "{dev}: smartctl could not read it (exit status {exit})"
            ));
            continue;
        }
        if d.pointer("/smart_status/passed") == Some(&Value::Bool(false)) {
            fault(
                "smart_failed",
                Action::Rma,
                "SMART overall health FAILED".into(),
                format!(
                    "smart_status: {}",
                    d.get("smart_status").cloned().unwrap_or(Value::Null)
                ),
            );
        }
        if let Some(log) = d.get("nvme_smart_health_information_log") {
            let cw = u64_at(log, "/critical_warning");
            let spare = u64_at(log, "/available_spare");
            let spare_min = u64_at(log, "/available_spare_threshold");
            let used = u64_at(log, "/percentage_used");
            let media = u64_at(log, "/media_errors");
            let readings = format!(
                "critical_warning {}, available_spare {}% (threshold {}%), percentage_used {}%, media_errors {}",
                opt(cw), opt(spare), opt(spare_min), opt(used), opt(media)
            );
            if let Some(c) = cw.filter(|c| *c != 0) {
                fault(
                    "nvme_critical_warning",
                    Action::Rma,
                    format!("critical warning 0x{c:02x} ({})", critical_warning_bits(c)),
                    readings.clone(),
                );
            }
            if let (Some(s), Some(t)) = (spare, spare_min) {
                if s < t {
                    fault(
                        "nvme_spare_low",
                        Action::Rma,
                        format!("available spare {s}% below its threshold {t}%"),
                        readings.clone(),
                    );
                }
            }
            if let Some(u) = used.filter(|u| u > percentage_used_max) {
                fault(
                    "nvme_worn",
                    Action::Rma,
                    format!("percentage used {u}% (max {percentage_used_max}%)"),
                    readings.clone(),
                );
            }
            if let Some(m) = media.filter(|m| m > media_errors_max) {
                fault(
                    "nvme_media_errors",
                    Action::Rma,
                    format!("{m} media errors (max {media_errors_max})"),
                    readings.clone(),
                );
            }
            measured.push(json!({"device": dev, "serial": serial, "critical_warning": cw, "available_spare": spare, "available_spare_threshold": spare_min, "percentage_used": used, "media_errors": media}));
        } else if let Some(table) = d
            .pointer("/ata_smart_attributes/table")
            .and_then(Value::as_array)
        {
            // Reallocated_Sector_Ct (5), Current_Pending_Sector (197), Offline_Uncorrectable (198).
            let raw = |id: u64| {
                table
                    .iter()
                    .find(|a| a.get("id").and_then(Value::as_u64) == Some(id))
                    .and_then(|a| u64_at(a, "/raw/value"))
                    .unwrap_or(0)
            };
            let (realloc, pending, offline) = (raw(5), raw(197), raw(198));
            let bad = realloc + pending + offline;
            if bad > *bad_sectors_max {
                fault(
                    "ata_bad_sectors",
                    Action::Rma,
                    format!("{bad} bad sectors (reallocated {realloc}, pending {pending}, offline uncorrectable {offline}; max {bad_sectors_max})"),
                    format!("attributes 5/197/198 raw: {realloc}/{pending}/{offline}"),
                );
            }
            measured.push(json!({"device": dev, "serial": serial, "reallocated": realloc, "pending": pending, "offline_uncorrectable": offline}));
        } else {
            unknown.push(format!("{dev}: no SMART health data in smartctl's report"));
        }
    }
    if let Some(min) = devices_min {
        if (docs.len() as u64) < *min {
            findings.push(Finding::new(
                Component::new(ComponentKind::Disk),
                "disk_count",
                Action::Investigate,
                format!("{} disks report SMART data, expected {min}", docs.len()),
            ));
        }
    }
    let measured = json!({"devices": measured, "unknown": unknown});
    if docs.is_empty() {
        return CheckResult::error(
            name,
            format!("no smartctl JSON in the output: {}", tail(output, 300)),
        );
    }
    if findings.is_empty() && !unknown.is_empty() {
        return CheckResult::error(name, unknown.join("; ")).measured(measured);
    }
    CheckResult::from_findings(
        name,
        findings,
        format!("{} disks healthy", docs.len()),
        measured,
    )
    .evidence(json!({"smartctl": docs}))
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
}

/// NVMe critical warning bits (Base Specification 2.0, SMART / Health Information, byte 0).
fn critical_warning_bits(c: u64) -> String {
    const BITS: [&str; 6] = [
        "spare below threshold",
        "temperature out of range",
        "reliability degraded",
        "read-only",
        "volatile memory backup failed",
        "persistent memory region read-only",
    ];
    let names: Vec<&str> = BITS
        .iter()
        .enumerate()
        .filter(|(i, _)| c & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "reserved bits".into()
    } else {
        names.join(", ")
    }
}

/// The fio verdict: any job with an error fails (a verify mismatch is errno 84).
pub fn evaluate_fio(name: &str, stdout: &str, stderr: &str) -> CheckResult {
    // fio may print notes before its JSON.
    let Some(doc) = stdout
        .find('{')
        .and_then(|i| serde_json::from_str::<Value>(&stdout[i..]).ok())
    else {
        return CheckResult::error(
            name,
            format!("fio printed no JSON report: {}", tail(stderr, 300)),
        );
    };
    let jobs = doc
        .get("jobs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if jobs.is_empty() {
        return CheckResult::error(name, "fio's report has no jobs");
    }
    let mut findings = Vec::new();
    let mut measured = Vec::new();
    for j in &jobs {
        let job = j.get("jobname").and_then(Value::as_str).unwrap_or("?");
        let file = j
            .pointer("/job options/filename")
            .and_then(Value::as_str)
            .unwrap_or(job);
        let error = u64_at(j, "/error").unwrap_or(0);
        let bw_kib = u64_at(j, "/write/bw").unwrap_or(0) + u64_at(j, "/read/bw").unwrap_or(0);
        measured.push(json!({"job": job, "file": file, "error": error, "bw_kib_s": bw_kib}));
        if error != 0 {
            let what = if error == 84 {
                "data read back differs from what was written (verify failed)".to_string()
            } else {
                format!("I/O error {error}")
            };
            let mut f = Finding::new(
                Component::new(ComponentKind::Disk).name(file.to_string()),
                if error == 84 {
                    "fio_verify_failed"
                } else {
                    "fio_io_error"
                },
                Action::Rma,
                format!("fio job {job} on {file}: {what}"),
            );
            for line in stderr.lines().filter(|l| !l.trim().is_empty()).take(4) {
                f.push_evidence(line.trim().to_string());
            }
            findings.push(f);
        }
    }
    CheckResult::from_findings(
        name,
        findings,
        format!("{} fio job(s) wrote and verified without error", jobs.len()),
        json!({"jobs": measured}),
    )
    .evidence(json!({"stderr_tail": tail(stderr, 2000)}))
}

/// A disk step: runs its command on the node, then parses.
pub struct DiskCheck {
    pub name: String,
    pub spec: DiskSpec,
    pub timeout: Duration,
}

impl Check for DiskCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let shell = match ctx.shell() {
                Ok(s) => s,
                Err(e) => return CheckResult::error(&self.name, e),
            };
            let command = match &self.spec {
                DiskSpec::Smart { command, .. } | DiskSpec::Fio { command } => command,
            };
            let out = match shell.exec(command, self.timeout.min(ctx.remaining())).await {
                Ok(o) => o,
                Err(e) => {
                    return CheckResult::error(
                        &self.name,
                        format!("{} on {}: {e}", self.name, shell.describe()),
                    )
                }
            };
            let mut cut = out.stdout.len().min(OUTPUT_BYTES_MAX);
            while !out.stdout.is_char_boundary(cut) {
                cut -= 1;
            }
            let stdout = &out.stdout[..cut];
            match &self.spec {
                DiskSpec::Smart { .. } => evaluate_smart(&self.name, &self.spec, stdout),
                DiskSpec::Fio { .. } => evaluate_fio(&self.name, stdout, &out.stderr),
            }
        })
    }
}
