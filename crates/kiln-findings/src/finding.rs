//! Findings: what a failing check found, one per component and fault, with the action a
//! hardware engineer takes. A check result carries its findings; `analysis` groups them per
//! component across checks and attempts.
//!
//! Actions for Xids and DCGM failure codes come from the versioned tables (`tables`); the
//! other checks name their action where they build the finding.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Most evidence lines one finding keeps (the result's `evidence` keeps everything raw).
pub const FINDING_EVIDENCE_LINES_MAX: usize = 8;
/// Longest evidence line kept, in characters.
pub const FINDING_EVIDENCE_LINE_CHARS_MAX: usize = 400;
/// Most counters one finding keeps.
pub const FINDING_COUNTERS_MAX: usize = 8;

/// The kind of part a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComponentKind {
    Gpu,
    Nvswitch,
    Hca,
    Nic,
    Psu,
    Fan,
    Disk,
    Bmc,
    Cpu,
    Memory,
    /// The system board / chassis (temperature sensors, PCIe slots, firmware).
    Board,
    /// The node as a whole (unreachable, software configuration, nothing more specific known).
    Node,
}

impl ComponentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentKind::Gpu => "gpu",
            ComponentKind::Nvswitch => "nvswitch",
            ComponentKind::Hca => "hca",
            ComponentKind::Nic => "nic",
            ComponentKind::Psu => "psu",
            ComponentKind::Fan => "fan",
            ComponentKind::Disk => "disk",
            ComponentKind::Bmc => "bmc",
            ComponentKind::Cpu => "cpu",
            ComponentKind::Memory => "memory",
            ComponentKind::Board => "board",
            ComponentKind::Node => "node",
        }
    }

    /// How a report names it: `GPU`, `HCA`, `PSU`.
    pub fn label(self) -> &'static str {
        match self {
            ComponentKind::Gpu => "GPU",
            ComponentKind::Nvswitch => "NVSwitch",
            ComponentKind::Hca => "HCA",
            ComponentKind::Nic => "NIC",
            ComponentKind::Psu => "PSU",
            ComponentKind::Fan => "fan",
            ComponentKind::Disk => "disk",
            ComponentKind::Bmc => "BMC",
            ComponentKind::Cpu => "CPU",
            ComponentKind::Memory => "memory",
            ComponentKind::Board => "board",
            ComponentKind::Node => "node",
        }
    }
}

/// The part a finding is about, as exactly as the check could tell.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Component {
    pub kind: ComponentKind,
    /// GPU index (NVML), PSU or fan number, port number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// A name where the part has one: `mlx5_6`, `enp97s0f0`, `nvme9`, `Bay1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// PCI address as NVML or sysfs writes it (`00000000:3B:00.0`, `0000:0c:00.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// A physical location a person can find: SXM slot, PCIe slot label, PSU bay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
}

impl Component {
    pub fn new(kind: ComponentKind) -> Component {
        Component {
            kind,
            index: None,
            name: None,
            serial: None,
            uuid: None,
            pci_address: None,
            slot: None,
        }
    }

    pub fn node() -> Component {
        Component::new(ComponentKind::Node)
    }

    pub fn index(mut self, i: u32) -> Component {
        self.index = Some(i);
        self
    }

    pub fn name(mut self, n: impl Into<String>) -> Component {
        self.name = Some(n.into());
        self
    }

    pub fn serial(mut self, s: Option<String>) -> Component {
        self.serial = s;
        self
    }

    pub fn uuid(mut self, u: Option<String>) -> Component {
        self.uuid = u;
        self
    }

    pub fn pci(mut self, p: Option<String>) -> Component {
        self.pci_address = p;
        self
    }

    pub fn slot(mut self, s: Option<String>) -> Component {
        self.slot = s;
        self
    }

    /// A stable key for grouping findings of one part across checks and attempts: the serial
    /// when known (it survives re-enumeration), else kind with index or name.
    pub fn key(&self) -> String {
        let who = self
            .serial
            .clone()
            .or_else(|| self.index.map(|i| i.to_string()))
            .or_else(|| self.name.clone())
            .or_else(|| self.pci_address.clone())
            .unwrap_or_default();
        format!("{}:{who}", self.kind.as_str())
    }
}

impl fmt::Display for Component {
    /// `GPU 3 (serial 1654922006537, SXM slot 3, 00000000:9B:00.0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind.label())?;
        if let Some(i) = self.index {
            write!(f, " {i}")?;
        }
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        let mut parts = Vec::new();
        if let Some(s) = &self.serial {
            parts.push(format!("serial {s}"));
        }
        if let Some(s) = &self.slot {
            parts.push(s.clone());
        }
        if let Some(p) = &self.pci_address {
            parts.push(p.clone());
        }
        if !parts.is_empty() {
            write!(f, " ({})", parts.join(", "))?;
        }
        Ok(())
    }
}

/// What a hardware engineer does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Return the part: run NVIDIA's field diagnostic, attach nvidia-bug-report.log.gz.
    Rma,
    ResetGpu,
    Reboot,
    ReflashFirmware,
    ReseatCable,
    /// A configuration fix (software, settings, manifest); the hardware may be fine.
    Config,
    Cooling,
    Investigate,
}

