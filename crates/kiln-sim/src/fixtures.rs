//! The recorded data simulated nodes replay, loaded once per fleet and shared by every node:
//! the DMTF `public-rackmount1` Redfish mockup (BSD-3-Clause, see fixtures/redfish/LICENSE.md),
//! the gcm sysfs and `ip -j` snapshots (MIT, see fixtures/sysfs/LICENSE), and the H100 probe
//! recording in fixtures/kiln (the one kiln-checks' tests read).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use kiln_checks::RecordedGpus;
use serde_json::Value;

const MOCKUP: &str = "redfish/public-rackmount1";
const PROBE_H100: &str = include_str!("../../../fixtures/kiln/probe-h100-healthy.json");
/// fio's JSON of a write/verify pass (recorded with fio 3.33, fixtures/kiln/README.md).
pub const FIO_PASS: &str = include_str!("../../../fixtures/kiln/fio-verify-pass.json");

/// Interface -> (link speed in Mb/s, permanent MAC), as a gcm Ethernet snapshot records them.
pub type EthSysfs = BTreeMap<String, (String, String)>;

pub struct Fixtures {
    /// Redfish path (`/redfish/v1/...`, no trailing slash) -> document.
    pub redfish: HashMap<String, Value>,
    /// The mockup's one ComputerSystem (`/redfish/v1/Systems/<id>`).
    pub system_path: String,
    /// Entries collections of the system's logs.
    pub sel_entries_paths: Vec<String>,
    /// sysfs path -> content, per snapshot name.
    pub sysfs: HashMap<&'static str, BTreeMap<String, String>>,
    /// `ip -j link` output, per snapshot name.
    pub ip_link: HashMap<&'static str, String>,
    /// Per Ethernet snapshot: interface -> link speed (Mb/s) and permanent MAC.
    pub eth_sysfs: HashMap<&'static str, EthSysfs>,
    /// `smartctl -x --json` of the recorded node's ten healthy NVMe drives.
    pub smartctl: Vec<Value>,
    pub probe: RecordedGpus,
}

/// `KILN_FIXTURES`, else `explicit`, else the repository's `fixtures/` (each recording with
/// its LICENSE and SOURCE, so `kiln sim` and `kiln demo` work from a bare checkout). Nothing
/// outside the checkout is looked at.
pub fn locate(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("KILN_FIXTURES") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    if dir.join(MOCKUP).is_dir() {
        return Ok(dir);
    }
    bail!(
        "cannot find the fixtures at {} (the repository's fixtures/); set KILN_FIXTURES or --fixtures",
        dir.display()
    )
}

