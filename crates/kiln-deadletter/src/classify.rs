//! Suggested action classes, derived from a dead-lettered node's failing checks (docs/deadletter.md,
//! "Action classes", keeps the same rules in words).
//!
//! Each failing check gets a class from its name (the playbook step name, which defaults to
//! the check kind) and, where the name alone does not say, from its message and measured
//! values. A node's class is the first, in this order, that any of its failing checks has:
//! GPU, NIC/cable, firmware, BMC, unknown. The order is "what must a person do at the rack":
//! a GPU or a cable needs hands on the hardware and dominates; a firmware update is remote but
//! must precede a retest; a BMC problem alone usually means the node itself may be fine.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionClass {
    /// Reseat or replace a GPU (GPU health, memory errors, PCIe link, NVLink, stress).
    Gpu,
    /// Check or replace the NIC, transceiver or cable (link state, rate, MTU).
    NicCable,
    /// Update firmware to the manifest's baseline (BMC, BIOS, VBIOS, NIC).
    Firmware,
    /// Look at the BMC (health, event log, power state, Redfish unreachable).
    Bmc,
    /// Nothing above matched (or nothing could be measured): look at the evidence.
    Unknown,
}

impl ActionClass {
    /// Node-level priority, highest first.
    pub const PRIORITY: [ActionClass; 5] = [
        ActionClass::Gpu,
        ActionClass::NicCable,
        ActionClass::Firmware,
        ActionClass::Bmc,
        ActionClass::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActionClass::Gpu => "gpu",
            ActionClass::NicCable => "nic_cable",
            ActionClass::Firmware => "firmware",
            ActionClass::Bmc => "bmc",
            ActionClass::Unknown => "unknown",
        }
    }

    /// What the report tells the engineer.
    pub fn label(self) -> &'static str {
        match self {
            ActionClass::Gpu => "reseat/replace GPU",
            ActionClass::NicCable => "NIC/cable",
            ActionClass::Firmware => "firmware update",
            ActionClass::Bmc => "BMC",
            ActionClass::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> ActionClass {
        Self::PRIORITY
            .into_iter()
            .find(|c| c.as_str() == s)
            .unwrap_or(ActionClass::Unknown)
    }
}

/// Words in a message or measured values that point at firmware levels.
const FIRMWARE_WORDS: [&str; 4] = ["firmware", "fw_ver", "vbios", "bios version"];

/// The class of one failing check.
pub fn classify_check(name: &str, message: &str, measured: &serde_json::Value) -> ActionClass {
    let name = name.to_ascii_lowercase();
    let text = format!("{} {}", message.to_ascii_lowercase(), measured).to_ascii_lowercase();
    let mentions = |words: &[&str]| words.iter().any(|w| text.contains(w));
    // Firmware first: `gpu_firmware` and `bmc_firmware` are firmware, not GPU or BMC faults,
    // and an InfiniBand failure that names `fw_ver` is an HCA firmware mismatch.
    if name.contains("firmware") || name.ends_with("_fw") {
        return ActionClass::Firmware;
    }
    let nic = ["infiniband", "ethernet", "nic", "ib_", "eth"]
        .iter()
        .any(|p| name.starts_with(p));
    if nic {
        // Only the message counts here: NIC checks always list the firmware they saw among
        // their measured values, so those would make every NIC failure a firmware one.
        let message = message.to_ascii_lowercase();
        return if FIRMWARE_WORDS.iter().any(|w| message.contains(w)) {
            ActionClass::Firmware
        } else {
            ActionClass::NicCable
        };
    }
    let gpu = name.starts_with("gpu")
        || name.starts_with("dcgm")
        || name.starts_with("nvlink")
        || name.contains("gpu_burn");
    if gpu {
        return ActionClass::Gpu;
    }
    if name.starts_with("bmc") || name.starts_with("redfish") {
        // The BMC's inventory failing on a GPU (missing, unhealthy, PCIe below its maximum)
        // is a GPU fault seen through the BMC.
        return if name.contains("inventory") && mentions(&["gpu", "pcie", "processor"]) {
            ActionClass::Gpu
        } else {
            ActionClass::Bmc
        };
    }
    // Custom step names: fall back to the words of the result.
    if mentions(&FIRMWARE_WORDS) {
        ActionClass::Firmware
    } else if mentions(&["xid", "ecc", "nvlink", "row remap", "retired page", "gpu "]) {
        ActionClass::Gpu
    } else if mentions(&[
        "link down",
        "linkdown",
        "operstate",
        "infiniband",
        "mtu",
        "cable",
    ]) {
        ActionClass::NicCable
    } else if mentions(&["redfish", "bmc", "sel entry"]) {
        ActionClass::Bmc
    } else {
        ActionClass::Unknown
    }
}

