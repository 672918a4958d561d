//! Ethernet from `ip -j link` (operstate, flags, MTU) and sysfs under `sysfs_root` (link speed,
//! the permanent MAC, the PCI slot): every expected interface present, UP with carrier
//! (`LOWER_UP`), at its MTU and speed, and, where the manifest or playbook says, with the
//! expected MAC and in the expected slot (a swapped NIC or cable otherwise passes; gcm's
//! `check_ethlink` compares the same).
//!
//! A bond member's `address` is the bond's; its own MAC is `bonding_slave/perm_hwaddr`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::check::CheckResult;
use crate::finding::{Action, Component, ComponentKind, Finding};
use crate::yaml::{Fields, LoadError};

/// One interface from `ip -j link` (fields Kiln uses; the rest is ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpLink {
    pub ifname: String,
    #[serde(default)]
    pub operstate: Option<String>,
    #[serde(default)]
    pub mtu: Option<u64>,
    #[serde(default)]
    pub flags: Vec<String>,
    #[serde(default)]
    pub link_type: Option<String>,
    #[serde(default)]
    pub address: Option<String>,
    /// Newer iproute2 prints a bond member's own MAC here.
    #[serde(default)]
    pub permaddr: Option<String>,
}

/// Parses `ip -j link` (or `ip -j addr`) output.
pub fn parse_ip_links(json_text: &str) -> Result<Vec<IpLink>, String> {
    serde_json::from_str(json_text.trim()).map_err(|e| format!("not `ip -j link` JSON: {e}"))
}

/// What the Ethernet step read: the links, and per interface its sysfs readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EthDump {
    pub links: Vec<IpLink>,
    /// ifname -> (`speed`, `permaddr`, `address`, `pci`) -> value.
    pub sysfs: BTreeMap<String, BTreeMap<String, String>>,
}

const SYSFS_TAGS: [&str; 4] = ["speed", "permaddr", "address", "pci"];

/// Splits the step's output: the JSON of the links command, then `tag<TAB>ifname<TAB>value`
/// lines from the sysfs loop.
pub fn parse_eth_dump(text: &str) -> Result<EthDump, String> {
    let mut json_part = String::new();
    let mut dump = EthDump::default();
    for line in text.lines() {
        let mut f = line.splitn(3, '\t');
        match (f.next(), f.next(), f.next()) {
            (Some(tag), Some(ifname), Some(value)) if SYSFS_TAGS.contains(&tag) => {
                let value = value.trim();
                if !value.is_empty() {
                    dump.sysfs
                        .entry(ifname.to_string())
                        .or_default()
                        .insert(tag.to_string(), value.to_string());
                }
            }
            _ => {
                json_part.push_str(line);
                json_part.push('\n');
            }
        }
    }
    dump.links = parse_ip_links(&json_part)?;
    Ok(dump)
}

#[derive(Debug, Clone, PartialEq)]
pub struct EthernetExpect {
    pub interfaces: Vec<String>,
    pub mtu: u64,
    /// The command printing the links as JSON.
    pub command: String,
    pub sysfs_root: String,
    /// Every listed interface's speed, Mb/s, unless `speeds_mbps` names it.
    pub speed_mbps: Option<u64>,
    pub speeds_mbps: Vec<(String, u64)>,
    /// Carrier required (`LOWER_UP` in the flags).
    pub lower_up: bool,
    /// Expected MAC per interface (the manifest's `mac.<ifname>` label wins over this).
    pub macs: Vec<(String, String)>,
    /// Expected PCI address per interface.
    pub slots: Vec<(String, String)>,
}

impl EthernetExpect {
    pub const FIELDS: [&'static str; 9] = [
        "interfaces",
        "mtu",
        "command",
        "sysfs_root",
        "speed_mbps",
        "speeds_mbps",
        "lower_up",
        "macs",
        "slots",
    ];

    pub(crate) fn parse(f: &mut Fields<'_>, errors: &mut Vec<LoadError>) -> Option<EthernetExpect> {
        const SPEED_MAX: u64 = 3_200_000;
        let interfaces = f.opt_str_list("interfaces", None, errors);
        if interfaces.as_ref().is_none_or(|v| v.is_empty()) && f.take("interfaces").is_none() {
            f.missing("interfaces", errors);
        }
        let mtu = f.req_u64("mtu", 68..=65535, errors);
        Some(EthernetExpect {
            command: f
                .opt_str("command", errors)
                .unwrap_or_else(|| "ip -j link".into()),
            sysfs_root: f
                .opt_str("sysfs_root", errors)
                .unwrap_or_else(|| "/sys".into()),
            speed_mbps: f.opt_u64("speed_mbps", 10..=SPEED_MAX, errors),
            speeds_mbps: f
                .opt_u64_map("speeds_mbps", 10..=SPEED_MAX, errors)
                .unwrap_or_default(),
            lower_up: f.opt_bool("lower_up", errors).unwrap_or(true),
            macs: f.opt_str_map("macs", None, errors).unwrap_or_default(),
            slots: f.opt_str_map("slots", None, errors).unwrap_or_default(),
            interfaces: interfaces?,
            mtu: mtu?,
        })
    }

