//! The GPU checks' evaluation: a pure function of (probe report, node, thresholds). Every
//! fault becomes a finding on its GPU (index, serial, UUID, PCI address, SXM slot) or NVSwitch,
//! with the action the fault calls for; a reading that is missing makes the step an Error.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{
    Ecc, Fabric, GpuFirmware, GpuThresholds, Inventory, Nvlink, Pcie, RetiredPagesLimits,
    RowRemapLimits, Thermal, Xid,
};
use crate::check::{CheckResult, NodeTarget};
use crate::finding::{xid_class, Action, Component, ComponentKind, Finding};
use crate::probe::{GpuReport, ProbeReport, NOT_SUPPORTED};

pub(super) fn evaluate(
    t: &GpuThresholds,
    name: &str,
    report: &ProbeReport,
    node: &NodeTarget,
) -> CheckResult {
    let mut ev = Eval::default();
    match t {
        GpuThresholds::Inventory(t) => inventory(t, report, node, &mut ev),
        GpuThresholds::Ecc(t) => ecc(t, report, &mut ev),
        GpuThresholds::RowRemap(t) => row_remap(t, report, &mut ev),
        GpuThresholds::RetiredPages(t) => retired_pages(t, report, &mut ev),
        GpuThresholds::Pcie(t) => pcie(t, report, &mut ev),
        GpuThresholds::Nvlink(t) => nvlink(t, report, &mut ev),
        GpuThresholds::Xid(t) => xid(t, report, &mut ev),
        GpuThresholds::Thermal(t) => thermal(t, report, &mut ev),
        GpuThresholds::Firmware(t) => firmware(t, report, node, &mut ev),
        GpuThresholds::Fabric(t) => fabric(t, report, &mut ev),
    }
    ev.finish(name, report)
}

/// What one evaluation found.
#[derive(Default)]
struct Eval {
    findings: Vec<Finding>,
    unknown: Vec<String>,
    notes: Vec<String>,
    measured: Vec<Value>,
    evidence: Vec<Value>,
    summary: String,
}

impl Eval {
    /// A GPU reading that is absent: "not supported" is a note, anything else unknown.
    fn missing(&mut self, gpu: &GpuReport, field: &str) {
        match gpu.unavailable.get(field).map(String::as_str) {
            Some(NOT_SUPPORTED) => self
                .notes
                .push(format!("{}: {field} not supported", gpu.label())),
            Some(reason) => self
                .unknown
                .push(format!("{}: {field} unreadable: {reason}", gpu.label())),
            None => self
                .unknown
                .push(format!("{}: {field} missing from the probe", gpu.label())),
        }
    }

    /// A fault on `gpu`: the message is prefixed with how messages name the GPU.
    fn gpu(&mut self, gpu: &GpuReport, code: &str, action: Action, what: String) -> &mut Finding {
        self.findings.push(Finding::new(
            gpu.component(),
            code,
            action,
            format!("{}: {what}", gpu.label()),
        ));
        let last = self.findings.len() - 1;
        &mut self.findings[last]
    }

    fn finish(self, name: &str, report: &ProbeReport) -> CheckResult {
        let measured = json!({
            "gpus": self.measured,
            "notes": self.notes,
            "unknown": self.unknown,
        });
        let evidence = json!({
            "driver_version": report.driver_version,
            "gpus": self.evidence,
        });
        if !self.findings.is_empty() {
            return CheckResult::from_findings(name, self.findings, "", measured)
                .evidence(evidence);
        }
        if !self.unknown.is_empty() {
            let msg = self.unknown.join("; ");
            return CheckResult::error(name, msg)
                .measured(measured)
                .evidence(evidence);
        }
        let mut msg = if self.summary.is_empty() {
            format!("{} GPUs within thresholds", report.gpus.len())
        } else {
            self.summary
        };
        if !self.notes.is_empty() {
            msg.push_str(&format!(" ({})", self.notes.join("; ")));
        }
        CheckResult::pass(name, msg)
            .measured(measured)
            .evidence(evidence)
    }
}

