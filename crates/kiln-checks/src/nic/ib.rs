//! InfiniBand from sysfs: per HCA its firmware and PCI address, per port its state, physical
//! state, rate, link layer and error counters, and per HCA netdev (`ib0`) its operstate and
//! carrier changes. Read under `<root>/class/infiniband/*` and, where sysfs is a snapshot
//! without the class symlinks, `<root>/bus/pci/devices/*/infiniband/*`; entries merge by HCA.
//!
//! What fails, and why (facebookresearch/gcm `check_iblink` finds the same faults):
//! - a port not ACTIVE: INIT means the link trained but the subnet manager has not configured
//!   the port (a fabric configuration matter, not a cable); DOWN/Polling is the cable;
//! - a port ACTIVE whose netdev is down, or whose carrier changed more than
//!   `carrier_changes_max` times: a flapping link the port state alone hides;
//! - the rate below the expected one (a degraded cable or transceiver);
//! - a PCI slot holding another HCA or netdev than the expected map says (a mis-bound
//!   interface: traffic meant for one rail goes out another);
//! - a port error counter (symbol errors, link downed, link error recovery, receive errors)
//!   that grew between the first InfiniBand step of the run and a later one (after stress).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use crate::check::CheckResult;
use crate::finding::{Action, Component, ComponentKind, Finding};
use crate::yaml::{Fields, LoadError};

/// Files read per HCA and per port.
const HCA_FILES: [&str; 1] = ["fw_ver"];
const PORT_FILES: [&str; 4] = ["state", "phys_state", "rate", "link_layer"];
/// Port counters (`ports/N/counters/`) that a healthy link keeps at 0 under load.
pub const PORT_COUNTERS: [&str; 4] = [
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
];
const NETDEV_FILES: [&str; 2] = ["operstate", "carrier_changes"];
/// The run memo key the first InfiniBand step keeps its counters under.
pub const COUNTERS_MEMO: &str = "infiniband/counters";