impl Fixtures {
    pub fn load(dir: &Path) -> anyhow::Result<Fixtures> {
        let root = dir.join(MOCKUP);
        let mut redfish = HashMap::new();
        load_mockup(&root, &root, &mut redfish)
            .with_context(|| format!("reading the Redfish mockup {}", root.display()))?;
        for doc in redfish.values_mut() {
            make_healthy(doc);
        }
        let system_path = redfish
            .get("/redfish/v1/Systems")
            .and_then(|c| c.pointer("/Members/0/@odata.id"))
            .and_then(Value::as_str)
            .map(|s| s.trim_end_matches('/').to_string())
            .ok_or_else(|| anyhow!("{}: no ComputerSystem in Systems", root.display()))?;
        let mut sel_entries_paths = Vec::new();
        let logs = redfish
            .get(&format!("{system_path}/LogServices"))
            .and_then(|c| c.get("Members"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for l in logs {
            let id = l.get("@odata.id").and_then(Value::as_str).unwrap_or("");
            if let Some(e) = redfish
                .get(id.trim_end_matches('/'))
                .and_then(|d| d.pointer("/Entries/@odata.id"))
                .and_then(Value::as_str)
            {
                sel_entries_paths.push(e.trim_end_matches('/').to_string());
            }
        }
        if sel_entries_paths.is_empty() {
            bail!("{}: the system has no log with Entries", root.display());
        }
        for needed in [
            "/redfish/v1/UpdateService/FirmwareInventory/BMC",
            "/redfish/v1/UpdateService/FirmwareInventory/BIOS",
        ] {
            if !redfish.contains_key(needed) {
                bail!("{}: {needed} missing", root.display());
            }
        }
        let mut sysfs = HashMap::new();
        for name in ["learn_good", "learn_stuck_ib_intf"] {
            sysfs.insert(name, load_sysfs(dir, name)?);
        }
        let mut ip_link = HashMap::new();
        let mut eth_sysfs = HashMap::new();
        for name in [
            "eth_learn_good",
            "eth_learn_down_intf",
            "eth_learn_degraded_intf",
        ] {
            let (links, sysfs) = load_eth(dir, name)?;
            ip_link.insert(name, links);
            eth_sysfs.insert(name, sysfs);
        }
        let mut smartctl = Vec::new();
        for i in 0..10 {
            let path = dir.join(format!("smartctl/learn_good/nvme{i}.json"));
            let text =
                std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
            smartctl.push(serde_json::from_str(&text).with_context(|| path.display().to_string())?);
        }
        let probe = RecordedGpus::from_json(PROBE_H100).context("the recorded H100 probe")?;
        Ok(Fixtures {
            redfish,
            system_path,
            sel_entries_paths,
            sysfs,
            ip_link,
            eth_sysfs,
            smartctl,
            probe,
        })
    }
}

/// Every `index.json` under `dir`, keyed by its Redfish path.
fn load_mockup(root: &Path, dir: &Path, out: &mut HashMap<String, Value>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.is_dir() {
            load_mockup(root, &path, out)?;
        } else if path.file_name().is_some_and(|n| n == "index.json") {
            let rel = path
                .parent()
                .and_then(|p| p.strip_prefix(root).ok())
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            let key = if rel.is_empty() {
                "/redfish/v1".to_string()
            } else {
                format!("/redfish/v1/{rel}")
            };
            let text = std::fs::read_to_string(&path)?;
            let doc: Value =
                serde_json::from_str(&text).with_context(|| path.display().to_string())?;
            out.insert(key, doc);
        }
    }
    Ok(())
}

/// The mockup is a failing node (a Warning rollup from a CPU temperature condition); a
/// simulated node is healthy unless a fault says otherwise.
fn make_healthy(doc: &mut Value) {
    if let Some(status) = doc.get_mut("Status").and_then(Value::as_object_mut) {
        for key in ["Health", "HealthRollup"] {
            if status.get(key).and_then(Value::as_str).is_some() {
                status.insert(key.into(), Value::from("OK"));
            }
        }
        status.remove("Conditions");
    }
}

fn load_sysfs(dir: &Path, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let path = dir.join("sysfs").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let map: BTreeMap<String, String> =
        serde_json::from_str(&text).with_context(|| path.display().to_string())?;
    Ok(map)
}

/// A gcm Ethernet snapshot: its `ip -j link` JSON, and per interface its `link_speed` and
/// `phys_macaddr`.
fn load_eth(dir: &Path, name: &str) -> anyhow::Result<(String, EthSysfs)> {
    let path = dir.join("sysfs").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let doc: Value = serde_json::from_str(&text).with_context(|| path.display().to_string())?;
    let links = doc
        .get("intf_status")
        .ok_or_else(|| anyhow!("{}: no intf_status", path.display()))?;
    let mut sysfs = BTreeMap::new();
    for (ifname, speed) in doc
        .get("link_speed")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let mac = doc
            .pointer(&format!("/phys_macaddr/{ifname}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        sysfs.insert(
            ifname.clone(),
            (speed.as_str().unwrap_or("").to_string(), mac),
        );
    }
    Ok((links.to_string(), sysfs))
}
