//! `kiln probe` on whatever machine runs the tests: without a GPU it must say NVML is missing
//! (in the JSON and on stderr) and exit 2; with one it must report every GPU and exit 0 or 1.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn probe_reports_nvml_state_and_exits_accordingly() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("probe")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let available = report["nvml"]["available"]
        .as_bool()
        .expect("nvml.available is a bool");
    let code = out.status.code().expect("exit code");
    if available {
        assert!(code == 0 || code == 1, "exit {code} with NVML available");
        assert!(
            !report["gpus"].as_array().unwrap().is_empty(),
            "NVML available but no GPUs: {report}"
        );
        assert!(report["driver_version"].is_string());
    } else {
        assert_eq!(code, 2, "NVML missing must exit 2");
        assert!(
            report["nvml"]["error"].as_str().unwrap().contains("NVML"),
            "{report}"
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("NVML is not available"));
        assert_eq!(report["gpus"], serde_json::json!([]));
    }
}
