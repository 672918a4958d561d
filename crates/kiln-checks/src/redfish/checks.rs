//! The BMC checks (DMTF Redfish schemas, DSP0268):
//! - `bmc_health`: each ComputerSystem's `Status.Health`/`HealthRollup` and `PowerState`;
//! - `bmc_firmware`: FirmwareInventory versions against the manifest baseline and against
//!   versions the playbook names for any inventory Id (HGX NVSwitch, retimers, CPLD);
//!   `Members` is iterated, its `@odata.count` never trusted;
//! - `bmc_sel`: the log entries (`EntryType` SEL or Event) of every LogService under Systems
//!   and Managers since the node was registered; 0 entries scanned is an Error (nothing read
//!   is not "nothing wrong");
//! - `bmc_chassis`: power supplies (health, presence, redundancy), fans and sensors against
//!   the thresholds the Sensor resources carry, from the PowerSubsystem/ThermalSubsystem/
//!   Sensors resources, or the older Power/Thermal ones;
//! - `bmc_inventory`: GPUs as Processors and PCIe devices, judged on what the link supports
//!   (lanes in use against `MaxLanes`, `MaxPCIeType` against a minimum), not on the current
//!   generation, which power-managed links drop at idle.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{odata_id, text, RedfishClient, RedfishError};
use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::finding::{Action, Component, ComponentKind, Finding};
use crate::yaml::{Fields, LoadError};

/// Baseline components a firmware inventory member can be compared with.
pub const FIRMWARE_COMPONENTS: [&str; 4] = ["bmc", "bios", "gpu_vbios", "nic"];
/// Most sensors one chassis check reads (a GET each): far above any server's count.
const SENSORS_MAX: usize = 512;

#[derive(Debug, Clone, PartialEq)]
pub enum BmcSpec {
    Health {
        power_state: String,
        health_allowed: Vec<String>,
    },
    Firmware {
        /// (baseline component, FirmwareInventory member Id)
        inventory_ids: Vec<(String, String)>,
        /// (FirmwareInventory member Id, or a prefix ending in `*`; expected version)
        versions: Vec<(String, String)>,
    },
    Sel {
        severities: Vec<String>,
    },
    Chassis {
        /// Power supplies that must be present and healthy (absent bays count against it).
        psus_min: Option<u64>,
        redundancy_required: bool,
        /// Sensor readings are judged against their critical thresholds (and fatal ones).
        sensors: bool,
    },
    Inventory {
        gpu_count: Option<u64>,
        /// Fail when the BMC lists no GPU at all (otherwise: not exposed, not checked).
        gpus_required: bool,
        pcie_at_max: bool,
        pcie_generation_min: Option<u64>,
    },
}

impl BmcSpec {
    pub const KINDS: [&'static str; 5] = [
        "bmc_health",
        "bmc_firmware",
        "bmc_sel",
        "bmc_chassis",
        "bmc_inventory",
    ];