fn inventory(t: &Inventory, report: &ProbeReport, node: &NodeTarget, ev: &mut Eval) {
    let expected = t.count.unwrap_or(u64::from(node.gpu_count));
    let found = report.gpus.len() as u64;
    if found != expected {
        let present: Vec<String> = report
            .gpus
            .iter()
            .map(|g| {
                g.pci_bus_id
                    .clone()
                    .unwrap_or_else(|| format!("#{}", g.index))
            })
            .collect();
        // A GPU NVML does not see has usually fallen off the bus: a reboot brings it back or
        // shows it is gone for good (then reseat, then RMA).
        ev.findings.push(Finding::new(
            Component::new(ComponentKind::Board),
            "gpu_count",
            Action::Reboot,
            format!(
                "GPU count {found}, expected {expected} (NVML sees: {})",
                present.join(", ")
            ),
        ));
    }
    for g in &report.gpus {
        let name = g.name.clone().unwrap_or_default();
        if !t.names.is_empty() && !t.names.contains(&name) {
            ev.gpu(
                g,
                "gpu_model",
                Action::Config,
                format!("model {name:?}, expected one of {:?}", t.names),
            );
        }
        ev.measured.push(json!({
            "index": g.index, "name": g.name, "uuid": g.uuid, "serial": g.serial,
            "pci_bus_id": g.pci_bus_id, "module_id": g.module_id,
        }));
    }
    ev.summary = format!("{found} GPUs, as expected");
}

fn ecc(t: &Ecc, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(e) = &g.ecc else {
            // A burn-in GPU without ECC counts is not a datacenter GPU in ECC mode.
            match g.unavailable.get("ecc").map(String::as_str) {
                Some(NOT_SUPPORTED) => {
                    ev.gpu(
                        g,
                        "ecc_disabled",
                        Action::Config,
                        "ECC not supported or disabled (enable with nvidia-smi -e 1, reboot)"
                            .into(),
                    );
                }
                _ => ev.missing(g, "ecc"),
            }
            continue;
        };
        ev.evidence
            .push(json!({ "gpu": g.index, "ecc": e, "ecc_sram": g.ecc_sram }));
        ev.measured.push(json!({
            "index": g.index,
            "volatile_uncorrected": e.volatile_uncorrected,
            "aggregate_uncorrected": e.aggregate_uncorrected,
            "volatile_corrected": e.volatile_corrected,
            "sram_aggregate_uncorrected": g.ecc_sram.map(|s| s.aggregate_uncorrected),
        }));
        let counts = format!(
            "volatile uncorrected {}, aggregate uncorrected {}, volatile corrected {}",
            e.volatile_uncorrected, e.aggregate_uncorrected, e.volatile_corrected
        );
        // A new uncorrectable HBM error is contained by a GPU reset (which also applies the
        // row remap it triggers); lifetime errors above the limit are the GPU's history.
        if e.volatile_uncorrected > t.uncorrected_volatile_max {
            let f = ev.gpu(
                g,
                "ecc_uncorrected_volatile",
                Action::ResetGpu,
                format!(
                    "ECC volatile uncorrected = {} (max {})",
                    e.volatile_uncorrected, t.uncorrected_volatile_max
                ),
            );
            f.push_evidence(counts.clone());
            f.set_counter("ecc_volatile_uncorrected", e.volatile_uncorrected);
            f.set_counter("ecc_aggregate_uncorrected", e.aggregate_uncorrected);
        }
        if let Some(max) = t.uncorrected_aggregate_max {
            if e.aggregate_uncorrected > max && e.volatile_uncorrected <= t.uncorrected_volatile_max
            {
                let f = ev.gpu(
                    g,
                    "ecc_uncorrected_aggregate",
                    Action::Investigate,
                    format!(
                        "ECC aggregate (lifetime) uncorrected = {} (max {max})",
                        e.aggregate_uncorrected
                    ),
                );
                f.push_evidence(counts.clone());
                f.set_counter("ecc_aggregate_uncorrected", e.aggregate_uncorrected);
            }
        }
        if let Some(max) = t.corrected_volatile_max {
            if e.volatile_corrected > max {
                ev.gpu(
                    g,
                    "ecc_corrected_volatile",
                    Action::Investigate,
                    format!(
                        "ECC volatile corrected = {} (max {max})",
                        e.volatile_corrected
                    ),
                )
                .set_counter("ecc_volatile_corrected", e.volatile_corrected);
            }
        }
        match &g.ecc_sram {
            Some(s) => {
                // Uncorrectable SRAM errors cannot be remapped away: NVIDIA's field diagnostic
                // decides (DCGM_FR_SRAM_THRESHOLD is an isolate-and-RMA code).
                if let Some(max) = t.sram_uncorrected_max {
                    if s.aggregate_uncorrected > max {
                        let f = ev.gpu(
                            g,
                            "ecc_sram_uncorrected",
                            Action::Rma,
                            format!(
                                "SRAM ECC aggregate uncorrected = {} (max {max})",
                                s.aggregate_uncorrected
                            ),
                        );
                        f.push_evidence(format!(
                            "SRAM volatile uncorrected {}, aggregate uncorrected {}",
                            s.volatile_uncorrected, s.aggregate_uncorrected
                        ));
                        f.set_counter("sram_aggregate_uncorrected", s.aggregate_uncorrected);
                    }
                }
                if let Some(max) = t.sram_corrected_max {
                    if s.aggregate_corrected > max {
                        ev.gpu(
                            g,
                            "ecc_sram_corrected",
                            Action::Investigate,
                            format!(
                                "SRAM ECC aggregate corrected = {} (max {max})",
                                s.aggregate_corrected
                            ),
                        )
                        .set_counter("sram_aggregate_corrected", s.aggregate_corrected);
                    }
                }
            }
            None if t.sram_uncorrected_max.is_some() || t.sram_corrected_max.is_some() => {
                ev.missing(g, "ecc_sram")
            }
            None => {}
        }
    }
}

