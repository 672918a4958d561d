//! Shared test helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use kiln_checks::{CheckContext, FirmwareBaseline, NodeTarget};
use time::macros::datetime;

pub fn node(gpu_count: u32) -> NodeTarget {
    NodeTarget {
        hostname: "gpu-a-01".into(),
        rack: "a".into(),
        bmc_address: "127.0.0.1".into(),
        gpu_model: if gpu_count > 0 {
            "H100-SXM".into()
        } else {
            String::new()
        },
        gpu_count,
        firmware: FirmwareBaseline {
            bmc: Some("1.45.455b66-rev4".into()),
            bios: Some("P79 v1.45".into()),
            gpu_vbios: Some("96.00.74.00.01".into()),
            nic: Some("20.31.2354".into()),
        },
        registered_at: datetime!(2012-01-01 00:00 UTC),
        labels: Default::default(),
    }
}

pub fn ctx(gpu_count: u32, budget: Duration) -> CheckContext {
    CheckContext::new(node(gpu_count), tokio::time::Instant::now() + budget)
}

/// The repository's `fixtures/` (recordings with their SOURCE and LICENSE; fixtures/README.md).
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// A file of Kiln's own recordings (`fixtures/kiln`).
pub fn own_fixture(name: &str) -> String {
    let p = fixtures().join("kiln").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
