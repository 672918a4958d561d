//! NIC checks. InfiniBand from sysfs (`<root>/class/infiniband/*` and, where sysfs is a
//! snapshot without the class symlinks, `<root>/bus/pci/devices/*/infiniband/*`): port
//! `state` ACTIVE, `phys_state` LinkUp, `rate` equal to the expected rate, HCA `fw_ver` in
//! the allowed list, HCA count. Ethernet from `ip -j link`: expected interfaces present,
//! operstate UP, MTU as expected.
//!
//! Both parse text (the agent fetches it over the node's shell); the checks run the
//! commands through `CheckContext::shell`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::gpu::tail;
use crate::yaml::{Fields, LoadError};

/// Files read per HCA and per port.
const HCA_FILES: [&str; 1] = ["fw_ver"];
const PORT_FILES: [&str; 4] = ["state", "phys_state", "rate", "link_layer"];

/// The shell command that dumps the InfiniBand sysfs files under `root` as
/// `path<TAB>content` lines (one per file; content is one line in these files).
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
    }
    format!(
        "for f in {}; do [ -f \"$f\" ] && printf '%s\\t%s\\n' \"$f\" \"$(head -n 1 \"$f\" 2>/dev/null)\"; done; true",
        globs.join(" ")
    )
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IbHca {
    pub name: String,
    pub fw_ver: Option<String>,
    pub ports: BTreeMap<u32, IbPort>,
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
}

/// Parses a `path<TAB>content` dump into HCAs, keyed by HCA name (so the class and PCI
/// paths of one HCA merge). Lines that are not sysfs InfiniBand files are ignored.
pub fn parse_ib_dump(dump: &str) -> BTreeMap<String, IbHca> {
    let mut hcas: BTreeMap<String, IbHca> = BTreeMap::new();
    for line in dump.lines() {
        let Some((path, content)) = line.split_once('\t') else {
            continue;
        };
        let content = content.trim().to_string();
        let parts: Vec<&str> = path.split('/').collect();
        let Some(ib) = parts.iter().rposition(|p| *p == "infiniband") else {
            continue;
        };
        let rest = &parts[ib + 1..];
        match rest {
            [hca, file] if HCA_FILES.contains(file) => {
                let h = hcas.entry(hca.to_string()).or_default();
                h.name = hca.to_string();
                h.fw_ver = Some(content);
            }
            [hca, "ports", port, file] if PORT_FILES.contains(file) => {
                let Ok(port) = port.parse::<u32>() else {
                    continue;
                };
                let h = hcas.entry(hca.to_string()).or_default();
                h.name = hca.to_string();
                let p = h.ports.entry(port).or_default();
                let slot = match *file {
                    "state" => &mut p.state,
                    "phys_state" => &mut p.phys_state,
                    "rate" => &mut p.rate,
                    _ => &mut p.link_layer,
                };
                *slot = Some(content);
            }
            _ => {}
        }
    }
    hcas
}

#[derive(Debug, Clone, PartialEq)]
pub struct InfinibandExpect {
    /// HCAs with at least one InfiniBand port (RoCE-only HCAs are not counted).
    pub hca_count: u64,
    pub rate_gbps: u64,
    /// Accepted HCA `fw_ver` values; empty accepts any.
    pub fw_versions: Vec<String>,
    pub sysfs_root: String,
}

impl InfinibandExpect {
    pub const FIELDS: [&'static str; 4] = ["hca_count", "rate_gbps", "fw_versions", "sysfs_root"];

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
        Some(InfinibandExpect {
            hca_count: hca_count?,
            rate_gbps: rate_gbps?,
            fw_versions,
            sysfs_root,
        })
    }