fn row_remap(t: &RowRemapLimits, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(r) = &g.row_remap else {
            match g.unavailable.get("row_remap").map(String::as_str) {
                // Hopper always remaps rows: "not supported" there means the reading did not
                // work (an old driver, a GPU in a bad state), so nothing is known.
                Some(NOT_SUPPORTED) if t.required => ev.unknown.push(format!(
                    "{}: row remapping reported not supported; an Ampere or newer GPU always \
                     remaps rows, so its memory health is unknown",
                    g.label()
                )),
                _ => ev.missing(g, "row_remap"),
            }
            continue;
        };
        ev.evidence.push(json!({ "gpu": g.index, "row_remap": r }));
        ev.measured
            .push(json!({ "index": g.index, "row_remap": r }));
        let counts = format!(
            "rows remapped: {} correctable, {} uncorrectable; pending {}, failure {}",
            r.correctable, r.uncorrectable, r.pending, r.failure
        );
        if r.pending && !t.pending_allowed {
            let f = ev.gpu(
                g,
                "row_remap_pending",
                Action::ResetGpu,
                "row remapping pending (reset the GPU to apply; then re-test)".into(),
            );
            f.push_evidence(counts.clone());
            remap_counters(f, r);
        }
        if r.failure && !t.failure_allowed {
            // NVIDIA's memory error management guide: a row-remap failure (no spare rows in a
            // bank) is an RMA criterion, after the field diagnostic confirms it.
            let f = ev.gpu(
                g,
                "row_remap_failure",
                Action::Rma,
                "row-remap failure (no spare rows left): run NVIDIA field diagnostic, attach \
                 nvidia-bug-report"
                    .into(),
            );
            f.push_evidence(counts.clone());
            remap_counters(f, r);
        }
        if let Some(max) = t.uncorrectable_max {
            if r.uncorrectable > max {
                let f = ev.gpu(
                    g,
                    "row_remap_uncorrectable",
                    Action::Investigate,
                    format!(
                        "rows remapped for uncorrectable errors = {} (max {max})",
                        r.uncorrectable
                    ),
                );
                f.push_evidence(counts);
                remap_counters(f, r);
            }
        }
    }
}