/// A node's class from its failing checks' classes (see the module docs for the order).
pub fn classify_node(checks: impl IntoIterator<Item = ActionClass>) -> ActionClass {
    checks
        .into_iter()
        .min_by_key(|c| ActionClass::PRIORITY.iter().position(|p| p == c))
        .unwrap_or(ActionClass::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn c(name: &str, message: &str) -> ActionClass {
        classify_check(name, message, &json!({}))
    }

    #[test]
    fn check_names() {
        for gpu in [
            "gpu_inventory",
            "gpu_ecc",
            "gpu_row_remap",
            "gpu_retired_pages",
            "gpu_pcie",
            "gpu_nvlink",
            "gpu_xid",
            "gpu_thermal",
            "dcgm_diag",
            "gpu_burn",
            "gpu_ecc_after_stress",
        ] {
            assert_eq!(c(gpu, ""), ActionClass::Gpu, "{gpu}");
        }
        for fw in ["gpu_firmware", "bmc_firmware"] {
            assert_eq!(
                c(fw, "VBIOS 96.00.1 differs"),
                ActionClass::Firmware,
                "{fw}"
            );
        }
        assert_eq!(
            c(
                "infiniband",
                "mlx5_6 port 1: state \"2: INIT\", expected ACTIVE"
            ),
            ActionClass::NicCable
        );
        assert_eq!(
            c("ethernet", "enp225s0f0: operstate DOWN"),
            ActionClass::NicCable
        );
        assert_eq!(
            c(
                "infiniband",
                "mlx5_2: fw_ver 28.39.1002 not in [28.40.1000]"
            ),
            ActionClass::Firmware
        );
        assert_eq!(c("bmc_health", "HealthRollup Warning"), ActionClass::Bmc);
        assert_eq!(c("bmc_sel", "1 Critical SEL entry"), ActionClass::Bmc);
        assert_eq!(
            c("bmc_inventory", "GPU 3 health Critical"),
            ActionClass::Gpu
        );
        assert_eq!(c("bmc_inventory", "power state Off"), ActionClass::Bmc);
        assert_eq!(c("command", "stress-ng exited 1"), ActionClass::Unknown);
        assert_eq!(
            c("playbook", "run exceeded its timeout"),
            ActionClass::Unknown
        );
    }

    #[test]
    fn custom_names_fall_back_to_words_and_values() {
        assert_eq!(c("step7", "Xid 79 on GPU 0000:1b:00.0"), ActionClass::Gpu);
        assert_eq!(
            classify_check("custom", "", &json!({"nvlink": {"replay_errors": 12}})),
            ActionClass::Gpu
        );
        assert_eq!(
            c("custom", "bond0 MTU 1500, expected 9000"),
            ActionClass::NicCable
        );
        assert_eq!(
            c("custom", "BIOS version 2.3.0, baseline 2.3.1"),
            ActionClass::Firmware
        );
        assert_eq!(c("custom", "redfish: connection refused"), ActionClass::Bmc);
        assert_eq!(c("custom", "scripted Fail"), ActionClass::Unknown);
    }

    #[test]
    fn node_class_by_priority() {
        use ActionClass::*;
        assert_eq!(classify_node([]), Unknown);
        assert_eq!(classify_node([Bmc, Firmware]), Firmware);
        assert_eq!(classify_node([Unknown, Bmc]), Bmc);
        assert_eq!(classify_node([Firmware, NicCable, Bmc]), NicCable);
        assert_eq!(classify_node([Bmc, Gpu, NicCable]), Gpu);
        for class in ActionClass::PRIORITY {
            assert_eq!(ActionClass::parse(class.as_str()), class);
        }
        assert_eq!(ActionClass::parse("bogus"), Unknown);
    }

    #[test]
    fn nic_firmware_listed_among_measured_values_is_not_a_firmware_finding() {
        let measured = json!({"hcas": [{"name": "mlx5_8", "fw_ver": "20.31.2354"}]});
        assert_eq!(
            classify_check("infiniband", "mlx5_8 port 1: state \"2: INIT\"", &measured),
            ActionClass::NicCable
        );
        assert_eq!(
            classify_check("infiniband", "mlx5_8 fw_ver 20.1 not allowed", &measured),
            ActionClass::Firmware
        );
    }
}
