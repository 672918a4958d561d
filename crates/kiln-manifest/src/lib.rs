//! Rack manifests: parsing and validation, nothing else (no I/O, no network, no clock).
//!
//! A manifest lists the nodes arriving in one or more racks. It comes as CSV, JSON or YAML,
//! always with the same flat field names (see [`FIELDS`]):
//!
//! ```text
//! hostname,rack,bmc_address,gpu_model,gpu_count,firmware_bmc,firmware_bios,firmware_gpu_vbios,firmware_nic,labels
//! gpu-a-01,a,10.0.0.11,H100-SXM,8,1.10,2.3.1,96.00.74.00.01,28.39.1002,row=3;pod=p1
//! ```
//!
//! JSON and YAML take either a list of node objects or an object `{"nodes": [...]}`; labels
//! are a map there (`{"row": "3"}`) or the CSV form `"row=3;pod=p1"`.
//!
//! [`parse`] validates every row before returning anything: a manifest is accepted whole or
//! refused whole, with every error found (line, field, reason), so an operator fixes the file
//! once instead of once per error.

mod csv_format;
mod json_format;
mod raw;
mod validate;
mod write;
mod yaml_format;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use validate::{validate_bmc_address, validate_hostname, validate_rack};
pub use write::write;

/// At most this many nodes in one manifest (a bound on memory and on one registration).
pub const MAX_NODES: usize = 100_000;
/// At most this many errors are listed; the rest are counted in [`ManifestErrors::omitted`].
pub const MAX_ERRORS: usize = 10_000;
/// Largest GPU count a node may declare.
pub const GPU_COUNT_MAX: u8 = 16;

/// The field names a manifest row may carry, in the order CSV writes them.
pub const FIELDS: [&str; 10] = [
    "hostname",
    "rack",
    "bmc_address",
    "gpu_model",
    "gpu_count",
    "firmware_bmc",
    "firmware_bios",
    "firmware_gpu_vbios",
    "firmware_nic",
    "labels",
];

/// One node as the manifest declares it, validated. Hostnames are lower-cased (DNS names
/// are case-insensitive); every string is trimmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub hostname: String,
    pub rack: String,
    /// `host`, `host:port`, `ipv4[:port]`, `[ipv6][:port]`, a bare IPv6 address, or `https://...`.
    pub bmc_address: String,
    /// Empty only when `gpu_count` is 0.
    pub gpu_model: String,
    pub gpu_count: u8,
    pub firmware_bmc: String,
    pub firmware_bios: String,
    pub firmware_gpu_vbios: String,
    pub firmware_nic: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A validated manifest: nodes in the order the file lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub nodes: Vec<NodeSpec>,
}

/// The three accepted encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Json,
    Yaml,
}

impl Format {
    pub const ALL: [Format; 3] = [Format::Csv, Format::Json, Format::Yaml];

    /// From a file name's extension (`.csv`, `.json`, `.yaml`/`.yml`, any case).
    pub fn from_path(path: &std::path::Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }

    /// From an HTTP Content-Type (parameters such as `; charset=utf-8` are ignored).
    pub fn from_content_type(content_type: &str) -> Option<Format> {
        let mime = content_type.split(';').next()?.trim().to_ascii_lowercase();
        match mime.as_str() {
            "text/csv" => Some(Format::Csv),
            "application/json" => Some(Format::Json),
            "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml" => {
                Some(Format::Yaml)
            }
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Json => "json",
            Format::Yaml => "yaml",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv",
            Format::Json => "application/json",
            Format::Yaml => "application/yaml",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            "yaml" | "yml" => Ok(Format::Yaml),
            other => Err(format!(
                "unknown manifest format {other:?}: expected csv, json or yaml"
            )),
        }
    }
}

/// One problem in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// 1-based line in the input: the CSV row's line; in JSON the line where the node object
    /// starts; in YAML the line of the offending value (of the node when the field is
    /// missing). `None` only for errors about the whole document with no position.
    pub line: Option<u64>,
    /// 1-based position of the node in the manifest (`None` for document-level errors).
    pub item: Option<usize>,
    /// The field (column) name, or `manifest` for errors about the document as a whole.
    pub field: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.item) {
            (Some(line), Some(item)) => write!(f, "line {line} (node {item})")?,
            (Some(line), None) => write!(f, "line {line}")?,
            (None, Some(item)) => write!(f, "node {item}")?,
            (None, None) => f.write_str("manifest")?,
        }
        write!(f, ", field {}: {}", self.field, self.reason)
    }
}

/// Every problem found in a refused manifest, in input order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestErrors {
    pub errors: Vec<FieldError>,
    /// Errors found beyond [`MAX_ERRORS`] and not listed.
    pub omitted: usize,
}

impl ManifestErrors {
    fn document(line: Option<u64>, reason: impl Into<String>) -> Self {
        ManifestErrors {
            errors: vec![FieldError {
                line,
                item: None,
                field: "manifest".into(),
                reason: reason.into(),
            }],
            omitted: 0,
        }
    }

    /// Total number of errors found, listed or not.
    pub fn count(&self) -> usize {
        self.errors.len() + self.omitted
    }
}

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "manifest refused: {} error(s), nothing was queued",
            self.count()
        )?;
        for e in &self.errors {
            writeln!(f, "  {e}")?;
        }
        if self.omitted > 0 {
            writeln!(f, "  ... and {} more", self.omitted)?;
        }
        Ok(())
    }
}

impl std::error::Error for ManifestErrors {}

/// Parses and validates a whole manifest.
///
/// `expected_rack`: when the manifest arrives for one rack (the HTTP endpoint's path), every
/// row's rack must equal it.
pub fn parse(
    input: &str,
    format: Format,
    expected_rack: Option<&str>,
) -> Result<Manifest, ManifestErrors> {
    let items = match format {
        Format::Csv => csv_format::read(input)?,
        Format::Json => json_format::read(input)?,
        Format::Yaml => yaml_format::read(input)?,
    };
    validate::validate_all(&items, expected_rack)
}

/// [`parse`] for raw bytes: refuses input that is not UTF-8 with the line of the first bad byte.
pub fn parse_bytes(
    input: &[u8],
    format: Format,
    expected_rack: Option<&str>,
) -> Result<Manifest, ManifestErrors> {
    match std::str::from_utf8(input) {
        Ok(text) => parse(text, format, expected_rack),
        Err(e) => {
            let valid = &input[..e.valid_up_to()];
            let line = valid.iter().filter(|b| **b == b'\n').count() as u64 + 1;
            Err(ManifestErrors::document(
                Some(line),
                format!("not UTF-8 text (bad byte at offset {})", e.valid_up_to()),
            ))
        }
    }
}

/// 1-based line of byte `offset` in `text`, counting from a known (offset, line) pair before it
/// so that a pass over increasing offsets is linear.
pub(crate) fn line_at(text: &str, from: (usize, u64), offset: usize) -> u64 {
    let (start, line) = from;
    let end = offset.min(text.len());
    if end <= start {
        return line;
    }
    line + text.as_bytes()[start..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count() as u64
}