/// The remap counts on a row-remap finding, for the trend across attempts.
fn remap_counters(f: &mut Finding, r: &crate::probe::RowRemap) {
    f.set_counter("rows_remapped_correctable", r.correctable);
    f.set_counter("rows_remapped_uncorrectable", r.uncorrectable);
}

fn retired_pages(t: &RetiredPagesLimits, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(p) = &g.retired_pages else {
            ev.missing(g, "retired_pages");
            continue;
        };
        ev.evidence
            .push(json!({ "gpu": g.index, "retired_pages": p }));
        ev.measured
            .push(json!({ "index": g.index, "retired": p.total(), "pending": p.pending }));
        if p.total() > t.max {
            ev.gpu(
                g,
                "retired_pages",
                Action::Rma,
                format!(
                    "retired pages = {} ({} multiple single-bit, {} double-bit; max {})",
                    p.total(),
                    p.multiple_single_bit,
                    p.double_bit,
                    t.max
                ),
            )
            .set_counter("retired_pages", p.total());
        }
        if p.pending && !t.pending_allowed {
            ev.gpu(
                g,
                "retired_pages_pending",
                Action::Reboot,
                "page retirement pending (reboot to apply)".into(),
            );
        }
    }
}

fn pcie(t: &Pcie, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        let Some(l) = &g.pcie else {
            ev.missing(g, "pcie");
            continue;
        };
        ev.evidence.push(json!({ "gpu": g.index, "pcie": l }));
        ev.measured.push(json!({ "index": g.index, "pcie": l }));
        let link = format!(
            "link Gen{} x{} (max Gen{} x{})",
            l.generation_current, l.width_current, l.generation_max, l.width_max
        );
        // A narrow or slow link is the path to the GPU, not the GPU: riser, retimer, cable or
        // baseboard.
        let mut link_fault = |code: &str, what: String| {
            let f = ev.gpu(
                g,
                code,
                Action::Investigate,
                format!("{what}; check riser, retimer and baseboard"),
            );
            f.push_evidence(link.clone());
        };
        if t.generation_equal_max && l.generation_current < l.generation_max {
            link_fault(
                "pcie_generation",
                format!(
                    "PCIe generation {} below max {}",
                    l.generation_current, l.generation_max
                ),
            );
        }
        let below_max = t.width_equal_max && l.width_current < l.width_max;
        if below_max {
            link_fault(
                "pcie_width",
                format!("PCIe width x{} below max x{}", l.width_current, l.width_max),
            );
        }
        if let Some(min) = t.generation_min {
            if u64::from(l.generation_max) < min {
                link_fault(
                    "pcie_generation",
                    format!(
                        "PCIe link can reach generation {} at most (min {min})",
                        l.generation_max
                    ),
                );
            }
        }
        if let Some(min) = t.width_min {
            if u64::from(l.width_current) < min && !below_max {
                link_fault(
                    "pcie_width",
                    format!("PCIe width x{} (min x{min})", l.width_current),
                );
            }
        }
    }
}

