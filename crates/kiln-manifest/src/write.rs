//! Writing manifests: the inverse of parsing, used by tests, the benchmark and tools that
//! generate manifests. Every writer's output parses back to the same nodes.

use crate::{Format, NodeSpec, FIELDS};

/// Serialises `nodes` in `format`.
pub fn write(nodes: &[NodeSpec], format: Format) -> String {
    match format {
        Format::Csv => write_csv(nodes),
        Format::Json => write_json(nodes),
        Format::Yaml => write_yaml(nodes),
    }
}

fn labels_text(node: &NodeSpec) -> String {
    node.labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

fn write_csv(nodes: &[NodeSpec]) -> String {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    // Writing to a Vec cannot fail; a failure here would be a bug in csv.
    let mut row = |cells: &[&str]| {
        if let Err(e) = w.write_record(cells) {
            unreachable!("csv write to memory failed: {e}");
        }
    };
    row(&FIELDS);
    for n in nodes {
        let count = n.gpu_count.to_string();
        let labels = labels_text(n);
        row(&[
            &n.hostname,
            &n.rack,
            &n.bmc_address,
            &n.gpu_model,
            &count,
            &n.firmware_bmc,
            &n.firmware_bios,
            &n.firmware_gpu_vbios,
            &n.firmware_nic,
            &labels,
        ]);
    }
    match w.into_inner() {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => unreachable!("csv flush to memory failed: {e}"),
    }
}

fn write_json(nodes: &[NodeSpec]) -> String {
    match serde_json::to_string_pretty(nodes) {
        Ok(s) => s + "\n",
        Err(e) => unreachable!("NodeSpec always serialises: {e}"),
    }
}

/// A double-quoted YAML scalar; JSON string escapes are valid YAML double-quoted escapes.
fn q(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn write_yaml(nodes: &[NodeSpec]) -> String {
    let mut out = String::from("nodes:\n");
    for n in nodes {
        out.push_str(&format!("  - hostname: {}\n", q(&n.hostname)));
        out.push_str(&format!("    rack: {}\n", q(&n.rack)));
        out.push_str(&format!("    bmc_address: {}\n", q(&n.bmc_address)));
        out.push_str(&format!("    gpu_model: {}\n", q(&n.gpu_model)));
        out.push_str(&format!("    gpu_count: {}\n", n.gpu_count));
        out.push_str(&format!("    firmware_bmc: {}\n", q(&n.firmware_bmc)));
        out.push_str(&format!("    firmware_bios: {}\n", q(&n.firmware_bios)));
        out.push_str(&format!(
            "    firmware_gpu_vbios: {}\n",
            q(&n.firmware_gpu_vbios)
        ));
        out.push_str(&format!("    firmware_nic: {}\n", q(&n.firmware_nic)));
        if n.labels.is_empty() {
            out.push_str("    labels: {}\n");
        } else {
            out.push_str("    labels:\n");
            for (k, v) in &n.labels {
                out.push_str(&format!("      {}: {}\n", q(k), q(v)));
            }
        }
    }
    out
}