    /// Evaluates parsed HCAs: every problem names the HCA, the port and the value.
    pub fn evaluate(&self, name: &str, hcas: &BTreeMap<String, IbHca>) -> CheckResult {
        let mut problems = Vec::new();
        let ib_hcas: Vec<&IbHca> = hcas
            .values()
            .filter(|h| {
                h.ports
                    .values()
                    .any(|p| p.link_layer.as_deref().unwrap_or("InfiniBand") == "InfiniBand")
            })
            .collect();
        if ib_hcas.len() as u64 != self.hca_count {
            problems.push(format!(
                "{} InfiniBand HCAs found ({}), expected {}",
                ib_hcas.len(),
                ib_hcas
                    .iter()
                    .map(|h| h.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.hca_count
            ));
        }
        let mut ports_checked = 0u64;
        for h in &ib_hcas {
            if !self.fw_versions.is_empty() {
                match &h.fw_ver {
                    Some(v) if self.fw_versions.contains(v) => {}
                    Some(v) => problems.push(format!(
                        "{}: firmware {v:?}, expected one of {:?}",
                        h.name, self.fw_versions
                    )),
                    None => problems.push(format!("{}: fw_ver missing", h.name)),
                }
            }
            for (num, p) in &h.ports {
                if p.link_layer.as_deref().unwrap_or("InfiniBand") != "InfiniBand" {
                    continue;
                }
                ports_checked += 1;
                let port = format!("{} port {num}", h.name);
                let state = p.state.as_deref().unwrap_or("(missing)");
                if !state_is(state, "ACTIVE") {
                    problems.push(format!("{port}: state {state:?}, expected ACTIVE"));
                }
                let phys = p.phys_state.as_deref().unwrap_or("(missing)");
                if !state_is(phys, "LinkUp") {
                    problems.push(format!("{port}: phys_state {phys:?}, expected LinkUp"));
                }
                match p.rate_gbps() {
                    Some(r) if (r - self.rate_gbps as f64).abs() < 0.5 => {}
                    _ => problems.push(format!(
                        "{port}: rate {:?}, expected {} Gb/sec",
                        p.rate.as_deref().unwrap_or("(missing)"),
                        self.rate_gbps
                    )),
                }
            }
        }
        let measured = json!({
            "hca_count": ib_hcas.len(),
            "ports_checked": ports_checked,
            "expected": { "hca_count": self.hca_count, "rate_gbps": self.rate_gbps, "fw_versions": self.fw_versions },
        });
        CheckResult::from_problems(
            name,
            problems,
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
}

/// Parses `ip -j link` (or `ip -j addr`) output.
pub fn parse_ip_links(json_text: &str) -> Result<Vec<IpLink>, String> {
    serde_json::from_str(json_text.trim()).map_err(|e| format!("not `ip -j link` JSON: {e}"))
}

#[derive(Debug, Clone, PartialEq)]
pub struct EthernetExpect {
    pub interfaces: Vec<String>,
    pub mtu: u64,
    pub command: String,
}

impl EthernetExpect {
    pub const FIELDS: [&'static str; 3] = ["interfaces", "mtu", "command"];

    pub(crate) fn parse(f: &mut Fields<'_>, errors: &mut Vec<LoadError>) -> Option<EthernetExpect> {
        let interfaces = f.opt_str_list("interfaces", None, errors);
        if interfaces.as_ref().is_none_or(|v| v.is_empty()) && f.take("interfaces").is_none() {
            f.missing("interfaces", errors);
        }
        let mtu = f.req_u64("mtu", 68..=65535, errors);
        let command = f
            .opt_str("command", errors)
            .unwrap_or_else(|| "ip -j link".into());
        Some(EthernetExpect {
            interfaces: interfaces?,
            mtu: mtu?,
            command,
        })
    }

    pub fn evaluate(&self, name: &str, links: &[IpLink]) -> CheckResult {
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        for want in &self.interfaces {
            let Some(l) = links.iter().find(|l| l.ifname == *want) else {
                problems.push(format!("{want}: interface missing"));
                continue;
            };
            let state = l.operstate.as_deref().unwrap_or("(missing)");
            if state != "UP" {
                problems.push(format!("{want}: operstate {state}, expected UP"));
            }
            match l.mtu {
                Some(m) if m == self.mtu => {}
                Some(m) => problems.push(format!("{want}: MTU {m}, expected {}", self.mtu)),
                None => problems.push(format!("{want}: MTU missing")),
            }
            seen.push(json!({ "ifname": l.ifname, "operstate": l.operstate, "mtu": l.mtu }));
        }
        CheckResult::from_problems(
            name,
            problems,
            format!(
                "{} interfaces UP with MTU {}",
                self.interfaces.len(),
                self.mtu
            ),
            json!({ "interfaces": seen, "expected_mtu": self.mtu }),
        )
        .evidence(serde_json::to_value(links).unwrap_or(Value::Null))
    }
}

/// A NIC check as a playbook step.
pub struct NicCheck {
    pub name: String,
    pub kind: NicExpect,
    pub command_timeout: std::time::Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NicExpect {
    Infiniband(InfinibandExpect),
    Ethernet(EthernetExpect),
}

impl Check for NicCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let shell = match ctx.shell() {
                Ok(s) => s,
                Err(e) => return CheckResult::error(&self.name, e),
            };
            let command = match &self.kind {
                NicExpect::Infiniband(t) => ib_dump_command(&t.sysfs_root),
                NicExpect::Ethernet(t) => t.command.clone(),
            };
            let timeout = self.command_timeout.min(ctx.remaining());
            let out = match shell.exec(&command, timeout).await {
                Ok(o) => o,
                Err(e) => {
                    return CheckResult::error(
                        &self.name,
                        format!("{} on {}: {e}", self.name, shell.describe()),
                    )
                }
            };
            match &self.kind {
                NicExpect::Infiniband(t) => t.evaluate(&self.name, &parse_ib_dump(&out.stdout)),
                NicExpect::Ethernet(t) => {
                    if out.exit_code != Some(0) {
                        return CheckResult::error(
                            &self.name,
                            format!(
                                "`{command}` exited with {:?}: {}",
                                out.exit_code,
                                tail(&out.stderr, 300)
                            ),
                        );
                    }
                    match parse_ip_links(&out.stdout) {
                        Ok(links) => t.evaluate(&self.name, &links),
                        Err(e) => CheckResult::error(&self.name, e)
                            .evidence(json!({ "stdout": tail(&out.stdout, 2000) })),
                    }
                }
            }
        })
    }
}