    pub fn fields(kind: &str) -> &'static [&'static str] {
        match kind {
            "bmc_health" => &["power_state", "health_allowed"],
            "bmc_firmware" => &["inventory_ids", "versions"],
            "bmc_sel" => &["severities"],
            "bmc_chassis" => &["psus_min", "redundancy_required", "sensors"],
            "bmc_inventory" => &[
                "gpu_count",
                "gpus_required",
                "pcie_at_max",
                "pcie_generation_min",
            ],
            _ => &[],
        }
    }

    pub(crate) fn parse(
        kind: &str,
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<BmcSpec> {
        const HEALTH: [&str; 3] = ["OK", "Warning", "Critical"];
        Some(match kind {
            "bmc_health" => BmcSpec::Health {
                power_state: f
                    .opt_choice("power_state", &["On", "Off"], errors)
                    .unwrap_or_else(|| "On".into()),
                health_allowed: f
                    .opt_str_list("health_allowed", Some(&HEALTH), errors)
                    .unwrap_or_else(|| vec!["OK".into()]),
            },
            "bmc_firmware" => BmcSpec::Firmware {
                inventory_ids: f
                    .opt_str_map("inventory_ids", Some(&FIRMWARE_COMPONENTS), errors)
                    .unwrap_or_else(|| {
                        vec![("bmc".into(), "BMC".into()), ("bios".into(), "BIOS".into())]
                    }),
                versions: f.opt_str_map("versions", None, errors).unwrap_or_default(),
            },
            "bmc_sel" => BmcSpec::Sel {
                severities: f
                    .opt_str_list("severities", Some(&HEALTH), errors)
                    .unwrap_or_else(|| vec!["Critical".into()]),
            },
            "bmc_chassis" => BmcSpec::Chassis {
                psus_min: f.opt_u64("psus_min", 0..=16, errors),
                redundancy_required: f.opt_bool("redundancy_required", errors).unwrap_or(true),
                sensors: f.opt_bool("sensors", errors).unwrap_or(true),
            },
            "bmc_inventory" => BmcSpec::Inventory {
                gpu_count: f.opt_u64("gpu_count", 0..=64, errors),
                gpus_required: f.opt_bool("gpus_required", errors).unwrap_or(false),
                pcie_at_max: f.opt_bool("pcie_at_max", errors).unwrap_or(true),
                pcie_generation_min: f.opt_u64("pcie_generation_min", 1..=6, errors),
            },
            _ => return None,
        })
    }
}

/// A Redfish check as a playbook step.
pub struct BmcCheck {
    pub name: String,
    pub spec: BmcSpec,
}

impl Check for BmcCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let Some(bmc) = ctx.bmc.as_deref() else {
                return CheckResult::error(
                    &self.name,
                    format!("no BMC client for {} in this run", ctx.node.hostname),
                );
            };
            let outcome = match &self.spec {
                BmcSpec::Health {
                    power_state,
                    health_allowed,
                } => health(&self.name, bmc, power_state, health_allowed).await,
                BmcSpec::Firmware {
                    inventory_ids,
                    versions,
                } => firmware(&self.name, bmc, ctx, inventory_ids, versions).await,
                BmcSpec::Sel { severities } => sel(&self.name, bmc, ctx, severities).await,
                BmcSpec::Chassis {
                    psus_min,
                    redundancy_required,
                    sensors,
                } => chassis(&self.name, bmc, *psus_min, *redundancy_required, *sensors).await,
                BmcSpec::Inventory {
                    gpu_count,
                    gpus_required,
                    pcie_at_max,
                    pcie_generation_min,
                } => {
                    let expected = gpu_count.unwrap_or(u64::from(ctx.node.gpu_count));
                    inventory(
                        &self.name,
                        bmc,
                        expected,
                        *gpus_required,
                        *pcie_at_max,
                        *pcie_generation_min,
                    )
                    .await
                }
            };
            outcome.unwrap_or_else(|e| {
                CheckResult::error(&self.name, format!("BMC {}: {e}", bmc.base_url()))
            })
        })
    }
}

async fn systems(bmc: &RedfishClient) -> Result<Vec<Value>, RedfishError> {
    bmc.members("/redfish/v1/Systems", true).await
}

fn system_label(s: &Value) -> String {
    format!("system {}", text(s, "/Id").unwrap_or_else(|| "?".into()))
}

fn bmc_component() -> Component {
    Component::new(ComponentKind::Bmc)
}