    /// The links command followed by the sysfs loop over the listed interfaces (an `echo`
    /// between them, so a links command whose output lacks a final newline still ends its line).
    pub fn full_command(&self) -> String {
        let root = self.sysfs_root.trim_end_matches('/');
        format!(
            "{}; echo; for i in {}; do d={root}/class/net/$i; \
             printf 'speed\\t%s\\t%s\\n' \"$i\" \"$(cat \"$d/speed\" 2>/dev/null)\"; \
             printf 'permaddr\\t%s\\t%s\\n' \"$i\" \"$(cat \"$d/bonding_slave/perm_hwaddr\" 2>/dev/null)\"; \
             printf 'address\\t%s\\t%s\\n' \"$i\" \"$(cat \"$d/address\" 2>/dev/null)\"; \
             [ -e \"$d/device\" ] && printf 'pci\\t%s\\t%s\\n' \"$i\" \"$(basename \"$(readlink -f \"$d/device\")\")\"; \
             done; true",
            self.command,
            self.interfaces.join(" ")
        )
    }

    fn speed_for(&self, ifname: &str) -> Option<u64> {
        self.speeds_mbps
            .iter()
            .find(|(i, _)| i == ifname)
            .map(|(_, s)| *s)
            .or(self.speed_mbps)
    }

    pub fn evaluate(
        &self,
        name: &str,
        dump: &EthDump,
        labels: &BTreeMap<String, String>,
    ) -> CheckResult {
        let mut findings = Vec::new();
        let mut seen = Vec::new();
        for want in &self.interfaces {
            let sys = dump.sysfs.get(want).cloned().unwrap_or_default();
            let component = Component::new(ComponentKind::Nic)
                .name(want.clone())
                .pci(sys.get("pci").cloned());
            let mut fault = |code: &str, action: Action, message: String| {
                findings.push(Finding::new(component.clone(), code, action, message));
            };
            let Some(l) = dump.links.iter().find(|l| l.ifname == *want) else {
                fault(
                    "eth_missing",
                    Action::Investigate,
                    format!("{want}: interface missing"),
                );
                continue;
            };
            let state = l.operstate.as_deref().unwrap_or("(missing)");
            if state != "UP" {
                fault(
                    "eth_down",
                    Action::ReseatCable,
                    format!("{want}: operstate {state}, expected UP"),
                );
            }
            if self.lower_up && state == "UP" && !l.flags.iter().any(|f| f == "LOWER_UP") {
                fault(
                    "eth_no_carrier",
                    Action::ReseatCable,
                    format!("{want}: no carrier (flags {:?} lack LOWER_UP)", l.flags),
                );
            }
            match l.mtu {
                Some(m) if m == self.mtu => {}
                Some(m) => fault(
                    "eth_mtu",
                    Action::Config,
                    format!("{want}: MTU {m}, expected {}", self.mtu),
                ),
                None => fault("eth_mtu", Action::Config, format!("{want}: MTU missing")),
            }
            let speed = sys.get("speed").and_then(|s| s.parse::<i64>().ok());
            if let Some(expected) = self.speed_for(want) {
                match speed {
                    Some(s) if s == expected as i64 => {}
                    // -1: no link, or a driver that cannot tell.
                    Some(s) => fault(
                        "eth_speed",
                        Action::ReseatCable,
                        format!("{want}: link speed {s} Mb/s, expected {expected} Mb/s"),
                    ),
                    None => fault(
                        "eth_speed",
                        Action::Investigate,
                        format!(
                            "{want}: link speed unreadable ({}/class/net/{want}/speed), expected {expected} Mb/s",
                            self.sysfs_root
                        ),
                    ),
                }
            }
            let mac = sys
                .get("permaddr")
                .cloned()
                .or_else(|| l.permaddr.clone())
                .or_else(|| sys.get("address").cloned())
                .or_else(|| l.address.clone());
            let want_mac = labels.get(&format!("mac.{want}")).cloned().or_else(|| {
                self.macs
                    .iter()
                    .find(|(i, _)| i == want)
                    .map(|(_, m)| m.clone())
            });
            if let Some(expected) = &want_mac {
                match &mac {
                    Some(m) if m.eq_ignore_ascii_case(expected) => {}
                    other => fault(
                        "eth_mac",
                        Action::Investigate,
                        format!(
                            "{want}: MAC {}, expected {expected} (a swapped NIC or cable)",
                            other.as_deref().unwrap_or("(unreadable)")
                        ),
                    ),
                }
            }
            if let Some((_, slot)) = self.slots.iter().find(|(i, _)| i == want) {
                match sys.get("pci") {
                    Some(p) if p.eq_ignore_ascii_case(slot) => {}
                    other => fault(
                        "eth_slot",
                        Action::Investigate,
                        format!(
                            "{want}: in PCI slot {}, expected {slot}",
                            other.map(String::as_str).unwrap_or("(unknown)")
                        ),
                    ),
                }
            }
            seen.push(json!({
                "ifname": l.ifname, "operstate": l.operstate, "mtu": l.mtu, "flags": l.flags,
                "speed_mbps": speed, "mac": mac, "pci": sys.get("pci"),
            }));
        }
        CheckResult::from_findings(
            name,
            findings,
            format!(
                "{} interfaces UP with MTU {}",
                self.interfaces.len(),
                self.mtu
            ),
            json!({ "interfaces": seen, "expected_mtu": self.mtu }),
        )
        .evidence(serde_json::to_value(dump).unwrap_or(Value::Null))
    }
}