fn nvlink(t: &Nvlink, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        if g.nvlinks.is_empty() {
            if t.links_min.unwrap_or(0) > 0 {
                match g.unavailable.get("nvlinks") {
                    Some(reason) if reason != NOT_SUPPORTED => ev
                        .unknown
                        .push(format!("{}: NVLink unreadable: {reason}", g.label())),
                    _ => {
                        ev.gpu(
                            g,
                            "nvlink_missing",
                            Action::ResetGpu,
                            format!("no NVLinks reported (min {})", t.links_min.unwrap_or(0)),
                        );
                    }
                }
            }
            continue;
        }
        ev.evidence
            .push(json!({ "gpu": g.index, "nvlinks": g.nvlinks }));
        let inactive: Vec<u32> = g
            .nvlinks
            .iter()
            .filter(|l| !l.active)
            .map(|l| l.link)
            .collect();
        let active = g.nvlinks.len() - inactive.len();
        ev.measured.push(json!({
            "index": g.index, "links": g.nvlinks.len(), "active": active, "inactive": inactive,
        }));
        if let Some(min) = t.links_min {
            if (g.nvlinks.len() as u64) < min {
                ev.gpu(
                    g,
                    "nvlink_missing",
                    Action::ResetGpu,
                    format!("{} NVLinks reported (min {min})", g.nvlinks.len()),
                );
            }
        }
        // An NVLink down is retrained by a GPU reset (DCGM_FR_NVLINK_DOWN); if it stays down
        // after that, the baseboard or the NVSwitch tray is at fault.
        if t.all_active && !inactive.is_empty() {
            ev.gpu(
                g,
                "nvlink_down",
                Action::ResetGpu,
                format!("NVLink(s) {inactive:?} inactive"),
            );
        }
        for l in &g.nvlinks {
            let crc = match (l.crc_flit_errors, l.crc_data_errors) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
            };
            for (code, what, value, max) in [
                (
                    "nvlink_replay",
                    "replay errors",
                    l.replay_errors,
                    t.replay_errors_max,
                ),
                (
                    "nvlink_recovery",
                    "recovery errors",
                    l.recovery_errors,
                    t.recovery_errors_max,
                ),
                ("nvlink_crc", "CRC errors", crc, t.crc_errors_max),
            ] {
                if let (Some(v), Some(max)) = (value, max) {
                    if v > max {
                        ev.gpu(
                            g,
                            code,
                            Action::ResetGpu,
                            format!("NVLink {} {what} = {v} (max {max})", l.link),
                        )
                        .set_counter(format!("nvlink{}_{code}", l.link), v);
                    }
                }
            }
        }
    }
}

/// The catalog's words for an Xid: `Xid 79 (GPU has fallen off the bus; NVIDIA: RESTART_BM,
/// reboot the node)`.
fn xid_words(xid: u32) -> (String, Action) {
    match xid_class(xid) {
        Some(c) => (
            format!(
                "Xid {xid} ({}; NVIDIA: {}, {})",
                c.description,
                c.bucket,
                c.action.label()
            ),
            c.action,
        ),
        None => (
            format!("Xid {xid} (not in the Xid catalog table; investigate)"),
            Action::Investigate,
        ),
    }
}

/// Xid 154 names the recovery action it changed to; that is the action.
fn xid_154_action(detail: &str) -> Option<Action> {
    let d = detail.to_ascii_lowercase();
    if d.contains("reboot") {
        Some(Action::Reboot)
    } else if d.contains("reset") {
        Some(Action::ResetGpu)
    } else {
        None
    }
}

fn xid(t: &Xid, report: &ProbeReport, ev: &mut Eval) {
    if let Some(e) = &report.kernel_log.error {
        ev.unknown.push(format!("kernel log unreadable: {e}"));
        return;
    }
    // One finding per (GPU, Xid), counting repeats: a GPU logging Xid 31 a hundred times is
    // one fault to act on, with its first lines as evidence.
    let mut grouped: BTreeMap<(String, u32), (usize, Vec<&crate::xid::XidEvent>)> = BTreeMap::new();
    for e in &report.xid_events {
        let allowed = t.allowed.contains(&u64::from(e.xid));
        ev.evidence.push(json!({ "xid": e, "allowed": allowed }));
        if allowed {
            continue;
        }
        let key = (crate::xid::normalize_pci(&e.pci), e.xid);
        let entry = grouped.entry(key).or_insert((0, Vec::new()));
        entry.0 += 1;
        entry.1.push(e);
    }
    for ((pci, xid), (count, events)) in grouped {
        let gpu = report.gpus.iter().find(|g| {
            g.pci_bus_id
                .as_deref()
                .is_some_and(|p| crate::xid::normalize_pci(p) == pci)
        });
        let (component, who) = match gpu {
            Some(g) => (g.component(), g.label()),
            None => (
                Component::new(ComponentKind::Gpu).pci(Some(pci.clone())),
                format!("GPU at PCI {pci}"),
            ),
        };
        let (words, mut action) = xid_words(xid);
        if xid == 154 {
            if let Some(a) = events.iter().find_map(|e| xid_154_action(&e.detail)) {
                action = a;
            }
        }
        let times = if count > 1 {
            format!(" x{count}")
        } else {
            String::new()
        };
        let detail = events.first().map(|e| e.detail.as_str()).unwrap_or("");
        let mut f = Finding::new(
            component,
            format!("xid_{xid}"),
            action,
            format!("{who}: {words}{times}: {detail}"),
        );
        for e in &events {
            let line = if e.line.is_empty() {
                format!("NVRM: Xid (PCI:{}): {}, {}", e.pci, e.xid, e.detail)
            } else {
                e.line.clone()
            };
            f = f.with_evidence(line);
        }
        ev.findings.push(f);
    }
    ev.measured.push(json!({
        "xid_events": report.xid_events.len(),
        "allowed": t.allowed,
        "kernel_log_lines": report.kernel_log.lines,
    }));
    ev.summary = if t.allowed.is_empty() {
        format!(
            "no Xid since boot ({} kernel log lines)",
            report.kernel_log.lines
        )
    } else {
        format!(
            "no Xid outside {:?} since boot ({} events in {} log lines)",
            t.allowed,
            report.xid_events.len(),
            report.kernel_log.lines
        )
    };
}