async fn health(
    name: &str,
    bmc: &RedfishClient,
    power_state: &str,
    allowed: &[String],
) -> Result<CheckResult, RedfishError> {
    let systems = systems(bmc).await?;
    let mut findings = Vec::new();
    let mut measured = Vec::new();
    if systems.is_empty() {
        findings.push(Finding::new(
            bmc_component(),
            "bmc_no_system",
            Action::Investigate,
            "the BMC lists no ComputerSystem",
        ));
    }
    for s in &systems {
        let label = system_label(s);
        let health = text(s, "/Status/Health");
        let rollup = text(s, "/Status/HealthRollup");
        let power = text(s, "/PowerState");
        let conditions: Vec<String> = s
            .pointer("/Status/Conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| text(c, "/Message"))
            .collect();
        let why = if conditions.is_empty() {
            String::new()
        } else {
            format!(": {}", conditions.join(" | "))
        };
        let system = Component::new(ComponentKind::Board)
            .name(text(s, "/Id").unwrap_or_default())
            .serial(text(s, "/SerialNumber"));
        for (what, value) in [("Health", &health), ("HealthRollup", &rollup)] {
            let mut fault = |message: String| {
                let mut f = Finding::new(
                    system.clone(),
                    "system_health",
                    Action::Investigate,
                    message,
                );
                for c in &conditions {
                    f.push_evidence(c.clone());
                }
                findings.push(f);
            };
            match value {
                Some(v) if allowed.contains(v) => {}
                Some(v) => fault(format!("{label}: {what} {v} (allowed {allowed:?}){why}")),
                None if what == "Health" => fault(format!("{label}: no Status.Health")),
                None => {}
            }
        }
        match &power {
            Some(p) if p == power_state => {}
            other => findings.push(Finding::new(
                system.clone(),
                "power_state",
                Action::Investigate,
                format!(
                    "{label}: PowerState {}, expected {power_state}",
                    other.as_deref().unwrap_or("(missing)")
                ),
            )),
        }
        measured.push(json!({
            "system": text(s, "/Id"), "health": health, "health_rollup": rollup,
            "power_state": power, "conditions": conditions,
        }));
    }
    Ok(CheckResult::from_findings(
        name,
        findings,
        format!("{} system(s) healthy and {power_state}", systems.len()),
        json!({ "systems": measured }),
    )
    .evidence(
        json!({ "systems": systems.iter().map(|s| s.get("Status").cloned()).collect::<Vec<_>>() }),
    ))
}

/// An inventory Id pattern: exact (case-insensitive), or a prefix ending in `*`.
fn id_matches(pattern: &str, id: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => id
            .to_ascii_lowercase()
            .starts_with(&prefix.to_ascii_lowercase()),
        None => id.eq_ignore_ascii_case(pattern),
    }
}