impl Action {
    /// Most severe first: a node's action is the first any of its findings has.
    pub const ORDER: [Action; 8] = [
        Action::Rma,
        Action::ReseatCable,
        Action::Cooling,
        Action::ReflashFirmware,
        Action::ResetGpu,
        Action::Reboot,
        Action::Config,
        Action::Investigate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Rma => "rma",
            Action::ResetGpu => "reset_gpu",
            Action::Reboot => "reboot",
            Action::ReflashFirmware => "reflash_firmware",
            Action::ReseatCable => "reseat_cable",
            Action::Config => "config",
            Action::Cooling => "cooling",
            Action::Investigate => "investigate",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        Action::ORDER.into_iter().find(|a| a.as_str() == s)
    }

    /// What the report tells the engineer to do, in a few words.
    pub fn label(self) -> &'static str {
        match self {
            Action::Rma => "RMA candidate",
            Action::ResetGpu => "reset the GPU",
            Action::Reboot => "reboot the node",
            Action::ReflashFirmware => "reflash firmware",
            Action::ReseatCable => "reseat cable/transceiver",
            Action::Config => "fix configuration",
            Action::Cooling => "check cooling",
            Action::Investigate => "investigate",
        }
    }

    /// The rank in `ORDER` (0 = most severe).
    pub fn rank(self) -> usize {
        Action::ORDER
            .iter()
            .position(|a| *a == self)
            .unwrap_or(Action::ORDER.len())
    }
}

/// One fault on one component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub component: Component,
    /// Machine-readable, stable across runs: `xid_79`, `row_remap_failure`,
    /// `DCGM_FR_FAULTY_MEMORY`, `ib_operstate_down`. Same code on the same component in two
    /// attempts is the same fault.
    pub code: String,
    pub action: Action,
    /// One line for a person, naming the value against its limit.
    pub message: String,
    /// The lines that prove it (an Xid line, DCGM's warning with its code, a SEL entry,
    /// counters before and after), at most `FINDING_EVIDENCE_LINES_MAX`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// Counter values behind the finding (`ecc_uncorrected_volatile: 12`), so a report can show
    /// them across attempts: growing counters and steady ones mean different things. At most
    /// `FINDING_COUNTERS_MAX`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

impl Finding {
    pub fn new(
        component: Component,
        code: impl Into<String>,
        action: Action,
        message: impl Into<String>,
    ) -> Finding {
        Finding {
            component,
            code: code.into(),
            action,
            message: message.into(),
            evidence: Vec::new(),
            counters: BTreeMap::new(),
        }
    }

    /// Records a counter value (dropped past `FINDING_COUNTERS_MAX` names).
    pub fn with_counter(mut self, name: impl Into<String>, value: u64) -> Finding {
        self.set_counter(name, value);
        self
    }

    /// `with_counter` on a finding already in place.
    pub fn set_counter(&mut self, name: impl Into<String>, value: u64) {
        let name = name.into();
        if self.counters.len() < FINDING_COUNTERS_MAX || self.counters.contains_key(&name) {
            self.counters.insert(name, value);
        }
    }

    /// Adds an evidence line (cut to its bound; lines past the bound are dropped).
    pub fn with_evidence(mut self, line: impl Into<String>) -> Finding {
        self.push_evidence(line);
        self
    }

    /// `with_evidence` on a finding already in place.
    pub fn push_evidence(&mut self, line: impl Into<String>) {
        if self.evidence.len() >= FINDING_EVIDENCE_LINES_MAX {
            return;
        }
        let line: String = line.into();
        let line = if line.chars().count() > FINDING_EVIDENCE_LINE_CHARS_MAX {
            let mut cut: String = line.chars().take(FINDING_EVIDENCE_LINE_CHARS_MAX).collect();
            cut.push('…');
            cut
        } else {
            line
        };
        self.evidence.push(line);
    }
}

/// The most severe action among `findings`, if any.
pub fn worst_action<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Option<Action> {
    findings
        .into_iter()
        .map(|f| f.action)
        .min_by_key(|a| a.rank())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_print_and_group() {
        let c = Component::new(ComponentKind::Gpu)
            .index(3)
            .serial(Some("1654922006537".into()))
            .slot(Some("SXM slot 3".into()))
            .pci(Some("00000000:9B:00.0".into()));
        assert_eq!(
            c.to_string(),
            "GPU 3 (serial 1654922006537, SXM slot 3, 00000000:9B:00.0)"
        );
        assert_eq!(c.key(), "gpu:1654922006537");
        assert_eq!(
            Component::new(ComponentKind::Hca).name("mlx5_6").key(),
            "hca:mlx5_6"
        );
        let f = Finding::new(c, "xid_79", Action::Reboot, "x").with_evidence("y".repeat(1000));
        assert!(f.evidence[0].chars().count() <= FINDING_EVIDENCE_LINE_CHARS_MAX + 1);
        let back: Finding =
            serde_json::from_str(&serde_json::to_string(&f).expect("ser")).expect("de");
        assert_eq!(back, f);
        assert_eq!(
            worst_action(&[
                Finding::new(Component::node(), "a", Action::Investigate, ""),
                Finding::new(Component::node(), "b", Action::Rma, ""),
            ]),
            Some(Action::Rma)
        );
    }
}