fn thermal(t: &Thermal, report: &ProbeReport, ev: &mut Eval) {
    for g in &report.gpus {
        match g.temperature_c {
            Some(c) if u64::from(c) > t.temperature_c_max => {
                ev.gpu(
                    g,
                    "gpu_temperature",
                    Action::Cooling,
                    format!("temperature {c} °C (max {})", t.temperature_c_max),
                );
            }
            Some(_) => {}
            None => ev.missing(g, "temperature_c"),
        }
        if let Some(max) = t.memory_temperature_c_max {
            match g.memory_temperature_c {
                Some(c) if u64::from(c) > max => {
                    ev.gpu(
                        g,
                        "hbm_temperature",
                        Action::Cooling,
                        format!("HBM temperature {c} °C (max {max})"),
                    );
                }
                Some(_) => {}
                None => ev.missing(g, "memory_temperature_c"),
            }
        }
        if let Some(max) = t.power_w_max {
            match g.power_mw {
                Some(mw) if u64::from(mw) > max * 1000 => {
                    ev.gpu(
                        g,
                        "gpu_power",
                        Action::Investigate,
                        format!("power {:.1} W (max {max})", f64::from(mw) / 1000.0),
                    );
                }
                Some(_) => {}
                None => ev.missing(g, "power_mw"),
            }
        }
        match &g.throttle_reasons {
            Some(reasons) => {
                let bad: Vec<&String> = reasons
                    .iter()
                    .filter(|r| t.throttle_forbidden.contains(r))
                    .collect();
                if !bad.is_empty() {
                    let action = throttle_action(&bad);
                    ev.gpu(
                        g,
                        "gpu_throttle",
                        action,
                        format!("throttled by {}", join(&bad)),
                    );
                }
            }
            None => ev.missing(g, "throttle_reasons"),
        }
        ev.measured.push(json!({
            "index": g.index, "temperature_c": g.temperature_c,
            "memory_temperature_c": g.memory_temperature_c, "power_mw": g.power_mw,
            "throttle_reasons": g.throttle_reasons,
        }));
    }
}

/// Thermal throttling is a cooling problem; a power brake is the board or PSU asserting it.
pub(crate) fn throttle_action(reasons: &[&String]) -> Action {
    if reasons.iter().any(|r| r.contains("thermal")) {
        Action::Cooling
    } else {
        Action::Investigate
    }
}