async fn firmware(
    name: &str,
    bmc: &RedfishClient,
    ctx: &CheckContext,
    inventory_ids: &[(String, String)],
    versions: &[(String, String)],
) -> Result<CheckResult, RedfishError> {
    let collection_path = match bmc.get("/redfish/v1/UpdateService").await {
        Ok(us) => text(&us, "/FirmwareInventory/@odata.id")
            .unwrap_or_else(|| "/redfish/v1/UpdateService/FirmwareInventory".into()),
        Err(_) => "/redfish/v1/UpdateService/FirmwareInventory".into(),
    };
    let collection = bmc.get(&collection_path).await?;
    let claimed = collection
        .get("Members@odata.count")
        .and_then(Value::as_u64);
    let items = bmc.members(&collection_path, true).await?;
    let inventory: Vec<(String, String, Option<String>)> = items
        .iter()
        .map(|i| {
            (
                text(i, "/Id").unwrap_or_default(),
                text(i, "/Name").unwrap_or_default(),
                text(i, "/Version"),
            )
        })
        .collect();
    let member_ids = || {
        inventory
            .iter()
            .map(|(i, _, _)| i.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut findings = Vec::new();
    let mut unknown = Vec::new();
    let mut compared = Vec::new();
    // (what is compared, inventory pattern, expected version): the manifest's baselines first,
    // then the playbook's versions.
    let mut wanted: Vec<(String, String, String)> = Vec::new();
    for (component, id) in inventory_ids {
        match ctx.node.firmware.get(component) {
            Some(want) => wanted.push((component.clone(), id.clone(), want.to_string())),
            None => unknown.push(format!(
                "no {component} firmware baseline for this node in the manifest"
            )),
        }
    }
    for (id, want) in versions {
        wanted.push((id.clone(), id.clone(), want.trim().to_string()));
    }
    for (what, pattern, want) in &wanted {
        let matching: Vec<&(String, String, Option<String>)> = inventory
            .iter()
            .filter(|(i, _, _)| id_matches(pattern, i))
            .collect();
        if matching.is_empty() {
            findings.push(Finding::new(
                Component::new(ComponentKind::Board).name(pattern.clone()),
                "firmware_missing",
                Action::Investigate,
                format!(
                    "{what}: no FirmwareInventory member {pattern:?} (members: {})",
                    member_ids()
                ),
            ));
        }
        for (id, fw_name, version) in matching {
            let have = version.as_deref().unwrap_or("(no Version)");
            if have.trim() != want {
                let label = if what == id {
                    format!("{id} ({fw_name})")
                } else {
                    format!("{what} ({fw_name})")
                };
                findings.push(
                    Finding::new(
                        Component::new(ComponentKind::Board).name(id.clone()),
                        "firmware_version",
                        Action::ReflashFirmware,
                        format!("{label}: version {have:?}, baseline {want:?}"),
                    )
                    .with_evidence(format!("FirmwareInventory/{id}: Version {have}")),
                );
            }
            compared
                .push(json!({ "component": what, "id": id, "version": version, "baseline": want }));
        }
    }
    let measured = json!({
        "compared": compared,
        "members_listed": inventory.len(),
        "members_odata_count": claimed,
    });
    let evidence = json!({
        "inventory": inventory.iter().map(|(i, n, v)| json!({"id": i, "name": n, "version": v})).collect::<Vec<_>>(),
    });
    if findings.is_empty() && !unknown.is_empty() {
        return Ok(CheckResult::error(name, unknown.join("; "))
            .measured(measured)
            .evidence(evidence));
    }
    Ok(CheckResult::from_findings(
        name,
        findings,
        format!("{} firmware component(s) at baseline", compared.len()),
        measured,
    )
    .evidence(evidence))
}

/// Every LogService of the systems and managers: (owner label, its logs collection path).
async fn log_services(bmc: &RedfishClient) -> Result<Vec<(String, String)>, RedfishError> {
    let mut out = Vec::new();
    for s in systems(bmc).await? {
        if let Some(p) = text(&s, "/LogServices/@odata.id") {
            out.push((text(&s, "/Id").unwrap_or_default(), p));
        }
    }
    for m in bmc.members("/redfish/v1/Managers", true).await? {
        if let Some(p) = text(&m, "/LogServices/@odata.id") {
            out.push((
                format!("Managers/{}", text(&m, "/Id").unwrap_or_default()),
                p,
            ));
        }
    }
    Ok(out)
}

async fn sel(
    name: &str,
    bmc: &RedfishClient,
    ctx: &CheckContext,
    severities: &[String],
) -> Result<CheckResult, RedfishError> {
    let since = ctx.node.registered_at;
    let mut findings = Vec::new();
    let mut scanned = 0u64;
    let mut older = 0u64;
    let mut logs_read = Vec::new();
    let mut evidence = Vec::new();
    for (owner, logs_path) in log_services(bmc).await? {
        for log in bmc.members(&logs_path, true).await? {
            let Some(entries_path) = text(&log, "/Entries/@odata.id") else {
                continue;
            };
            let log_id = format!("{owner}/{}", text(&log, "/Id").unwrap_or_default());
            logs_read.push(log_id.clone());
            for e in bmc.members(&entries_path, true).await? {
                scanned += 1;
                // SEL (IPMI-style) and Event (Redfish events, what OpenBMC logs) both record
                // hardware faults; Oem entries are vendor noise.
                if text(&e, "/EntryType").is_some_and(|t| t != "SEL" && t != "Event") {
                    continue;
                }
                let severity = text(&e, "/Severity").unwrap_or_default();
                if !severities.contains(&severity) {
                    continue;
                }
                let created = text(&e, "/Created");
                let when = created
                    .as_deref()
                    .and_then(|c| OffsetDateTime::parse(c, &Rfc3339).ok());
                if when.is_some_and(|w| w < since) {
                    older += 1;
                    continue;
                }
                let message = text(&e, "/Message").unwrap_or_default();
                let sensor = text(&e, "/SensorType");
                let (component, action) = sel_component(&e, sensor.as_deref(), &message);
                let line = format!(
                    "{log_id} entry {} at {}: {severity}: {message}{}",
                    text(&e, "/Id").unwrap_or_default(),
                    created.as_deref().unwrap_or("(no valid Created time)"),
                    text(&e, "/MessageId")
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default()
                );
                findings.push(
                    Finding::new(component, "bmc_log_entry", action, format!("log {line}"))
                        .with_evidence(line),
                );
                evidence.push(e);
            }
        }
    }
    let since_text = since.format(&Rfc3339).unwrap_or_default();
    let measured = json!({
        "entries_scanned": scanned, "forbidden_before_registration": older,
        "since": since_text, "logs": logs_read,
    });
    if scanned == 0 && findings.is_empty() {
        return Ok(CheckResult::error(
            name,
            format!(
                "no log entry read from {} log(s) ({}): an empty or unreadable log says nothing",
                logs_read.len(),
                logs_read.join(", ")
            ),
        )
        .measured(measured));
    }
    Ok(CheckResult::from_findings(
        name,
        findings,
        format!("no {severities:?} log entries since {since_text} ({scanned} entries scanned in {} logs)", logs_read.len()),
        measured,
    )
    .evidence(json!({ "entries": evidence })))
}

/// The part a log entry is about, from its sensor type and words, and what to do.
fn sel_component(e: &Value, sensor: Option<&str>, message: &str) -> (Component, Action) {
    let words = format!("{} {}", sensor.unwrap_or(""), message).to_ascii_lowercase();
    // The entry's own name for the part (`PSU2`, `FAN3`) if its message has one, else the IPMI
    // sensor number: that numbers sensors, not bays, so it is a name, never an index.
    let part = message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| {
            let lower = w.to_ascii_lowercase();
            ["psu", "fan", "dimm"].iter().any(|p| {
                lower
                    .strip_prefix(p)
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
            })
        })
        .map(str::to_string)
        .or_else(|| {
            e.get("SensorNumber")
                .and_then(Value::as_u64)
                .map(|n| format!("sensor {n}"))
        });
    let with_number = |c: Component| match &part {
        Some(n) => c.name(n.clone()),
        None => c,
    };
    if words.contains("power supply") || words.contains("psu") {
        (with_number(Component::new(ComponentKind::Psu)), Action::Rma)
    } else if words.contains("fan") {
        (
            with_number(Component::new(ComponentKind::Fan)),
            Action::Cooling,
        )
    } else if words.contains("temperature") || words.contains("thermal") || words.contains("melt") {
        (
            with_number(Component::new(ComponentKind::Board)),
            Action::Cooling,
        )
    } else if words.contains("memory") || words.contains("dimm") {
        (
            with_number(Component::new(ComponentKind::Memory)),
            Action::Investigate,
        )
    } else {
        (
            with_number(Component::new(ComponentKind::Board)),
            Action::Investigate,
        )
    }
}

fn health_of(v: &Value) -> (Option<String>, Option<String>) {
    (text(v, "/Status/State"), text(v, "/Status/Health"))
}

fn conditions_of(v: &Value) -> Vec<String> {
    v.pointer("/Status/Conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| text(c, "/Message"))
        .collect()
}

async fn chassis(
    name: &str,
    bmc: &RedfishClient,
    psus_min: Option<u64>,
    redundancy_required: bool,
    read_sensors: bool,
) -> Result<CheckResult, RedfishError> {
    let mut findings = Vec::new();
    let mut measured_psus = Vec::new();
    let mut measured_fans = Vec::new();
    let mut sensors_read = 0usize;
    let mut psus_present = 0u64;
    let all = bmc.members("/redfish/v1/Chassis", true).await?;
    for c in &all {
        let chassis_id = text(c, "/Id").unwrap_or_default();
        // Power supplies: the PowerSubsystem (Redfish 2020.4+), else the older Power resource.
        let mut psus: Vec<Value> = Vec::new();
        let mut redundancy: Vec<Value> = Vec::new();
        if let Some(p) = text(c, "/PowerSubsystem/@odata.id") {
            let ps = bmc.get(&p).await?;
            if let Some(list) = text(&ps, "/PowerSupplies/@odata.id") {
                psus = bmc.members(&list, true).await?;
            }
            redundancy = ps
                .get("PowerSupplyRedundancy")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
        } else if let Some(p) = text(c, "/Power/@odata.id") {
            let power = bmc.get(&p).await?;
            psus = power
                .get("PowerSupplies")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            redundancy = power
                .get("Redundancy")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
        }
        for (i, p) in psus.iter().enumerate() {
            let (state, health) = health_of(p);
            let label = text(p, "/Location/PartLocation/ServiceLabel")
                .or_else(|| text(p, "/Name"))
                .unwrap_or_else(|| format!("PSU {i}"));
            let component = Component::new(ComponentKind::Psu)
                .index(u32::try_from(i).unwrap_or(u32::MAX))
                .name(
                    text(p, "/Id")
                        .or_else(|| text(p, "/MemberId"))
                        .unwrap_or_default(),
                )
                .serial(text(p, "/SerialNumber"))
                .slot(Some(label.clone()));
            measured_psus.push(
                json!({"chassis": chassis_id, "psu": label, "state": state, "health": health}),
            );
            if state.as_deref() == Some("Absent") {
                continue;
            }
            psus_present += 1;
            if let Some(h) = health.as_deref().filter(|h| *h != "OK") {
                let conditions = conditions_of(p);
                let mut f = Finding::new(
                    component,
                    "psu_health",
                    Action::Rma,
                    format!(
                        "chassis {chassis_id}: {label} Health {h}{}: replace the power supply",
                        if conditions.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", conditions.join(" | "))
                        }
                    ),
                );
                for c in conditions {
                    f.push_evidence(c);
                }
                findings.push(f);
            }
        }
        if redundancy_required {
            for r in &redundancy {
                let (state, health) = health_of(r);
                let ok_state = matches!(state.as_deref(), None | Some("Enabled"));
                let ok_health = matches!(health.as_deref(), None | Some("OK"));
                if !ok_state || !ok_health {
                    findings.push(
                        Finding::new(
                            Component::new(ComponentKind::Psu).name("redundancy".to_string()),
                            "psu_redundancy_lost",
                            Action::Investigate,
                            format!(
                                "chassis {chassis_id}: power supply redundancy {} is {} / {} (a power supply is missing or failed)",
                                text(r, "/RedundancyType").or_else(|| text(r, "/Mode")).unwrap_or_else(|| "group".into()),
                                state.as_deref().unwrap_or("?"),
                                health.as_deref().unwrap_or("?")
                            ),
                        )
                        .with_evidence(r.to_string()),
                    );
                }
            }
        }
        // Fans: ThermalSubsystem, else Thermal.
        let mut fans: Vec<Value> = Vec::new();
        if let Some(t) = text(c, "/ThermalSubsystem/@odata.id") {
            let ts = bmc.get(&t).await?;
            if let Some(list) = text(&ts, "/Fans/@odata.id") {
                fans = bmc.members(&list, true).await?;
            }
        } else if let Some(t) = text(c, "/Thermal/@odata.id") {
            fans = bmc
                .get(&t)
                .await?
                .get("Fans")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
        }
        for (i, fan) in fans.iter().enumerate() {
            let (state, health) = health_of(fan);
            let label = text(fan, "/Location/PartLocation/ServiceLabel")
                .or_else(|| text(fan, "/Name"))
                .unwrap_or_else(|| format!("fan {i}"));
            measured_fans.push(
                json!({"chassis": chassis_id, "fan": label, "state": state, "health": health}),
            );
            if state.as_deref() == Some("Absent") {
                continue;
            }
            if let Some(h) = health.as_deref().filter(|h| *h != "OK") {
                findings.push(Finding::new(
                    Component::new(ComponentKind::Fan)
                        .index(u32::try_from(i).unwrap_or(u32::MAX))
                        .slot(Some(label.clone())),
                    "fan_health",
                    Action::Cooling,
                    format!("chassis {chassis_id}: {label} Health {h}: replace the fan"),
                ));
            }
        }
        if read_sensors {
            if let Some(s) = text(c, "/Sensors/@odata.id") {
                for sensor in bmc.members(&s, true).await?.iter().take(SENSORS_MAX) {
                    sensors_read += 1;
                    if let Some(f) = sensor_finding(&chassis_id, sensor) {
                        findings.push(f);
                    }
                }
            }
        }
    }
    if let Some(min) = psus_min {
        if psus_present < min {
            findings.push(Finding::new(
                Component::new(ComponentKind::Psu),
                "psu_missing",
                Action::Investigate,
                format!("{psus_present} power supplies present, expected {min}"),
            ));
        }
    }
    let measured = json!({
        "chassis": all.len(), "psus": measured_psus, "psus_present": psus_present,
        "fans": measured_fans, "sensors_read": sensors_read,
    });
    if all.is_empty() {
        return Ok(CheckResult::error(name, "the BMC lists no Chassis").measured(measured));
    }
    Ok(CheckResult::from_findings(
        name,
        findings,
        format!(
            "{psus_present} power supplies, {} fans, {sensors_read} sensors within their critical thresholds",
            measured_fans.len()
        ),
        measured,
    ))
}

/// A sensor whose reading is past a critical (or fatal) threshold, or whose own health is
/// Critical. Caution thresholds are warnings and do not fail a node.
fn sensor_finding(chassis_id: &str, s: &Value) -> Option<Finding> {
    if text(s, "/Status/State").as_deref() == Some("Absent") {
        return None;
    }
    let label = text(s, "/Name").or_else(|| text(s, "/Id"))?;
    let reading = s.get("Reading").and_then(Value::as_f64);
    let units = text(s, "/ReadingUnits").unwrap_or_default();
    let limit = |key: &str| {
        s.pointer(&format!("/Thresholds/{key}/Reading"))
            .and_then(Value::as_f64)
    };
    let temperature = units == "Cel" || text(s, "/ReadingType").as_deref() == Some("Temperature");
    let action = if temperature {
        Action::Cooling
    } else {
        Action::Investigate
    };
    let component = Component::new(ComponentKind::Board).name(label.clone());
    if let Some(r) = reading {
        for (key, above) in [
            ("UpperFatal", true),
            ("UpperCritical", true),
            ("LowerFatal", false),
            ("LowerCritical", false),
        ] {
            if let Some(t) = limit(key) {
                if (above && r >= t) || (!above && r <= t) {
                    return Some(
                        Finding::new(
                            component,
                            "sensor_threshold",
                            action,
                            format!(
                                "chassis {chassis_id}: sensor {label} reads {r} {units}, {} its {key} threshold {t}",
                                if above { "at or above" } else { "at or below" }
                            ),
                        )
                        .with_evidence(format!("{label}: Reading {r} {units}; Thresholds {}", s.get("Thresholds").cloned().unwrap_or(Value::Null))),
                    );
                }
            }
        }
    }
    if text(s, "/Status/Health").as_deref() == Some("Critical") {
        return Some(Finding::new(
            component,
            "sensor_health",
            action,
            format!("chassis {chassis_id}: sensor {label} Health Critical"),
        ));
    }
    None
}

async fn inventory(
    name: &str,
    bmc: &RedfishClient,
    expected_gpus: u64,
    gpus_required: bool,
    pcie_at_max: bool,
    pcie_generation_min: Option<u64>,
) -> Result<CheckResult, RedfishError> {
    let mut findings = Vec::new();
    let mut notes = Vec::new();
    let mut gpus = Vec::new();
    let mut pcie_links: BTreeMap<String, Value> = BTreeMap::new();
    let systems = systems(bmc).await?;
    for s in &systems {
        if let Some(p) = text(s, "/Processors/@odata.id") {
            for proc_ in bmc.members(&p, true).await? {
                if text(&proc_, "/ProcessorType").as_deref() == Some("GPU") {
                    gpus.push(proc_);
                }
            }
        }
        // Older schema: an array of device links on the system.
        if let Some(list) = s.get("PCIeDevices").and_then(Value::as_array) {
            for l in list {
                if let Some(id) = odata_id(l) {
                    pcie_links.entry(id).or_insert(Value::Null);
                }
            }
        }
    }
    for c in bmc.members("/redfish/v1/Chassis", true).await? {
        if let Some(p) = text(&c, "/PCIeDevices/@odata.id") {
            for l in bmc.members(&p, false).await? {
                if let Some(id) = odata_id(&l) {
                    pcie_links.entry(id).or_insert(Value::Null);
                }
            }
        }
    }
    for g in &gpus {
        if let Some(h) = text(g, "/Status/Health").filter(|h| h != "OK") {
            findings.push(Finding::new(
                Component::new(ComponentKind::Gpu)
                    .name(text(g, "/Id").unwrap_or_default())
                    .serial(text(g, "/SerialNumber")),
                "bmc_gpu_health",
                Action::Investigate,
                format!(
                    "GPU {} ({}): Health {h}",
                    text(g, "/Id").unwrap_or_default(),
                    text(g, "/Model").unwrap_or_default()
                ),
            ));
        }
    }
    if gpus.is_empty() {
        if gpus_required && expected_gpus > 0 {
            findings.push(Finding::new(
                Component::new(ComponentKind::Board),
                "bmc_gpu_count",
                Action::Investigate,
                format!("the BMC lists no GPU, expected {expected_gpus}"),
            ));
        } else {
            notes.push("the BMC exposes no GPU processors (not checked)".to_string());
        }
    } else if gpus.len() as u64 != expected_gpus {
        findings.push(Finding::new(
            Component::new(ComponentKind::Board),
            "bmc_gpu_count",
            Action::Reboot,
            format!(
                "the BMC lists {} GPU(s) ({}), expected {expected_gpus}",
                gpus.len(),
                gpus.iter()
                    .filter_map(|g| text(g, "/Id"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let mut devices = Vec::new();
    for id in pcie_links.keys() {
        let d = bmc.get(id).await?;
        let iface = d.get("PCIeInterface");
        let label = format!(
            "PCIe device {} ({})",
            text(&d, "/Id").unwrap_or_default(),
            text(&d, "/Name").unwrap_or_default()
        );
        let component = Component::new(ComponentKind::Board)
            .name(text(&d, "/Id").unwrap_or_default())
            .serial(text(&d, "/SerialNumber"))
            .slot(text(&d, "/Slot/Location/PartLocation/ServiceLabel"));
        if let Some(i) = iface {
            let cur = text(i, "/PCIeType");
            let max = text(i, "/MaxPCIeType");
            let lanes = i.get("LanesInUse").and_then(Value::as_u64);
            let max_lanes = i.get("MaxLanes").and_then(Value::as_u64);
            // Width does not drop at idle: fewer lanes than the link supports is a fault
            // (a riser, a retimer, a badly seated card).
            if pcie_at_max {
                if let (Some(l), Some(m)) = (lanes, max_lanes) {
                    if l < m {
                        findings.push(Finding::new(
                            component.clone(),
                            "pcie_lanes",
                            Action::Investigate,
                            format!("{label}: x{l} lanes in use, max x{m}; check riser, retimer and seating"),
                        ));
                    }
                }
            }
            if let (Some(min), Some(m)) = (pcie_generation_min, &max) {
                if u64::from(gen_number(m)) < min {
                    findings.push(Finding::new(
                        component,
                        "pcie_generation",
                        Action::Investigate,
                        format!("{label}: supports {m} at most (min Gen{min})"),
                    ));
                }
            }
            devices.push(json!({
                "id": id, "pcie_type": cur, "max_pcie_type": max, "lanes_in_use": lanes, "max_lanes": max_lanes,
            }));
        }
    }
    let mut pass_msg = format!(
        "{} GPU(s), {} PCIe device(s) at their maximum width",
        gpus.len(),
        devices.len()
    );
    if !notes.is_empty() {
        pass_msg.push_str(&format!(" ({})", notes.join("; ")));
    }
    Ok(CheckResult::from_findings(
        name,
        findings,
        pass_msg,
        json!({
            "gpus": gpus.iter().map(|g| json!({"id": text(g, "/Id"), "model": text(g, "/Model"), "health": text(g, "/Status/Health")})).collect::<Vec<_>>(),
            "expected_gpus": expected_gpus,
            "pcie_devices": devices,
            "notes": notes,
        }),
    ))
}

/// `Gen4` -> 4; anything else 0.
fn gen_number(s: &str) -> u32 {
    s.trim_start_matches("Gen").parse().unwrap_or(0)
}