/// The shell command that dumps the InfiniBand sysfs files under `root` as
/// `path<TAB>content` lines (one per file; content is one line in these files), and for each
/// HCA under the class directory its PCI address (`pci<TAB>hca<TAB>address`).
pub fn ib_dump_command(root: &str) -> String {
    let root = root.trim_end_matches('/');
    let mut globs = Vec::new();
    for base in [
        format!("{root}/class/infiniband/*"),
        format!("{root}/bus/pci/devices/*/infiniband/*"),
    ] {
        for f in HCA_FILES {
            globs.push(format!("{base}/{f}"));
        }
        for f in PORT_FILES {
            globs.push(format!("{base}/ports/*/{f}"));
        }
        for f in PORT_COUNTERS {
            globs.push(format!("{base}/ports/*/counters/{f}"));
        }
    }
    for f in NETDEV_FILES {
        globs.push(format!("{root}/class/infiniband/*/device/net/*/{f}"));
        globs.push(format!("{root}/bus/pci/devices/*/net/*/{f}"));
    }
    format!(
        "for f in {}; do [ -f \"$f\" ] && printf '%s\\t%s\\n' \"$f\" \"$(head -n 1 \"$f\" 2>/dev/null)\"; done; \
         for d in {root}/class/infiniband/*; do [ -e \"$d/device\" ] && printf 'pci\\t%s\\t%s\\n' \"${{d##*/}}\" \"$(basename \"$(readlink -f \"$d/device\")\")\"; done; true",
        globs.join(" ")
    )
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IbHca {
    pub name: String,
    pub fw_ver: Option<String>,
    /// The PCI address of the slot holding it (`0000:0c:00.0`).
    pub pci: Option<String>,
    pub ports: BTreeMap<u32, IbPort>,
    /// Its netdevs (`ib0`), each with `operstate` and `carrier_changes`.
    pub netdevs: BTreeMap<String, BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IbPort {
    /// e.g. `4: ACTIVE`.
    pub state: Option<String>,
    /// e.g. `5: LinkUp`.
    pub phys_state: Option<String>,
    /// e.g. `200 Gb/sec (4X HDR)`.
    pub rate: Option<String>,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: Option<String>,
    pub counters: BTreeMap<String, u64>,
}

impl IbPort {
    /// The rate in Gb/s, from `200 Gb/sec (4X HDR)`.
    pub fn rate_gbps(&self) -> Option<f64> {
        self.rate
            .as_deref()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn is_infiniband(&self) -> bool {
        self.link_layer.as_deref().unwrap_or("InfiniBand") == "InfiniBand"
    }
}

/// Parses the dump into HCAs, keyed by HCA name (so the class and PCI paths of one HCA
/// merge). Lines that are not InfiniBand sysfs files are ignored.
pub fn parse_ib_dump(dump: &str) -> BTreeMap<String, IbHca> {
    let mut hcas: BTreeMap<String, IbHca> = BTreeMap::new();
    // PCI address -> netdev -> file -> content, joined to HCAs by address at the end.
    let mut pci_netdevs: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>> =
        BTreeMap::new();
    for line in dump.lines() {
        let fields: Vec<&str> = line.splitn(3, '\t').collect();
        if let ["pci", hca, addr] = fields[..] {
            let h = hcas.entry(hca.to_string()).or_default();
            h.name = hca.to_string();
            h.pci = Some(addr.trim().to_string());
            continue;
        }
        let Some((path, content)) = line.split_once('\t') else {
            continue;
        };
        let content = content.trim().to_string();
        let parts: Vec<&str> = path.split('/').collect();
        // `.../bus/pci/devices/<pci>/net/<ifname>/<file>`
        if let Some(n) = parts.iter().rposition(|p| *p == "net") {
            if let [ifname, file] = parts[n + 1..] {
                if !NETDEV_FILES.contains(&file) {
                    continue;
                }
                if let Some(ib) = parts.iter().position(|p| *p == "infiniband") {
                    // `.../class/infiniband/<hca>/device/net/<ifname>/<file>`
                    if let Some(hca) = parts.get(ib + 1) {
                        let h = hcas.entry(hca.to_string()).or_default();
                        h.name = hca.to_string();
                        h.netdevs
                            .entry(ifname.to_string())
                            .or_default()
                            .insert(file.to_string(), content);
                    }
                } else if n >= 1 {
                    pci_netdevs
                        .entry(parts[n - 1].to_string())
                        .or_default()
                        .entry(ifname.to_string())
                        .or_default()
                        .insert(file.to_string(), content);
                }
            }
            continue;
        }
        let Some(ib) = parts.iter().rposition(|p| *p == "infiniband") else {
            continue;
        };
        let pci = (ib >= 1 && parts.get(ib.wrapping_sub(2)) == Some(&"devices"))
            .then(|| parts[ib - 1].to_string());
        let rest = &parts[ib + 1..];
        let Some(hca) = rest.first() else { continue };
        let h = hcas.entry(hca.to_string()).or_default();
        h.name = hca.to_string();
        if pci.is_some() && h.pci.is_none() {
            h.pci = pci;
        }
        match rest {
            [_, file] if HCA_FILES.contains(file) => h.fw_ver = Some(content),
            [_, "ports", port, file] if PORT_FILES.contains(file) => {
                let Ok(port) = port.parse::<u32>() else {
                    continue;
                };
                let p = h.ports.entry(port).or_default();
                let slot = match *file {
                    "state" => &mut p.state,
                    "phys_state" => &mut p.phys_state,
                    "rate" => &mut p.rate,
                    _ => &mut p.link_layer,
                };
                *slot = Some(content);
            }
            [_, "ports", port, "counters", counter] if PORT_COUNTERS.contains(counter) => {
                let (Ok(port), Ok(v)) = (port.parse::<u32>(), content.parse::<u64>()) else {
                    continue;
                };
                h.ports
                    .entry(port)
                    .or_default()
                    .counters
                    .insert(counter.to_string(), v);
            }
            _ => {}
        }
    }
    for h in hcas.values_mut() {
        if let Some(devs) = h.pci.as_ref().and_then(|p| pci_netdevs.get(p)) {
            for (ifname, files) in devs {
                h.netdevs
                    .entry(ifname.clone())
                    .or_default()
                    .extend(files.clone());
            }
        }
    }
    hcas
}

/// The port counters of every HCA, as kept for a later step: `{hca: {port: {counter: n}}}`.
pub fn counters_json(hcas: &BTreeMap<String, IbHca>) -> Value {
    json!(hcas
        .iter()
        .map(|(n, h)| (
            n.clone(),
            Value::Object(
                h.ports
                    .iter()
                    .map(|(p, port)| (p.to_string(), json!(port.counters)))
                    .collect::<serde_json::Map<_, _>>()
            )
        ))
        .collect::<serde_json::Map<_, _>>())
}

/// What a PCI slot must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotBinding {
    pub pci: String,
    pub hca: Option<String>,
    pub netdev: Option<String>,
    /// A label a person finds on the chassis (`HCA-1`, `OSFP 3`).
    pub slot: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InfinibandExpect {
    /// HCAs with at least one InfiniBand port (RoCE-only HCAs are not counted).
    pub hca_count: u64,
    pub rate_gbps: u64,
    /// Accepted HCA `fw_ver` values; empty accepts any.
    pub fw_versions: Vec<String>,
    pub sysfs_root: String,
    /// Carrier changes a netdev may have seen since boot (a few at link-up are normal).
    pub carrier_changes_max: u64,
    /// Growth allowed in each port error counter between the run's first InfiniBand step and
    /// this one.
    pub counter_delta_max: u64,
    pub bindings: Vec<SlotBinding>,
}

impl InfinibandExpect {
    pub const FIELDS: [&'static str; 7] = [
        "hca_count",
        "rate_gbps",
        "fw_versions",
        "sysfs_root",
        "carrier_changes_max",
        "counter_delta_max",
        "bindings",
    ];

    pub(crate) fn parse(
        f: &mut Fields<'_>,
        errors: &mut Vec<LoadError>,
    ) -> Option<InfinibandExpect> {
        let hca_count = f.req_u64("hca_count", 0..=64, errors);
        let rate_gbps = f.req_u64("rate_gbps", 1..=3200, errors);
        let fw_versions = f
            .opt_str_list("fw_versions", None, errors)
            .unwrap_or_default();
        let sysfs_root = f
            .opt_str("sysfs_root", errors)
            .unwrap_or_else(|| "/sys".into());
        let carrier_changes_max = f
            .opt_u64("carrier_changes_max", 0..=1_000_000, errors)
            .unwrap_or(10);
        let counter_delta_max = f
            .opt_u64("counter_delta_max", 0..=1_000_000_000, errors)
            .unwrap_or(0);
        let bindings = f
            .opt_map_of("bindings", errors, |pci, mut b, errors| {
                let binding = SlotBinding {
                    pci: pci.to_string(),
                    hca: b.opt_str("hca", errors),
                    netdev: b.opt_str("netdev", errors),
                    slot: b.opt_str("slot", errors),
                };
                b.finish(&["hca", "netdev", "slot"], errors);
                Some(binding)
            })
            .unwrap_or_default()
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        Some(InfinibandExpect {
            hca_count: hca_count?,
            rate_gbps: rate_gbps?,
            fw_versions,
            sysfs_root,
            carrier_changes_max,
            counter_delta_max,
            bindings,
        })
    }

    /// Evaluates parsed HCAs against the expectations and, when an earlier step kept them,
    /// the port counters of that step.
    pub fn evaluate(
        &self,
        name: &str,
        hcas: &BTreeMap<String, IbHca>,
        baseline: Option<&Value>,
    ) -> CheckResult {
        let mut findings = Vec::new();
        let slot_of = |h: &IbHca| {
            self.bindings
                .iter()
                .find(|b| Some(&b.pci) == h.pci.as_ref())
                .and_then(|b| b.slot.clone())
        };
        let hca_component = |h: &IbHca| {
            Component::new(ComponentKind::Hca)
                .name(h.name.clone())
                .pci(h.pci.clone())
                .slot(slot_of(h))
        };
        let ib_hcas: Vec<&IbHca> = hcas
            .values()
            .filter(|h| h.ports.values().any(IbPort::is_infiniband))
            .collect();
        if ib_hcas.len() as u64 != self.hca_count {
            findings.push(Finding::new(
                Component::new(ComponentKind::Board),
                "ib_hca_count",
                Action::Investigate,
                format!(
                    "{} InfiniBand HCAs found ({}), expected {}",
                    ib_hcas.len(),
                    ib_hcas
                        .iter()
                        .map(|h| h.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.hca_count
                ),
            ));
        }
        let mut ports_checked = 0u64;
        let mut counter_deltas = Vec::new();
        for h in &ib_hcas {
            if !self.fw_versions.is_empty() {
                match &h.fw_ver {
                    Some(v) if self.fw_versions.contains(v) => {}
                    Some(v) => findings.push(Finding::new(
                        hca_component(h),
                        "ib_firmware",
                        Action::ReflashFirmware,
                        format!(
                            "{}: firmware {v:?}, expected one of {:?}",
                            h.name, self.fw_versions
                        ),
                    )),
                    None => findings.push(Finding::new(
                        hca_component(h),
                        "ib_firmware",
                        Action::ReflashFirmware,
                        format!("{}: fw_ver missing", h.name),
                    )),
                }
            }
            let mut any_active = false;
            for (num, p) in &h.ports {
                if !p.is_infiniband() {
                    continue;
                }
                ports_checked += 1;
                let port = format!("{} port {num}", h.name);
                let component = hca_component(h).index(*num);
                let state = p.state.as_deref().unwrap_or("(missing)");
                let phys = p.phys_state.as_deref().unwrap_or("(missing)");
                let readings = format!(
                    "state {state}, phys_state {phys}, rate {}",
                    p.rate.as_deref().unwrap_or("(missing)")
                );
                if state_is(state, "ACTIVE") {
                    any_active = true;
                } else if state_is(state, "INIT") && state_is(phys, "LinkUp") {
                    findings.push(
                        Finding::new(
                            component.clone(),
                            "ib_port_init",
                            Action::Config,
                            format!(
                                "{port}: state {state:?}, expected ACTIVE (link up, but the subnet manager has not configured the port)"
                            ),
                        )
                        .with_evidence(readings.clone()),
                    );
                } else {
                    findings.push(
                        Finding::new(
                            component.clone(),
                            "ib_port_down",
                            Action::ReseatCable,
                            format!("{port}: state {state:?}, expected ACTIVE"),
                        )
                        .with_evidence(readings.clone()),
                    );
                }
                if !state_is(phys, "LinkUp") {
                    findings.push(
                        Finding::new(
                            component.clone(),
                            "ib_phys_down",
                            Action::ReseatCable,
                            format!("{port}: phys_state {phys:?}, expected LinkUp"),
                        )
                        .with_evidence(readings.clone()),
                    );
                }
                match p.rate_gbps() {
                    Some(r) if (r - self.rate_gbps as f64).abs() < 0.5 => {}
                    _ => findings.push(
                        Finding::new(
                            component.clone(),
                            "ib_rate",
                            Action::ReseatCable,
                            format!(
                                "{port}: rate {:?}, expected {} Gb/sec",
                                p.rate.as_deref().unwrap_or("(missing)"),
                                self.rate_gbps
                            ),
                        )
                        .with_evidence(readings.clone()),
                    ),
                }
                if let Some(before) = baseline
                    .and_then(|b| b.get(&h.name))
                    .and_then(|hb| hb.get(num.to_string()))
                {
                    for (counter, now) in &p.counters {
                        let Some(then) = before.get(counter).and_then(Value::as_u64) else {
                            continue;
                        };
                        let delta = now.saturating_sub(then);
                        counter_deltas.push(json!({"hca": h.name, "port": num, "counter": counter, "before": then, "after": now}));
                        if delta > self.counter_delta_max {
                            findings.push(
                                Finding::new(
                                    component.clone(),
                                    format!("ib_{counter}"),
                                    Action::ReseatCable,
                                    format!(
                                        "{port}: {counter} grew by {delta} since the run's first InfiniBand check (max {})",
                                        self.counter_delta_max
                                    ),
                                )
                                .with_evidence(format!("{counter}: {then} -> {now}"))
                                .with_counter(format!("{counter}_before"), then)
                                .with_counter(format!("{counter}_after"), *now),
                            );
                        }
                    }
                }
            }
            // The port's view can be ACTIVE while the netdev flaps: gcm's "ACTIVE, but the
            // logical interface is down". Only judged where the port is ACTIVE, since a port
            // in INIT or DOWN already explains its netdev.
            if any_active {
                for (ifname, files) in &h.netdevs {
                    let component = hca_component(h).name(format!("{} ({ifname})", h.name));
                    let operstate = files.get("operstate").map(String::as_str);
                    let changes = files
                        .get("carrier_changes")
                        .and_then(|c| c.parse::<u64>().ok());
                    let readings = format!(
                        "{ifname}: operstate {}, carrier_changes {}",
                        operstate.unwrap_or("(missing)"),
                        changes.map(|c| c.to_string()).unwrap_or("(missing)".into())
                    );
                    if operstate.is_some_and(|o| !o.eq_ignore_ascii_case("up")) {
                        findings.push(
                            Finding::new(
                                component.clone(),
                                "ib_netdev_down",
                                Action::ReseatCable,
                                format!(
                                    "{} ({ifname}): port ACTIVE but netdev operstate {}{}",
                                    h.name,
                                    operstate.unwrap_or("?"),
                                    changes
                                        .map(|c| format!(", {c} carrier changes: a flapping link"))
                                        .unwrap_or_default()
                                ),
                            )
                            .with_evidence(readings.clone()),
                        );
                    } else if let Some(c) = changes.filter(|c| *c > self.carrier_changes_max) {
                        findings.push(
                            Finding::new(
                                component,
                                "ib_link_flapping",
                                Action::ReseatCable,
                                format!(
                                    "{} ({ifname}): {c} carrier changes (max {}): a flapping link",
                                    h.name, self.carrier_changes_max
                                ),
                            )
                            .with_evidence(readings),
                        );
                    }
                }
            }
        }
        for b in &self.bindings {
            let holder = hcas
                .values()
                .find(|h| h.pci.as_deref() == Some(b.pci.as_str()));
            let slot = b.slot.clone().unwrap_or_else(|| b.pci.clone());
            let component = Component::new(ComponentKind::Hca)
                .pci(Some(b.pci.clone()))
                .slot(b.slot.clone());
            match holder {
                None => findings.push(Finding::new(
                    component.name(b.hca.clone().unwrap_or_default()),
                    "ib_slot_empty",
                    Action::Investigate,
                    format!(
                        "slot {slot} ({}) holds no InfiniBand HCA, expected {}",
                        b.pci,
                        b.hca.as_deref().unwrap_or("one")
                    ),
                )),
                Some(h) => {
                    if let Some(want) = &b.hca {
                        if &h.name != want {
                            findings.push(Finding::new(
                                component.clone().name(h.name.clone()),
                                "ib_misbind",
                                Action::Config,
                                format!(
                                    "slot {slot} ({}) is bound to {}, expected {want}",
                                    b.pci, h.name
                                ),
                            ));
                        }
                    }
                    if let Some(want) = &b.netdev {
                        if !h.netdevs.contains_key(want) {
                            let have: Vec<&str> = h.netdevs.keys().map(String::as_str).collect();
                            findings.push(Finding::new(
                                component.name(h.name.clone()),
                                "ib_netdev_misbind",
                                Action::Config,
                                format!(
                                    "slot {slot} ({}): {} has netdev {}, expected {want}",
                                    b.pci,
                                    h.name,
                                    if have.is_empty() {
                                        "none".to_string()
                                    } else {
                                        have.join(", ")
                                    }
                                ),
                            ));
                        }
                    }
                }
            }
        }
        let measured = json!({
            "hca_count": ib_hcas.len(),
            "ports_checked": ports_checked,
            "counters_compared": counter_deltas,
            "expected": { "hca_count": self.hca_count, "rate_gbps": self.rate_gbps, "fw_versions": self.fw_versions },
        });
        CheckResult::from_findings(
            name,
            findings,
            format!(
                "{} HCAs, {ports_checked} ports ACTIVE/LinkUp at {} Gb/sec",
                ib_hcas.len(),
                self.rate_gbps
            ),
            measured,
        )
        .evidence(serde_json::to_value(hcas).unwrap_or(Value::Null))
    }
}

/// `4: ACTIVE` is ACTIVE; so is a bare `ACTIVE`.
fn state_is(value: &str, want: &str) -> bool {
    let v = value.rsplit(':').next().unwrap_or(value).trim();
    v.eq_ignore_ascii_case(want)
}