fn firmware(t: &GpuFirmware, report: &ProbeReport, node: &NodeTarget, ev: &mut Eval) {
    if !t.driver_versions.is_empty() {
        match &report.driver_version {
            Some(v) if t.driver_versions.contains(v) => {}
            Some(v) => ev.findings.push(Finding::new(
                Component::node(),
                "driver_version",
                Action::Config,
                format!("driver {v}, expected one of {:?}", t.driver_versions),
            )),
            None => ev
                .unknown
                .push("driver version missing from the probe".into()),
        }
    }
    if t.vbios_equal_baseline {
        let Some(want) = node.firmware.get("gpu_vbios") else {
            ev.unknown
                .push("no gpu_vbios baseline for this node in the manifest".into());
            return;
        };
        for g in &report.gpus {
            match &g.vbios_version {
                Some(v) if v.eq_ignore_ascii_case(want) => {}
                Some(v) => {
                    ev.gpu(
                        g,
                        "vbios_version",
                        Action::ReflashFirmware,
                        format!("VBIOS {v}, baseline {want}"),
                    );
                }
                None => ev.missing(g, "vbios_version"),
            }
            ev.measured
                .push(json!({ "index": g.index, "vbios_version": g.vbios_version }));
        }
        ev.summary = format!("{} GPUs on VBIOS {want}", report.gpus.len());
    }
}

fn fabric(t: &Fabric, report: &ProbeReport, ev: &mut Eval) {
    if t.fabric_manager_required {
        match &report.fabric_manager {
            Some(s) if s.active() => {}
            // Without Fabric Manager the NVSwitches route nothing: a configuration fix first.
            Some(s) => ev.findings.push(Finding::new(
                Component::node(),
                "fabric_manager_down",
                Action::Config,
                format!(
                    "{} is {} (must be active on an NVSwitch system)",
                    s.unit, s.state
                ),
            )),
            None => ev
                .unknown
                .push("the probe did not say whether Fabric Manager runs".into()),
        }
    }
    for g in &report.gpus {
        match &g.fabric {
            Some(f) if f.state == "Completed" && f.status == "Success" => {}
            Some(f) => {
                let fnd = ev.gpu(
                    g,
                    "fabric_state",
                    Action::ResetGpu,
                    format!(
                        "NVLink fabric state {:?}, status {:?} (expected Completed, Success)",
                        f.state, f.status
                    ),
                );
                fnd.push_evidence(format!("Fabric State: {}, Status: {}", f.state, f.status));
            }
            None => ev.missing(g, "fabric"),
        }
        ev.measured
            .push(json!({ "index": g.index, "fabric": g.fabric }));
    }
    if let Some(e) = &report.kernel_log.error {
        ev.unknown.push(format!("kernel log unreadable: {e}"));
    }
    let mut by_switch: BTreeMap<(String, u32), Vec<&crate::xid::SxidEvent>> = BTreeMap::new();
    for e in &report.sxid_events {
        ev.evidence.push(json!({ "sxid": e }));
        if t.sxid_allowed.contains(&u64::from(e.sxid)) {
            continue;
        }
        by_switch
            .entry((e.pci.clone(), e.sxid))
            .or_default()
            .push(e);
    }
    for ((pci, sxid), events) in by_switch {
        let fatal = events.iter().any(|e| e.fatal);
        // A fatal SXid leaves the fabric degraded until the NVSwitches and GPUs are reset,
        // which on HGX means a reboot; a non-fatal one during burn-in points at a link.
        let action = if fatal {
            Action::Reboot
        } else {
            Action::Investigate
        };
        let detail = events.first().map(|e| e.detail.as_str()).unwrap_or("");
        let times = if events.len() > 1 {
            format!(" x{}", events.len())
        } else {
            String::new()
        };
        let mut f = Finding::new(
            Component::new(ComponentKind::Nvswitch).pci(Some(pci.clone())),
            format!("sxid_{sxid}"),
            action,
            format!("NVSwitch {pci}: SXid {sxid}{times}: {detail}"),
        );
        for e in &events {
            f = f.with_evidence(e.line.clone());
        }
        ev.findings.push(f);
    }
    ev.summary = format!(
        "Fabric Manager active, {} GPUs registered with the fabric, no SXid",
        report.gpus.len()
    );
}

fn join(items: &[&String]) -> String {
    items
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
